//! `tallyd query allowances`: what a user lets each gateway charge; and
//! `tallyd query withdrawals`: what a user took back (ADR 0020).

use clap::Args;
use tally_settlement::query_path;

use super::{show, Shape};
use crate::cli::args::QueryOpts;
use crate::cli::{Command, Context};

/// `query allowances --user U`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct AllowancesCommand {
    /// The user.
    #[arg(long)]
    pub user: String,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for AllowancesCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(
            &self.opts,
            &query_path::allowances(&self.user),
            Shape::Allowances,
        )
    }
}

/// `query withdrawals --user U`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct WithdrawalsCommand {
    /// The user.
    #[arg(long)]
    pub user: String,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for WithdrawalsCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(
            &self.opts,
            &query_path::withdrawals(&self.user),
            Shape::Flat,
        )
    }
}

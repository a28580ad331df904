//! `tallyd query balance|params|windows|gateways`: chain state other
//! than route records and hub sync. `balance` takes `--verify`
//! ([`super::verified`]).

use clap::Args;
use tally_settlement::{keys, query_path};

use super::{show, verified, Shape};
use crate::cli::args::{PageArgs, QueryOpts, VerifyArgs};
use crate::cli::{Command, Context};

/// `query balance --user U`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct BalanceCommand {
    /// The user.
    #[arg(long)]
    pub user: String,
    /// Light-client verification.
    #[command(flatten)]
    pub verify: VerifyArgs,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for BalanceCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let path = query_path::balance(&self.user);
        if !self.verify.verify {
            return show(&self.opts, &path, Shape::Flat);
        }
        let read = verified::read(ctx, &self.opts, &self.verify, &[keys::balance(&self.user)])?;
        let v = tally_light::verified::answer(&read, &path.to_string())?;
        verified::print(&self.opts, Shape::Flat, v, &read)
    }
}

/// `query params`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ParamsCommand {
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for ParamsCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(&self.opts, &query_path::params(), Shape::Flat)
    }
}

/// `query windows [--limit N] [--cursor C]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct WindowsCommand {
    /// Paging.
    #[command(flatten)]
    pub page: PageArgs,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for WindowsCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let path = query_path::windows().page(self.page.limit, self.page.cursor.as_deref());
        show(&self.opts, &path, Shape::Windows)
    }
}

/// `query gateways`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct GatewaysCommand {
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for GatewaysCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(&self.opts, &query_path::gateways(), Shape::Gateways)
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::args::Output;
    use crate::cli::query::tests::query;
    use crate::cli::query::QueryCommand;
    use clap::error::ErrorKind;

    #[test]
    fn parses() {
        let QueryCommand::Balance(c) = query(&[
            "query",
            "balance",
            "--user",
            "carol",
            "--node",
            "http://n:1",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.user, "carol");
        assert_eq!(c.opts.node.primary(), "http://n:1");
        let QueryCommand::Windows(c) =
            query(&["query", "windows", "--limit", "3", "--output", "json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.page.limit, Some(3));
        assert_eq!(c.opts.format(), Output::Json);
        for ok in [
            &["query", "params"][..],
            &["query", "gateways", "--output", "table"],
            &["query", "dkg", "--output", "json"],
        ] {
            query(ok).unwrap();
        }
    }

    #[test]
    fn refuses_bad_invocations() {
        for (bad, kind) in [
            (
                &["query", "balance"][..],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["query", "params", "--limit", "1"],
                ErrorKind::UnknownArgument,
            ),
            (
                &["query", "windows", "--limit", "x"],
                ErrorKind::ValueValidation,
            ),
            (&["query", "dkg", "--output"], ErrorKind::InvalidValue),
        ] {
            assert_eq!(query(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
    }
}

/// `query upgrade [--applied NAME]`: the app version and the pending plan,
/// or a plan carried out.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct UpgradeQuery {
    /// Show the plan carried out under this name instead.
    #[arg(long)]
    pub applied: Option<String>,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for UpgradeQuery {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let path = match &self.applied {
            Some(name) => query_path::upgrade_applied(name),
            None => query_path::upgrade(),
        };
        show(&self.opts, &path, Shape::Flat)
    }
}

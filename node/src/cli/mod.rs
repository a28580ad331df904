//! The `tallyd` command line.
//!
//! [`Cli`] is the parser; each subcommand lives in its own module as a type
//! implementing [`Command`], and groups of subcommands (`keys`, `genesis`,
//! `query`, ...) are enums whose `execute` hands over to the chosen one.
//! Argument groups several commands share are in [`args`], table output in
//! [`table`].
//!
//! ```text
//! cli/
//!   args.rs      NodeArgs, OutputArgs, QueryOpts, PageArgs, LogArgs
//!   table.rs     column and key: value rendering
//!   init.rs      tallyd init
//!   start.rs     tallyd start (its steps in launch.rs)
//!   launch.rs    the launch of tallyd start, one fn per step
//!   keys.rs      tallyd keys add|show|relay-address
//!   allowance.rs tallyd tx allowance grant|revoke
//!   genesis.rs   tallyd genesis add-gateway|fund|set-param|validate
//!   dkg.rs       tallyd dkg dealer (tests only)
//!   explorer.rs  tallyd explorer (the SLA explorer page; server in tally_explorer)
//!   tx.rs        tallyd tx report
//!   validator.rs tallyd tx validator propose|approve
//!   light.rs     tallyd light init|show (the light client's trust root)
//!   status.rs    tallyd status (health checks; the decision is crate::health)
//!   query/       tallyd query ... (sla, state, sync, node; --verify in verified.rs)
//! ```

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

pub mod allowance;
pub mod args;
pub mod dkg;
pub mod explorer;
pub mod genesis;
pub mod govern;
pub mod init;
pub mod keys;
mod launch;
pub mod light;
pub mod query;
pub mod slo;
pub mod start;
pub mod status;
pub mod table;
pub mod tx;
pub mod upgrade;
pub mod user;
pub mod validator;

/// A subcommand, ready to run.
pub trait Command {
    /// Runs the command; an error is printed as `error: ...` and the
    /// process exits with status 1.
    fn execute(self, ctx: &Context) -> anyhow::Result<()>;
}

/// What every command may use besides its own arguments.
#[derive(Clone, Debug)]
pub struct Context {
    /// The node home directory (`--home`).
    pub home: PathBuf,
}

impl Context {
    /// The home directory.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// `<home>/config/genesis.json`.
    pub fn genesis_path(&self) -> PathBuf {
        self.home.join("config").join("genesis.json")
    }
}

/// `tallyd`'s arguments.
#[derive(Parser, Debug)]
#[command(
    name = "tallyd",
    version,
    about = "Tally: SLA records and settlement for AI-inference gateways, on CometBFT"
)]
pub struct Cli {
    /// Node home directory (config/, data/, keys/).
    #[arg(long, global = true, env = "TALLY_HOME", default_value_os_t = default_home())]
    pub home: PathBuf,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Commands,
}

impl Cli {
    /// Runs the chosen subcommand.
    pub fn run(self) -> anyhow::Result<()> {
        let ctx = Context { home: self.home };
        self.command.execute(&ctx)
    }
}

/// `$HOME/.tally`, or `./.tally` without a `HOME`.
fn default_home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".tally")
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Commands {
    /// Write config/app.toml (CometBFT's config.toml comes from `cometbft init`).
    Init(init::InitCommand),
    /// Run the ABCI application for the CometBFT node of this home.
    Start(start::StartCommand),
    /// Gateway signing keys.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Edit the app_state of config/genesis.json.
    #[command(subcommand)]
    Genesis(genesis::GenesisCommand),
    /// Send transactions.
    #[command(subcommand)]
    Tx(tx::TxCommand),
    /// Query a node.
    #[command(subcommand)]
    Query(query::QueryCommand),
    /// Threshold key setup.
    #[command(subcommand)]
    Dkg(dkg::DkgCommand),
    /// The light client's trust root (for queries with --verify).
    #[command(subcommand)]
    Light(light::LightCommand),
    /// Serve a web page of a node's SLA records, balances and settlement.
    Explorer(explorer::ExplorerCommand),
    /// Whether this node is healthy: exit 0, or a code naming the first failing check.
    Status(status::StatusCommand),
}

impl Command for Commands {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Init(c) => c.execute(ctx),
            Self::Start(c) => c.execute(ctx),
            Self::Keys(c) => c.execute(ctx),
            Self::Genesis(c) => c.execute(ctx),
            Self::Tx(c) => c.execute(ctx),
            Self::Query(c) => c.execute(ctx),
            Self::Dkg(c) => c.execute(ctx),
            Self::Light(c) => c.execute(ctx),
            Self::Explorer(c) => c.execute(ctx),
            Self::Status(c) => c.execute(ctx),
        }
    }
}

/// Parses `args` (program name first) as `tallyd` would, for tests.
#[cfg(test)]
pub(crate) fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("tallyd").chain(args.iter().copied()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn home_is_global_and_a_subcommand_is_required() {
        let c = parse(&["init", "--home", "/h"]).unwrap();
        assert_eq!(c.home, PathBuf::from("/h"));
        let c = parse(&["--home", "/h2", "query", "params"]).unwrap();
        assert_eq!(c.home, PathBuf::from("/h2"));
        let e = parse(&[]).unwrap_err();
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        let e = parse(&["frobnicate"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidSubcommand);
    }
}

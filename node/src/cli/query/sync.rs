//! `tallyd query sync|batch|hubcalls`: settlement with a hub chain.

use clap::Args;
use tally_settlement::query_path;

use super::{show, Shape};
use crate::cli::args::{PageArgs, QueryOpts};
use crate::cli::{Command, Context};

/// `query sync [--chain C]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct SyncCommand {
    /// The hub chain.
    #[arg(long, default_value = "hub")]
    pub chain: String,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for SyncCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(&self.opts, &query_path::sync(&self.chain), Shape::Flat)
    }
}

/// `query batch --nonce N [--chain C]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct BatchCommand {
    /// The hub chain.
    #[arg(long, default_value = "hub")]
    pub chain: String,
    /// The batch's nonce (1, 2, ...).
    #[arg(long)]
    pub nonce: u64,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for BatchCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(
            &self.opts,
            &query_path::batch(&self.chain, self.nonce),
            Shape::Batch,
        )
    }
}

/// `query hubcalls [--chain C] [--limit N] [--cursor C]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct HubcallsCommand {
    /// The hub chain.
    #[arg(long, default_value = "hub")]
    pub chain: String,
    /// Paging.
    #[command(flatten)]
    pub page: PageArgs,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for HubcallsCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let path =
            query_path::hubcalls(&self.chain).page(self.page.limit, self.page.cursor.as_deref());
        show(&self.opts, &path, Shape::Calls)
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::args::Output;
    use crate::cli::query::tests::query;
    use crate::cli::query::QueryCommand;
    use clap::error::ErrorKind;

    #[test]
    fn parses_as_the_e2e_test_calls_it() {
        let QueryCommand::Batch(c) = query(&[
            "query",
            "batch",
            "--chain",
            "hub",
            "--nonce",
            "2",
            "--output",
            "json",
            "--node",
            "http://127.0.0.1:26667",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!((c.chain.as_str(), c.nonce), ("hub", 2));
        assert_eq!(c.opts.format(), Output::Json);
        assert_eq!(c.opts.node.endpoints(), ["http://127.0.0.1:26667"]);
    }

    #[test]
    fn chain_defaults_to_hub() {
        let QueryCommand::Sync(c) = query(&["query", "sync"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.chain, "hub");
        let QueryCommand::Hubcalls(c) =
            query(&["query", "hubcalls", "--limit", "1", "--cursor", "00"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.chain, "hub");
        assert_eq!(c.page.cursor.as_deref(), Some("00"));
    }

    #[test]
    fn refuses_bad_invocations() {
        for (bad, kind) in [
            (&["query", "batch"][..], ErrorKind::MissingRequiredArgument),
            (
                &["query", "batch", "--nonce", "one"],
                ErrorKind::ValueValidation,
            ),
            (
                &["query", "sync", "--nonce", "1"],
                ErrorKind::UnknownArgument,
            ),
            (
                &["query", "hubcalls", "--limit", "-3"],
                ErrorKind::UnknownArgument,
            ),
        ] {
            assert_eq!(query(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
    }
}

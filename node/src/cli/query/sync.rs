//! `tallyd query sync|batch|hubcalls`: settlement with a hub chain. The
//! hub chain defaults to the one the node's chain settles on (its
//! `hub_chain` parameter: `hub` for the reference hub, `evm:<chain
//! id>:0x<address>` for the EVM hub, ADR 0022).

use clap::Args;
use tally_settlement::query_path;

use super::{query_json, show, Shape};
use crate::cli::args::{PageArgs, QueryOpts};
use crate::cli::{Command, Context};
use crate::rpc::Rpc;

/// `chain`, or the chain's `hub_chain` parameter read from the node.
fn hub_chain(chain: Option<String>, opts: &QueryOpts) -> anyhow::Result<String> {
    if let Some(c) = chain {
        return Ok(c);
    }
    let params = query_json(&Rpc::new(&opts.node.primary()), "/params")?;
    params["hub_chain"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("the node's /params has no hub_chain: give --chain"))
}

/// `query sync [--chain C]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct SyncCommand {
    /// The hub chain (default: the chain's `hub_chain` parameter).
    #[arg(long)]
    pub chain: Option<String>,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for SyncCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let chain = hub_chain(self.chain, &self.opts)?;
        show(&self.opts, &query_path::sync(&chain), Shape::Flat)
    }
}

/// `query batch --nonce N [--chain C]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct BatchCommand {
    /// The hub chain (default: the chain's `hub_chain` parameter).
    #[arg(long)]
    pub chain: Option<String>,
    /// The batch's nonce (1, 2, ...).
    #[arg(long)]
    pub nonce: u64,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for BatchCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let chain = hub_chain(self.chain, &self.opts)?;
        show(
            &self.opts,
            &query_path::batch(&chain, self.nonce),
            Shape::Batch,
        )
    }
}

/// `query hubcalls [--chain C] [--limit N] [--cursor C]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct HubcallsCommand {
    /// The hub chain (default: the chain's `hub_chain` parameter).
    #[arg(long)]
    pub chain: Option<String>,
    /// Paging.
    #[command(flatten)]
    pub page: PageArgs,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for HubcallsCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let chain = hub_chain(self.chain, &self.opts)?;
        let path = query_path::hubcalls(&chain).page(self.page.limit, self.page.cursor.as_deref());
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
        assert_eq!((c.chain.as_deref(), c.nonce), (Some("hub"), 2));
        assert_eq!(c.opts.format(), Output::Json);
        assert_eq!(c.opts.node.endpoints(), ["http://127.0.0.1:26667"]);
    }

    #[test]
    fn chain_defaults_to_the_chains_hub_chain() {
        // No --chain: read from the node's /params when run.
        let QueryCommand::Sync(c) = query(&["query", "sync"]).unwrap() else {
            panic!()
        };
        assert_eq!(c.chain, None);
        let QueryCommand::Hubcalls(c) =
            query(&["query", "hubcalls", "--limit", "1", "--cursor", "00"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.chain, None);
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

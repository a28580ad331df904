//! `tallyd query raw|status`: any query path as JSON, and the node's own
//! status.

use crate::rpc::Rpc;
use clap::Args;

use super::query_json;
use crate::cli::args::{Output, QueryOpts};
use crate::cli::{table, Command, Context};

/// `query raw PATH`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct RawCommand {
    /// The query path as sent, e.g. '/sla/provider/acme-ai?limit=5'
    /// (escape `/` inside a segment as %2F).
    pub path: String,
    /// Node and output format (always JSON).
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for RawCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let v = query_json(&Rpc::new(&self.opts.node.primary()), &self.path)?;
        println!("{v}");
        Ok(())
    }
}

/// `query status`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct StatusCommand {
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for StatusCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let s = Rpc::new(&self.opts.node.primary()).status()?;
        let v = serde_json::json!({"chain_id": s.chain_id, "height": s.height, "app_hash": s.app_hash, "catching_up": s.catching_up});
        match self.opts.format() {
            Output::Json => println!("{v}"),
            Output::Table => table::flat(&mut std::io::stdout().lock(), &v)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::query::tests::query;
    use crate::cli::query::QueryCommand;
    use clap::error::ErrorKind;

    #[test]
    fn raw_takes_the_path_verbatim() {
        let QueryCommand::Raw(c) =
            query(&["query", "raw", "/balance/carol", "--node", "http://n:1"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.path, "/balance/carol");
        assert_eq!(c.opts.node.primary(), "http://n:1");
        let e = query(&["query", "raw"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn status_takes_node_and_output() {
        let QueryCommand::Status(c) = query(&["query", "status", "--output", "json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.opts.format(), Output::Json);
        let e = query(&["query", "status", "extra"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
    }
}

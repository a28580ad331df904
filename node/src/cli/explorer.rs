//! `tallyd explorer`: serve the SLA explorer page for one node
//! ([`tally_explorer`]).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use tally_explorer::Config;

use crate::rpc::Rpc;

use super::args::NodeArgs;
use super::{Command, Context};

/// Serve a web page of a node's SLA records, balances and settlement.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ExplorerCommand {
    /// Address to serve the page on (IP:PORT; 127.0.0.1 keeps it local).
    #[arg(long, default_value = "127.0.0.1:26780")]
    pub listen: SocketAddr,
    /// The node whose state the page shows (the first, if several).
    #[command(flatten)]
    pub node: NodeArgs,
    /// A provider shown when the page's URL names none (repeat or use
    /// commas for several).
    #[arg(long = "provider", value_name = "PROVIDER", value_delimiter = ',')]
    pub providers: Vec<String>,
    /// The hub chain whose settlement pipeline is shown (default: the
    /// chain's hub_chain parameter).
    #[arg(long)]
    pub chain: Option<String>,
    /// Seconds between the page's refreshes (0: never).
    #[arg(long, default_value_t = 10)]
    pub refresh_secs: u64,
}

impl ExplorerCommand {
    /// The page's settings, checked ([`Config::new`]).
    fn config(&self) -> anyhow::Result<Config> {
        Ok(Config::new(
            &self.node.primary(),
            self.providers.clone(),
            self.chain.clone(),
            self.refresh_secs,
        )?)
    }
}

impl Command for ExplorerCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let cfg = self.config()?;
        let node = Rpc::new(&self.node.primary()).client().clone();
        let listen = self.listen.to_string();
        let server = tally_explorer::serve(&listen, Arc::new(node), cfg.clone())
            .with_context(|| format!("serving the explorer on {listen}"))?;
        let addr = server.local_addr().map_or(listen, |a| a.to_string());
        println!("explorer: http://{addr}/ reading {}", cfg.node);
        if !self.listen.ip().is_loopback() {
            eprintln!(
                "note: {addr} is not a loopback address: anyone who reaches it can read this node's SLA records through it"
            );
        }
        server.wait();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Commands};

    fn explorer(args: &[&str]) -> Result<ExplorerCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Explorer(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_and_flags() {
        let c = explorer(&["explorer"]).unwrap();
        assert_eq!(c.listen, "127.0.0.1:26780".parse().unwrap());
        assert_eq!(c.refresh_secs, 10);
        let cfg = c.config().unwrap();
        assert!(cfg.providers.is_empty() && cfg.chain.is_none());
        let c = explorer(&[
            "explorer",
            "--listen",
            "127.0.0.1:24856",
            "--node",
            "http://u:pw@127.0.0.1:1",
            "--provider",
            "a,b",
            "--provider",
            "c",
            "--chain",
            "hub",
            "--refresh-secs",
            "0",
        ])
        .unwrap();
        let cfg = c.config().unwrap();
        assert_eq!(cfg.providers, ["a", "b", "c"]);
        assert_eq!(cfg.chain.as_deref(), Some("hub"));
        assert_eq!(cfg.refresh_secs, 0);
        // The page never shows the node's credentials.
        assert_eq!(cfg.node, "http://***@127.0.0.1:1");
    }

    #[test]
    fn bad_settings_are_refused_with_the_flag_named() {
        let e = explorer(&["explorer", "--listen", "localhost"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        for (args, needle) in [
            (
                &["explorer", "--provider", "a b"][..],
                "--provider: provider \"a b\" has character",
            ),
            (&["explorer", "--chain", ""], "--chain: chain is empty"),
            (
                &["explorer", "--refresh-secs", "3601"],
                "--refresh-secs must be 0..=3600",
            ),
            (&["explorer", "--node", "ftp://x"], "--node must be an http"),
        ] {
            let e = explorer(args).unwrap().config().unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }
}

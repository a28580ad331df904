//! `tallyd light init|show`: the trust root the light client verifies
//! headers from (`<home>/light/trust.json`, [`tally_light::trust`]).
//! Queries with `--verify` read it; a successful verification advances it
//! to the header it verified.

use crate::rpc::Rpc;
use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::json;
use tally_light::{trust, LightError, RpcSource, Source, TrustRoot};

use super::args::{NodeArgs, Output, OutputArgs};
use super::{table, Command, Context};

/// The light client's trust root.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum LightCommand {
    /// Store the trust root `--verify` starts from: a header you trust, or
    /// (without --height/--hash) the node's latest, to compare with a
    /// source you trust.
    Init(InitCommand),
    /// Print the stored trust root.
    Show(ShowCommand),
}

impl Command for LightCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Init(c) => c.execute(ctx),
            Self::Show(c) => c.execute(ctx),
        }
    }
}

/// `light init [--node URL] [--height H --hash HEX] [--force]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct InitCommand {
    /// The node to read the header from.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Height of a header you trust (with --hash).
    #[arg(long, requires = "hash")]
    pub height: Option<u64>,
    /// Hash (hex) of the header at --height, from a source you trust.
    #[arg(long, requires = "height")]
    pub hash: Option<String>,
    /// Replace an existing trust root.
    #[arg(long)]
    pub force: bool,
}

impl Command for InitCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let path = trust::path_in(ctx.home());
        if path.exists() && !self.force {
            let what = match TrustRoot::load(&path) {
                Ok(r) => format!("height {}, hash {}", r.height, r.hash_hex()),
                Err(e) => e.to_string(),
            };
            bail!(
                "a trust root is already stored in {} ({what}); --force replaces it",
                path.display()
            );
        }
        let url = self.node.primary();
        let source = RpcSource::new(Rpc::new(&url).client().clone());
        let root = match (self.height, &self.hash) {
            (Some(h), Some(hash)) => {
                let given = TrustRoot::new(None, h, hash).map_err(anyhow::Error::msg)?;
                let header = source.signed_header(Some(h))?.header;
                let got = header.hash().as_bytes().to_vec();
                if got != given.hash {
                    return Err(LightError::TrustRootMismatch {
                        height: h,
                        got: hex::encode_upper(&got),
                        want: given.hash_hex(),
                    }
                    .into());
                }
                TrustRoot {
                    chain_id: Some(header.chain_id.to_string()),
                    ..given
                }
            }
            _ => {
                let header = source.signed_header(None)?.header;
                TrustRoot {
                    chain_id: Some(header.chain_id.to_string()),
                    height: header.height.value(),
                    hash: header.hash().as_bytes().to_vec(),
                }
            }
        };
        root.save(&path)?;
        let chain = root.chain_id.as_deref().unwrap_or("");
        println!("chain_id: {chain}");
        println!("height: {}", root.height);
        println!("hash: {}", root.hash_hex());
        println!("trust root written to {}", path.display());
        if self.hash.is_none() {
            println!(
                "NOTE: this header comes from {} and is not verified by anything: compare its height \
                 and hash with a source you trust (another operator, your own node) before relying on \
                 --verify; if they differ, run `tallyd light init --force --height H --hash HEX` with the trusted ones.",
                tally_client::redact_url(&url)
            );
        } else {
            println!(
                "the node's header at height {} has the hash given",
                root.height
            );
        }
        Ok(())
    }
}

/// `light show`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ShowCommand {
    /// How to print.
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Command for ShowCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let path = trust::path_in(ctx.home());
        let root = TrustRoot::load(&path)?;
        let v = json!({
            "chain_id": root.chain_id,
            "height": root.height,
            "hash": root.hash_hex(),
            "file": path.display().to_string(),
        });
        match self.output.format() {
            Output::Json => println!("{v}"),
            Output::Table => table::flat(&mut std::io::stdout().lock(), &v)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Commands};
    use clap::error::ErrorKind;

    fn light(args: &[&str]) -> Result<LightCommand, clap::Error> {
        let mut full = vec!["light"];
        full.extend_from_slice(args);
        match parse(&full)?.command {
            Commands::Light(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses() {
        let LightCommand::Init(c) = light(&["init", "--node", "http://n:1"]).unwrap() else {
            panic!()
        };
        assert_eq!((c.height, c.hash.as_deref(), c.force), (None, None, false));
        assert_eq!(c.node.primary(), "http://n:1");
        let LightCommand::Init(c) =
            light(&["init", "--height", "9", "--hash", "AB", "--force"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (c.height, c.hash.as_deref(), c.force),
            (Some(9), Some("AB"), true)
        );
        assert!(matches!(
            light(&["show", "--output", "json"]).unwrap(),
            LightCommand::Show(_)
        ));
        for (bad, kind) in [
            (
                &["init", "--height", "9"][..],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["init", "--hash", "AB"],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["init", "--height", "x", "--hash", "AB"],
                ErrorKind::ValueValidation,
            ),
            (&["verify"], ErrorKind::InvalidSubcommand),
        ] {
            assert_eq!(light(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
    }

    #[test]
    fn init_refuses_to_replace_a_root_and_show_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context {
            home: dir.path().to_path_buf(),
        };
        let path = trust::path_in(dir.path());
        let root = TrustRoot::new(Some("c".into()), 3, &"AB".repeat(32)).unwrap();
        root.save(&path).unwrap();
        // No node is asked: the existing root is kept.
        let LightCommand::Init(c) = light(&["init", "--node", "http://127.0.0.1:1"]).unwrap()
        else {
            panic!()
        };
        let e = c.execute(&ctx).unwrap_err().to_string();
        assert!(e.contains("--force") && e.contains("height 3"), "{e}");
        assert_eq!(TrustRoot::load(&path).unwrap(), root);
        // With --force the node is asked (and here unreachable): the root
        // stays as it was.
        let LightCommand::Init(c) =
            light(&["init", "--node", "http://127.0.0.1:1", "--force"]).unwrap()
        else {
            panic!()
        };
        assert!(c.execute(&ctx).is_err());
        assert_eq!(TrustRoot::load(&path).unwrap(), root);
        let LightCommand::Show(c) = light(&["show"]).unwrap() else {
            panic!()
        };
        c.execute(&ctx).unwrap();
    }
}

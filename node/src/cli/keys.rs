//! `tallyd keys add|show`: gateway signing keys in `<home>/keys/`.

use std::path::{Path, PathBuf};

use crate::keyfile;
use clap::{Args, Subcommand};

use super::args::{Output, OutputArgs};
use super::{Command, Context};

/// Gateway signing keys.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum KeysCommand {
    /// Create a new ed25519 key in <home>/keys/NAME.json (or --out FILE).
    Add(AddCommand),
    /// Show a key's public key. Takes a key name or a key file path.
    Show(ShowCommand),
}

impl Command for KeysCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Add(c) => c.execute(ctx),
            Self::Show(c) => c.execute(ctx),
        }
    }
}

/// `keys add NAME [--out FILE] [--force]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct AddCommand {
    /// The key's name.
    pub name: String,
    /// Write the key here instead of <home>/keys/NAME.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace an existing key file.
    #[arg(long)]
    pub force: bool,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Command for AddCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let path = self
            .out
            .unwrap_or_else(|| keyfile::keys_dir(ctx.home()).join(format!("{}.json", self.name)));
        let key = keyfile::create(&path, &self.name, self.force)?;
        print_key(
            &self.name,
            &hex::encode(key.verifying_key().to_bytes()),
            &path,
            self.output.format(),
        );
        Ok(())
    }
}

/// `keys show NAME|FILE`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ShowCommand {
    /// A key name in <home>/keys or a key file path.
    pub name: String,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Command for ShowCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let path = keyfile::resolve(ctx.home(), &self.name);
        let (name, key) = keyfile::load(&path)?;
        print_key(
            &name,
            &hex::encode(key.verifying_key().to_bytes()),
            &path,
            self.output.format(),
        );
        Ok(())
    }
}

fn print_key(name: &str, pubkey: &str, path: &Path, output: Output) {
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({"name": name, "public_key": pubkey, "file": path.display().to_string()})
        ),
        Output::Table => {
            println!("name:       {name}");
            println!("public_key: {pubkey}");
            println!("file:       {}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Commands};

    fn keys(args: &[&str]) -> Result<KeysCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Keys(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses() {
        assert_eq!(
            keys(&["keys", "add", "gateway", "--out", "/tmp/g.key", "--force"]).unwrap(),
            KeysCommand::Add(AddCommand {
                name: "gateway".into(),
                out: Some("/tmp/g.key".into()),
                force: true,
                output: OutputArgs {
                    output: Output::Table,
                    json: false,
                },
            })
        );
        assert_eq!(
            keys(&["keys", "show", "gw1", "--output", "json"]).unwrap(),
            KeysCommand::Show(ShowCommand {
                name: "gw1".into(),
                output: OutputArgs {
                    output: Output::Json,
                    json: false,
                },
            })
        );
        for (bad, kind) in [
            (
                &["keys", "add"][..],
                clap::error::ErrorKind::MissingRequiredArgument,
            ),
            (
                &["keys", "show"],
                clap::error::ErrorKind::MissingRequiredArgument,
            ),
            (
                &["keys", "show", "a", "--output", "yaml"],
                clap::error::ErrorKind::InvalidValue,
            ),
            (&["keys", "list"], clap::error::ErrorKind::InvalidSubcommand),
        ] {
            assert_eq!(keys(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
    }

    #[test]
    fn add_then_show_finds_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context {
            home: dir.path().to_path_buf(),
        };
        keys(&["keys", "add", "gw1"])
            .unwrap()
            .execute(&ctx)
            .unwrap();
        let path = keyfile::keys_dir(dir.path()).join("gw1.json");
        assert!(path.exists());
        keys(&["keys", "show", "gw1"])
            .unwrap()
            .execute(&ctx)
            .unwrap();
        let e = keys(&["keys", "add", "gw1"])
            .unwrap()
            .execute(&ctx)
            .unwrap_err();
        assert!(!e.to_string().is_empty());
    }
}

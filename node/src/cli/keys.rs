//! `tallyd keys add|show`: gateway signing keys in `<home>/keys/`;
//! `tallyd keys relay-address`: the EVM account this validator's relay
//! pays its hub transactions from (`evm_key_file` of app.toml).

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
    /// Print the address of this node's EVM relay key (fund it: the relay pays its own gas).
    RelayAddress(RelayAddressCommand),
}

impl Command for KeysCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Add(c) => c.execute(ctx),
            Self::Show(c) => c.execute(ctx),
            Self::RelayAddress(c) => c.execute(ctx),
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

/// `keys relay-address [--key-file FILE]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct RelayAddressCommand {
    /// The key file (default: `evm_key_file` of app.toml).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
}

impl Command for RelayAddressCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let path = match self.key_file {
            Some(p) => p,
            None => crate::config::AppConfig::load(ctx.home())?.evm_key_path(ctx.home()),
        };
        println!("{}", relay_address(&path)?);
        Ok(())
    }
}

/// The address of the EVM relay key at `path` (`0x` and 40 lowercase hex
/// digits); the key file must be one only its owner can read.
pub fn relay_address(path: &Path) -> anyhow::Result<String> {
    let key = tally_hub_evm::key::RelayKey::load(path)?;
    Ok(format!("0x{}", hex::encode(key.address().as_slice())))
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
            (
                &["keys", "relay-address", "x"],
                clap::error::ErrorKind::UnknownArgument,
            ),
        ] {
            assert_eq!(keys(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
    }

    #[test]
    fn relay_address_reads_the_configured_key_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context {
            home: dir.path().to_path_buf(),
        };
        assert_eq!(
            keys(&["keys", "relay-address"]).unwrap(),
            KeysCommand::RelayAddress(RelayAddressCommand { key_file: None })
        );
        // anvil's first development account, a well-known address.
        let path = dir.path().join("config/relay_evm_key.hex");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            relay_address(&path).unwrap(),
            "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
        );
        keys(&["keys", "relay-address"])
            .unwrap()
            .execute(&ctx)
            .unwrap();
        // A key others can read is refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = relay_address(&path).unwrap_err().to_string();
        assert!(e.contains("too open"), "{e}");
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

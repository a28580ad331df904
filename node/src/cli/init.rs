//! `tallyd init`: write `config/app.toml`, create `data/`, and make the
//! EVM relay key (`config/relay_evm_key.hex`, 0600) unless one is there.

use crate::config::AppConfig;
use anyhow::{bail, Context as _};
use clap::Args;

use super::{Command, Context};

/// Write config/app.toml (CometBFT's config.toml comes from `cometbft init`).
#[derive(Args, Debug, PartialEq, Eq)]
pub struct InitCommand {
    /// ABCI listen address.
    #[arg(long, default_value = "127.0.0.1:26658")]
    pub abci_listen: String,
    /// Overwrite an existing app.toml.
    #[arg(long)]
    pub force: bool,
}

impl Command for InitCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let home = ctx.home();
        let path = AppConfig::path(home);
        if path.exists() && !self.force {
            bail!("{} exists; pass --force to overwrite", path.display());
        }
        let cfg = AppConfig {
            abci_listen: self.abci_listen,
            ..AppConfig::default()
        };
        cfg.save(home)?;
        let data = home.join("data");
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        println!("wrote {}", path.display());
        let (key_path, made) = relay_key(&cfg.evm_key_path(home))?;
        println!(
            "{} {} (EVM relay account {}; fund it to settle on an EVM hub)",
            if made { "wrote" } else { "kept" },
            key_path.display(),
            super::keys::relay_address(&key_path)?
        );
        Ok(())
    }
}

/// Makes the EVM relay key at `path` (mode 0600) unless a file is there
/// already (an existing key is never replaced, not even with `--force`);
/// whether it was made.
fn relay_key(path: &std::path::Path) -> anyhow::Result<(std::path::PathBuf, bool)> {
    if path.symlink_metadata().is_ok() {
        return Ok((path.to_path_buf(), false));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    tally_hub_evm::key::RelayKey::create(path)?;
    Ok((path.to_path_buf(), true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Commands};

    fn init(args: &[&str]) -> Result<InitCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Init(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses() {
        assert_eq!(
            init(&["init"]).unwrap(),
            InitCommand {
                abci_listen: "127.0.0.1:26658".into(),
                force: false
            }
        );
        assert_eq!(
            init(&["init", "--abci-listen", "0.0.0.0:1", "--force"]).unwrap(),
            InitCommand {
                abci_listen: "0.0.0.0:1".into(),
                force: true
            }
        );
        let e = init(&["init", "--force=yes"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::TooManyValues);
        let e = init(&["init", "--abci-listen"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn writes_app_toml_once_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context {
            home: dir.path().to_path_buf(),
        };
        let cmd = || init(&["init", "--abci-listen", "127.0.0.1:9"]).unwrap();
        cmd().execute(&ctx).unwrap();
        let cfg = AppConfig::load(dir.path()).unwrap();
        assert_eq!(cfg.abci_listen, "127.0.0.1:9");
        assert!(dir.path().join("data").is_dir());
        let e = cmd().execute(&ctx).unwrap_err().to_string();
        assert!(e.contains("pass --force"), "{e}");
        init(&["init", "--force"]).unwrap().execute(&ctx).unwrap();
    }

    #[test]
    fn makes_the_evm_relay_key_once_and_never_replaces_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context {
            home: dir.path().to_path_buf(),
        };
        init(&["init"]).unwrap().execute(&ctx).unwrap();
        let path = dir.path().join("config/relay_evm_key.hex");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let first = std::fs::read_to_string(&path).unwrap();
        assert_eq!(first.trim().len(), 64, "one line of hex");
        // --force rewrites app.toml, not the key (its account may hold funds).
        init(&["init", "--force"]).unwrap().execute(&ctx).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        let a = crate::cli::keys::relay_address(&path).unwrap();
        assert_eq!((a.len(), &a[..2]), (42, "0x"));
    }
}

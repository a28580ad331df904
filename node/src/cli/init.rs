//! `tallyd init`: write `config/app.toml` and create `data/`.

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
        Ok(())
    }
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
}

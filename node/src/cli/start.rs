//! `tallyd start`: load `app.toml`, set up logging and hand over to the
//! launch's named steps ([`launch`]: genesis, store, shares, metrics page,
//! participant, relay, ABCI server).
//! [`StartCommand::execute_with`] serves a wrapper around the app instead
//! (the test-only `tallyd-byzantine` does).

use clap::Args;

use super::args::LogArgs;
use super::{launch, Command, Context};
use crate::config::AppConfig;

/// Run the ABCI application for the CometBFT node of this home.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct StartCommand {
    /// Logging overrides.
    #[command(flatten)]
    pub log: LogArgs,
}

impl Command for StartCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        self.execute_with(ctx, |app| app)
    }
}

impl StartCommand {
    /// Runs `tallyd start` ([`launch::run`]), serving `wrap(app)` over ABCI
    /// instead of the app itself (the relay still works with the app).
    pub fn execute_with<A: tendermint_abci::Application>(
        self,
        ctx: &Context,
        wrap: impl FnOnce(tally_abci::TallyApp) -> A,
    ) -> anyhow::Result<()> {
        let cfg = AppConfig::load(ctx.home())?;
        self.log.init(&cfg.log_format, &cfg.log_level)?;
        launch::run(ctx.home(), &ctx.genesis_path(), &cfg, wrap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::LogFormat;
    use crate::cli::{parse, Commands};

    fn start(args: &[&str]) -> Result<StartCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Start(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses() {
        assert_eq!(start(&["start"]).unwrap().log, LogArgs::default());
        let c = start(&[
            "start",
            "--log-format",
            "json",
            "--log-level",
            "tally=debug,info",
        ])
        .unwrap();
        assert_eq!(c.log.log_format, Some(LogFormat::Json));
        assert_eq!(c.log.log_level.as_deref(), Some("tally=debug,info"));
        let e = start(&["start", "--log-format", "xml"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        let e = start(&["start", "--abci-listen", "x"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn a_bad_app_toml_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("config")).unwrap();
        std::fs::write(AppConfig::path(dir.path()), "log_format = \"xml\"\n").unwrap();
        let ctx = Context {
            home: dir.path().to_path_buf(),
        };
        let e = start(&["start"]).unwrap().execute(&ctx).unwrap_err();
        assert!(format!("{e:#}").contains("log_format"), "{e:#}");
    }
}

//! `tallyd start`: check the genesis, open the store, load the threshold key
//! share, serve the metrics page (app and relay), spawn the relay and serve
//! ABCI until the process ends.
//! [`StartCommand::execute_with`] serves a wrapper around the app instead
//! (the test-only `tallyd-byzantine` does).

use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use tally_node::config::AppConfig;
use tally_settlement::Genesis;

use super::args::LogArgs;
use super::genesis::read_app_state;
use super::{Command, Context};

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
    /// Runs `tallyd start`, serving `wrap(app)` over ABCI instead of the
    /// app itself (the relay still works with the app).
    pub fn execute_with<A: tendermint_abci::Application>(
        self,
        ctx: &Context,
        wrap: impl FnOnce(tally_abci::TallyApp) -> A,
    ) -> anyhow::Result<()> {
        let home = ctx.home();
        let cfg = AppConfig::load(home)?;
        self.log.init(&cfg.log_format, &cfg.log_level)?;
        // Refuse a genesis we could not run before CometBFT ever asks.
        let genesis_path = ctx.genesis_path();
        if genesis_path.exists() {
            let app_state = read_app_state(&genesis_path)?;
            Genesis::parse(app_state.to_string().as_bytes())
                .and_then(|g| g.check_hub_funding())
                .with_context(|| format!("{}", genesis_path.display()))?;
        }
        let db_path = cfg.db_path(home);
        std::fs::create_dir_all(&db_path)
            .with_context(|| format!("creating {}", db_path.display()))?;
        let backend = Arc::new(
            tally_store::RocksBackend::open(&db_path)
                .with_context(|| format!("opening {}", db_path.display()))?,
        );
        // The binary owns the halt: exit 2 (genesis) or 3 (store), after the app's FATAL line.
        let halt = tally_abci::Halt::new(|e| std::process::exit(e.reason.exit_code()));
        let app = tally_abci::TallyApp::new(backend.clone(), halt)?;
        app.set_retain_versions(cfg.state_retain_versions);
        let snapshot_dir = cfg.snapshot_path(home);
        let snapshots = tally_node::snapshots::DiskSnapshots::open(
            &snapshot_dir,
            cfg.snapshot_interval,
            cfg.snapshot_keep_recent as usize,
            backend,
        )?;
        tracing::info!(
            dir = %snapshot_dir.display(),
            interval = cfg.snapshot_interval,
            keep = cfg.snapshot_keep_recent,
            held = tally_abci::SnapshotStore::list(&snapshots).len(),
            "state-sync snapshots"
        );
        app.set_snapshots(Arc::new(snapshots));
        let share_path = cfg.share_path(home);
        let mut rank = None;
        let mut shares = Vec::new();
        if share_path.exists() {
            let dkg = if genesis_path.exists() {
                Genesis::parse(read_app_state(&genesis_path)?.to_string().as_bytes())?.dkg
            } else {
                None
            };
            let share = tally_node::dealer::load_share(&share_path, dkg.as_ref())?;
            if let Some(g) = &dkg {
                let address = tally_node::dealer::validator_address(home)?;
                tally_node::dealer::check_binding(g, share.index, &address)?;
            }
            tracing::info!(index = share.index, file = %share_path.display(), "threshold signer enabled");
            rank = Some(share.index.saturating_sub(1));
            shares.push((0, share.clone()));
            app.set_signer(share);
        }
        // Shares of keys the chain's ceremonies made (newest two epochs).
        for (epoch, share) in tally_node::participant::load_epoch_shares(home) {
            tracing::info!(
                epoch,
                index = share.index,
                "threshold signer enabled for a key epoch"
            );
            rank = rank.or(Some(share.index.saturating_sub(1)));
            app.add_signer(epoch, share.clone());
            shares.push((epoch, share));
        }
        if shares.is_empty() {
            tracing::info!(file = %share_path.display(), "no threshold key share: this node does not sign");
        }
        // A DKG key that does not load is logged: the node still validates.
        let _participant = match spawn_participant(&app, home, &cfg, shares) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "DKG participant not started");
                None
            }
        };
        // One metrics page for the app and the relay, served whenever
        // `metrics_listen` is set, with or without a relay.
        let relay_on = !cfg.hub_endpoints.is_empty();
        let mut metrics = if relay_on {
            tally_relay::Metrics::new(&cfg.metrics_prefix)
        } else {
            tally_relay::Metrics::without_relay(&cfg.metrics_prefix)
        };
        app.register_metrics(metrics.registry_mut());
        let relay_handles = metrics.relay().clone();
        let metrics = Arc::new(metrics);
        // A validator keeps validating when its metrics port is taken.
        let _metrics_endpoint = if cfg.metrics_listen.is_empty() {
            None
        } else {
            match tally_relay::metrics::serve(&cfg.metrics_listen, metrics) {
                Ok(ep) => {
                    tracing::info!(addr = %cfg.metrics_listen, "Prometheus metrics at /metrics");
                    Some(ep)
                }
                Err(e) => {
                    tracing::error!(error = %e, "metrics endpoint not served");
                    None
                }
            }
        };
        // The relay runs on its own thread, never inside an ABCI call.
        let _relay = if relay_on {
            let mut rc = cfg.relay_config(rank);
            // With a DKG encryption key the node's shares come from the
            // chain's ceremonies (maybe none yet, and a reshare moves its
            // index): the relay reads its rank from the active key.
            if tally_node::dkgkey::enc_key_path(home).exists() {
                rc.address = tally_node::dealer::validator_address(home)
                    .ok()
                    .and_then(|a| hex::decode(a).ok())
                    .and_then(|b| b.try_into().ok());
            }
            Some(tally_relay::spawn_with_handles(
                app.clone(),
                rc,
                relay_handles,
            )?)
        } else {
            None
        };
        let last = app.last_commit();
        tracing::info!(
            home = %home.display(),
            db = %db_path.display(),
            height = last.height,
            app_hash = %hex::encode(last.app_hash),
            listen = %cfg.abci_listen,
            "tallyd starting"
        );
        let server = tendermint_abci::ServerBuilder::default()
            .bind(cfg.abci_listen.as_str(), wrap(app))
            .with_context(|| format!("binding ABCI server to {}", cfg.abci_listen))?;
        server.listen().context("ABCI server stopped")?;
        Ok(())
    }
}

/// Starts the DKG participant ([`tally_node::participant`]) when this home
/// has an encryption key (`config/dkg_key.json`).
fn spawn_participant(
    app: &tally_abci::TallyApp,
    home: &std::path::Path,
    cfg: &AppConfig,
    shares: Vec<(u64, tally_settlement::bls::SecretShare)>,
) -> anyhow::Result<Option<std::thread::JoinHandle<()>>> {
    let enc_path = tally_node::dkgkey::enc_key_path(home);
    if !enc_path.exists() {
        tracing::info!(file = %enc_path.display(), "no DKG encryption key: this node takes no part in ceremonies");
        return Ok(None);
    }
    let enc = tally_node::dkgkey::load_enc_key(&enc_path)?;
    let key = tally_node::dkgkey::load_consensus_key(home)?;
    let url = tally_node::participant::rpc_url(home, &cfg.cometbft_rpc);
    let p = tally_node::participant::Participant::new(app.clone(), home, &url, key, enc, shares);
    tracing::info!(participant = ?p, "DKG participant started");
    Ok(Some(p.spawn()?))
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

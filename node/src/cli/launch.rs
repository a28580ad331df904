//! The launch of `tallyd start`, one named step per function, run in this
//! order by [`run`]: check the genesis (once), open the store and the app,
//! keep state-sync snapshots, load the threshold key shares, start the DKG
//! participant, build and serve the metrics page, start the relay, serve
//! ABCI until the process ends. A step whose failure should not stop a
//! validator (the participant, the metrics port) logs it and goes on.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use tally_abci::TallyApp;
use tally_settlement::bls::SecretShare;
use tally_settlement::Genesis;
use tally_settlement::KeyEpoch;
use tally_store::RocksBackend;

use super::genesis::read_app_state;
use crate::config::AppConfig;
use crate::metrics::Metrics;
use crate::{dealer, dkgkey, participant, snapshots};

/// Runs every step; serves `wrap(app)` over ABCI until the server stops
/// (the relay and the participant still work with the app itself).
pub fn run<A: tendermint_abci::Application>(
    home: &Path,
    genesis_path: &Path,
    cfg: &AppConfig,
    wrap: impl FnOnce(TallyApp) -> A,
) -> anyhow::Result<()> {
    let genesis = check_genesis(genesis_path)?;
    let (app, backend) = open_store(home, cfg)?;
    keep_snapshots(&app, home, cfg, backend)?;
    let shares = load_shares(&app, home, cfg, genesis.and_then(|g| g.dkg).as_ref())?;
    let _participant = start_participant(&app, home, cfg, shares.all);
    let (metrics, relay_metrics) = metrics_registry(&app, cfg);
    let _page = serve_metrics(cfg, metrics);
    let _relay = start_relay(&app, home, cfg, shares.rank, relay_metrics)?;
    serve_abci(app, home, cfg, wrap)
}

/// Refuses a genesis we could not run before CometBFT ever asks; the
/// parsed genesis (`None` without a genesis file) for the later steps.
fn check_genesis(path: &Path) -> anyhow::Result<Option<Genesis>> {
    if !path.exists() {
        return Ok(None);
    }
    let app_state = read_app_state(path)?;
    let genesis = Genesis::parse(app_state.to_string().as_bytes())
        .and_then(|g| g.check_hub_funding().map(|()| g))
        .with_context(|| format!("{}", path.display()))?;
    Ok(Some(genesis))
}

/// Opens the RocksDB store and the app over it. The binary owns the halt:
/// exit 2 (genesis), 3 (store) or 4 (an upgrade this binary lacks, after
/// writing `data/upgrade-info.json`), after the app's FATAL line.
fn open_store(home: &Path, cfg: &AppConfig) -> anyhow::Result<(TallyApp, Arc<RocksBackend>)> {
    let db_path = cfg.db_path(home);
    std::fs::create_dir_all(&db_path).with_context(|| format!("creating {}", db_path.display()))?;
    let backend = Arc::new(
        RocksBackend::open(&db_path).with_context(|| format!("opening {}", db_path.display()))?,
    );
    let info_path = upgrade_info_path(home);
    let halt = tally_abci::Halt::new(move |e| {
        if let Some(info) = &e.upgrade_info {
            write_upgrade_info(&info_path, info);
        }
        std::process::exit(e.reason.exit_code())
    });
    let app = TallyApp::new(backend.clone(), halt)?;
    app.set_retain_versions(cfg.state_retain_versions);
    app.set_mempool_limit(mempool_limit(home));
    Ok((app, backend))
}

/// The mempool limits CheckTx keeps under (see `tally_abci::mempool`):
/// `[mempool] size` and `max_txs_bytes` of `<home>/config/config.toml`,
/// CometBFT's defaults where missing; none when `recheck = false` (the
/// app's count then has no way to learn what left the mempool) or when
/// `config.toml` cannot be read (warned).
fn mempool_limit(home: &Path) -> Option<tally_abci::mempool::MempoolLimit> {
    let path = home.join("config").join("config.toml");
    let table = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|t| t.parse::<toml::Table>().map_err(|e| e.to_string()))
    {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no mempool limit kept: config.toml unreadable; CometBFT may drop accepted transactions when its mempool fills");
            return None;
        }
    };
    let limit = parse_mempool_limit(&table);
    if limit.is_none() {
        tracing::warn!("[mempool] recheck = false: no mempool limit kept; CometBFT may drop accepted transactions when its mempool fills");
    }
    limit
}

/// [`mempool_limit`] of a parsed `config.toml`.
fn parse_mempool_limit(config: &toml::Table) -> Option<tally_abci::mempool::MempoolLimit> {
    let default = tally_abci::mempool::MempoolLimit::default();
    let Some(m) = config.get("mempool") else {
        return Some(default);
    };
    if m.get("recheck").and_then(|v| v.as_bool()) == Some(false) {
        return None;
    }
    let int = |k: &str| m.get(k).and_then(|v| v.as_integer()).filter(|v| *v > 0);
    Some(tally_abci::mempool::MempoolLimit {
        txs: int("size").map_or(default.txs, |v| v as usize),
        bytes: int("max_txs_bytes").map_or(default.bytes, |v| v as u64),
    })
}

/// Gives the app the snapshot directory it offers state sync from.
fn keep_snapshots(
    app: &TallyApp,
    home: &Path,
    cfg: &AppConfig,
    backend: Arc<RocksBackend>,
) -> anyhow::Result<()> {
    let dir = cfg.snapshot_path(home);
    let snapshots = snapshots::DiskSnapshots::open(
        &dir,
        cfg.snapshot_interval,
        cfg.snapshot_keep_recent as usize,
        backend,
    )?;
    tracing::info!(
        dir = %dir.display(),
        interval = cfg.snapshot_interval,
        keep = cfg.snapshot_keep_recent,
        held = tally_abci::SnapshotStore::list(&snapshots).len(),
        "state-sync snapshots"
    );
    app.set_snapshots(Arc::new(snapshots));
    Ok(())
}

/// This validator's threshold key shares, as the signer holds them.
struct Shares {
    /// Every share by key epoch (0: the dealer's share file).
    all: Vec<(u64, SecretShare)>,
    /// The signer rank the relay staggers its submissions by.
    rank: Option<u32>,
}

/// Gives the app the dealer's share (checked against the genesis key and
/// this validator's address) and the shares of keys the chain's
/// ceremonies made (newest two epochs).
fn load_shares(
    app: &TallyApp,
    home: &Path,
    cfg: &AppConfig,
    dkg: Option<&KeyEpoch>,
) -> anyhow::Result<Shares> {
    let share_path = cfg.share_path(home);
    let mut shares = Shares {
        all: Vec::new(),
        rank: None,
    };
    if share_path.exists() {
        let share = dealer::load_share(&share_path, dkg)?;
        if let Some(g) = dkg {
            dealer::check_binding(g, share.index, &dealer::validator_address(home)?)?;
        }
        tracing::info!(index = share.index, file = %share_path.display(), "threshold signer enabled");
        shares.rank = Some(share.index.saturating_sub(1));
        shares.all.push((0, share.clone()));
        app.set_signer(share);
    }
    for (epoch, share) in participant::load_epoch_shares(home) {
        tracing::info!(
            epoch,
            index = share.index,
            "threshold signer enabled for a key epoch"
        );
        shares.rank = shares.rank.or(Some(share.index.saturating_sub(1)));
        app.add_signer(epoch, share.clone());
        shares.all.push((epoch, share));
    }
    if shares.all.is_empty() {
        tracing::info!(file = %share_path.display(), "no threshold key share: this node does not sign");
    }
    Ok(shares)
}

/// Starts the DKG participant ([`participant`]); it takes part in every
/// ceremony that names this node's consensus key. A home without a
/// readable ed25519 consensus key (a remote signer, say) takes no part;
/// the node still validates.
fn start_participant(
    app: &TallyApp,
    home: &Path,
    cfg: &AppConfig,
    shares: Vec<(u64, SecretShare)>,
) -> Option<std::thread::JoinHandle<()>> {
    spawn_participant(app, home, cfg, shares)
        .map_err(|e| {
            tracing::error!(error = %format!("{e:#}"), "DKG participant not started: this node takes no part in key ceremonies")
        })
        .ok()
}

/// The participant of [`start_participant`], from the consensus key file.
fn spawn_participant(
    app: &TallyApp,
    home: &Path,
    cfg: &AppConfig,
    shares: Vec<(u64, SecretShare)>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let key = dkgkey::load_consensus_key(home)?;
    let url = participant::rpc_url(home, &cfg.cometbft_rpc);
    let p = participant::Participant::new(app.clone(), home, &url, key, shares);
    tracing::info!(participant = ?p, "DKG participant started");
    Ok(p.spawn()?)
}

/// The node's registry with the app's families, and the relay's when a
/// relay runs (`hub_endpoints` set).
fn metrics_registry(
    app: &TallyApp,
    cfg: &AppConfig,
) -> (Metrics, Option<tally_relay::RelayMetrics>) {
    let mut metrics = Metrics::new(&cfg.metrics_prefix);
    let relay = (!cfg.hub_endpoints.is_empty())
        .then(|| tally_relay::RelayMetrics::register(metrics.registry_mut()));
    app.register_metrics(metrics.registry_mut());
    (metrics, relay)
}

/// Serves the metrics page whenever `metrics_listen` is set, with or
/// without a relay. A validator keeps validating when its metrics port is
/// taken.
fn serve_metrics(cfg: &AppConfig, metrics: Metrics) -> Option<tally_explorer::Server> {
    if cfg.metrics_listen.is_empty() {
        return None;
    }
    match crate::metrics::serve(&cfg.metrics_listen, Arc::new(metrics)) {
        Ok(server) => {
            tracing::info!(addr = %cfg.metrics_listen, "Prometheus metrics at /metrics");
            Some(server)
        }
        Err(e) => {
            tracing::error!(error = %e, "metrics endpoint not served");
            None
        }
    }
}

/// Starts the relay on its own thread (never inside an ABCI call) when it
/// has its metric handles, i.e. `hub_endpoints` are set.
fn start_relay(
    app: &TallyApp,
    home: &Path,
    cfg: &AppConfig,
    rank: Option<u32>,
    metrics: Option<tally_relay::RelayMetrics>,
) -> anyhow::Result<Option<tokio::sync::watch::Sender<bool>>> {
    let Some(metrics) = metrics else {
        return Ok(None);
    };
    let mut rc = cfg.relay_config(home, rank);
    // The node's shares come from the chain's ceremonies (maybe none yet,
    // and every re-key may move its index): the relay reads its rank from
    // the active key's signers by this validator's address.
    rc.address = dealer::validator_address(home)
        .ok()
        .and_then(|a| hex::decode(a).ok())
        .and_then(|b| b.try_into().ok());
    Ok(Some(tally_relay::spawn(
        Arc::new(app.clone()),
        rc,
        metrics,
    )?))
}

/// Serves `wrap(app)` over ABCI at `abci_listen` until the server stops.
fn serve_abci<A: tendermint_abci::Application>(
    app: TallyApp,
    home: &Path,
    cfg: &AppConfig,
    wrap: impl FnOnce(TallyApp) -> A,
) -> anyhow::Result<()> {
    let served = wrap(app.clone());
    refuse_missing_version(&app, home)?;
    let last = app.last_commit();
    tracing::info!(
        home = %home.display(),
        db = %cfg.db_path(home).display(),
        height = last.height,
        app_hash = %hex::encode(last.app_hash),
        listen = %cfg.abci_listen,
        "tallyd starting"
    );
    let server = tendermint_abci::ServerBuilder::default()
        .bind(cfg.abci_listen.as_str(), served)
        .with_context(|| format!("binding ABCI server to {}", cfg.abci_listen))?;
    server.listen().context("ABCI server stopped")?;
    Ok(())
}

/// Where a node that stops for an upgrade leaves the plan:
/// `<home>/data/upgrade-info.json`.
pub fn upgrade_info_path(home: &Path) -> std::path::PathBuf {
    home.join("data").join("upgrade-info.json")
}

fn write_upgrade_info(path: &Path, info: &str) {
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, format!("{info}\n")));
    match written {
        Ok(()) => tracing::error!(path = %path.display(), "upgrade plan written"),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "could not write the upgrade plan")
        }
    }
}

/// Exits with code 4 before serving when this binary cannot run the next
/// block of its state (its app version, or an upgrade due at that block,
/// is above the versions it carries): restarting the old binary after the
/// upgrade height, or on a snapshot taken after it, stops here at once
/// rather than replaying anything.
fn refuse_missing_version(app: &TallyApp, home: &Path) -> anyhow::Result<()> {
    let Some(stop) = app.upgrade_stop() else {
        return Ok(());
    };
    write_upgrade_info(&upgrade_info_path(home), &stop.info);
    tracing::error!(height = stop.height, "UPGRADE NEEDED: {}", stop.message);
    eprintln!(
        "error: UPGRADE NEEDED at height {}: {}",
        stop.height, stop.message
    );
    std::process::exit(tally_abci::HaltReason::UpgradeNeeded.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_abci::mempool::MempoolLimit;

    fn limit(toml_text: &str) -> Option<MempoolLimit> {
        parse_mempool_limit(&toml_text.parse::<toml::Table>().expect("test toml"))
    }

    #[test]
    fn the_mempool_limit_comes_from_config_toml() {
        assert_eq!(
            limit("[mempool]\nsize = 1234\nmax_txs_bytes = 99999\nrecheck = true\n"),
            Some(MempoolLimit {
                txs: 1234,
                bytes: 99_999
            })
        );
        // CometBFT's defaults (5000, 1 GiB) where a key or the table is missing.
        assert_eq!(
            limit("[mempool]\nsize = 70\n"),
            Some(MempoolLimit {
                txs: 70,
                bytes: 1_073_741_824
            })
        );
        assert_eq!(
            limit("[rpc]\nladdr = \"x\"\n"),
            Some(MempoolLimit {
                txs: 5000,
                bytes: 1_073_741_824
            })
        );
        // Without rechecks the app cannot count what left: no limit.
        assert_eq!(limit("[mempool]\nsize = 70\nrecheck = false\n"), None);
    }
}

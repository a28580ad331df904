//! The relay: runs inside `tallyd`, beside consensus and never inside an
//! ABCI call. Every `poll` it reads the chain's committed settlement state;
//! it submits the signed batch of the current attempt to the hub (staggered
//! by signer rank, transport retries per the client's policy, failover
//! across hub endpoints), watches the hub, and hands what it saw to the
//! node's signer: `settled` once the hub shows the nonce settled
//! `confirmations` blocks deep, `failed` when the submission was refused,
//! the transport budget was spent, or the attempt passed
//! `attempt_deadline_secs`. The chain acts on either once t validators sign
//! it.
//!
//! Modules, top-down:
//! - [`config`]: [`RelayConfig`] and its defaults.
//! - `poll`: the loop, I/O only; its decisions are [`decide`]'s pure
//!   functions.
//! - `submission`: one submission as a task (retry policy, breakers).
//! - `hub`: reads from the hub over `tally_client::rpc`, behind the
//!   endpoints' circuit breakers.
//! - [`metrics`]: the Prometheus registry and its HTTP endpoint.

use std::sync::Arc;

use tally_abci::TallyApp;
use tokio::sync::watch;

pub mod config;
pub mod decide;
mod hub;
pub mod metrics;
mod poll;
mod submission;

pub use config::{BreakerConfig, HubTimeouts, RelayConfig};
pub use hub::HubError;
pub use metrics::{Metrics, RelayMetrics};

/// Starts the relay on its own thread, with its metrics served at
/// `metrics_listen` if set; returns the sender that stops it.
pub fn spawn(app: TallyApp, cfg: RelayConfig) -> std::io::Result<watch::Sender<bool>> {
    let metrics = Metrics::new(&cfg.metrics_prefix);
    spawn_with_metrics(app, cfg, metrics)
}

/// [`spawn`] with a registry the caller made (and may have registered its
/// own families in); names keep the registry's prefix. The registry is
/// served at `metrics_listen` (if set) until the relay stops.
pub fn spawn_with_metrics(
    app: TallyApp,
    cfg: RelayConfig,
    metrics: Metrics,
) -> std::io::Result<watch::Sender<bool>> {
    let relay_metrics = metrics.relay().clone();
    let metrics = Arc::new(metrics);
    let endpoint = cfg.metrics_listen.as_deref().and_then(|addr| {
        match metrics::serve(addr, metrics.clone()) {
            Ok(s) => {
                tracing::info!(addr, "Prometheus metrics at /metrics");
                Some(s)
            }
            Err(e) => {
                tracing::error!(error = %e, "metrics endpoint not served");
                None
            }
        }
    });
    spawn_inner(app, cfg, relay_metrics, endpoint)
}

/// Starts the relay updating `metrics`, handles of a registry the caller
/// serves (`tallyd start` serves one page for the app and the relay);
/// `cfg.metrics_listen` is ignored.
pub fn spawn_with_handles(
    app: TallyApp,
    cfg: RelayConfig,
    metrics: RelayMetrics,
) -> std::io::Result<watch::Sender<bool>> {
    spawn_inner(app, cfg, metrics, None)
}

fn spawn_inner(
    app: TallyApp,
    cfg: RelayConfig,
    relay_metrics: RelayMetrics,
    endpoint: Option<metrics::MetricsServer>,
) -> std::io::Result<watch::Sender<bool>> {
    let (stop, rx) = watch::channel(false);
    std::thread::Builder::new()
        .name("tally-relay".into())
        .spawn(move || {
            // Served until the relay stops (the guard is dropped then).
            let _endpoint = endpoint;
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "relay runtime failed to start");
                    return;
                }
            };
            rt.block_on(poll::run(app, cfg, relay_metrics, rx));
        })?;
    Ok(stop)
}

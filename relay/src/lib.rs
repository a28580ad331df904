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
//! - [`chain`]: [`Chain`], what the relay reads of the application and
//!   hands to it (implemented for `tally_abci::TallyApp`).
//! - [`config`]: [`RelayConfig`] and its defaults.
//! - `poll`: the loop, I/O only; its decisions are [`decide`]'s pure
//!   functions.
//! - `submission`: one submission as a task (retry policy, breakers).
//! - `hub`: the hub's endpoints behind their circuit breakers, and the
//!   per-endpoint protocol of each kind of hub (`hub::protocol`): the
//!   reference hub chain (`hub::reference`) or the EVM hub's contract
//!   (`hub::evm`), chosen by [`RelayConfig::hub`].
//! - [`metrics`]: the relay's metric families ([`RelayMetrics`]), which
//!   it registers in the registry the node owns and serves
//!   (`tally_node::metrics`).

use tokio::sync::watch;

pub mod chain;
pub mod config;
pub mod decide;
mod hub;
pub mod metrics;
mod poll;
mod submission;

pub use chain::{Chain, SharedChain};
pub use config::{BreakerConfig, EvmConfig, EvmTip, HubKind, HubTimeouts, RelayConfig};
pub use hub::HubError;
pub use metrics::RelayMetrics;

/// Why the relay did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The hub cannot be used as configured (the EVM hub's relay key file
    /// is missing, unreadable or readable by others).
    #[error("relay not started: {0}")]
    Hub(String),
    /// The relay's thread could not be spawned.
    #[error("relay thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Starts the relay on its own thread, reading and handing in through
/// `app` and updating `metrics` (families the node registered in the
/// registry it serves); returns the sender that stops it. The hub is set
/// up first, so a relay that cannot work as configured fails here.
pub fn spawn(
    app: SharedChain,
    cfg: RelayConfig,
    metrics: RelayMetrics,
) -> Result<watch::Sender<bool>, StartError> {
    let hub = hub::Hub::new(&cfg).map_err(StartError::Hub)?;
    let (stop, rx) = watch::channel(false);
    std::thread::Builder::new()
        .name("tally-relay".into())
        .spawn(move || {
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
            rt.block_on(poll::run(app, hub, cfg, metrics, rx));
        })?;
    Ok(stop)
}

//! The relay's view of the hub: its endpoints in failover order, each with
//! a circuit breaker shared by reads and submissions, and what is asked of
//! them through the hub kind's [`HubProtocol`] (`protocol.rs`; the
//! reference hub in `reference.rs`, the EVM hub in `evm.rs`). Every call
//! is blocking; the loop and the submissions run them on tokio's blocking
//! pool.
//!
//! The tip and a range's deposits are one poll step on ONE endpoint: the
//! tip is read with failover ([`Hub::tip`] says which endpoint answered),
//! the deposits on that endpoint only ([`Hub::deposits`]), at the tip's
//! height, and an answer from below the range's end is refused
//! ([`HubError::Stale`]). A step whose deposit read fails is abandoned;
//! the next tip read (only the next) starts at the following endpoint, so
//! a node that answers its tip but not its deposits cannot stall deposits
//! while another endpoint answers both.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tally_client::rpc::{Connector, RpcClient, RpcError};
use tally_client::{Breaker, BreakerState, Broadcast};

use crate::config::{HubKind, RelayConfig};

pub(crate) mod evm;
pub(crate) mod protocol;
pub(crate) mod reference;

pub(crate) use protocol::{Deposits, Payload, TryFailure, TryLimits};
use protocol::{Endpoint, HubProtocol};

/// Why a hub read failed.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// No endpoint answered (the last one's reason).
    #[error("hub unreachable: {0}")]
    Unreachable(String),
    /// An endpoint answered with a JSON-RPC error.
    #[error("hub: {0}")]
    Rpc(RpcError),
    /// The answer was not what the hub's protocol promises.
    #[error("hub: {0}")]
    Answer(String),
    /// The endpoint answered from a height below the one the read needs
    /// (a lagging node): the answer could miss deposits and is refused.
    #[error("hub: {path} answered from height {height}, below the range end {want}")]
    Stale {
        /// What was read.
        path: String,
        /// The height the answer says it is from.
        height: u64,
        /// The least height an answer may come from.
        want: u64,
    },
    /// The chain's `hub_chain` parameter does not name a hub of the kind
    /// this relay is set up for.
    #[error("hub: {0}")]
    Config(String),
}

/// The hub's tip as one endpoint answered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tip {
    /// Index of the endpoint that answered.
    pub(crate) endpoint: usize,
    /// Its latest height.
    pub(crate) height: u64,
}

/// The hub's endpoints, their breakers and the hub kind's protocol (cheap
/// to clone).
#[derive(Clone, Debug)]
pub(crate) struct Hub {
    protocol: Arc<dyn HubProtocol>,
    /// Clients for reads (the read timeouts).
    clients: Arc<Vec<RpcClient>>,
    /// Clients for submission tries (the per-try timeout).
    submit_clients: Arc<Vec<RpcClient>>,
    breakers: Arc<Vec<Breaker>>,
    /// The endpoint the next tip read tries first, once (after a failed
    /// deposit read on one endpoint, the one after it; else 0).
    first: Arc<AtomicUsize>,
}

/// Endpoint indexes to try, in failover order: those whose breaker is not
/// open, or all of them if every breaker is open.
pub(crate) fn usable(breakers: &[Breaker]) -> Vec<usize> {
    let open = |b: &Breaker| b.state() == BreakerState::Open;
    let v: Vec<usize> = (0..breakers.len())
        .filter(|i| breakers.get(*i).is_some_and(|b| !open(b)))
        .collect();
    if v.is_empty() {
        (0..breakers.len()).collect()
    } else {
        v
    }
}

impl Hub {
    /// The hub `cfg` describes: its endpoints with their timeouts, each
    /// behind a breaker, spoken to in the configured hub kind's protocol.
    /// Fails when the EVM hub's relay key cannot be used.
    pub(crate) fn new(cfg: &RelayConfig) -> Result<Self, String> {
        let protocol: Arc<dyn HubProtocol> = match &cfg.hub {
            HubKind::Tally => Arc::new(reference::ReferenceHub),
            HubKind::Evm(evm) => Arc::new(evm::EvmProtocol::new(evm, cfg.hub_endpoints.len())?),
        };
        Ok(Self::with_protocol(cfg, protocol))
    }

    fn with_protocol(cfg: &RelayConfig, protocol: Arc<dyn HubProtocol>) -> Self {
        let t = cfg.hub_timeouts;
        let read = Connector::new(t.connect, t.read);
        let submit = Connector::new(t.connect, cfg.policy.per_try_timeout);
        let endpoints = &cfg.hub_endpoints;
        Self {
            protocol,
            clients: Arc::new(endpoints.iter().map(|e| read.client(e)).collect()),
            submit_clients: Arc::new(endpoints.iter().map(|e| submit.client(e)).collect()),
            breakers: Arc::new(endpoints.iter().map(|_| cfg.breaker.breaker()).collect()),
            first: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The endpoints' URLs, in failover order.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.clients.iter().map(|c| c.url().to_string()).collect()
    }

    /// The breakers, one per endpoint.
    pub(crate) fn breakers(&self) -> &[Breaker] {
        &self.breakers
    }

    /// The operator command that hands the hub a governed rotation.
    pub(crate) fn govern_command(&self) -> &'static str {
        self.protocol.govern_command()
    }

    /// Runs `read` on endpoint `i` only, through its breaker. An endpoint
    /// that could not be reached (or answered garbage) counts against its
    /// breaker and is [`HubError::Unreachable`]; any other error is an
    /// answer: the endpoint is alive and the error is returned.
    fn on<T>(
        &self,
        i: usize,
        read: impl FnOnce(&dyn HubProtocol, Endpoint<'_>) -> Result<T, HubError>,
    ) -> Result<T, HubError> {
        let (Some(client), Some(b)) = (self.clients.get(i), self.breakers.get(i)) else {
            return Err(HubError::Unreachable(format!("no endpoint {i}")));
        };
        if !b.allow() {
            return Err(HubError::Unreachable(format!(
                "{}: circuit open",
                client.shown_url()
            )));
        }
        let r = read(self.protocol.as_ref(), Endpoint { index: i, client });
        b.record(!matches!(r, Err(HubError::Unreachable(_))));
        r
    }

    /// Runs `read` on the usable endpoints in failover order, starting
    /// at `first`, until one answers; returns which one did.
    fn read_from<T>(
        &self,
        first: usize,
        read: impl Fn(&dyn HubProtocol, Endpoint<'_>) -> Result<T, HubError>,
    ) -> Result<(usize, T), HubError> {
        let mut order = usable(&self.breakers);
        let start = order.iter().position(|i| *i >= first).unwrap_or(0);
        order.rotate_left(start);
        let mut last = String::from("no endpoint");
        for i in order {
            match self.on(i, &read) {
                Ok(v) => return Ok((i, v)),
                Err(HubError::Unreachable(m)) => last = m,
                Err(e) => return Err(e),
            }
        }
        Err(HubError::Unreachable(last))
    }

    /// Runs `read` on the first usable endpoint that answers.
    fn read<T>(
        &self,
        read: impl Fn(&dyn HubProtocol, Endpoint<'_>) -> Result<T, HubError>,
    ) -> Result<T, HubError> {
        self.read_from(0, read).map(|(_, v)| v)
    }

    /// The hub's latest usable height, and which endpoint said so.
    pub(crate) fn tip(&self, hub: &str) -> Result<Tip, HubError> {
        let first = self.first.swap(0, Ordering::Relaxed);
        let (endpoint, height) = self.read_from(first, |p, ep| p.tip(ep, hub))?;
        Ok(Tip { endpoint, height })
    }

    /// Deposits in hub heights `from..=to`, by sequence number, with the
    /// hub's deposit count through `to`: read on `tip`'s endpoint only, at
    /// `tip`'s height, and refused unless the answer is from a height of
    /// at least `to`. A failed read makes the next tip read start at the
    /// following endpoint.
    pub(crate) fn deposits(
        &self,
        hub: &str,
        tip: Tip,
        from: u64,
        to: u64,
    ) -> Result<Deposits, HubError> {
        let r = self.on(tip.endpoint, |p, ep| {
            p.deposits(ep, hub, tip.height, (from, to))
        });
        if r.is_err() {
            let n = self.clients.len().max(1);
            self.first.store((tip.endpoint + 1) % n, Ordering::Relaxed);
        }
        r
    }

    /// The height at which `nonce` settled on the hub, if it did.
    pub(crate) fn settled_at(&self, hub: &str, nonce: u64) -> Result<Option<u64>, HubError> {
        self.read(|p, ep| p.settled_at(ep, hub, nonce))
    }

    /// The last key rotation the hub applied (0: none yet).
    pub(crate) fn last_rotation(&self, hub: &str) -> Result<u64, HubError> {
        self.read(|p, ep| p.last_rotation(ep, hub))
    }

    /// The last nonce the hub settled (0: none yet).
    pub(crate) fn last_nonce(&self, hub: &str) -> Result<u64, HubError> {
        self.read(|p, ep| p.last_nonce(ep, hub))
    }

    /// One submission try of `payload` on endpoint `i` (its breaker is the
    /// caller's to consult and update).
    pub(crate) fn submit_on(
        &self,
        i: usize,
        payload: &Payload,
        limits: TryLimits,
    ) -> Result<Broadcast, TryFailure> {
        let Some(client) = self.submit_clients.get(i) else {
            return Err(TryFailure::endpoint(tally_client::Failure::Transport(
                format!("no endpoint {i}"),
            )));
        };
        self.protocol
            .submit(Endpoint { index: i, client }, payload, limits)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::BreakerConfig;

    #[test]
    fn open_breakers_are_skipped_unless_all_are_open() {
        let cfg = BreakerConfig {
            failure_threshold: 1,
            open_for: Duration::from_secs(60),
            probes: 1,
        };
        let bs: Vec<Breaker> = (0..3).map(|_| cfg.breaker()).collect();
        assert_eq!(usable(&bs), [0, 1, 2]);
        bs[1].record(false);
        assert_eq!(usable(&bs), [0, 2]);
        bs[0].record(false);
        bs[2].record(false);
        assert_eq!(usable(&bs), [0, 1, 2]);
    }

    #[test]
    fn unreachable_endpoints_count_against_their_breakers() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut cfg = RelayConfig::new(vec![format!("http://127.0.0.1:{port}")]);
        cfg.breaker = BreakerConfig {
            failure_threshold: 2,
            ..BreakerConfig::default()
        };
        let hub = Hub::new(&cfg).unwrap();
        assert!(matches!(hub.tip("hub"), Err(HubError::Unreachable(_))));
        assert_eq!(hub.breakers()[0].state(), BreakerState::Closed);
        assert!(matches!(hub.tip("hub"), Err(HubError::Unreachable(_))));
        assert_eq!(hub.breakers()[0].state(), BreakerState::Open);
        // Every breaker open: the endpoint is still tried, but the breaker
        // refuses until its open time has passed.
        let e = hub.last_nonce("hub").unwrap_err().to_string();
        assert!(e.contains("circuit open"), "{e}");
    }
}

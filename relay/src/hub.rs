//! The relay's view of the hub: its endpoints in failover order, each with
//! a circuit breaker shared by reads and submissions, and the reads the
//! poll loop needs (tip, deposits, settlement, last nonce) over the
//! workspace's JSON-RPC client. Every call is blocking; the loop runs them
//! on tokio's blocking pool.

use std::sync::Arc;

use serde_json::Value;
use tally_client::rpc::{Connector, RpcClient, RpcError};
use tally_client::{Breaker, BreakerState};
use tally_settlement::proto::HubDeposit;

use crate::config::{BreakerConfig, HubTimeouts};

/// Why a hub read failed.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// No endpoint answered (the last one's reason).
    #[error("hub unreachable: {0}")]
    Unreachable(String),
    /// An endpoint answered with a JSON-RPC error.
    #[error("hub: {0}")]
    Rpc(RpcError),
    /// The answer was not what the hub's query path promises.
    #[error("hub: {0}")]
    Answer(String),
}

/// The hub's endpoints and their breakers (cheap to clone).
#[derive(Clone, Debug)]
pub(crate) struct Hub {
    clients: Arc<Vec<RpcClient>>,
    breakers: Arc<Vec<Breaker>>,
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
    /// Clients of `endpoints` with `timeouts`, each behind a breaker.
    pub(crate) fn new(endpoints: &[String], timeouts: HubTimeouts, breaker: BreakerConfig) -> Self {
        let http = Connector::new(timeouts.connect, timeouts.read);
        Self {
            clients: Arc::new(endpoints.iter().map(|e| http.client(e)).collect()),
            breakers: Arc::new(endpoints.iter().map(|_| breaker.breaker()).collect()),
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

    /// Runs `read` on the first usable endpoint that answers. An endpoint
    /// that could not be reached (or answered garbage) counts against its
    /// breaker and the next is tried; a JSON-RPC error is an answer: the
    /// endpoint is alive and the error is returned.
    fn read<T>(&self, read: impl Fn(&RpcClient) -> Result<T, RpcError>) -> Result<T, HubError> {
        let mut last = String::from("no endpoint");
        for i in usable(&self.breakers) {
            let (Some(client), Some(b)) = (self.clients.get(i), self.breakers.get(i)) else {
                continue;
            };
            if !b.allow() {
                last = format!("{}: circuit open", client.shown_url());
                continue;
            }
            match read(client) {
                Ok(v) => {
                    b.record(true);
                    return Ok(v);
                }
                Err(e @ RpcError::Rpc { .. }) => {
                    b.record(true);
                    return Err(HubError::Rpc(e));
                }
                Err(e) => {
                    b.record(false);
                    last = e.to_string();
                }
            }
        }
        Err(HubError::Unreachable(last))
    }

    /// The hub's latest height.
    pub(crate) fn tip(&self) -> Result<u64, HubError> {
        Ok(self.read(RpcClient::status)?.height)
    }

    /// The JSON value of the hub's query `path`; `None` if the hub answered
    /// it with an error code (logged at debug level).
    fn query(&self, path: &str) -> Result<Option<Value>, HubError> {
        let a = self.read(|c| c.abci_query(path))?;
        if a.code != 0 {
            tracing::debug!(path, code = a.code, log = %a.log, "hub query refused");
            return Ok(None);
        }
        serde_json::from_slice(&a.value)
            .map(Some)
            .map_err(|e| HubError::Answer(format!("{path}: {e}")))
    }

    /// Deposits in hub heights `from..=to`, by sequence number.
    pub(crate) fn deposits(&self, from: u64, to: u64) -> Result<Vec<HubDeposit>, HubError> {
        let path = format!("/deposits/{from}/{to}");
        let v = self
            .query(&path)?
            .ok_or_else(|| HubError::Answer(format!("{path} refused")))?;
        let mut out: Vec<HubDeposit> = v["deposits"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| HubDeposit {
                        seq: d["seq"].as_u64().unwrap_or(0),
                        user: d["user"].as_str().unwrap_or("").to_string(),
                        amount: d["amount"].as_u64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by_key(|d| d.seq);
        Ok(out)
    }

    /// The height at which `nonce` of `chain` settled on the hub, if it did.
    pub(crate) fn settled_at(&self, chain: &str, nonce: u64) -> Result<Option<u64>, HubError> {
        Ok(self
            .query(&format!("/batch/{chain}/{nonce}"))?
            .and_then(|v| v["height"].as_u64()))
    }

    /// The last nonce of `chain` the hub settled (0: none yet).
    pub(crate) fn last_nonce(&self, chain: &str) -> Result<u64, HubError> {
        let path = format!("/last_nonce/{chain}");
        self.query(&path)?
            .and_then(|v| v["last_nonce"].as_u64())
            .ok_or_else(|| HubError::Answer(format!("{path}: no last_nonce")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
        let hub = Hub::new(
            &[format!("http://127.0.0.1:{port}")],
            HubTimeouts::default(),
            BreakerConfig {
                failure_threshold: 2,
                ..BreakerConfig::default()
            },
        );
        assert!(matches!(hub.tip(), Err(HubError::Unreachable(_))));
        assert_eq!(hub.breakers()[0].state(), BreakerState::Closed);
        assert!(matches!(hub.tip(), Err(HubError::Unreachable(_))));
        assert_eq!(hub.breakers()[0].state(), BreakerState::Open);
        // Every breaker open: the endpoint is still tried, but the breaker
        // refuses until its open time has passed.
        let e = hub.last_nonce("hub").unwrap_err().to_string();
        assert!(e.contains("circuit open"), "{e}");
    }
}

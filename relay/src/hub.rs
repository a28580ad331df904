//! The relay's view of the hub: its endpoints in failover order, each with
//! a circuit breaker shared by reads and submissions, and the reads the
//! poll loop needs (tip, deposits, settlement, last nonce) over the
//! workspace's JSON-RPC client. Every call is blocking; the loop runs them
//! on tokio's blocking pool.
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

use serde_json::Value;
use tally_client::rpc::{Connector, QueryAnswer, RpcClient, RpcError};
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
    /// The endpoint answered from a height below the one the read needs
    /// (a lagging node): the answer could miss deposits and is refused.
    #[error("hub: {path} answered from height {height}, below the range end {want}")]
    Stale {
        /// The query path.
        path: String,
        /// The height the answer says it is from.
        height: u64,
        /// The least height an answer may come from.
        want: u64,
    },
}

/// The hub's tip as one endpoint answered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tip {
    /// Index of the endpoint that answered.
    pub(crate) endpoint: usize,
    /// Its latest height.
    pub(crate) height: u64,
}

/// The hub's `/deposits/{from}/{to}` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Deposits {
    /// Deposits in the range, by sequence number.
    pub(crate) deposits: Vec<HubDeposit>,
    /// The hub's cumulative deposit count through `to`.
    pub(crate) count: u64,
    /// The height the answer is from (at least `to`).
    pub(crate) height: u64,
}

/// The hub's endpoints and their breakers (cheap to clone).
#[derive(Clone, Debug)]
pub(crate) struct Hub {
    clients: Arc<Vec<RpcClient>>,
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
    /// Clients of `endpoints` with `timeouts`, each behind a breaker.
    pub(crate) fn new(endpoints: &[String], timeouts: HubTimeouts, breaker: BreakerConfig) -> Self {
        let http = Connector::new(timeouts.connect, timeouts.read);
        Self {
            clients: Arc::new(endpoints.iter().map(|e| http.client(e)).collect()),
            breakers: Arc::new(endpoints.iter().map(|_| breaker.breaker()).collect()),
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

    /// Runs `read` on endpoint `i` only, through its breaker. An endpoint
    /// that could not be reached (or answered garbage) counts against its
    /// breaker and is [`HubError::Unreachable`]; a JSON-RPC error is an
    /// answer: the endpoint is alive and the error is returned.
    fn on<T>(
        &self,
        i: usize,
        read: impl FnOnce(&RpcClient) -> Result<T, RpcError>,
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
        match read(client) {
            Ok(v) => {
                b.record(true);
                Ok(v)
            }
            Err(e @ RpcError::Rpc { .. }) => {
                b.record(true);
                Err(HubError::Rpc(e))
            }
            Err(e) => {
                b.record(false);
                Err(HubError::Unreachable(e.to_string()))
            }
        }
    }

    /// Runs `read` on the usable endpoints in failover order, starting
    /// at `first`, until one answers; returns which one did.
    fn read_from<T>(
        &self,
        first: usize,
        read: impl Fn(&RpcClient) -> Result<T, RpcError>,
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
    fn read<T>(&self, read: impl Fn(&RpcClient) -> Result<T, RpcError>) -> Result<T, HubError> {
        self.read_from(0, read).map(|(_, v)| v)
    }

    /// The hub's latest height, and which endpoint said so.
    pub(crate) fn tip(&self) -> Result<Tip, HubError> {
        let first = self.first.swap(0, Ordering::Relaxed);
        let (endpoint, s) = self.read_from(first, RpcClient::status)?;
        Ok(Tip {
            endpoint,
            height: s.height,
        })
    }

    /// The JSON value of a query answer; `None` if the hub answered with
    /// an error code (logged at debug level).
    fn value(path: &str, a: &QueryAnswer) -> Result<Option<Value>, HubError> {
        if a.code != 0 {
            tracing::debug!(path, code = a.code, log = %a.log, "hub query refused");
            return Ok(None);
        }
        serde_json::from_slice(&a.value)
            .map(Some)
            .map_err(|e| HubError::Answer(format!("{path}: {e}")))
    }

    /// The JSON value of the hub's query `path`, from any endpoint.
    fn query(&self, path: &str) -> Result<Option<Value>, HubError> {
        let a = self.read(|c| c.abci_query(path))?;
        Self::value(path, &a)
    }

    /// Deposits in hub heights `from..=to`, by sequence number, with the
    /// hub's deposit count through `to`: read on `tip`'s endpoint only, at
    /// `tip`'s height, and refused unless the answer is from a height of
    /// at least `to`. A failed read makes the next tip read start at the
    /// following endpoint.
    pub(crate) fn deposits(&self, tip: Tip, from: u64, to: u64) -> Result<Deposits, HubError> {
        let r = self.deposits_on(tip, from, to);
        if r.is_err() {
            let n = self.clients.len().max(1);
            self.first.store((tip.endpoint + 1) % n, Ordering::Relaxed);
        }
        r
    }

    fn deposits_on(&self, tip: Tip, from: u64, to: u64) -> Result<Deposits, HubError> {
        let path = format!("/deposits/{from}/{to}");
        let a = self.on(tip.endpoint, |c| c.abci_query_at(&path, tip.height))?;
        if a.height < to {
            return Err(HubError::Stale {
                path,
                height: a.height,
                want: to,
            });
        }
        let v =
            Self::value(&path, &a)?.ok_or_else(|| HubError::Answer(format!("{path} refused")))?;
        let count = v["deposit_count"]
            .as_u64()
            .ok_or_else(|| HubError::Answer(format!("{path}: no deposit_count")))?;
        let mut deposits: Vec<HubDeposit> = v["deposits"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| HubDeposit {
                        seq: d["seq"].as_u64().unwrap_or(0),
                        user: d["user"].as_str().unwrap_or("").to_string(),
                        amount: d["amount"].as_u64().unwrap_or(0),
                        // A key that is not hex becomes bytes the chain
                        // refuses, so the answer is refused, not stripped.
                        pubkey: d["pubkey"]
                            .as_str()
                            .map(|h| unhex(h).unwrap_or_else(|| vec![0]))
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        deposits.sort_by_key(|d| d.seq);
        Ok(Deposits {
            deposits,
            count,
            height: a.height,
        })
    }

    /// The height at which `nonce` of `chain` settled on the hub, if it did.
    pub(crate) fn settled_at(&self, chain: &str, nonce: u64) -> Result<Option<u64>, HubError> {
        Ok(self
            .query(&format!("/batch/{chain}/{nonce}"))?
            .and_then(|v| v["height"].as_u64()))
    }

    /// The last key rotation of `chain` the hub applied (0: none yet).
    pub(crate) fn last_rotation(&self, chain: &str) -> Result<u64, HubError> {
        let path = format!("/keys/{chain}");
        self.query(&path)?
            .and_then(|v| v["last_rotation"].as_u64())
            .ok_or_else(|| HubError::Answer(format!("{path}: no last_rotation")))
    }

    /// The last nonce of `chain` the hub settled (0: none yet).
    pub(crate) fn last_nonce(&self, chain: &str) -> Result<u64, HubError> {
        let path = format!("/last_nonce/{chain}");
        self.query(&path)?
            .and_then(|v| v["last_nonce"].as_u64())
            .ok_or_else(|| HubError::Answer(format!("{path}: no last_nonce")))
    }
}

/// The bytes of hex string `s` (`None` if it is not hex).
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect()
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

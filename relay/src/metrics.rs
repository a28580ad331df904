//! Prometheus metrics through `prometheus-client`.
//!
//! [`Metrics`] owns the registry, whose names all carry `metrics_prefix`.
//! The relay registers its families there ([`RelayMetrics`]); `tallyd
//! start` registers the state machine's (`tally_abci::metrics`, listed in
//! that module) through [`Metrics::registry_mut`] and serves the registry
//! itself, also when no relay runs ([`Metrics::without_relay`]).
//! [`serve`] answers `GET /metrics` over HTTP (`tiny_http`) in the
//! Prometheus text format (version 0.0.4) until its [`MetricsServer`] is
//! dropped.
//!
//! | name (after the prefix) | kind | meaning |
//! |---|---|---|
//! | `relay_submissions_total{outcome}` | counter | this relay's batch submissions by [`Outcome`] |
//! | `retries_total{layer="transport"}` | counter | retries inside this relay's submissions |
//! | `retries_total{layer="settlement"}` | counter | attempts beyond each batch's first, from chain state |
//! | `hub_circuit_state{endpoint}` | gauge | 0 closed, 1 half-open, 2 open (`endpoint` with userinfo and query values shown as `***`) |
//! | `sync_attempts_total`, `sync_failures_total` | counter | the chain's settlement attempts and failed attempts |
//! | `pending_hub_calls` | gauge | hub calls not yet in a batch (at most 1000 counted) |
//! | `oldest_pending_call_age_seconds` | gauge | seconds since the window of the oldest such call ended |
//! | `hub_cursor_lag_blocks` | gauge | hub blocks whose deposits are not credited on Tally yet |
//! | `hub_deposit_answers_refused_total{reason}` | counter | hub deposit answers this relay refused to hand in, by [`Refusal`] |

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How a submission ended (the `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The hub settled the batch (code 0).
    Ok,
    /// The hub had already settled the nonce (code 4, or its last nonce
    /// covered it before anything was sent).
    AlreadySettled,
    /// The hub's mempool cache already had the bytes.
    InCache,
    /// The hub refused the batch (any other code).
    Refused,
    /// The transport retries ran out.
    Failed,
    /// Stopped: the nonce settled, the attempt ended, or the node stopped.
    Cancelled,
    /// A batch the hub forgot (restored from a backup), re-submitted from
    /// the body Tally kept.
    Recovered,
}

impl Outcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::AlreadySettled,
        Outcome::InCache,
        Outcome::Refused,
        Outcome::Failed,
        Outcome::Cancelled,
        Outcome::Recovered,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::AlreadySettled => "already_settled",
            Outcome::InCache => "in_cache",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Recovered => "recovered",
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Why a hub deposit answer was refused (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Answered from a height below the range's end (a lagging node).
    Stale,
    /// Its list and deposit count are not a message the chain would
    /// credit (a short list, or a count that does not fit the cursor).
    Inconsistent,
}

impl Refusal {
    /// Every reason, in a fixed order.
    pub const ALL: [Refusal; 2] = [Refusal::Stale, Refusal::Inconsistent];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Stale => "stale",
            Refusal::Inconsistent => "inconsistent",
        }
    }
}

impl EncodeLabelValue for Refusal {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// Which retry layer (the `layer` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Layer {
    Transport,
    Settlement,
}

impl EncodeLabelValue for Layer {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        let v = match self {
            Layer::Transport => "transport",
            Layer::Settlement => "settlement",
        };
        EncodeLabelValue::encode(&v, encoder)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: Refusal,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LayerLabel {
    layer: Layer,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

/// The relay's metric handles (cheap to clone: every handle shares its
/// value with the registry).
#[derive(Clone, Debug)]
pub struct RelayMetrics {
    submissions: Family<OutcomeLabel, Counter>,
    transport_retries: Counter,
    settlement_retries: Counter,
    sync_attempts: Counter,
    sync_failures: Counter,
    pending_hub_calls: Gauge,
    oldest_pending_call_age: Gauge,
    hub_cursor_lag: Gauge,
    hub_circuit_state: Family<EndpointLabel, Gauge>,
    refused_answers: Family<ReasonLabel, Counter>,
}

impl RelayMetrics {
    /// Registers the relay's families in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let submissions = Family::<OutcomeLabel, Counter>::default();
        // Every outcome exists from the start, at 0.
        for outcome in Outcome::ALL {
            let _ = submissions.get_or_create(&OutcomeLabel { outcome });
        }
        let retries = Family::<LayerLabel, Counter>::default();
        let refused_answers = Family::<ReasonLabel, Counter>::default();
        for reason in Refusal::ALL {
            let _ = refused_answers.get_or_create(&ReasonLabel { reason });
        }
        let m = Self {
            transport_retries: retries.get_or_create_owned(&LayerLabel {
                layer: Layer::Transport,
            }),
            settlement_retries: retries.get_or_create_owned(&LayerLabel {
                layer: Layer::Settlement,
            }),
            submissions,
            sync_attempts: Counter::default(),
            sync_failures: Counter::default(),
            pending_hub_calls: Gauge::default(),
            oldest_pending_call_age: Gauge::default(),
            hub_cursor_lag: Gauge::default(),
            hub_circuit_state: Family::default(),
            refused_answers,
        };
        registry.register(
            "relay_submissions",
            "This relay's batch submissions, by outcome",
            m.submissions.clone(),
        );
        registry.register(
            "retries",
            "Retries: inside this relay's submissions (transport), attempts beyond each batch's first (settlement)",
            retries,
        );
        registry.register(
            "hub_circuit_state",
            "Circuit breaker of each hub endpoint: 0 closed, 1 half-open, 2 open",
            m.hub_circuit_state.clone(),
        );
        registry.register(
            "sync_attempts",
            "The chain's settlement attempts",
            m.sync_attempts.clone(),
        );
        registry.register(
            "sync_failures",
            "The chain's failed settlement attempts",
            m.sync_failures.clone(),
        );
        registry.register(
            "pending_hub_calls",
            "Hub calls not yet in a batch (at most 1000 counted)",
            m.pending_hub_calls.clone(),
        );
        registry.register(
            "oldest_pending_call_age_seconds",
            "Seconds since the window of the oldest pending hub call ended",
            m.oldest_pending_call_age.clone(),
        );
        registry.register(
            "hub_cursor_lag_blocks",
            "Hub blocks whose deposits are not credited on Tally yet",
            m.hub_cursor_lag.clone(),
        );
        registry.register(
            "hub_deposit_answers_refused",
            "Hub deposit answers this relay refused to hand in, by reason",
            m.refused_answers.clone(),
        );
        m
    }

    /// A hub deposit answer was refused for `reason`.
    pub fn refused_answer(&self, reason: Refusal) {
        self.refused_answers
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// One submission ended with `outcome`.
    pub fn submitted(&self, outcome: Outcome) {
        self.submissions
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// One retry inside a submission.
    pub fn transport_retry(&self) {
        self.transport_retries.inc();
    }

    /// The chain's settlement counters, read from committed state: its
    /// attempts, failed attempts, and attempts beyond each batch's first.
    pub fn set_sync(&self, attempts: u64, failures: u64, settlement_retries: u64) {
        self.sync_attempts
            .inner()
            .store(attempts, Ordering::Relaxed);
        self.sync_failures
            .inner()
            .store(failures, Ordering::Relaxed);
        self.settlement_retries
            .inner()
            .store(settlement_retries, Ordering::Relaxed);
    }

    /// Hub calls not yet in a batch, and the age of the oldest.
    pub fn set_pending(&self, calls: usize, oldest_age_secs: u64) {
        self.pending_hub_calls.set(saturating_i64(calls as u64));
        self.oldest_pending_call_age
            .set(saturating_i64(oldest_age_secs));
    }

    /// Hub blocks whose deposits are not credited yet.
    pub fn set_cursor_lag(&self, blocks: u64) {
        self.hub_cursor_lag.set(saturating_i64(blocks));
    }

    /// The breaker state gauge of `endpoint`, labelled with the URL's
    /// credentials hidden (the metrics page is unauthenticated).
    pub fn set_circuit_state(&self, endpoint: &str, state: u8) {
        self.hub_circuit_state
            .get_or_create(&EndpointLabel {
                endpoint: tally_client::redact_url(endpoint),
            })
            .set(i64::from(state));
    }
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The registry and the relay's handles.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    relay: RelayMetrics,
}

impl Metrics {
    /// A registry whose names start with `prefix_`, with the relay's
    /// families registered.
    pub fn new(prefix: &str) -> Self {
        let mut registry = Registry::with_prefix(prefix);
        let relay = RelayMetrics::register(&mut registry);
        Self { registry, relay }
    }

    /// A registry whose names start with `prefix_` without the relay's
    /// families (a node that runs no relay); [`Metrics::relay`] then
    /// returns handles nothing serves.
    pub fn without_relay(prefix: &str) -> Self {
        let registry = Registry::with_prefix(prefix);
        let relay = RelayMetrics::register(&mut Registry::default());
        Self { registry, relay }
    }

    /// The registry, for more families (register before serving).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The relay's handles.
    pub fn relay(&self) -> &RelayMetrics {
        &self.relay
    }

    /// Everything registered, in the Prometheus text format (0.0.4).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// Why the metrics endpoint could not be served.
#[derive(Debug, thiserror::Error)]
#[error("metrics endpoint {addr}: {msg}")]
pub struct ServeError {
    addr: String,
    msg: String,
}

/// The metrics endpoint; dropping it stops serving and closes the port.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    stopping: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.local_addr())
            .finish_non_exhaustive()
    }
}

impl MetricsServer {
    /// The address it listens on (useful when asked for port 0).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.server_addr().to_ip()
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `metrics` at `http://addr/metrics` on a thread of its own; any
/// other path is 404.
pub fn serve(addr: &str, metrics: Arc<Metrics>) -> Result<MetricsServer, ServeError> {
    let server = tiny_http::Server::http(addr).map_err(|e| ServeError {
        addr: addr.into(),
        msg: e.to_string(),
    })?;
    let server = Arc::new(server);
    let stopping = Arc::new(AtomicBool::new(false));
    let (s, stop) = (server.clone(), stopping.clone());
    let thread = std::thread::Builder::new()
        .name("tally-metrics".into())
        .spawn(move || answer_requests(&s, &stop, &metrics))
        .map_err(|e| ServeError {
            addr: addr.into(),
            msg: e.to_string(),
        })?;
    Ok(MetricsServer {
        server,
        stopping,
        thread: Some(thread),
    })
}

fn answer_requests(server: &tiny_http::Server, stopping: &AtomicBool, metrics: &Metrics) {
    const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
    loop {
        let rq = match server.recv() {
            Ok(rq) => rq,
            Err(_) if stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                tracing::debug!(error = %e, "metrics endpoint: accept failed");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        let path = rq.url().split('?').next().unwrap_or("");
        let get = matches!(
            rq.method(),
            tiny_http::Method::Get | tiny_http::Method::Head
        );
        let resp = if get && path == "/metrics" {
            let mut r = tiny_http::Response::from_string(metrics.encode());
            if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE) {
                r.add_header(h);
            }
            r
        } else {
            tiny_http::Response::from_string("not found; metrics are at /metrics\n")
                .with_status_code(404)
        };
        if let Err(e) = rq.respond(resp) {
            tracing::debug!(error = %e, "metrics endpoint: answer not sent");
        }
    }
}

#[cfg(test)]
mod tests;

//! The relay's Prometheus metric families (`prometheus-client`):
//! [`RelayMetrics::register`] adds them to a registry the node owns and
//! serves (`tally_node::metrics`, with the state machine's families beside
//! them); the relay keeps the handles. Names below are after the
//! registry's prefix (`metrics_prefix`).
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

use std::sync::atomic::Ordering;

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

#[cfg(test)]
mod tests;

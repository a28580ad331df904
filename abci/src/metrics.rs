//! The state machine's Prometheus metrics: [`AppMetrics`], a handle the
//! ABCI handlers update, and a collector the node registers into the
//! relay's registry ([`TallyApp::register_metrics`]) so both are served on
//! one `/metrics` page with one prefix.
//!
//! Nothing here can block or panic an ABCI call: every value the handlers
//! touch is an atomic (no lock, no map lookup that allocates), and counts
//! that come from a block's results are applied at Commit, so a
//! FinalizeBlock executed twice is counted once. Gauges read from
//! committed state (signing progress, the current batch) are computed at
//! scrape time on the metrics endpoint's thread, never on an ABCI
//! connection; a store error there leaves them out of that scrape.
//!
//! | name (after the prefix) | kind | meaning |
//! |---|---|---|
//! | `abci_duration_seconds{method}` | histogram | time spent in each ABCI method: `check_tx`, `prepare_proposal`, `process_proposal`, `extend_vote`, `verify_vote_extension`, `finalize_block`, `commit` |
//! | `reports_accepted_total` | counter | usage reports committed with code 0 |
//! | `records_accepted_total` | counter | usage records in those reports |
//! | `tx_rejected_total{phase,code}` | counter | transactions refused, by result code name: `phase` is `check_tx` (new), `recheck` (CheckTx after a commit) or `block` (FinalizeBlock) |
//! | `windows_closed_total` | counter | settlement windows closed |
//! | `threshold_signed_total{kind}` | counter | messages that reached the threshold and were acted on: `batch`, `hub_result`, `hub_block` |
//! | `threshold_combine_failed_total` | counter | messages whose partials reached the threshold but did not combine |
//! | `vote_extensions_rejected_total{reason}` | counter | vote extensions this node refused in VerifyVoteExtension, by why: `too_large`, `undecodable`, `too_many_partials`, `not_a_signer`, `foreign_index`, `malformed`, `state` (its own state unreadable) |
//! | `app_height` | gauge | last height this app committed |
//! | `last_block_time_seconds` | gauge | header time (unix seconds) of that block |
//! | `bls_share_loaded` | gauge | 1 when this node holds a threshold key share (it signs), else 0 |
//! | `bls_share_index` | gauge | that share's index (1-based), 0 without one |
//! | `signing_threshold` | gauge | partials needed per message (`t`); 0 without a threshold key |
//! | `signing_pending_messages` | gauge | messages with partials stored, still below `t` |
//! | `signing_partials{kind,digest}` | gauge | partials stored for each such message (`digest`: first 16 hex digits) |
//! | `signing_oldest_pending_blocks` | gauge | blocks since the oldest such message got its first partial (0: none) |
//! | `batch_age_seconds` | gauge | last block time minus the end of the window of the oldest call in the current unsettled batch (0: no batch in flight) |
//! | `sync_current_attempt` | gauge | attempt number of the current batch (0: none) |
//!
//! There is no DKG metric: the running ceremony (round, phase, dealings,
//! acks, reveals), the active key's epoch and the validator-set proposals
//! are read with the `/dkg` and `/proposals` queries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tally_settlement::sync::BadExtension;
use tally_settlement::Code;
use tally_store::Backend;
use tendermint_proto::v0_38::abci::ResponseFinalizeBlock;

mod state;

/// An ABCI method whose duration is measured (the `method` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// CheckTx (mempool connection).
    CheckTx,
    /// PrepareProposal.
    PrepareProposal,
    /// ProcessProposal.
    ProcessProposal,
    /// ExtendVote.
    ExtendVote,
    /// VerifyVoteExtension.
    VerifyVoteExtension,
    /// FinalizeBlock.
    FinalizeBlock,
    /// Commit.
    Commit,
}

impl Method {
    /// Every method, in label order.
    pub const ALL: [Method; 7] = [
        Method::CheckTx,
        Method::PrepareProposal,
        Method::ProcessProposal,
        Method::ExtendVote,
        Method::VerifyVoteExtension,
        Method::FinalizeBlock,
        Method::Commit,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::CheckTx => "check_tx",
            Method::PrepareProposal => "prepare_proposal",
            Method::ProcessProposal => "process_proposal",
            Method::ExtendVote => "extend_vote",
            Method::VerifyVoteExtension => "verify_vote_extension",
            Method::FinalizeBlock => "finalize_block",
            Method::Commit => "commit",
        }
    }
}

/// Where a transaction was refused (the `phase` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// CheckTx of a new transaction.
    CheckTx,
    /// CheckTx re-run on what stayed in the mempool after a commit.
    Recheck,
    /// Its result in a block (FinalizeBlock).
    Block,
}

impl Phase {
    const ALL: [Phase; 3] = [Phase::CheckTx, Phase::Recheck, Phase::Block];

    fn as_str(self) -> &'static str {
        match self {
            Phase::CheckTx => "check_tx",
            Phase::Recheck => "recheck",
            Phase::Block => "block",
        }
    }
}

/// Kinds of threshold-signed messages (the `kind` label), by the event
/// the state machine emits when one is acted on.
const SIGNED_KINDS: [(&str, &str); 3] = [
    ("batch_signed", "batch"),
    ("hub_sync_end", "hub_result"),
    ("hub_deposits", "hub_block"),
];

/// Upper bounds (seconds) of the duration buckets.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A histogram of atomics: observing never takes a lock.
#[derive(Debug, Default)]
struct AtomicHistogram {
    /// Observations per bucket; the last one is above every bound (+Inf).
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

impl AtomicHistogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS.len());
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn encode(&self, mut e: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = BUCKETS
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect();
        // The +Inf bucket is the total count (the encoder adds it).
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        e.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }
}

/// What one executed block adds to the counters, applied at its Commit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTally {
    /// Block height.
    pub height: u64,
    /// Block header time (unix seconds).
    pub time: u64,
    /// Usage reports accepted.
    pub reports: u64,
    /// Records in them.
    pub records: u64,
    /// Result codes of refused transactions.
    pub rejected: Vec<u32>,
    /// Windows closed.
    pub windows_closed: u64,
    /// Messages acted on at the threshold, per [`SIGNED_KINDS`] entry.
    pub signed: [u64; 3],
    /// Threshold combinations that failed.
    pub combine_failed: u64,
}

impl BlockTally {
    /// Reads a block's counts from FinalizeBlock's answer.
    pub fn from_response(height: u64, time: u64, r: &ResponseFinalizeBlock) -> Self {
        let mut t = BlockTally {
            height,
            time,
            ..Default::default()
        };
        let tx_events = r.tx_results.iter().flat_map(|x| x.events.iter());
        for e in r.events.iter().chain(tx_events) {
            match e.r#type.as_str() {
                "usage_report" => {
                    t.reports = t.reports.saturating_add(1);
                    let records = e
                        .attributes
                        .iter()
                        .find(|a| a.key == "records")
                        .and_then(|a| a.value.parse::<u64>().ok())
                        .unwrap_or(0);
                    t.records = t.records.saturating_add(records);
                }
                "window_closed" => t.windows_closed = t.windows_closed.saturating_add(1),
                "combine_failed" => t.combine_failed = t.combine_failed.saturating_add(1),
                kind => {
                    let i = SIGNED_KINDS.iter().position(|(k, _)| *k == kind);
                    if let Some(n) = i.and_then(|i| t.signed.get_mut(i)) {
                        *n = n.saturating_add(1);
                    }
                }
            }
        }
        t.rejected = r
            .tx_results
            .iter()
            .filter(|x| x.code != 0)
            .map(|x| x.code)
            .collect();
        t
    }
}

/// One phase's refusal counters, by code value (more than 32 codes, so
/// the array's `Default` is written out).
#[derive(Debug)]
struct Row([AtomicU64; Code::ALL.len()]);

impl Default for Row {
    fn default() -> Self {
        Row(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl std::ops::Deref for Row {
    type Target = [AtomicU64; Code::ALL.len()];
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// The values the handlers update (shared by every clone of the handle).
#[derive(Debug, Default)]
struct Values {
    durations: [AtomicHistogram; Method::ALL.len()],
    reports: AtomicU64,
    records: AtomicU64,
    /// Refusals by phase, then by code value.
    rejected: [Row; Phase::ALL.len()],
    windows_closed: AtomicU64,
    signed: [AtomicU64; SIGNED_KINDS.len()],
    combine_failed: AtomicU64,
    /// Vote extensions refused, by [`EXTENSION_REASONS`] position.
    extensions_rejected: [AtomicU64; EXTENSION_REASONS.len()],
    height: AtomicU64,
    block_time: AtomicU64,
    /// 0: no share; otherwise its index.
    share_index: AtomicU64,
}

/// The app's metric handle: cheap to clone, every clone shares the values.
#[derive(Clone, Debug, Default)]
pub struct AppMetrics {
    values: Arc<Values>,
}

impl AppMetrics {
    /// Records the duration of one call of `method`.
    pub fn observe(&self, method: Method, d: Duration) {
        let i = Method::ALL.iter().position(|m| *m == method).unwrap_or(0);
        if let Some(h) = self.values.durations.get(i) {
            h.observe(d);
        }
    }

    /// A transaction refused with result code `code` in `phase` (code 0 is
    /// not counted; an unknown code is not counted either).
    pub fn rejected(&self, phase: Phase, code: u32) {
        if code == 0 {
            return;
        }
        let p = Phase::ALL.iter().position(|x| *x == phase).unwrap_or(0);
        let slot = Code::ALL
            .iter()
            .position(|c| c.value() == code)
            .and_then(|c| self.values.rejected.get(p)?.get(c));
        if let Some(s) = slot {
            s.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// VerifyVoteExtension refused an extension because of `why`.
    pub fn extension_rejected(&self, why: &BadExtension) {
        if let Some(n) = self.values.extensions_rejected.get(extension_reason(why)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A block was committed: its counts and its height and time.
    pub fn committed(&self, t: &BlockTally) {
        let v = &self.values;
        v.reports.fetch_add(t.reports, Ordering::Relaxed);
        v.records.fetch_add(t.records, Ordering::Relaxed);
        v.windows_closed
            .fetch_add(t.windows_closed, Ordering::Relaxed);
        v.combine_failed
            .fetch_add(t.combine_failed, Ordering::Relaxed);
        for (slot, n) in v.signed.iter().zip(t.signed) {
            slot.fetch_add(n, Ordering::Relaxed);
        }
        for code in &t.rejected {
            self.rejected(Phase::Block, *code);
        }
        self.set_height(t.height, t.time);
    }

    /// The last committed height and its block time.
    pub fn set_height(&self, height: u64, time: u64) {
        self.values.height.store(height, Ordering::Relaxed);
        self.values.block_time.store(time, Ordering::Relaxed);
    }

    /// This node's threshold key share: its index, or `None`.
    pub fn set_share(&self, index: Option<u32>) {
        self.values
            .share_index
            .store(index.map_or(0, u64::from), Ordering::Relaxed);
    }

    /// Registers the app's metrics in `registry`: these values, and the
    /// gauges read from `backend`'s committed state at scrape time.
    pub fn register(&self, registry: &mut Registry, backend: Arc<dyn Backend>) {
        registry.register_collector(Box::new(AppCollector {
            values: self.values.clone(),
            backend,
        }));
    }
}

/// Encodes the values and the state gauges on each scrape.
#[derive(Debug)]
struct AppCollector {
    values: Arc<Values>,
    backend: Arc<dyn Backend>,
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let v = i64::try_from(v).unwrap_or(i64::MAX);
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// The transaction counters: reports and records accepted, transactions
/// refused by phase and code.
fn encode_tx_counters(e: &mut DescriptorEncoder, v: &Values) -> std::fmt::Result {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    counter(
        e,
        "reports_accepted",
        "Usage reports committed with code 0",
        load(&v.reports),
    )?;
    counter(
        e,
        "records_accepted",
        "Usage records in accepted reports",
        load(&v.records),
    )?;
    {
        let mut d = e.encode_descriptor(
            "tx_rejected",
            "Transactions refused, by phase (check_tx, recheck, block) and result code",
            None,
            MetricType::Counter,
        )?;
        for (phase, row) in Phase::ALL.iter().zip(&v.rejected) {
            for (code, n) in Code::ALL.iter().zip(row.iter()) {
                if *code == Code::Ok {
                    continue;
                }
                let labels = [("phase", phase.as_str()), ("code", code.name())];
                ConstCounter::new(load(n)).encode(d.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

impl Collector for AppCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let v = &self.values;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        {
            let mut d = e.encode_descriptor(
                "abci_duration_seconds",
                "Time spent in each ABCI method",
                None,
                MetricType::Histogram,
            )?;
            for (m, h) in Method::ALL.iter().zip(&v.durations) {
                h.encode(d.encode_family(&[("method", m.as_str())])?)?;
            }
        }
        encode_tx_counters(&mut e, v)?;
        counter(
            &mut e,
            "windows_closed",
            "Settlement windows closed",
            load(&v.windows_closed),
        )?;
        {
            let mut d = e.encode_descriptor(
                "threshold_signed",
                "Messages that reached the signing threshold and were acted on, by kind",
                None,
                MetricType::Counter,
            )?;
            for ((_, kind), n) in SIGNED_KINDS.iter().zip(&v.signed) {
                ConstCounter::new(load(n)).encode(d.encode_family(&[("kind", *kind)])?)?;
            }
        }
        counter(
            &mut e,
            "threshold_combine_failed",
            "Messages whose partials reached the threshold but did not combine",
            load(&v.combine_failed),
        )?;
        {
            let mut d = e.encode_descriptor(
                "vote_extensions_rejected",
                "Vote extensions refused in VerifyVoteExtension, by reason",
                None,
                MetricType::Counter,
            )?;
            for (reason, n) in EXTENSION_REASONS.iter().zip(&v.extensions_rejected) {
                ConstCounter::new(load(n)).encode(d.encode_family(&[("reason", *reason)])?)?;
            }
        }
        gauge(
            &mut e,
            "app_height",
            "Last height this app committed",
            load(&v.height),
        )?;
        gauge(
            &mut e,
            "last_block_time_seconds",
            "Header time (unix seconds) of the last committed block",
            load(&v.block_time),
        )?;
        let share = load(&v.share_index);
        gauge(
            &mut e,
            "bls_share_loaded",
            "1 when this node holds a threshold key share (it signs), else 0",
            u64::from(share > 0),
        )?;
        gauge(
            &mut e,
            "bls_share_index",
            "Index of this node's threshold key share, 0 without one",
            share,
        )?;
        state::encode(&mut e, &self.backend, load(&v.height))
    }
}

mod reasons;
use reasons::{extension_reason, EXTENSION_REASONS};

#[cfg(test)]
mod tests;

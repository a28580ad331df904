//! The reporter: buffers usage records, seals them into signed reports of
//! up to 1,000 records, and gets each onto the chain exactly once, resending
//! the SAME bytes after any failure; it gives up on a report only once the
//! report's `expires_at` has passed, with an error naming it.
//!
//! Submission and confirmation are separate. A report is handed to a node's
//! mempool with `broadcast_tx_sync` (CheckTx's answer only, one short
//! request, with the retry policy's endpoint failover); many reports are in
//! flight at once (`max_in_flight`). One block follower per reporter (see
//! `confirm`) polls the latest height every `confirm_poll`, reads each new
//! block and its results, and wakes the report whose transaction hash it
//! finds, with the block's code and `data`. A report no block has shown
//! `resubmit_after` after it was sent (dropped from a mempool, or its node
//! went down) is sent again; CometBFT then may answer "already in cache",
//! and a lookup by hash (when the node's tx indexer is on) tells whether it
//! is in a block already. The follower does not need the indexer.
//!
//! A report that already landed is answered as a duplicate (code 7) whose
//! `data` is the SHA-256 of the accepted report's body, by CheckTx for a
//! resubmission or in a block for a second copy: it counts as landed only
//! when that hash is this report's own; otherwise the id was taken by a
//! different report, and the caller sees a refusal. Any other CheckTx
//! refusal is final when no earlier copy may be in a mempool, except codes
//! that mean "not now" (16, a node's store fault; 26, the mempool's report
//! claims are full), which are retried; a block's refusal is final.
//!
//! A report that may have reached a mempool expires only when the follower
//! has read a block whose time is after its `expires_at` without finding
//! it (the chain refuses it in that block and every later one), or, when
//! no block can be read, `expiry_grace` after `expires_at` if no node's
//! index has it either. One never sent expires at `expires_at`.
//!
//! No usage is lost to a stopped chain (an upgrade, ADR 0019): a report
//! that expired unseen is signed again under the SAME report id with a new
//! expiry, as long as `reseal_for` after its first expiry, but only once
//! the chain proved its old bytes can never land: the follower read a
//! block whose time is after the old `expires_at` without it, or the
//! chain refused it as expired (code 5). The replay rule then lets at most
//! one of the two land. While no block past the old expiry can be read,
//! it waits for one rather than expire.
//!
//! Every record holds one buffer permit from `record` until its report has
//! an outcome; the permits are owned by a guard that gives them back on
//! every path, a panic in a submission included.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::SigningKey;
use tally_settlement::proto::UsageRecord;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinSet;

use crate::transport::Transport;

mod config;
mod confirm;
mod context;
mod deliver;
mod seal;
mod submit;
pub use config::ReporterConfig;
use confirm::Confirmations;
use context::Context;
use seal::seal;
use submit::{SlotGuard, Submission};

/// Errors the gateway sees.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The buffer is full (`try_record`); the record is handed back.
    #[error("reporter buffer is full ({0} records waiting)")]
    Full(usize, Box<UsageRecord>),
    /// The reporter has shut down; the record is handed back.
    #[error("reporter is shut down")]
    Closed(Box<UsageRecord>),
    /// The configuration cannot work.
    #[error("bad reporter config: {0}")]
    Config(String),
}

/// The final outcome of one report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReportOutcome {
    /// In a block, accepted (code 0), or already there (duplicate, code 7,
    /// with this report's own body hash in the answer's `data`).
    Landed {
        /// Report id, hex.
        report_id: String,
        /// Records in it.
        records: usize,
        /// Block height (0 when only known as a duplicate).
        height: u64,
    },
    /// The chain refused it with `code` (nothing was counted). A code 7
    /// whose `data` is not this report's body hash is a refusal too: the
    /// report id was taken by a different report (the log says so).
    Rejected {
        /// Report id, hex.
        report_id: String,
        /// Records in it.
        records: usize,
        /// Tally result code.
        code: u32,
        /// Why.
        log: String,
    },
    /// Not confirmed before its `expires_at`: it can no longer land.
    Expired {
        /// Report id, hex.
        report_id: String,
        /// Records in it.
        records: usize,
        /// The last error seen.
        last_error: String,
    },
    /// The submission stopped abnormally (a panic in the transport): the
    /// reporter no longer knows whether the report landed.
    Failed {
        /// Report id, hex.
        report_id: String,
        /// Records in it.
        records: usize,
        /// What happened.
        error: String,
    },
}

impl ReportOutcome {
    /// Records in the report.
    pub fn records(&self) -> usize {
        match self {
            ReportOutcome::Landed { records, .. }
            | ReportOutcome::Rejected { records, .. }
            | ReportOutcome::Expired { records, .. }
            | ReportOutcome::Failed { records, .. } => *records,
        }
    }
}

/// The error text of a code 7 answer for a different report's body.
pub const ID_TAKEN: &str = "report id taken by a different report";

/// Counters, readable at any time.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Records accepted by `record` and not yet sealed into a report.
    pub buffered: AtomicU64,
    /// Reports sealed.
    pub reports: AtomicU64,
    /// Records confirmed on chain.
    pub landed_records: AtomicU64,
    /// Attempts after a report's first (for any reason).
    pub retried: AtomicU64,
    /// Reports sent again because no block showed them in
    /// `resubmit_after`.
    pub resubmitted: AtomicU64,
    /// Reports sent (or being sent) and without an outcome yet.
    pub in_flight: AtomicU64,
    /// Reports the block follower found in a block.
    pub confirmed: AtomicU64,
    /// The latest height the block follower saw.
    pub chain_height: AtomicU64,
    /// Reports refused, by code.
    pub rejected: Mutex<BTreeMap<u32, u64>>,
    /// Reports that expired unconfirmed.
    pub expired: AtomicU64,
    /// Reports signed again under the same id after their old bytes
    /// expired unseen (`reseal_for`).
    pub resealed: AtomicU64,
    /// Submissions that stopped abnormally (a panic).
    pub failed: AtomicU64,
}

enum Cmd {
    Record(UsageRecord),
    Flush(oneshot::Sender<()>),
}

/// A running reporter. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Reporter {
    tx: mpsc::Sender<Cmd>,
    metrics: Arc<Metrics>,
    outcomes: Arc<Mutex<Vec<ReportOutcome>>>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    capacity: usize,
    /// One permit per record that may be held (buffered or in flight);
    /// returned when the record's report has an outcome.
    slots: Arc<Semaphore>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Reporter {
    /// Starts a reporter signing with `key` and talking through `transport`.
    pub fn start<T: Transport>(
        cfg: ReporterConfig,
        key: SigningKey,
        transport: T,
    ) -> Result<Self, ReportError> {
        if cfg.endpoints.is_empty() {
            return Err(ReportError::Config("no RPC endpoints".into()));
        }
        if !(1..=1000).contains(&cfg.max_records) {
            return Err(ReportError::Config("max_records must be 1..=1000".into()));
        }
        if cfg.ttl.is_zero() || cfg.ttl > Duration::from_secs(540) {
            return Err(ReportError::Config("ttl must be 1..=540 s".into()));
        }
        if cfg.flush_interval.is_zero() || cfg.flush_interval > Duration::from_secs(3600) {
            return Err(ReportError::Config(
                "flush_interval must be more than 0 and at most 1 h".into(),
            ));
        }
        if cfg.confirm_poll.is_zero() || cfg.confirm_poll > Duration::from_secs(60) {
            return Err(ReportError::Config(
                "confirm_poll must be more than 0 and at most 60 s".into(),
            ));
        }
        if cfg.resubmit_after < Duration::from_secs(1) {
            return Err(ReportError::Config(
                "resubmit_after must be at least 1 s".into(),
            ));
        }
        let (tx, rx) = mpsc::channel(cfg.capacity.max(1));
        let metrics = Arc::new(Metrics::default());
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let (shutdown, _) = watch::channel(false);
        let capacity = cfg.capacity;
        let slots = Arc::new(Semaphore::new(capacity.max(1)));
        let task = tokio::spawn(run(
            cfg,
            key,
            Arc::new(transport),
            rx,
            Shared {
                metrics: metrics.clone(),
                outcomes: outcomes.clone(),
                shutdown: shutdown.subscribe(),
                slots: slots.clone(),
            },
        ));
        Ok(Self {
            tx,
            metrics,
            outcomes,
            shutdown,
            task,
            capacity,
            slots,
        })
    }

    /// Buffers a record, waiting while the buffer is full.
    pub async fn record(&self, r: UsageRecord) -> Result<(), ReportError> {
        match self.slots.acquire().await {
            Ok(p) => p.forget(),
            Err(_) => return Err(ReportError::Closed(Box::new(r))),
        }
        self.metrics.buffered.fetch_add(1, Ordering::Relaxed);
        self.tx.send(Cmd::Record(r)).await.map_err(|e| {
            self.metrics.buffered.fetch_sub(1, Ordering::Relaxed);
            self.slots.add_permits(1);
            match e.0 {
                Cmd::Record(r) => ReportError::Closed(Box::new(r)),
                Cmd::Flush(_) => ReportError::Config("unreachable".into()),
            }
        })
    }

    /// Buffers a record, or hands it back at once when the buffer is full.
    pub fn try_record(&self, r: UsageRecord) -> Result<(), ReportError> {
        match self.slots.try_acquire() {
            Ok(p) => p.forget(),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                return Err(ReportError::Full(self.capacity, Box::new(r)))
            }
            Err(tokio::sync::TryAcquireError::Closed) => {
                return Err(ReportError::Closed(Box::new(r)))
            }
        }
        self.metrics.buffered.fetch_add(1, Ordering::Relaxed);
        self.tx.try_send(Cmd::Record(r)).map_err(|e| {
            self.metrics.buffered.fetch_sub(1, Ordering::Relaxed);
            self.slots.add_permits(1);
            match e {
                mpsc::error::TrySendError::Full(Cmd::Record(r)) => {
                    ReportError::Full(self.capacity, Box::new(r))
                }
                mpsc::error::TrySendError::Closed(Cmd::Record(r)) => {
                    ReportError::Closed(Box::new(r))
                }
                _ => ReportError::Config("unreachable".into()),
            }
        })
    }

    /// Seals what is buffered and waits until every report so far has an
    /// outcome.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Outcomes of finished reports so far (drained).
    pub fn take_outcomes(&self) -> Vec<ReportOutcome> {
        std::mem::take(&mut *self.outcomes.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Graceful shutdown: flushes, waits for every report's outcome, and
    /// returns the outcomes not yet taken.
    pub async fn shutdown(self) -> Vec<ReportOutcome> {
        self.flush().await;
        let Reporter {
            tx,
            outcomes,
            shutdown,
            task,
            ..
        } = self;
        drop(tx);
        let _ = task.await;
        // Nothing is in flight any more; tell stragglers all the same.
        let _ = shutdown.send(true);
        let mut o = outcomes.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *o)
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the background task shares with the handle.
struct Shared {
    metrics: Arc<Metrics>,
    outcomes: Arc<Mutex<Vec<ReportOutcome>>>,
    shutdown: watch::Receiver<bool>,
    slots: Arc<Semaphore>,
}

async fn run<T: Transport>(
    cfg: ReporterConfig,
    key: SigningKey,
    transport: Arc<T>,
    mut rx: mpsc::Receiver<Cmd>,
    shared: Shared,
) {
    let Shared {
        metrics,
        outcomes,
        shutdown,
        slots,
    } = shared;
    let cfg = Arc::new(cfg);
    let permits = Arc::new(Semaphore::new(cfg.max_in_flight.max(1)));
    let ctx = Arc::new(Context {
        cfg: cfg.clone(),
        transport,
        metrics: metrics.clone(),
        conf: Arc::new(Confirmations::default()),
        key: Arc::new(key.clone()),
    });
    // The block follower lives as long as this task (aborted when it ends
    // or is dropped).
    let _follower = AbortOnDrop(tokio::spawn(confirm::follow(
        cfg.clone(),
        ctx.transport.clone(),
        ctx.conf.clone(),
        metrics.clone(),
    )));
    let mut inflight: JoinSet<()> = JoinSet::new();
    let mut buf: Vec<UsageRecord> = Vec::with_capacity(cfg.max_records);
    let now = tokio::time::Instant::now();
    let mut tick = tokio::time::interval_at(
        now.checked_add(cfg.flush_interval).unwrap_or(now),
        cfg.flush_interval,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
    let submit = |buf: &mut Vec<UsageRecord>, inflight: &mut JoinSet<()>| {
        if buf.is_empty() {
            return;
        }
        let records = std::mem::take(buf);
        metrics
            .buffered
            .fetch_sub(records.len() as u64, Ordering::Relaxed);
        metrics.reports.fetch_add(1, Ordering::Relaxed);
        let sealed = seal(&cfg, &key, records);
        let guard = SlotGuard {
            slots: slots.clone(),
            n: sealed.records,
        };
        let sub = Submission {
            ctx: ctx.clone(),
            outcomes: outcomes.clone(),
            permits: permits.clone(),
            shutdown: shutdown.clone(),
        };
        inflight.spawn(sub.run(sealed, guard));
    };
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(Cmd::Record(r)) => {
                    buf.push(r);
                    if buf.len() >= cfg.max_records {
                        submit(&mut buf, &mut inflight);
                    }
                }
                Some(Cmd::Flush(done)) => {
                    submit(&mut buf, &mut inflight);
                    waiters.push(done);
                }
                None => break,
            },
            _ = tick.tick() => submit(&mut buf, &mut inflight),
            Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
        }
        if inflight.is_empty() {
            for w in waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }
    submit(&mut buf, &mut inflight);
    while inflight.join_next().await.is_some() {}
    for w in waiters.drain(..) {
        let _ = w.send(());
    }
}

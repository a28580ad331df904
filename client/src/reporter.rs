//! The reporter: buffers usage records, seals them into signed reports of
//! up to 1,000 records, submits each through CometBFT's RPC until it is
//! confirmed in a block, resubmitting the SAME bytes after any transport
//! failure (a report that already landed is then answered as a duplicate,
//! which counts as success), and gives up only at the report's
//! `expires_at`, with an error naming it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::SigningKey;
use rand::SeedableRng;
use sha2::{Digest, Sha256};
use tally_settlement::proto::{ReportUsage, UsageRecord};
use tally_settlement::{sign_report, Code};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinSet;

use crate::retry::{RetryError, RetryPolicy};
use crate::transport::{Broadcast, Transport};

/// How a reporter behaves.
#[derive(Clone, Debug)]
pub struct ReporterConfig {
    /// CometBFT RPC endpoints, tried in order with failover.
    pub endpoints: Vec<String>,
    /// The chain's id (reports name it).
    pub chain_id: String,
    /// Records per report (1..=1000).
    pub max_records: usize,
    /// A partly filled report is sealed after this long.
    pub flush_interval: Duration,
    /// Records that may wait in the buffer; `record` waits beyond it.
    pub capacity: usize,
    /// A report's lifetime: `expires_at = now + ttl` (at most 540 s).
    pub ttl: Duration,
    /// Transport retry policy of one submission attempt.
    pub policy: RetryPolicy,
    /// Reports submitted at the same time.
    pub max_in_flight: usize,
}

impl ReporterConfig {
    /// Defaults for `endpoints` on `chain_id`.
    pub fn new(endpoints: Vec<String>, chain_id: &str) -> Self {
        Self {
            endpoints,
            chain_id: chain_id.into(),
            max_records: 1000,
            flush_interval: Duration::from_millis(500),
            capacity: 50_000,
            ttl: Duration::from_secs(300),
            policy: RetryPolicy::default(),
            max_in_flight: 16,
        }
    }
}

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
    /// In a block, accepted (code 0), or already there (duplicate, code 7).
    Landed {
        /// Report id, hex.
        report_id: String,
        /// Records in it.
        records: usize,
        /// Block height (0 when only known as a duplicate).
        height: u64,
    },
    /// The chain refused it with `code` (nothing was counted).
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
}

/// Counters, readable at any time.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Records accepted by `record` and not yet sealed into a report.
    pub buffered: AtomicU64,
    /// Reports sealed.
    pub reports: AtomicU64,
    /// Records confirmed on chain.
    pub landed_records: AtomicU64,
    /// Resubmissions after a failed attempt.
    pub retried: AtomicU64,
    /// Reports refused, by code.
    pub rejected: Mutex<BTreeMap<u32, u64>>,
    /// Reports that expired unconfirmed.
    pub expired: AtomicU64,
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

struct Sealed {
    id: String,
    tx: Vec<u8>,
    records: usize,
    expires_at: u64,
}

fn seal(cfg: &ReporterConfig, key: &SigningKey, records: Vec<UsageRecord>) -> Sealed {
    let report_id: [u8; 16] = rand::random();
    let expires_at = unix_now() + cfg.ttl.as_secs();
    let n = records.len();
    let tx = sign_report(
        key,
        &ReportUsage {
            chain_id: cfg.chain_id.clone(),
            report_id: report_id.to_vec(),
            expires_at,
            records,
        },
    );
    Sealed {
        id: hex::encode(report_id),
        tx,
        records: n,
        expires_at,
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
    let mut inflight: JoinSet<()> = JoinSet::new();
    let mut buf: Vec<UsageRecord> = Vec::with_capacity(cfg.max_records);
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + cfg.flush_interval,
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
        let (cfg, transport, metrics, outcomes, permits, shutdown, slots) = (
            cfg.clone(),
            transport.clone(),
            metrics.clone(),
            outcomes.clone(),
            permits.clone(),
            shutdown.clone(),
            slots.clone(),
        );
        inflight.spawn(async move {
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            let outcome = deliver(&cfg, transport.as_ref(), &metrics, sealed, shutdown).await;
            match &outcome {
                ReportOutcome::Landed { records, .. } => {
                    metrics
                        .landed_records
                        .fetch_add(*records as u64, Ordering::Relaxed);
                }
                ReportOutcome::Rejected {
                    code,
                    report_id,
                    log,
                    ..
                } => {
                    tracing::error!(report_id, code, log, "report refused by the chain");
                    *metrics
                        .rejected
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(*code)
                        .or_default() += 1;
                }
                ReportOutcome::Expired {
                    report_id,
                    last_error,
                    ..
                } => {
                    tracing::error!(
                        report_id,
                        last_error,
                        "report expired before it was confirmed"
                    );
                    metrics.expired.fetch_add(1, Ordering::Relaxed);
                }
            }
            let n = match &outcome {
                ReportOutcome::Landed { records, .. }
                | ReportOutcome::Rejected { records, .. }
                | ReportOutcome::Expired { records, .. } => *records,
            };
            outcomes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(outcome);
            slots.add_permits(n);
        });
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

/// Submits one sealed report until it has an outcome.
async fn deliver<T: Transport>(
    cfg: &ReporterConfig,
    transport: &T,
    metrics: &Metrics,
    sealed: Sealed,
    mut shutdown: watch::Receiver<bool>,
) -> ReportOutcome {
    let hash: [u8; 32] = Sha256::digest(&sealed.tx).into();
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut last_error = String::new();
    let mut first = true;
    loop {
        if unix_now() >= sealed.expires_at {
            return ReportOutcome::Expired {
                report_id: sealed.id,
                records: sealed.records,
                last_error,
            };
        }
        if !first {
            metrics.retried.fetch_add(1, Ordering::Relaxed);
        }
        first = false;
        let r = cfg
            .policy
            .run(&cfg.endpoints, &mut shutdown, &mut rng, |e: &String, _| {
                transport.broadcast_commit(e.clone(), sealed.tx.clone())
            })
            .await;
        match r {
            Ok(Broadcast::Result { code, log, height }) => {
                return finished(sealed, code, log, height)
            }
            Ok(Broadcast::InCache) => {
                // In some mempool or already in a block: find out which.
                for e in &cfg.endpoints {
                    if let Ok(Some((height, code))) = transport.lookup(e.clone(), hash).await {
                        return finished(sealed, code, "refused in its block".into(), height);
                    }
                }
                last_error = "in a mempool, not yet in a block".into();
            }
            Err(RetryError::Fatal(f)) => last_error = f.to_string(),
            Err(RetryError::Shutdown) => last_error = "shutting down".into(),
            Err(e) => last_error = e.to_string(),
        }
        // Settle down before the next attempt (same bytes).
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A report the chain answered: accepted or already there (duplicate) is
/// landed; any other code is a refusal.
fn finished(sealed: Sealed, code: u32, log: String, height: u64) -> ReportOutcome {
    if code == Code::Ok.value() || code == Code::DuplicateReport.value() {
        ReportOutcome::Landed {
            report_id: sealed.id,
            records: sealed.records,
            height,
        }
    } else {
        ReportOutcome::Rejected {
            report_id: sealed.id,
            records: sealed.records,
            code,
            log,
        }
    }
}

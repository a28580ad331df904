//! One report's way to an outcome: sealing, the buffer-permit guard, the
//! submission task (its panics caught), the resubmission loop, and reading
//! the chain's answer (code 7 counts only with this report's body hash).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use prost::Message;
use rand::SeedableRng;
use sha2::{Digest, Sha256};
use tally_settlement::calls::group_records;
use tally_settlement::proto::{tx, ReportUsage, Tx, UsageRecord};
use tally_settlement::{sign_report, Code};
use tokio::sync::{watch, Semaphore};

use super::{unix_now, Metrics, ReportOutcome, ReporterConfig, ID_TAKEN};
use crate::retry::RetryError;
use crate::transport::{Broadcast, Included, Transport};

/// A signed report, ready to submit.
pub(super) struct Sealed {
    id: String,
    tx: Vec<u8>,
    /// SHA-256 of the signed report's body, as the chain hashes it.
    body_hash: [u8; 32],
    pub(super) records: usize,
    expires_at: u64,
}

/// SHA-256 of the `SignedReport.body` inside a report transaction.
fn body_hash(tx_bytes: &[u8]) -> [u8; 32] {
    let body = match Tx::decode(tx_bytes).ok().and_then(|t| t.sum) {
        Some(tx::Sum::Report(s)) => s.body,
        _ => Vec::new(),
    };
    Sha256::digest(&body).into()
}

pub(super) fn seal(cfg: &ReporterConfig, key: &SigningKey, records: Vec<UsageRecord>) -> Sealed {
    let report_id: [u8; 16] = rand::random();
    let expires_at = unix_now().saturating_add(cfg.ttl.as_secs());
    let n = records.len();
    let tx = sign_report(
        key,
        &ReportUsage {
            chain_id: cfg.chain_id.clone(),
            report_id: report_id.to_vec(),
            expires_at,
            // The compact form: each route's names once, ~5 bytes a call.
            records: Vec::new(),
            route_calls: group_records(records),
        },
    );
    Sealed {
        id: hex::encode(report_id),
        body_hash: body_hash(&tx),
        tx,
        records: n,
        expires_at,
    }
}

/// Buffer permits of one report's records, given back when dropped: after
/// its outcome, and also when its task panics or is aborted.
pub(super) struct SlotGuard {
    pub(super) slots: Arc<Semaphore>,
    pub(super) n: usize,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots.add_permits(self.n);
    }
}

/// What one report's task needs, cloned from the reporter's.
pub(super) struct Submission<T> {
    pub(super) cfg: Arc<ReporterConfig>,
    pub(super) transport: Arc<T>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) outcomes: Arc<Mutex<Vec<ReportOutcome>>>,
    pub(super) permits: Arc<Semaphore>,
    pub(super) shutdown: watch::Receiver<bool>,
}

impl<T: Transport> Submission<T> {
    /// Submits `sealed` to an outcome and records it; `guard` gives the
    /// records' buffer permits back when this task ends, however it ends.
    pub(super) async fn run(self, sealed: Sealed, guard: SlotGuard) {
        let _guard = guard;
        let Submission {
            cfg,
            transport,
            metrics,
            outcomes,
            permits,
            shutdown,
        } = self;
        let Ok(_permit) = permits.acquire_owned().await else {
            return;
        };
        let (report_id, records) = (sealed.id.clone(), sealed.records);
        // The submission runs as its own task so that a panic in it (a
        // transport's bug) becomes an outcome here, not a lost report.
        let m = metrics.clone();
        let submission =
            tokio::spawn(
                async move { deliver(&cfg, transport.as_ref(), &m, sealed, shutdown).await },
            );
        let outcome = match submission.await {
            Ok(o) => o,
            Err(e) => ReportOutcome::Failed {
                report_id,
                records,
                error: if e.is_panic() {
                    format!("submission panicked: {}", panic_text(e.into_panic()))
                } else {
                    "submission cancelled".into()
                },
            },
        };
        note_outcome(&metrics, &outcome);
        outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(outcome);
    }
}

/// The counters and log line of a finished report.
fn note_outcome(metrics: &Metrics, outcome: &ReportOutcome) {
    match outcome {
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
        ReportOutcome::Failed {
            report_id, error, ..
        } => {
            tracing::error!(report_id, error, "report submission failed");
            metrics.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A panic's message, if it is text.
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    match p.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => p
            .downcast_ref::<&str>()
            .map_or_else(|| "(no message)".into(), |s| (*s).to_string()),
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
            Ok(Broadcast::Result {
                code,
                log,
                height,
                data,
            }) => return finished(sealed, code, log, height, &data),
            Ok(Broadcast::InCache) => {
                // In some mempool or already in a block: find out which.
                for e in &cfg.endpoints {
                    if let Ok(Some(Included { height, code, data })) =
                        transport.lookup(e.clone(), hash).await
                    {
                        return finished(
                            sealed,
                            code,
                            "refused in its block".into(),
                            height,
                            &data,
                        );
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

/// A report the chain answered: accepted, or already there (a duplicate
/// whose `data` is this report's own body hash), is landed; a duplicate
/// answer for a different body, and any other code, is a refusal.
fn finished(sealed: Sealed, code: u32, log: String, height: u64, data: &[u8]) -> ReportOutcome {
    let landed = if code == Code::DuplicateReport.value() {
        data == sealed.body_hash.as_slice()
    } else {
        code == Code::Ok.value()
    };
    if landed {
        return ReportOutcome::Landed {
            report_id: sealed.id,
            records: sealed.records,
            height,
        };
    }
    let log = if code == Code::DuplicateReport.value() {
        format!(
            "{ID_TAKEN}: the chain holds body sha256 {}, this report's is {} ({log})",
            if data.is_empty() {
                "(none given)".to_string()
            } else {
                hex::encode(data)
            },
            hex::encode(sealed.body_hash),
        )
    } else {
        log
    };
    ReportOutcome::Rejected {
        report_id: sealed.id,
        records: sealed.records,
        code,
        log,
    }
}

//! One report's task: the buffer-permit guard, the in-flight permit, the
//! submission (its panics caught, a report that expired unseen signed
//! again) and the outcome's counters.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::sync::{watch, Semaphore};

use super::context::Context;
use super::deliver::{deliver, proven_gone};
use super::seal::{reseal, Sealed};
use super::{unix_now, Metrics, ReportOutcome};
use crate::transport::Transport;
use tally_settlement::Code;

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
    pub(super) ctx: Arc<Context<T>>,
    pub(super) outcomes: Arc<Mutex<Vec<ReportOutcome>>>,
    pub(super) permits: Arc<Semaphore>,
    pub(super) shutdown: watch::Receiver<bool>,
}

/// One report counted in flight until dropped.
struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T: Transport> Submission<T> {
    /// Submits `sealed` to an outcome and records it; `guard` gives the
    /// records' buffer permits back when this task ends, however it ends.
    pub(super) async fn run(self, sealed: Sealed, guard: SlotGuard) {
        let _guard = guard;
        let Submission {
            ctx,
            outcomes,
            permits,
            shutdown,
        } = self;
        let Ok(_permit) = permits.acquire_owned().await else {
            return;
        };
        let metrics = ctx.metrics.clone();
        metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlight(&metrics);
        let (report_id, records) = (sealed.id.clone(), sealed.records);
        // The submission runs as its own task so that a panic in it (a
        // transport's bug) becomes an outcome here, not a lost report.
        let submission =
            tokio::spawn(async move { deliver_resealing(&ctx, sealed, shutdown).await });
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

/// Delivers `sealed`; while `reseal_for` after its first expiry, a report
/// the chain proved can no longer land (a block after its expiry did not
/// hold it, or refused it as expired) is signed again under the same id
/// with a new expiry and delivered again.
async fn deliver_resealing<T: Transport>(
    ctx: &Context<T>,
    mut sealed: Sealed,
    shutdown: watch::Receiver<bool>,
) -> ReportOutcome {
    let reseal_until = if ctx.cfg.reseal_for.is_zero() {
        0
    } else {
        sealed
            .expires_at
            .saturating_add(ctx.cfg.reseal_for.as_secs())
    };
    loop {
        // Registered with the block follower before the first broadcast.
        let watch = ctx.conf.watch(Sha256::digest(&sealed.tx).into());
        let (tx, records, expires_at) = (sealed.tx.clone(), sealed.records, sealed.expires_at);
        let outcome = deliver(ctx, sealed, watch, shutdown.clone(), reseal_until).await;
        let gone = match &outcome {
            ReportOutcome::Expired { .. } => proven_gone(ctx, expires_at),
            ReportOutcome::Rejected { code, .. } => *code == Code::ReportExpired.value(),
            _ => false,
        };
        if !gone || unix_now() >= reseal_until {
            return outcome;
        }
        let Some(next) = reseal(&ctx.cfg, &ctx.key, &tx, records) else {
            return outcome;
        };
        tracing::warn!(
            report_id = next.id,
            old_expires_at = expires_at,
            expires_at = next.expires_at,
            "report expired unseen (its bytes can no longer land): signed again under the same id"
        );
        ctx.metrics.resealed.fetch_add(1, Ordering::Relaxed);
        sealed = next;
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

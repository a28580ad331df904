//! One sealed report's way to an outcome: hand the same bytes to a mempool
//! (`broadcast_tx_sync`) until some block holds them, and read the chain's
//! answer (code 7 counts only with this report's body hash).

use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::SeedableRng;
use sha2::{Digest, Sha256};
use tally_settlement::Code;
use tokio::sync::watch;

use super::confirm::{Seen, Watch};
use super::context::Context;
use super::seal::Sealed;
use super::{unix_now, ReportOutcome, ID_TAKEN};
use crate::retry::RetryError;
use crate::transport::{Admission, Included, Transport};

/// Pause before another attempt after a failed or refused-for-now one.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// CheckTx codes that say "not now" rather than "never": a node's store
/// fault (another node, or the same one restarted, may take it), a full
/// table of report claims in the mempool ("retry after the next block"; our
/// own bytes never clash with our own claim), and a full mempool.
fn transient_check_code(code: u32) -> bool {
    [Code::Internal, Code::ReportPending, Code::MempoolFull]
        .iter()
        .any(|c| c.value() == code)
}

/// Whether the chain showed that a report expiring at `expires_at` can
/// never land: the follower read a block whose time is after it (every
/// block before it was read too, and none held the report).
pub(super) fn proven_gone<T: Transport>(ctx: &Context<T>, expires_at: u64) -> bool {
    ctx.conf.read_time() > expires_at
}

/// Submits `sealed` until it has an outcome. `watch` is registered with the
/// block follower before the first broadcast. Before `reseal_until` (unix
/// seconds) an expired report that may still be in a mempool is not given
/// up until a block after its expiry was read (see the reporter's docs).
pub(super) async fn deliver<T: Transport>(
    ctx: &Context<T>,
    sealed: Sealed,
    mut watch: Watch,
    mut shutdown: watch::Receiver<bool>,
    reseal_until: u64,
) -> ReportOutcome {
    let (cfg, transport, metrics) = (&ctx.cfg, ctx.transport.as_ref(), &ctx.metrics);
    let hash: [u8; 32] = Sha256::digest(&sealed.tx).into();
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut last_error = String::new();
    // Whether some attempt may have put the bytes in a mempool (then a
    // later CheckTx refusal is not the end: that copy may still land).
    let mut maybe_sent = false;
    let mut attempts = 0u32;
    loop {
        if let Some(s) = watch.seen() {
            return landed_in_block(sealed, s);
        }
        match expiry(ctx, &sealed, maybe_sent, hash).await {
            Gone::No => {}
            Gone::Found(i) => return from_block(sealed, i),
            Gone::Yes => {
                // Looked at after the follower's block time: a block it
                // read before that time is in here.
                if let Some(s) = watch.seen() {
                    return landed_in_block(sealed, s);
                }
                if !proven_gone(ctx, sealed.expires_at) && unix_now() < reseal_until {
                    // It may be signed again, but only once a block after
                    // its expiry shows its bytes can no longer land: wait
                    // for one (the chain may be stopped).
                    tokio::select! {
                        s = watch.wait() => return landed_in_block(sealed, s),
                        _ = tokio::time::sleep(cfg.confirm_poll.max(RETRY_PAUSE)) => continue,
                    }
                }
                return ReportOutcome::Expired {
                    report_id: sealed.id,
                    records: sealed.records,
                    last_error: if last_error.is_empty() {
                        "not confirmed before it expired".into()
                    } else {
                        last_error
                    },
                };
            }
        }
        if attempts > 0 {
            metrics.retried.fetch_add(1, Ordering::Relaxed);
        }
        attempts += 1;
        let r = cfg
            .policy
            .run(&cfg.endpoints, &mut shutdown, &mut rng, |e: &String, _| {
                transport.broadcast_sync(e.clone(), sealed.tx.clone())
            })
            .await;
        // How long to wait for a block to show it before trying again.
        let wait = match r {
            Ok(Admission::Accepted) => {
                maybe_sent = true;
                cfg.resubmit_after
            }
            Ok(Admission::Refused { code, log, .. }) if transient_check_code(code) => {
                last_error = format!("CheckTx code {code} (for now): {log}");
                RETRY_PAUSE
            }
            Ok(Admission::Refused { code, log, data }) => {
                if code == Code::DuplicateReport.value() || !maybe_sent {
                    // Final: landed before (code 7, own body), taken by a
                    // different report, or refused and never sent before.
                    let height = if code == Code::DuplicateReport.value() {
                        known_height(ctx, &mut watch, hash).await
                    } else {
                        0
                    };
                    return finished(sealed, code, log, height, &data);
                }
                // An earlier copy may still be in a mempool: the blocks
                // decide, up to the report's expiry.
                last_error = format!("CheckTx refused a resubmission with code {code}: {log}");
                cfg.resubmit_after
            }
            Ok(Admission::InCache) => {
                maybe_sent = true;
                if let Some(i) = lookup(ctx, hash).await {
                    return from_block(sealed, i);
                }
                last_error = "in a mempool, not yet in a block".into();
                cfg.resubmit_after
            }
            Err(e) => {
                // The answer may be lost after the node took the bytes.
                maybe_sent = true;
                last_error = match e {
                    RetryError::Fatal(f) => f.to_string(),
                    RetryError::Shutdown => "shutting down".into(),
                    e => e.to_string(),
                };
                RETRY_PAUSE
            }
        };
        // Wait for a block to show it (same bytes again afterwards).
        tokio::select! {
            s = watch.wait() => return landed_in_block(sealed, s),
            _ = tokio::time::sleep(wait) => {
                if wait != RETRY_PAUSE {
                    // Not seen in a block in time: resubmitted.
                    metrics.resubmitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Whether a report can no longer land.
enum Gone {
    /// It still may.
    No,
    /// A node's index has it in a block after all.
    Found(Included),
    /// It cannot.
    Yes,
}

/// Never sent anywhere: gone at `expires_at`. Possibly sent: once the
/// block follower read a block after `expires_at` without it (the chain
/// refuses it there and later), or, if the follower cannot read blocks,
/// `expiry_grace` after `expires_at` when no node's index has it either.
async fn expiry<T: Transport>(
    ctx: &Context<T>,
    sealed: &Sealed,
    maybe_sent: bool,
    hash: [u8; 32],
) -> Gone {
    let now = unix_now();
    if now < sealed.expires_at {
        return Gone::No;
    }
    if !maybe_sent {
        return Gone::Yes;
    }
    let past = ctx.conf.read_time() > sealed.expires_at
        || now
            >= sealed
                .expires_at
                .saturating_add(ctx.cfg.expiry_grace.as_secs());
    if !past {
        return Gone::No;
    }
    match lookup(ctx, hash).await {
        Some(i) => Gone::Found(i),
        None => Gone::Yes,
    }
}

/// The report's block by hash from the first node whose index has it.
async fn lookup<T: Transport>(ctx: &Context<T>, hash: [u8; 32]) -> Option<Included> {
    for e in &ctx.cfg.endpoints {
        let r = tokio::time::timeout(
            ctx.cfg.policy.per_try_timeout,
            ctx.transport.lookup(e.clone(), hash),
        )
        .await;
        if let Ok(Ok(Some(i))) = r {
            return Some(i);
        }
    }
    None
}

/// The height of a report known to have landed (CheckTx said code 7): the
/// follower's, else a node's index, else 0.
async fn known_height<T: Transport>(ctx: &Context<T>, watch: &mut Watch, hash: [u8; 32]) -> u64 {
    if let Some(s) = watch.seen() {
        return s.height;
    }
    lookup(ctx, hash).await.map_or(0, |i| i.height)
}

fn landed_in_block(sealed: Sealed, s: Seen) -> ReportOutcome {
    let log = if s.tx.log.is_empty() {
        "refused in its block".into()
    } else {
        s.tx.log
    };
    finished(sealed, s.tx.code, log, s.height, &s.tx.data)
}

/// The outcome of a report found in a block by a lookup (tx index or the
/// expiry check): its result code and `data` there decide.
fn from_block(sealed: Sealed, i: Included) -> ReportOutcome {
    finished(
        sealed,
        i.code,
        "refused in its block".into(),
        i.height,
        &i.data,
    )
}

/// A report the chain answered: accepted, or already there (a duplicate
/// whose `data` is this report's own body hash), is landed; a duplicate
/// answer for a different body, and any other code, is a refusal.
pub(super) fn finished(
    sealed: Sealed,
    code: u32,
    log: String,
    height: u64,
    data: &[u8],
) -> ReportOutcome {
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

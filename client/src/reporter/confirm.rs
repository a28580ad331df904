//! The reporter's one block follower: it asks for the latest committed
//! height every `confirm_poll`, reads each new block and its results, and
//! hands every transaction whose hash a submission waits for to that
//! submission. No request stays open per report.
//!
//! While no report waits, it only tracks the height and skips blocks: a
//! report registered afterwards is broadcast afterwards, so it can only land
//! above a height already committed when the follower last saw the set
//! empty. While reports wait, every block is read, in order; the time of
//! the newest block read tells a waiting report when it can no longer land
//! (the chain refuses a report in any block whose time is at or past its
//! `expires_at`, and block times only grow).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::{Metrics, ReporterConfig};
use crate::transport::{BlockTx, Transport};

/// A report's transaction seen in a block.
#[derive(Debug)]
pub(super) struct Seen {
    /// The block's height.
    pub(super) height: u64,
    /// The transaction and its result.
    pub(super) tx: BlockTx,
}

/// Blocks behind the tip the follower reads when reports already wait the
/// first time it learns the height (they may have landed meanwhile).
const LOOK_BACK: u64 = 5;

/// The transactions submissions wait for, and how far the follower got.
#[derive(Debug, Default)]
pub(super) struct Confirmations {
    waiting: Mutex<HashMap<[u8; 32], oneshot::Sender<Seen>>>,
    /// Time of the newest block read while reports waited (0: none yet).
    read_time: AtomicU64,
}

impl Confirmations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], oneshot::Sender<Seen>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the transaction with `hash`: register BEFORE the first
    /// broadcast. The registration ends when the [`Watch`] is dropped.
    pub(super) fn watch(self: &Arc<Self>, hash: [u8; 32]) -> Watch {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(hash, tx);
        Watch {
            rx,
            hash,
            owner: self.clone(),
        }
    }

    fn is_idle(&self) -> bool {
        self.lock().is_empty()
    }

    /// Hands a block's transactions to their submissions, then records the
    /// block's time (in that order: a submission that sees the time also
    /// sees its transaction). Returns how many were waited for.
    fn deliver(&self, height: u64, time: u64, txs: Vec<BlockTx>) -> u64 {
        let mut n = 0;
        {
            let mut w = self.lock();
            for tx in txs {
                if let Some(s) = w.remove(&tx.hash) {
                    let _ = s.send(Seen { height, tx });
                    n += 1;
                }
            }
        }
        self.read_time.fetch_max(time, Ordering::SeqCst);
        n
    }

    /// Time of the newest block read while reports waited.
    pub(super) fn read_time(&self) -> u64 {
        self.read_time.load(Ordering::SeqCst)
    }
}

/// One submission's registration.
pub(super) struct Watch {
    rx: oneshot::Receiver<Seen>,
    hash: [u8; 32],
    owner: Arc<Confirmations>,
}

impl Watch {
    /// The block that holds the transaction, if the follower saw it.
    pub(super) fn seen(&mut self) -> Option<Seen> {
        self.rx.try_recv().ok()
    }

    /// Waits until the follower sees the transaction (forever if the
    /// follower is gone: callers bound it with a timeout).
    pub(super) async fn wait(&mut self) -> Seen {
        match (&mut self.rx).await {
            Ok(s) => s,
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.owner.lock().remove(&self.hash);
    }
}

/// Follows the chain for `conf` until aborted.
pub(super) async fn follow<T: Transport>(
    cfg: Arc<ReporterConfig>,
    transport: Arc<T>,
    conf: Arc<Confirmations>,
    metrics: Arc<Metrics>,
) {
    // Endpoints, the one that answered last first.
    let mut order = cfg.endpoints.clone();
    let mut next: Option<u64> = None;
    let mut poll = tokio::time::interval(cfg.confirm_poll);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        poll.tick().await;
        let Some((at, latest)) = tip(&cfg, transport.as_ref(), &order).await else {
            continue;
        };
        order.rotate_left(at);
        metrics.chain_height.store(latest, Ordering::Relaxed);
        // Checked after the height is known (see the module docs).
        if conf.is_idle() {
            next = Some(latest + 1);
            continue;
        }
        let mut h = next.unwrap_or_else(|| latest.saturating_sub(LOOK_BACK).max(1));
        while h <= latest {
            if conf.is_idle() {
                h = latest + 1;
                break;
            }
            let Some((at, b)) = block(&cfg, transport.as_ref(), &order, h).await else {
                break;
            };
            order.rotate_left(at);
            let n = conf.deliver(h, b.time, b.txs);
            metrics.confirmed.fetch_add(n, Ordering::Relaxed);
            h += 1;
        }
        next = Some(h);
    }
}

/// The first endpoint's answer to "latest height", in `order`.
async fn tip<T: Transport>(
    cfg: &ReporterConfig,
    transport: &T,
    order: &[String],
) -> Option<(usize, u64)> {
    for (i, e) in order.iter().enumerate() {
        let r = tokio::time::timeout(
            cfg.policy.per_try_timeout,
            transport.latest_height(e.clone()),
        )
        .await;
        match r {
            Ok(Ok(h)) => return Some((i, h)),
            Ok(Err(f)) => {
                tracing::debug!(endpoint = %crate::redact_url(e), error = %f, "block follower: no height")
            }
            Err(_) => {
                tracing::debug!(endpoint = %crate::redact_url(e), "block follower: height timed out")
            }
        }
    }
    None
}

/// Block `h` from the first endpoint that has it, in `order`.
async fn block<T: Transport>(
    cfg: &ReporterConfig,
    transport: &T,
    order: &[String],
    h: u64,
) -> Option<(usize, crate::transport::Block)> {
    for (i, e) in order.iter().enumerate() {
        let r =
            tokio::time::timeout(cfg.policy.per_try_timeout, transport.block(e.clone(), h)).await;
        match r {
            Ok(Ok(b)) => return Some((i, b)),
            Ok(Err(f)) => {
                tracing::debug!(endpoint = %crate::redact_url(e), height = h, error = %f, "block follower: no block")
            }
            Err(_) => {
                tracing::debug!(endpoint = %crate::redact_url(e), height = h, "block follower: block timed out")
            }
        }
    }
    None
}

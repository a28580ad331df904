//! The application: [`TallyApp`], the state its handlers share, and the
//! `Application` impl, which only delegates to one module per handler.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tally_settlement::bls::SecretShare;
use tally_settlement::{self as settlement};
use tally_store::halt::{Halt, HaltEvent, HaltReason};
use tally_store::{Backend, ChangeSet, CommitMeta, Pending, StoreError};
use tracing::error;

use crate::inbox::{HandIn, Inbox};
use crate::mempool::Claims;
use crate::metrics::{AppMetrics, BlockTally};

/// Errors of the adapter that are not ABCI responses.
#[derive(Debug, thiserror::Error)]
pub enum AbciError {
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Tally as an ABCI++ application. Cheap to clone: clones share state.
#[derive(Clone, Debug)]
pub struct TallyApp {
    pub(crate) inner: Arc<Inner>,
}

/// The state every connection's clone shares.
#[derive(Debug)]
pub(crate) struct Inner {
    /// Committed state.
    pub(crate) backend: Arc<dyn Backend>,
    /// The consensus connection's block state.
    pub(crate) consensus: Mutex<Consensus>,
    /// The last commit, readable without waiting for a block to execute.
    pub(crate) committed: RwLock<CommitMeta>,
    /// This validator's threshold key shares by key epoch (at most the
    /// current key's and the next one's are kept).
    pub(crate) signer: RwLock<Vec<(u64, SecretShare)>>,
    /// What the relay handed in, waiting to be signed in ExtendVote.
    pub(crate) inbox: Mutex<Inbox>,
    /// Report scopes claimed by transactions waiting in the mempool.
    pub(crate) claims: Mutex<Claims>,
    /// Gateway signatures this node verified (mempool and blocks).
    pub(crate) signatures: crate::sigcache::SignatureCache,
    /// The last threshold key parsed from state, shared by every handler
    /// that reads the active key (proposals, vote extensions,
    /// SubmitPartials): parsed again only when the stored key changes.
    pub(crate) key_cache: settlement::KeyCache,
    /// Where this node's snapshots are kept, if it serves any.
    pub(crate) snapshots: RwLock<Option<Arc<dyn crate::snapshot_store::SnapshotStore>>>,
    /// The state-sync restore under way, if any.
    pub(crate) restore: Mutex<Option<tally_store::restore::Restore>>,
    /// The app's metric values (atomics; see `metrics`).
    pub(crate) metrics: AppMetrics,
    /// Called when the node must stop.
    halt: Halt,
    /// Set once the halt hook was called: no further consensus work.
    halted: AtomicBool,
    /// The newest app version this node runs (ADR 0019).
    pub(crate) max_app_version: AtomicU64,
}

/// The consensus connection's block state.
#[derive(Debug)]
pub(crate) struct Consensus {
    /// Committed state plus the writes of the block being executed.
    pub(crate) pending: Pending,
    /// Height executed by FinalizeBlock and not yet committed.
    pub(crate) finalized: Option<u64>,
    /// The writes pending before that FinalizeBlock (genesis writes before
    /// the first block), restored if the same height is executed again.
    pub(crate) before_block: ChangeSet,
    /// What the executed block adds to the metrics, applied at its Commit.
    pub(crate) tally: Option<BlockTally>,
}

/// What happened to a block, for callers that run the app in-process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// Height committed.
    pub height: u64,
    /// App hash after it.
    pub app_hash: [u8; 32],
}

impl TallyApp {
    /// An app over `backend`, resuming from its last commit. `halt` is
    /// called when the node must stop (the binary's hook exits the
    /// process; see [`Halt`]).
    ///
    /// A store an interrupted state sync left half-restored is wiped first
    /// (it holds no commit; CometBFT starts over from an empty app).
    pub fn new(backend: Arc<dyn Backend>, halt: Halt) -> Result<Self, AbciError> {
        if tally_store::restore::Restore::discard_interrupted(backend.as_ref())? {
            tracing::warn!("discarded the partial state of an interrupted state sync");
        }
        let pending = Pending::open(backend.clone())?;
        let committed = RwLock::new(pending.committed().clone());
        let metrics = AppMetrics::default();
        let last_time = settlement::state::chain::last_time(&backend).unwrap_or(0);
        metrics.set_height(pending.committed().height, last_time);
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                consensus: Mutex::new(Consensus {
                    pending,
                    finalized: None,
                    before_block: ChangeSet::default(),
                    tally: None,
                }),
                committed,
                signer: RwLock::new(Vec::new()),
                inbox: Mutex::new(Inbox::default()),
                claims: Mutex::new(Claims::default()),
                signatures: Default::default(),
                key_cache: settlement::KeyCache::new(),
                snapshots: RwLock::new(None),
                restore: Mutex::new(None),
                metrics,
                halt,
                halted: AtomicBool::new(false),
                max_app_version: AtomicU64::new(settlement::upgrade::LATEST_APP_VERSION),
            }),
        })
    }

    pub(crate) fn consensus(&self) -> MutexGuard<'_, Consensus> {
        // A poisoned lock means a handler panicked; the state it guarded is
        // still the last consistent one we wrote, so keep going.
        self.inner
            .consensus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn claims(&self) -> MutexGuard<'_, Claims> {
        self.inner.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gateway signatures this node already verified.
    pub(crate) fn signatures(&self) -> &crate::sigcache::SignatureCache {
        &self.inner.signatures
    }

    /// The parsed threshold key, kept while the stored one is unchanged.
    pub(crate) fn key_cache(&self) -> &settlement::KeyCache {
        &self.inner.key_cache
    }

    pub(crate) fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inner.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last committed height and app hash.
    pub fn last_commit(&self) -> Committed {
        let m = self
            .inner
            .committed
            .read()
            .unwrap_or_else(|e| e.into_inner());
        Committed {
            height: m.height,
            app_hash: m.app_hash,
        }
    }

    /// Keeps the last `versions` versions of the Merkle tree for historical
    /// proofs (0: every version); see [`tally_store::merkle`].
    pub fn set_retain_versions(&self, versions: u64) {
        self.consensus().pending.set_retain_versions(versions);
    }

    /// Keeps new transactions under CometBFT's mempool `limit` (`None`:
    /// no limit); see [`crate::mempool`].
    pub fn set_mempool_limit(&self, limit: Option<crate::mempool::MempoolLimit>) {
        self.claims().set_limit(limit);
    }

    /// What the last commit's tree update cost.
    pub fn last_tree_stats(&self) -> tally_store::TreeStats {
        self.consensus().pending.last_tree_stats()
    }

    /// Committed state, for read-only use.
    pub fn committed_state(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// A throwaway overlay of committed state, for proposals.
    pub(crate) fn committed_pending(&self) -> Result<Pending, StoreError> {
        Pending::open(self.inner.backend.clone())
    }

    /// Gives the app this validator's threshold key share: from now on its
    /// vote extensions carry partial signatures.
    pub fn set_signer(&self, share: SecretShare) {
        self.add_signer(0, share);
    }

    /// Gives the app this validator's share of the key of `epoch` (a key
    /// from the on-chain DKG or a reshare): its vote extensions carry
    /// partials with it while that key is the chain's active key. Shares
    /// of older epochs are forgotten once a newer one arrives, but the
    /// one before it is kept until the newer key activates.
    pub fn add_signer(&self, epoch: u64, share: SecretShare) {
        self.inner.metrics.set_share(Some(share.index));
        let mut s = self.inner.signer.write().unwrap_or_else(|e| e.into_inner());
        s.retain(|(e, _)| *e != epoch);
        s.push((epoch, share));
        s.sort_by_key(|(e, _)| *e);
        while s.len() > 2 {
            s.remove(0);
        }
    }

    /// Drops every share of a key epoch below `epoch` (the active one):
    /// once a new key is active, the old key's shares are never used again
    /// and their memory is zeroed as they drop (blst zeroizes secret keys).
    pub fn retire_signers_below(&self, epoch: u64) {
        let mut s = self.inner.signer.write().unwrap_or_else(|e| e.into_inner());
        s.retain(|(e, _)| *e >= epoch);
    }

    /// The epochs this validator holds shares of.
    pub fn signer_epochs(&self) -> Vec<u64> {
        let s = self.inner.signer.read().unwrap_or_else(|e| e.into_inner());
        s.iter().map(|(e, _)| *e).collect()
    }

    /// The app's metric handle (the handlers update it).
    pub fn metrics(&self) -> &AppMetrics {
        &self.inner.metrics
    }

    /// Registers the app's metrics in `registry` (the node's, where the
    /// relay's are too, so one `/metrics` page serves both): the handlers' counters and histograms,
    /// and gauges read from committed state at scrape time.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.inner
            .metrics
            .register(registry, self.inner.backend.clone());
    }

    /// The relay's hand-in: a hub result or hub block it observed. The next
    /// vote extensions sign it while the chain is waiting for it. A
    /// [`HubResult`](tally_settlement::proto::HubResult) or
    /// [`HubBlock`](tally_settlement::proto::HubBlock) converts into a
    /// [`HandIn`].
    pub fn hand_in(&self, item: impl Into<HandIn>) {
        let item = item.into();
        let cursor = match &item {
            HandIn::Block(b) => settlement::sync::hub_cursor(&self.inner.backend, &b.chain).ok(),
            HandIn::Result(_) => None,
        };
        self.inbox().put(item, cursor);
    }

    /// A copy of the hand-ins held for this validator's next vote
    /// extensions (what the relay handed in and the chain still waits for).
    pub fn held(&self) -> Inbox {
        self.inbox().clone()
    }

    /// Answers a query path against committed state.
    pub fn query_path(&self, path: &str) -> settlement::query::QueryResult {
        settlement::query::query(&self.inner.backend, path)
    }

    /// Whether the app asked its binary to stop (it then refuses further
    /// consensus work; only a recording hook lets it go on running).
    pub fn halted(&self) -> bool {
        self.inner.halted.load(Ordering::SeqCst)
    }

    /// Calls the halt hook and stops taking consensus work.
    pub(crate) fn halt(&self, reason: HaltReason, height: u64, error: String) {
        self.halt_with(HaltEvent {
            reason,
            height,
            error,
            upgrade_info: None,
        });
    }

    /// [`Self::halt`] with the whole event.
    pub(crate) fn halt_with(&self, event: HaltEvent) {
        self.inner.halted.store(true, Ordering::SeqCst);
        self.inner.halt.halt(event);
    }

    /// The node's own storage failed (a read, a corrupt value, a write).
    /// The block's result would depend on a local fault, so no answer is
    /// safe: continuing would report an app hash this node cannot
    /// reproduce. Logs a FATAL line and halts; after the fault is fixed
    /// CometBFT replays from the last commit. See
    /// docs/adr/0003-store-and-app-hash.md.
    pub(crate) fn fatal_store_error(&self, height: u64, what: &str) {
        error!(height, error = %what, "FATAL: local store failure; stopping the app (CometBFT will replay from the last commit after restart)");
        self.halt(HaltReason::StoreFailure, height, what.to_string());
    }
}

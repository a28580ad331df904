//! State sync: ListSnapshots, LoadSnapshotChunk, OfferSnapshot and
//! ApplySnapshotChunk.
//!
//! Serving side: the node gives the app a [`SnapshotStore`]
//! (`crate::snapshot_store`)
//! ([`TallyApp::set_snapshots`]); the app tells it of every commit (it
//! decides when to take a snapshot and writes it off the ABCI path) and
//! answers CometBFT's list and chunk requests from it.
//!
//! Restoring side: OfferSnapshot accepts a snapshot only if its metadata
//! decodes, hashes to the offered hash, agrees with the offered height and
//! chunk count, and names the app hash CometBFT's light client verified;
//! then [`Restore`] takes the chunks, each checked against its listed hash
//! (a mismatch refetches the chunk and drops its sender), and after the
//! last one rebuilds the tree and compares its root with that app hash. A
//! snapshot whose content is wrong is rejected and the store wiped; only a
//! failure of the local store aborts state sync.

use std::sync::{Arc, MutexGuard};

use bytes::Bytes;
use tally_store::restore::{Applied, Restore, RestoreError};
use tally_store::snapshot::{self, Metadata, SnapshotError};
use tally_store::Pending;
use tendermint_proto::v0_38::abci::{
    response_apply_snapshot_chunk::Result as ApplyResult,
    response_offer_snapshot::Result as OfferResult, RequestApplySnapshotChunk,
    RequestLoadSnapshotChunk, RequestOfferSnapshot, ResponseApplySnapshotChunk,
    ResponseListSnapshots, ResponseLoadSnapshotChunk, ResponseOfferSnapshot, Snapshot,
};
use tracing::{error, info, warn};

use crate::app::TallyApp;
use crate::snapshot_store::SnapshotStore;

pub(crate) fn list_snapshots(app: &TallyApp) -> ResponseListSnapshots {
    let snapshots = app
        .snapshots()
        .map(|s| s.list())
        .unwrap_or_default()
        .into_iter()
        .map(|s| Snapshot {
            height: s.metadata.height,
            format: snapshot::FORMAT,
            chunks: s.metadata.chunks(),
            hash: Bytes::copy_from_slice(&s.metadata.hash()),
            metadata: Bytes::from(s.metadata.encode()),
        })
        .collect();
    ResponseListSnapshots { snapshots }
}

pub(crate) fn load_snapshot_chunk(
    app: &TallyApp,
    req: RequestLoadSnapshotChunk,
) -> ResponseLoadSnapshotChunk {
    let chunk = app
        .snapshots()
        .and_then(|s| s.load_chunk(req.height, req.format, req.chunk))
        .unwrap_or_default();
    ResponseLoadSnapshotChunk {
        chunk: Bytes::from(chunk),
    }
}

/// Why an offered snapshot is refused, before anything is written.
fn check_offer(req: &RequestOfferSnapshot) -> Result<Metadata, (OfferResult, String)> {
    let s = req
        .snapshot
        .as_ref()
        .ok_or((OfferResult::Reject, "no snapshot in the offer".to_string()))?;
    if s.format != snapshot::FORMAT {
        return Err((
            OfferResult::RejectFormat,
            format!("format {} (this node reads {})", s.format, snapshot::FORMAT),
        ));
    }
    let meta = Metadata::decode(&s.metadata).map_err(|e| match e {
        SnapshotError::Format(_) => (OfferResult::RejectFormat, e.to_string()),
        _ => (OfferResult::Reject, e.to_string()),
    })?;
    if meta.hash().as_slice() != s.hash.as_ref() {
        return Err((
            OfferResult::Reject,
            "the snapshot hash is not the hash of its metadata".into(),
        ));
    }
    if meta.height != s.height || meta.chunks() != s.chunks {
        return Err((
            OfferResult::Reject,
            format!(
                "offered as height {} with {} chunks, the metadata says height {} with {}",
                s.height,
                s.chunks,
                meta.height,
                meta.chunks()
            ),
        ));
    }
    if meta.app_hash.as_slice() != req.app_hash.as_ref() {
        return Err((
            OfferResult::Reject,
            format!(
                "the snapshot's app hash {} is not the verified app hash {} of height {}",
                hex::encode(meta.app_hash),
                hex::encode(&req.app_hash),
                meta.height
            ),
        ));
    }
    Ok(meta)
}

pub(crate) fn offer_snapshot(app: &TallyApp, req: RequestOfferSnapshot) -> ResponseOfferSnapshot {
    let result = |r: OfferResult| ResponseOfferSnapshot { result: r as i32 };
    let meta = match check_offer(&req) {
        Ok(m) => m,
        Err((r, why)) => {
            warn!(reason = %why, "snapshot refused");
            return result(r);
        }
    };
    let mut restore = app.restore();
    if let Some(old) = restore.take() {
        info!(
            height = old.metadata().height,
            "a new snapshot replaces the restore under way"
        );
        if let Err(e) = old.abort() {
            error!(error = %e, "wiping the earlier restore failed; aborting state sync");
            return result(OfferResult::Abort);
        }
    }
    let height = meta.height;
    let chunks = meta.chunks();
    match Restore::begin(app.committed_state().clone(), meta) {
        Ok(mut r) => {
            // The tree covers the digests of the report ids, not the ids
            // (side state, ADR 0025): they must match before the restore
            // is accepted.
            r.set_side_check(Box::new(|b| {
                tally_settlement::state::replay::check_side_ids(b)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }));
            info!(height, chunks, "restoring a snapshot");
            *restore = Some(r);
            result(OfferResult::Accept)
        }
        Err(e) => {
            error!(error = %e, "cannot restore a snapshot; aborting state sync");
            result(OfferResult::Abort)
        }
    }
}

pub(crate) fn apply_snapshot_chunk(
    app: &TallyApp,
    req: RequestApplySnapshotChunk,
) -> ResponseApplySnapshotChunk {
    let reply =
        |r: ApplyResult, refetch: Vec<u32>, reject: Vec<String>| ResponseApplySnapshotChunk {
            result: r as i32,
            refetch_chunks: refetch,
            reject_senders: reject,
        };
    let mut guard = app.restore();
    let Some(restore) = guard.as_mut() else {
        warn!(
            index = req.index,
            "a snapshot chunk arrived with no restore under way"
        );
        return reply(ApplyResult::Abort, Vec::new(), Vec::new());
    };
    match restore.apply(req.index, &req.chunk) {
        Ok(Applied::More { .. }) => reply(ApplyResult::Accept, Vec::new(), Vec::new()),
        Ok(Applied::Done(meta)) => {
            *guard = None;
            drop(guard);
            if let Err(e) = reopen(app) {
                error!(error = %e, "reopening the restored store failed; aborting state sync");
                return reply(ApplyResult::Abort, Vec::new(), Vec::new());
            }
            info!(
                height = meta.height,
                app_hash = %hex::encode(meta.app_hash),
                "snapshot restored"
            );
            reply(ApplyResult::Accept, Vec::new(), Vec::new())
        }
        Err(e @ (RestoreError::ChunkHash { .. } | RestoreError::OutOfOrder { .. })) => {
            warn!(index = req.index, sender = %req.sender, error = %e, "snapshot chunk refused; fetching it again");
            let reject = if matches!(e, RestoreError::ChunkHash { .. }) && !req.sender.is_empty() {
                vec![req.sender]
            } else {
                Vec::new()
            };
            let again = match e {
                RestoreError::OutOfOrder { expected, .. } => expected,
                _ => req.index,
            };
            reply(ApplyResult::Retry, vec![again], reject)
        }
        Err(RestoreError::Store(e)) => {
            *guard = None;
            error!(error = %e, "local store failure while restoring a snapshot; aborting state sync");
            reply(ApplyResult::Abort, Vec::new(), Vec::new())
        }
        Err(e) => {
            // The snapshot's own content is wrong; `apply` wiped the store.
            *guard = None;
            warn!(error = %e, "snapshot rejected");
            reply(ApplyResult::RejectSnapshot, Vec::new(), Vec::new())
        }
    }
}

/// Points the consensus state and the committed metadata at the restored
/// store.
fn reopen(app: &TallyApp) -> Result<(), tally_store::StoreError> {
    let mut c = app.consensus();
    let retain = c.pending.retain_versions();
    let mut pending = Pending::open(app.committed_state().clone())?;
    pending.set_retain_versions(retain);
    *app.inner
        .committed
        .write()
        .unwrap_or_else(|e| e.into_inner()) = pending.committed().clone();
    c.pending = pending;
    c.finalized = None;
    c.before_block = Default::default();
    drop(c);
    app.claims().clear();
    Ok(())
}

impl TallyApp {
    /// Serves and takes snapshots through `store` from now on.
    pub fn set_snapshots(&self, store: Arc<dyn SnapshotStore>) {
        *self
            .inner
            .snapshots
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(store);
    }

    pub(crate) fn snapshots(&self) -> Option<Arc<dyn SnapshotStore>> {
        self.inner
            .snapshots
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn restore(&self) -> MutexGuard<'_, Option<Restore>> {
        self.inner.restore.lock().unwrap_or_else(|e| e.into_inner())
    }
}

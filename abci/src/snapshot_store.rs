//! What the app asks of the node's snapshot directory: the
//! [`SnapshotStore`] trait and the [`SnapshotInfo`] it lists. The node
//! implements it (files on disk); the handlers in `snapshot` use it.

use std::fmt::Debug;

use tally_store::snapshot::Metadata;

/// A snapshot a node holds, as CometBFT lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its metadata (height, app hash, chunk hashes).
    pub metadata: Metadata,
}

/// Where a node keeps the snapshots it serves. Implemented by the binary
/// (files on disk); every method is called on an ABCI connection and must
/// return quickly.
pub trait SnapshotStore: Send + Sync + Debug {
    /// The snapshots ready to serve, newest first.
    fn list(&self) -> Vec<SnapshotInfo>;
    /// Chunk `chunk` of the snapshot at `height` in `format`, if held.
    fn load_chunk(&self, height: u64, format: u32, chunk: u32) -> Option<Vec<u8>>;
    /// `height` was committed durably; take a snapshot of it if due (off
    /// the calling thread).
    fn committed(&self, height: u64);
}

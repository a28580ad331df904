//! A block's buffered writes and the reads that see through them.
//!
//! [`Pending`] is the state the consensus connection works on: the
//! committed backend plus a [`ChangeSet`] of the current block, made of
//! range deletes (in the order issued) and point writes (puts and deletes,
//! sorted by key). Reads look at the change set first and merge it with
//! the backend during scans; a range delete drops the earlier buffered
//! writes it covers, and later writes inside the range survive.
//!
//! FinalizeBlock asks for the app hash ([`Pending::app_hash_at`]): the
//! change set is expanded into point updates (a range delete becomes
//! deletes of the committed keys it covers) and the tree's next version
//! computed ([`crate::merkle`]); that version is kept until Commit and
//! dropped by any further write. [`Pending::commit`] writes the change set,
//! the tree's new nodes, versioned values and stale index, and the
//! metadata in one atomic batch (RocksDB: one `WriteBatch` with a synced
//! WAL, range deletes of the flat state as range tombstones), so a block
//! is either fully durable or absent, tree included; it also prunes, in
//! that batch, what the kept versions no longer use (pruning is node-local
//! and never changes a root). Genesis writes from InitChain are part of
//! block 1's version.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::merkle::{self, Prepared};
use crate::{Backend, CommitMeta, Kv, KvRead, StoreError, TreeStats};

/// The writes of one block, in a canonical order: range deletes (in the
/// order they were made) apply first, then point writes in key order. A
/// point write made after a range delete that covers it survives, one made
/// before is dropped when the range delete is recorded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ChangeSet {
    /// Range deletes `[start, end)` (empty `end`: unbounded).
    pub ranges: Vec<(Vec<u8>, Vec<u8>)>,
    /// Point writes: `Some(value)` puts, `None` deletes.
    pub writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl ChangeSet {
    /// True when the block changed nothing.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.writes.is_empty()
    }

    /// Whether a pending range delete covers `key`.
    fn range_deleted(&self, key: &[u8]) -> bool {
        self.ranges.iter().any(|(s, e)| in_range(key, s, e))
    }
}

pub(crate) fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    key >= start && (end.is_empty() || key < end)
}

/// Committed state plus the current block's uncommitted writes.
#[derive(Debug)]
pub struct Pending {
    backend: Arc<dyn Backend>,
    changes: ChangeSet,
    meta: CommitMeta,
    /// Tree versions kept for historical proofs (0: all).
    retain: u64,
    /// The tree version computed for the current changes, if still valid.
    prepared: Option<Prepared>,
    /// What the last commit's tree update cost.
    last_stats: TreeStats,
}

/// Tree versions kept by default: about 14 hours of 5-second blocks.
pub const DEFAULT_RETAIN_VERSIONS: u64 = 10_000;

impl Pending {
    /// Opens pending state on top of `backend`'s last commit.
    pub fn open(backend: Arc<dyn Backend>) -> Result<Self, StoreError> {
        let meta = backend.meta()?.unwrap_or_default();
        Ok(Self {
            backend,
            changes: ChangeSet::default(),
            meta,
            retain: DEFAULT_RETAIN_VERSIONS,
            prepared: None,
            last_stats: TreeStats::default(),
        })
    }

    /// Keeps the last `versions` tree versions for historical proofs (0:
    /// every version); older ones are pruned a bounded amount per commit.
    pub fn set_retain_versions(&mut self, versions: u64) {
        self.retain = versions;
    }

    /// Tree versions kept (0: all).
    pub fn retain_versions(&self) -> u64 {
        self.retain
    }

    /// What the last commit's tree update cost.
    pub fn last_tree_stats(&self) -> TreeStats {
        self.last_stats
    }

    /// The last committed height and app hash.
    pub fn committed(&self) -> &CommitMeta {
        &self.meta
    }

    /// The backend underneath.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The writes buffered so far.
    pub fn changes(&self) -> &ChangeSet {
        &self.changes
    }

    /// Forgets every uncommitted write.
    pub fn discard(&mut self) {
        self.changes = ChangeSet::default();
        self.prepared = None;
    }

    /// The app hash the buffered writes give at `height`: the root of the
    /// Merkle tree over the state they leave ([`crate::merkle`]). Computed
    /// once and kept for [`Pending::commit`] until the writes change.
    pub fn app_hash_at(&mut self, height: u64) -> Result<[u8; 32], StoreError> {
        let prepared = self.take_prepared(height)?;
        Ok(self.prepared.insert(prepared).root)
    }

    /// The version computed for the current writes at `height`, or a new one.
    fn take_prepared(&mut self, height: u64) -> Result<Prepared, StoreError> {
        match self.prepared.take() {
            Some(p) if p.height == height => Ok(p),
            _ => merkle::prepare(self.backend.as_ref(), &self.changes, height),
        }
    }

    /// Replaces the buffered writes (to undo a block executed twice).
    pub fn set_changes(&mut self, changes: ChangeSet) {
        self.changes = changes;
        self.prepared = None;
    }

    /// Writes the buffered change set with `height` and its app hash in one
    /// durable batch, with the tree's new version (computed by
    /// [`Pending::app_hash_at`] if still valid) and its pruning, and returns
    /// the new metadata. Refuses writes into the reserved `0x00` namespace.
    pub fn commit(&mut self, height: u64) -> Result<CommitMeta, StoreError> {
        if let Some(k) = self
            .changes
            .writes
            .keys()
            .chain(self.changes.ranges.iter().map(|(s, _)| s))
            .find(|k| k.as_slice() < crate::USER_SPACE_START)
        {
            return Err(StoreError::ReservedKey(k.clone()));
        }
        let mut prepared = self.take_prepared(height)?;
        merkle::add_pruning(self.backend.as_ref(), &mut prepared, self.retain)?;
        let meta = CommitMeta {
            height,
            app_hash: prepared.root,
        };
        self.backend.commit(&self.changes, &prepared.raw, &meta)?;
        self.meta = meta.clone();
        self.last_stats = prepared.stats;
        self.changes = ChangeSet::default();
        Ok(meta)
    }
}

impl KvRead for Pending {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(v) = self.changes.writes.get(key) {
            return Ok(v.clone());
        }
        if self.changes.range_deleted(key) {
            return Ok(None);
        }
        Backend::get(self.backend.as_ref(), key)
    }

    fn for_each(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        use std::ops::Bound;
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        if !end.is_empty() && start >= end {
            return Ok(());
        }
        let mut overlay = self
            .changes
            .writes
            .range((Bound::Included(start.to_vec()), upper))
            .peekable();
        let mut stopped = false;
        // Merge: overlay entries not later than the backend's key go first.
        Backend::for_each(self.backend.as_ref(), start, end, &mut |k, v| {
            while let Some((ok, ov)) = overlay.peek() {
                if ok.as_slice() > k {
                    break;
                }
                let same = ok.as_slice() == k;
                if let Some(ov) = ov {
                    if !f(ok, ov) {
                        stopped = true;
                        return false;
                    }
                }
                overlay.next();
                if same {
                    return true; // the overlay shadows this backend pair
                }
            }
            if self.changes.range_deleted(k) {
                return true;
            }
            if !f(k, v) {
                stopped = true;
                return false;
            }
            true
        })?;
        if stopped {
            return Ok(());
        }
        for (k, v) in overlay {
            if let Some(v) = v {
                if !f(k, v) {
                    break;
                }
            }
        }
        Ok(())
    }
}

impl Kv for Pending {
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.prepared = None;
        self.changes.writes.insert(key, Some(value));
    }

    fn delete(&mut self, key: Vec<u8>) {
        self.prepared = None;
        self.changes.writes.insert(key, None);
    }

    fn delete_range(&mut self, start: Vec<u8>, end: Vec<u8>) {
        if !end.is_empty() && start >= end {
            return;
        }
        self.prepared = None;
        self.changes
            .writes
            .retain(|k, _| !in_range(k, &start, &end));
        self.changes.ranges.push((start, end));
    }

    fn for_each_buffered(&self, start: &[u8], end: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) {
        if end <= start {
            return;
        }
        let range = self.changes.writes.range::<[u8], _>((
            std::ops::Bound::Included(start),
            std::ops::Bound::Excluded(end),
        ));
        for (k, v) in range {
            if let Some(v) = v {
                if !f(k, v) {
                    return;
                }
            }
        }
    }
}

//! A block's buffered writes and the reads that see through them.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::{Backend, CommitMeta, Kv, KvRead, StoreError};

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

    /// The chained app hash: `sha256(prev || height || canonical encoding)`.
    pub fn chained_hash(&self, prev: &[u8; 32], height: u64) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"tally/app-hash/v1");
        h.update(prev);
        h.update(height.to_be_bytes());
        for (s, e) in &self.ranges {
            h.update([b'R']);
            put_len_prefixed(&mut h, s);
            put_len_prefixed(&mut h, e);
        }
        for (k, v) in &self.writes {
            match v {
                Some(v) => {
                    h.update([b'P']);
                    put_len_prefixed(&mut h, k);
                    put_len_prefixed(&mut h, v);
                }
                None => {
                    h.update([b'D']);
                    put_len_prefixed(&mut h, k);
                }
            }
        }
        h.finalize().into()
    }
}

fn put_len_prefixed(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
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
}

impl Pending {
    /// Opens pending state on top of `backend`'s last commit.
    pub fn open(backend: Arc<dyn Backend>) -> Result<Self, StoreError> {
        let meta = backend.meta()?.unwrap_or_default();
        Ok(Self {
            backend,
            changes: ChangeSet::default(),
            meta,
        })
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
    }

    /// The app hash the buffered writes would give at `height`.
    pub fn app_hash_at(&self, height: u64) -> [u8; 32] {
        self.changes.chained_hash(&self.meta.app_hash, height)
    }

    /// Replaces the buffered writes (to undo a block executed twice).
    pub fn set_changes(&mut self, changes: ChangeSet) {
        self.changes = changes;
    }

    /// Writes the buffered change set with `height` and its app hash in one
    /// durable batch, and returns the new metadata. Refuses writes into the
    /// reserved `0x00` namespace.
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
        let meta = CommitMeta {
            height,
            app_hash: self.app_hash_at(height),
        };
        self.backend.commit(&self.changes, &meta)?;
        self.meta = meta.clone();
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
        self.changes.writes.insert(key, Some(value));
    }

    fn delete(&mut self, key: Vec<u8>) {
        self.changes.writes.insert(key, None);
    }

    fn delete_range(&mut self, start: Vec<u8>, end: Vec<u8>) {
        if !end.is_empty() && start >= end {
            return;
        }
        self.changes
            .writes
            .retain(|k, _| !in_range(k, &start, &end));
        self.changes.ranges.push((start, end));
    }
}

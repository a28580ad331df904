//! The in-memory twin of the RocksDB backend.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::RwLock;

use crate::changes::in_range;
use crate::{user_start, Backend, ChangeSet, CommitMeta, RawWrite, StoreError, USER_SPACE_START};

/// An in-memory [`Backend`] with the same semantics as RocksDB's: atomic
/// commits, range deletes, metadata beside the data.
#[derive(Debug, Default)]
pub struct MemBackend {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default, Clone)]
struct Inner {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The reserved namespace (the Merkle tree).
    raw: BTreeMap<Vec<u8>, Vec<u8>>,
    meta: Option<CommitMeta>,
}

impl MemBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A deep copy of this store, as if its files were copied.
    pub fn snapshot(&self) -> Self {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner()).clone();
        Self {
            inner: RwLock::new(inner),
        }
    }

    /// Number of stored pairs (metadata excluded).
    pub fn len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .data
            .len()
    }

    /// Number of entries in the reserved namespace (the Merkle tree).
    pub fn raw_len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .raw
            .len()
    }

    /// True when no pair is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Backend for MemBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .data
            .get(key)
            .cloned())
    }

    fn for_each(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let start = user_start(start);
        if !end.is_empty() && start >= end {
            return Ok(());
        }
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        for (k, v) in inner.data.range((Bound::Included(start.to_vec()), upper)) {
            if !f(k, v) {
                break;
            }
        }
        Ok(())
    }

    fn commit(
        &self,
        changes: &ChangeSet,
        raw: &[RawWrite],
        meta: &CommitMeta,
    ) -> Result<(), StoreError> {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        for (k, v) in raw {
            match v {
                Some(v) => inner.raw.insert(k.clone(), v.clone()),
                None => inner.raw.remove(k),
            };
        }
        for (s, e) in &changes.ranges {
            inner.data.retain(|k, _| !in_range(k, s, e));
        }
        for (k, v) in &changes.writes {
            match v {
                Some(v) => inner.data.insert(k.clone(), v.clone()),
                None => inner.data.remove(k),
            };
        }
        inner.meta = Some(meta.clone());
        Ok(())
    }

    fn meta(&self) -> Result<Option<CommitMeta>, StoreError> {
        Ok(self
            .inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .meta
            .clone())
    }

    fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        Ok(if key < USER_SPACE_START {
            inner.raw.get(key).cloned()
        } else {
            inner.data.get(key).cloned()
        })
    }

    fn last_at_or_before(
        &self,
        prefix: &[u8],
        key: &[u8],
    ) -> Result<Option<crate::Pair>, StoreError> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let map = if key < USER_SPACE_START {
            &inner.raw
        } else {
            &inner.data
        };
        Ok(map
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone())))
    }

    fn for_each_raw(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        if start >= end {
            return Ok(());
        }
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let raw = inner
            .raw
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)));
        let data = inner
            .data
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)));
        for (k, v) in raw.chain(data) {
            if !f(k, v) {
                break;
            }
        }
        Ok(())
    }

    fn write_raw(&self, writes: &[RawWrite], _sync: bool) -> Result<(), StoreError> {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        for (k, v) in writes {
            let map = if k.as_slice() < USER_SPACE_START {
                &mut inner.raw
            } else {
                &mut inner.data
            };
            match v {
                Some(v) => map.insert(k.clone(), v.clone()),
                None => map.remove(k),
            };
        }
        Ok(())
    }

    fn wipe(&self) -> Result<(), StoreError> {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = Inner::default();
        Ok(())
    }
}

//! Tally's key-value store.
//!
//! The state machine reads and writes through the small [`KvRead`] / [`Kv`]
//! traits. A block's writes are buffered in a [`Pending`] change set on top of
//! a durable [`Backend`]; [`Pending::commit`] writes the whole change set, the
//! height and the app hash in one atomic batch. Two backends exist: RocksDB
//! ([`RocksBackend`], feature `rocksdb`) and an in-memory twin
//! ([`MemBackend`]) with the same semantics, for tests.
//!
//! Keys starting with byte `0x00` are reserved for the store's own metadata
//! and for the Merkle tree over user space ([`merkle`]) whose root is the app
//! hash; [`proof`] proves single keys against it.
//!
//! Keys starting with byte `0x01` are **side state** ([`is_side`]): written,
//! read, scanned, snapshot and restored like every user key, but not leaves
//! of the tree, so they cost no tree nodes and are in no proof. The state
//! machine must commit to them itself, in tree keys of its own, and check
//! a restored store's side state against those (Tally's report ids, ADR
//! 0025).
//!
//! [`snapshot`] writes committed state as the chunks of a state-sync
//! snapshot and [`restore`] rebuilds a store, tree included, from them.
//!
//! [`halt`] holds the hook both applications on this store use to ask their
//! binary to stop on a fault they cannot answer.

mod changes;
pub mod halt;
mod mem;
pub mod merkle;
pub mod proof;
pub mod restore;
#[cfg(feature = "rocksdb")]
mod rocks;
pub mod snapshot;

pub use changes::{ChangeSet, Pending, DEFAULT_RETAIN_VERSIONS};
pub use mem::MemBackend;
pub use merkle::{RawWrite, TreeStats};
#[cfg(feature = "rocksdb")]
pub use rocks::RocksBackend;

use std::fmt::Debug;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The durable backend failed (I/O, corruption reported by RocksDB).
    #[error("storage backend: {0}")]
    Backend(String),
    /// Stored metadata could not be decoded.
    #[error("corrupt store metadata: {0}")]
    Corrupt(String),
    /// The Merkle tree could not be read or updated.
    #[error("merkle tree: {0}")]
    Tree(String),
    /// A write stored an empty value, which no Merkle proof can carry.
    #[error("key {} was given an empty value; every stored value must be non-empty to be provable", String::from_utf8_lossy(.0))]
    EmptyValue(Vec<u8>),
    /// A write used a key in the reserved `0x00` namespace.
    #[error("key {0:02x?} is in the reserved metadata namespace")]
    ReservedKey(Vec<u8>),
}

/// Key-value pairs in key order, as scans return them.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// One key-value pair.
pub type Pair = (Vec<u8>, Vec<u8>);

/// What the store remembers about the last commit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommitMeta {
    /// Last committed block height (0 before the first block).
    pub height: u64,
    /// App hash after that block.
    pub app_hash: [u8; 32],
}

/// Read access to state. `scan` visits keys in `[start, end)` in ascending
/// order; an empty `end` means "to the end of the key space".
pub trait KvRead {
    /// The value stored under `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Calls `f` for each pair in `[start, end)` in key order until it returns
    /// `false`.
    fn for_each(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;

    /// Up to `limit` pairs of `[start, end)` in key order.
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Pairs, StoreError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.for_each(start, end, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            out.len() < limit
        })?;
        Ok(out)
    }

    /// Up to `limit` pairs whose key starts with `prefix`.
    fn scan_prefix(&self, prefix: &[u8], limit: usize) -> Result<Pairs, StoreError> {
        self.scan(prefix, &prefix_end(prefix), limit)
    }
}

/// Write access to state, buffered until commit.
pub trait Kv: KvRead {
    /// Sets `key` to `value`.
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>);
    /// Removes `key`.
    fn delete(&mut self, key: Vec<u8>);
    /// Removes every key in `[start, end)` (a range tombstone, not a scan).
    fn delete_range(&mut self, start: Vec<u8>, end: Vec<u8>);
    /// Removes every key starting with `prefix`.
    fn delete_prefix(&mut self, prefix: &[u8]) {
        self.delete_range(prefix.to_vec(), prefix_end(prefix));
    }
    /// Visits the puts buffered since the last commit (the current block's)
    /// whose key is in `[start, end)` (`end` not empty), in key order,
    /// until `f` returns `false`; deletes and committed pairs are not
    /// visited. Costs what the buffered range holds, nothing of the
    /// backend: how a block commits to the side state it wrote.
    fn for_each_buffered(&self, start: &[u8], end: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool);
}

/// A durable store of committed state.
pub trait Backend: Send + Sync + Debug {
    /// The committed value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Visits committed pairs of `[start, end)` in key order (empty `end`:
    /// unbounded) until `f` returns `false`. Metadata keys are never visited.
    fn for_each(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;
    /// Writes `changes`, the reserved-namespace writes `raw` (the tree) and
    /// `meta` in one atomic, durable write.
    fn commit(
        &self,
        changes: &ChangeSet,
        raw: &[RawWrite],
        meta: &CommitMeta,
    ) -> Result<(), StoreError>;
    /// The metadata of the last commit, if any.
    fn meta(&self) -> Result<Option<CommitMeta>, StoreError>;
    /// The committed value of any key, the reserved namespace included.
    fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// The greatest committed pair whose key starts with `prefix` and is at
    /// most `key`, the reserved namespace included.
    fn last_at_or_before(&self, prefix: &[u8], key: &[u8]) -> Result<Option<Pair>, StoreError>;
    /// Visits committed pairs of `[start, end)` (`end` not empty) in key
    /// order, the reserved namespace included, until `f` returns `false`.
    fn for_each_raw(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;
    /// Writes `writes` to any key, user space or reserved namespace, without
    /// touching the metadata (state sync's restore); `sync` makes the write
    /// durable before returning.
    fn write_raw(&self, writes: &[RawWrite], sync: bool) -> Result<(), StoreError>;
    /// Removes every key, the metadata included (the start of a restore).
    fn wipe(&self) -> Result<(), StoreError>;
}

impl<T: Backend + ?Sized> Backend for std::sync::Arc<T> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get(key)
    }
    fn for_each(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        (**self).for_each(start, end, f)
    }
    fn commit(
        &self,
        changes: &ChangeSet,
        raw: &[RawWrite],
        meta: &CommitMeta,
    ) -> Result<(), StoreError> {
        (**self).commit(changes, raw, meta)
    }
    fn meta(&self) -> Result<Option<CommitMeta>, StoreError> {
        (**self).meta()
    }
    fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get_raw(key)
    }
    fn last_at_or_before(&self, prefix: &[u8], key: &[u8]) -> Result<Option<Pair>, StoreError> {
        (**self).last_at_or_before(prefix, key)
    }
    fn for_each_raw(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        (**self).for_each_raw(start, end, f)
    }
    fn write_raw(&self, writes: &[RawWrite], sync: bool) -> Result<(), StoreError> {
        (**self).write_raw(writes, sync)
    }
    fn wipe(&self) -> Result<(), StoreError> {
        (**self).wipe()
    }
}

impl<B: Backend + ?Sized> KvRead for B {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Backend::get(self, key)
    }
    fn for_each(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        Backend::for_each(self, start, end, f)
    }
}

/// The smallest key greater than every key starting with `prefix`; empty
/// (unbounded) when no such key exists.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    Vec::new()
}

/// First key after the metadata namespace.
pub(crate) const USER_SPACE_START: &[u8] = b"\x01";

/// First byte of side-state keys: stored and snapshot, never tree leaves.
pub const SIDE: u8 = 0x01;

/// First key after side state: the tree holds every user key from here on.
pub(crate) const TREE_SPACE_START: &[u8] = b"\x02";

/// Whether `key` is side state (first byte [`SIDE`]): not in the Merkle
/// tree, not provable.
pub fn is_side(key: &[u8]) -> bool {
    key.first() == Some(&SIDE)
}

/// Clamps a scan's start to user space so metadata is never visited.
pub(crate) fn user_start(start: &[u8]) -> &[u8] {
    if start < USER_SPACE_START {
        USER_SPACE_START
    } else {
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"ab"), b"ac".to_vec());
        assert_eq!(prefix_end(&[1, 0xff]), vec![2]);
        assert_eq!(prefix_end(&[0xff, 0xff]), Vec::<u8>::new());
    }
}

//! The RocksDB backend.

use std::path::Path;

use rocksdb::{Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions, DB};

use crate::{user_start, Backend, ChangeSet, CommitMeta, RawWrite, StoreError, USER_SPACE_START};

const META_HEIGHT: &[u8] = b"\x00meta/height";
const META_APP_HASH: &[u8] = b"\x00meta/app_hash";

fn encode_meta(meta: &CommitMeta) -> [(&'static [u8], Vec<u8>); 2] {
    [
        (META_HEIGHT, meta.height.to_be_bytes().to_vec()),
        (META_APP_HASH, meta.app_hash.to_vec()),
    ]
}

fn decode_meta(
    height: Option<Vec<u8>>,
    hash: Option<Vec<u8>>,
) -> Result<Option<CommitMeta>, StoreError> {
    match (height, hash) {
        (None, None) => Ok(None),
        (Some(h), Some(a)) => {
            let height = u64::from_be_bytes(
                h.as_slice()
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("height is not 8 bytes".into()))?,
            );
            let app_hash: [u8; 32] = a
                .as_slice()
                .try_into()
                .map_err(|_| StoreError::Corrupt("app hash is not 32 bytes".into()))?;
            Ok(Some(CommitMeta { height, app_hash }))
        }
        _ => Err(StoreError::Corrupt(
            "height and app hash must both exist".into(),
        )),
    }
}

/// Committed state in a RocksDB database. Every commit is one `WriteBatch`
/// written with a synced WAL; range deletes are RocksDB range tombstones.
#[derive(Debug)]
pub struct RocksBackend {
    db: DB,
}

fn backend_err(e: rocksdb::Error) -> StoreError {
    StoreError::Backend(e.into_string())
}

impl RocksBackend {
    /// Opens (creating if missing) the database at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_max_open_files(512);
        opts.increase_parallelism(2);
        opts.set_write_buffer_size(64 << 20);
        let db = DB::open(&opts, path).map_err(backend_err)?;
        Ok(Self { db })
    }

    /// Flushes the memtables and compacts the whole key space, waiting for
    /// both: what is left on disk is the live data (benchmarks).
    pub fn compact(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(backend_err)?;
        self.db.compact_range::<&[u8], &[u8]>(None, None);
        Ok(())
    }

    /// Opens the database at `path` read-only (a checkpoint being exported).
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        let mut opts = Options::default();
        opts.set_max_open_files(256);
        let db = DB::open_for_read_only(&opts, path, false).map_err(backend_err)?;
        Ok(Self { db })
    }

    /// Writes a RocksDB checkpoint of the committed state into `path` (which
    /// must not exist): hard links to the live files on the same file
    /// system, so it is cheap and does not block writers for long. Opened
    /// with [`RocksBackend::open_read_only`] it is a consistent view of the
    /// last commit.
    pub fn checkpoint(&self, path: &Path) -> Result<(), StoreError> {
        let cp = rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(backend_err)?;
        cp.create_checkpoint(path).map_err(backend_err)
    }
}

impl RocksBackend {
    /// Visits `[start, end)` (empty `end`: unbounded) in key order until `f`
    /// returns `false`.
    fn forward(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        if !end.is_empty() && start >= end {
            return Ok(());
        }
        let mut ro = ReadOptions::default();
        if !end.is_empty() {
            ro.set_iterate_upper_bound(end.to_vec());
        }
        for item in self
            .db
            .iterator_opt(IteratorMode::From(start, Direction::Forward), ro)
        {
            let (k, v) = item.map_err(backend_err)?;
            if !f(&k, &v) {
                break;
            }
        }
        Ok(())
    }
}

impl Backend for RocksBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get(key).map_err(backend_err)
    }

    fn for_each(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.forward(user_start(start), end, f)
    }

    fn commit(
        &self,
        changes: &ChangeSet,
        raw: &[RawWrite],
        meta: &CommitMeta,
    ) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for (s, e) in &changes.ranges {
            let start = user_start(s);
            if e.is_empty() {
                // Unbounded: everything from `start` up; 0xff.. sorts after any
                // key the state machine writes (identifiers are ASCII).
                batch.delete_range(start, [0xffu8; 64].as_slice());
            } else {
                batch.delete_range(start, e.as_slice());
            }
        }
        for (k, v) in &changes.writes {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        for (k, v) in raw {
            if k.as_slice() >= USER_SPACE_START {
                return Err(StoreError::Backend(format!(
                    "raw write {k:02x?} outside the reserved namespace"
                )));
            }
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        for (k, v) in encode_meta(meta) {
            batch.put(k, v);
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo).map_err(backend_err)
    }

    fn meta(&self) -> Result<Option<CommitMeta>, StoreError> {
        let h = self.db.get(META_HEIGHT).map_err(backend_err)?;
        let a = self.db.get(META_APP_HASH).map_err(backend_err)?;
        decode_meta(h, a)
    }

    fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get(key).map_err(backend_err)
    }

    fn last_at_or_before(
        &self,
        prefix: &[u8],
        key: &[u8],
    ) -> Result<Option<crate::Pair>, StoreError> {
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(prefix.to_vec());
        let mut it = self
            .db
            .iterator_opt(IteratorMode::From(key, Direction::Reverse), ro);
        match it.next() {
            None => Ok(None),
            Some(item) => {
                let (k, v) = item.map_err(backend_err)?;
                Ok(k.starts_with(prefix).then(|| (k.to_vec(), v.to_vec())))
            }
        }
    }

    fn for_each_raw(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        if end.is_empty() {
            return Err(StoreError::Backend("a raw scan needs an end".into()));
        }
        self.forward(start, end, f)
    }

    fn write_raw(&self, writes: &[RawWrite], sync: bool) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for (k, v) in writes {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(batch, &wo).map_err(backend_err)
    }

    fn wipe(&self) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        // Every key Tally writes sorts below 64 bytes of 0xff.
        batch.delete_range([].as_slice(), [0xffu8; 64].as_slice());
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo).map_err(backend_err)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{Kv, KvRead, MemBackend, Pending};

    #[test]
    fn range_delete_leaves_no_key_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let b: Arc<dyn Backend> = Arc::new(RocksBackend::open(dir.path()).unwrap());
            let mut p = Pending::open(b.clone()).unwrap();
            for i in 0..100u32 {
                p.put(format!("psig/aa/{i:04}").into_bytes(), vec![1]);
            }
            p.put(b"psig/ab/0001".to_vec(), vec![2]);
            p.commit(1).unwrap();
            p.delete_prefix(b"psig/aa/");
            p.commit(2).unwrap();
            assert!(b.scan_prefix(b"psig/aa/", 10).unwrap().is_empty());
            assert_eq!(b.scan_prefix(b"psig/", 10).unwrap().len(), 1);
        }
        let b = RocksBackend::open(dir.path()).unwrap();
        assert_eq!(b.meta().unwrap().unwrap().height, 2);
        assert!(b.scan_prefix(b"psig/aa/", 10).unwrap().is_empty());
    }

    #[test]
    fn rocks_and_memory_agree_on_hashes_and_contents() {
        let dir = tempfile::tempdir().unwrap();
        let r: Arc<dyn Backend> = Arc::new(RocksBackend::open(dir.path()).unwrap());
        let m: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let mut pr = Pending::open(r.clone()).unwrap();
        let mut pm = Pending::open(m.clone()).unwrap();
        for h in 1..=5u64 {
            for p in [&mut pr, &mut pm] {
                for i in 0..20u64 {
                    p.put(
                        format!("k/{:03}", (h * 7 + i) % 50).into_bytes(),
                        h.to_be_bytes().to_vec(),
                    );
                }
                p.delete_range(
                    format!("k/{:03}", h * 3).into_bytes(),
                    format!("k/{:03}", h * 3 + 5).into_bytes(),
                );
                p.delete(b"k/010".to_vec());
            }
            let a = pr.commit(h).unwrap();
            let b = pm.commit(h).unwrap();
            assert_eq!(a, b);
        }
        assert_eq!(
            r.scan(b"", b"", 1000).unwrap(),
            m.scan(b"", b"", 1000).unwrap()
        );
    }
}

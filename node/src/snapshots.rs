//! The node's snapshot files: taken every `snapshot_interval` heights from
//! a RocksDB checkpoint, served to peers that state-sync.
//!
//! Layout under the snapshot directory:
//!
//! ```text
//! <height>/metadata        the snapshot's metadata (tally_store::snapshot)
//! <height>/<index>         chunk <index>, decimal
//! <height>.checkpoint/     the RocksDB checkpoint being exported (transient)
//! <height>.partial/        chunks being written (transient)
//! ```
//!
//! When height `H` is committed and `H` is a multiple of the interval, the
//! commit (on the consensus connection) only creates the checkpoint: hard
//! links to RocksDB's files, a consistent view of `H`. A background thread
//! then reads the checkpoint, writes the chunks into `H.partial`, renames it
//! to `H` when complete, deletes the checkpoint and the snapshots beyond the
//! newest `keep_recent`. One export runs at a time; a height that comes due
//! while one runs is skipped. Transient directories found at start are the
//! remains of a stopped node and are deleted.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tally_abci::{SnapshotInfo, SnapshotStore};
use tally_store::snapshot::{self, Metadata};
use tally_store::RocksBackend;
use tracing::{error, info, warn};

use crate::fs::{FsOp, FsPathError};

/// Snapshots on disk; see the module docs. Cheap to clone: clones share
/// the directory and its list.
#[derive(Debug, Clone)]
pub struct DiskSnapshots(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    interval: u64,
    keep_recent: usize,
    db: Arc<RocksBackend>,
    /// Complete snapshots, newest first.
    ready: Mutex<Vec<Metadata>>,
    /// Set while an export runs.
    busy: AtomicBool,
}

/// Why the snapshot directory could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotDirError {
    /// Reading or cleaning the directory failed.
    #[error("snapshot directory {0}")]
    Io(#[from] FsPathError),
}

impl DiskSnapshots {
    /// Opens (creating) `dir`, deletes what a stopped export left and loads
    /// the complete snapshots. `interval` 0 serves what is there and takes
    /// no new ones.
    pub fn open(
        dir: &Path,
        interval: u64,
        keep_recent: usize,
        db: Arc<RocksBackend>,
    ) -> Result<Self, SnapshotDirError> {
        fs::create_dir_all(dir).map_err(FsPathError::of(FsOp::CreateDir, dir))?;
        let mut ready = Vec::new();
        let list = FsPathError::of(FsOp::ReadDir, dir);
        for entry in fs::read_dir(dir).map_err(&list)? {
            let entry = entry.map_err(&list)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".checkpoint") || name.ends_with(".partial") {
                let path = entry.path();
                fs::remove_dir_all(&path).map_err(FsPathError::of(FsOp::Remove, &path))?;
                continue;
            }
            let Ok(height) = name.parse::<u64>() else {
                continue;
            };
            match load_metadata(&entry.path()) {
                Ok(m) if m.height == height => ready.push(m),
                Ok(_) | Err(_) => {
                    warn!(path = %entry.path().display(), "ignoring a snapshot directory whose metadata is missing or wrong");
                }
            }
        }
        ready.sort_by_key(|m| std::cmp::Reverse(m.height));
        Ok(Self(Arc::new(Shared {
            dir: dir.to_path_buf(),
            interval,
            keep_recent: keep_recent.max(1),
            db,
            ready: Mutex::new(ready),
            busy: AtomicBool::new(false),
        })))
    }

    /// Whether an export is running.
    pub fn exporting(&self) -> bool {
        self.0.busy.load(Ordering::SeqCst)
    }

    /// Takes a snapshot of the last commit, `height`, now (on this thread):
    /// what [`SnapshotStore::committed`] does in the background.
    pub fn take(&self, height: u64) -> Result<Metadata, String> {
        let checkpoint = self.0.checkpoint(height)?;
        self.0.export(height, &checkpoint)
    }
}

impl Shared {
    fn ready(&self) -> std::sync::MutexGuard<'_, Vec<Metadata>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn checkpoint(&self, height: u64) -> Result<PathBuf, String> {
        let checkpoint = self.dir.join(format!("{height}.checkpoint"));
        if checkpoint.exists() {
            fs::remove_dir_all(&checkpoint).map_err(|e| e.to_string())?;
        }
        self.db
            .checkpoint(&checkpoint)
            .map_err(|e| format!("checkpoint: {e}"))?;
        Ok(checkpoint)
    }

    fn export(&self, height: u64, checkpoint: &Path) -> Result<Metadata, String> {
        let result = self.export_inner(height, checkpoint);
        let _ = fs::remove_dir_all(checkpoint);
        let _ = fs::remove_dir_all(self.dir.join(format!("{height}.partial")));
        result
    }

    fn export_inner(&self, height: u64, checkpoint: &Path) -> Result<Metadata, String> {
        let view = RocksBackend::open_read_only(checkpoint).map_err(|e| e.to_string())?;
        let partial = self.dir.join(format!("{height}.partial"));
        let _ = fs::remove_dir_all(&partial);
        fs::create_dir_all(&partial).map_err(|e| e.to_string())?;
        let meta = snapshot::export(&view, &mut |i, chunk| {
            fs::write(partial.join(i.to_string()), chunk)
        })
        .map_err(|e| e.to_string())?;
        drop(view);
        if meta.height != height {
            return Err(format!(
                "the checkpoint holds height {}, not {height}",
                meta.height
            ));
        }
        fs::write(partial.join("metadata"), meta.encode()).map_err(|e| e.to_string())?;
        let done = self.dir.join(height.to_string());
        let _ = fs::remove_dir_all(&done);
        fs::rename(&partial, &done).map_err(|e| e.to_string())?;
        let mut ready = self.ready();
        ready.retain(|m| m.height != height);
        ready.push(meta.clone());
        ready.sort_by_key(|m| std::cmp::Reverse(m.height));
        while ready.len() > self.keep_recent {
            if let Some(old) = ready.pop() {
                let _ = fs::remove_dir_all(self.dir.join(old.height.to_string()));
            }
        }
        Ok(meta)
    }
}

fn load_metadata(dir: &Path) -> Result<Metadata, String> {
    let bytes = fs::read(dir.join("metadata")).map_err(|e| e.to_string())?;
    let m = Metadata::decode(&bytes).map_err(|e| e.to_string())?;
    for i in 0..m.chunks() {
        if !dir.join(i.to_string()).is_file() {
            return Err(format!("chunk {i} is missing"));
        }
    }
    Ok(m)
}

impl SnapshotStore for DiskSnapshots {
    fn list(&self) -> Vec<SnapshotInfo> {
        self.0
            .ready()
            .iter()
            .map(|m| SnapshotInfo {
                metadata: m.clone(),
            })
            .collect()
    }

    fn load_chunk(&self, height: u64, format: u32, chunk: u32) -> Option<Vec<u8>> {
        if format != snapshot::FORMAT || !self.0.ready().iter().any(|m| m.height == height) {
            return None;
        }
        fs::read(self.0.dir.join(height.to_string()).join(chunk.to_string())).ok()
    }

    fn committed(&self, height: u64) {
        let s = &self.0;
        if s.interval == 0 || !height.is_multiple_of(s.interval) {
            return;
        }
        if s.busy.swap(true, Ordering::SeqCst) {
            warn!(
                height,
                "skipping a snapshot: the previous one is still being written"
            );
            return;
        }
        // Only the checkpoint is made here, while nothing else writes the
        // store; reading it into chunks happens on a thread of its own.
        let checkpoint = match s.checkpoint(height) {
            Ok(c) => c,
            Err(e) => {
                error!(height, error = %e, "snapshot checkpoint failed");
                s.busy.store(false, Ordering::SeqCst);
                return;
            }
        };
        let shared = self.0.clone();
        let spawned = std::thread::Builder::new()
            .name("tally-snapshot".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                match shared.export(height, &checkpoint) {
                    Ok(m) => info!(
                        height,
                        chunks = m.chunks(),
                        pairs = m.pairs,
                        ms = started.elapsed().as_millis() as u64,
                        "snapshot taken"
                    ),
                    Err(e) => error!(height, error = %e, "snapshot export failed"),
                }
                shared.busy.store(false, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            error!(height, error = %e, "cannot start the snapshot thread");
            let _ = fs::remove_dir_all(self.0.dir.join(format!("{height}.checkpoint")));
            self.0.busy.store(false, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_store::{Kv, Pending};

    fn wait_idle(s: &DiskSnapshots) {
        for _ in 0..500 {
            if !s.exporting() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the export never finished");
    }

    #[test]
    fn takes_serves_and_prunes_snapshots_and_cleans_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(RocksBackend::open(&dir.path().join("db")).unwrap());
        let snap_dir = dir.path().join("snapshots");
        let snaps = DiskSnapshots::open(&snap_dir, 2, 2, db.clone()).unwrap();
        let mut p = Pending::open(db.clone()).unwrap();
        for h in 1..=7u64 {
            p.put(format!("k/{h}").into_bytes(), vec![h as u8]);
            p.commit(h).unwrap();
            snaps.committed(h);
            wait_idle(&snaps);
        }
        // Heights 2, 4, 6 were due; the newest two are kept, newest first.
        let held: Vec<u64> = snaps.list().iter().map(|s| s.metadata.height).collect();
        assert_eq!(held, vec![6, 4]);
        assert!(!snap_dir.join("2").exists());
        let m = &snaps.list()[0].metadata;
        assert_eq!(m.pairs, 6, "height 6 holds k/1..k/6");
        let chunk = snaps.load_chunk(6, snapshot::FORMAT, 0).unwrap();
        assert_eq!(snapshot::sha256(&chunk), m.chunk_hashes[0]);
        assert!(snaps.load_chunk(6, 2, 0).is_none());
        assert!(snaps.load_chunk(2, snapshot::FORMAT, 0).is_none());
        assert!(snaps.load_chunk(6, snapshot::FORMAT, 9).is_none());
        // Leftovers of a stopped node go; a directory without valid
        // metadata is not served.
        std::fs::create_dir_all(snap_dir.join("8.partial")).unwrap();
        std::fs::create_dir_all(snap_dir.join("8.checkpoint")).unwrap();
        std::fs::create_dir_all(snap_dir.join("10")).unwrap();
        std::fs::write(snap_dir.join("10/metadata"), b"junk").unwrap();
        drop(snaps);
        let again = DiskSnapshots::open(&snap_dir, 2, 2, db).unwrap();
        assert!(!snap_dir.join("8.partial").exists() && !snap_dir.join("8.checkpoint").exists());
        let held: Vec<u64> = again.list().iter().map(|s| s.metadata.height).collect();
        assert_eq!(held, vec![6, 4]);
    }
}

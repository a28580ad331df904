//! Rebuilding a store from a state-sync snapshot ([`crate::snapshot`]).
//!
//! [`Restore::begin`] takes an empty store (one with no commit; whatever an
//! interrupted restore left is wiped) and marks it as being restored;
//! [`Restore::apply`] takes the chunks in order, checks each against the
//! hash the metadata lists for it, decodes it and writes its pairs (each
//! also indexed by its key hash for the tree, except side state, which is
//! no leaf); after the last one it builds
//! the Merkle tree in key-hash order ([`crate::merkle`]), and only if
//! the root equals the snapshot's app hash writes the height and app hash
//! (one synced write that also clears the mark). Any other outcome wipes the
//! store again: a store is either empty, marked as mid-restore (wiped by
//! [`Restore::discard_interrupted`] when the node starts), or whole.

use std::sync::Arc;

use crate::snapshot::{decode_chunk, sha256, Metadata, SnapshotError};
use crate::{merkle, Backend, ChangeSet, CommitMeta, StoreError};

/// Set while a restore is under way (reserved namespace).
const MARKER: &[u8] = b"\x00restore";

/// Why a restore step failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The store already holds committed state: a restore never overwrites it.
    #[error("the store already holds committed state (height {0}); a snapshot is only restored into an empty store")]
    NotEmpty(u64),
    /// The chunk's bytes do not hash to what the metadata lists: the peer
    /// sent something else; the same chunk from another peer may do.
    #[error("chunk {index} does not match its hash in the snapshot metadata")]
    ChunkHash {
        /// The chunk's index.
        index: u32,
    },
    /// Chunks must come in order.
    #[error("chunk {index} arrived, chunk {expected} was expected")]
    OutOfOrder {
        /// The chunk given.
        index: u32,
        /// The chunk expected.
        expected: u32,
    },
    /// The snapshot's own content is broken (it matched its metadata): the
    /// whole snapshot is refused and the store wiped.
    #[error(transparent)]
    Invalid(#[from] SnapshotError),
    /// The chunks hold a different number of pairs than the metadata says.
    #[error("the chunks hold {got} pairs, the metadata says {expected}")]
    PairCount {
        /// Pairs in the metadata.
        expected: u64,
        /// Pairs in the chunks.
        got: u64,
    },
    /// The rebuilt tree's root is not the snapshot's app hash.
    #[error("restored state hashes to {}, the snapshot claims {}", hex(.got), hex(.expected))]
    AppHash {
        /// The app hash of the snapshot.
        expected: [u8; 32],
        /// The root of what was restored.
        got: [u8; 32],
    },
    /// The side state does not match what the tree commits to about it.
    #[error("restored side state does not match the state's commitments: {0}")]
    SideState(String),
    /// The local store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn hex(b: &[u8; 32]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What [`Restore::apply`] did with a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The chunk is in; `next` is the index of the chunk to apply next.
    More {
        /// Next chunk index.
        next: u32,
    },
    /// That was the last chunk: the store is whole at this commit.
    Done(CommitMeta),
}

/// Checks a restored store's side state against the tree before the
/// restore is accepted: `Err` names what does not match.
pub type SideCheck = Box<dyn Fn(&dyn Backend) -> Result<(), String> + Send + Sync>;

/// A restore under way.
pub struct Restore {
    backend: Arc<dyn Backend>,
    meta: Metadata,
    next: u32,
    last_key: Option<Vec<u8>>,
    pairs: u64,
    /// Of those, the pairs that are tree leaves (not side state).
    leaves: u64,
    tree_batch: u64,
    side_check: Option<SideCheck>,
}

impl std::fmt::Debug for Restore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Restore")
            .field("meta", &self.meta)
            .field("next", &self.next)
            .field("pairs", &self.pairs)
            .field("leaves", &self.leaves)
            .field("side_check", &self.side_check.is_some())
            .finish()
    }
}

impl Restore {
    /// Starts restoring the snapshot `meta` into `backend`, which must hold
    /// no commit; anything else in it is wiped.
    pub fn begin(backend: Arc<dyn Backend>, meta: Metadata) -> Result<Self, RestoreError> {
        if let Some(m) = backend.meta()? {
            return Err(RestoreError::NotEmpty(m.height));
        }
        backend.wipe()?;
        backend.write_raw(&[(MARKER.to_vec(), Some(vec![1]))], true)?;
        Ok(Self {
            backend,
            meta,
            next: 0,
            last_key: None,
            pairs: 0,
            leaves: 0,
            tree_batch: merkle::RESTORE_BATCH,
            side_check: None,
        })
    }

    /// Checks the side state with `check` once the tree's root matched,
    /// before the restore is accepted: the tree does not cover side state,
    /// so only what the state machine committed to in it can vouch for it.
    pub fn set_side_check(&mut self, check: SideCheck) {
        self.side_check = Some(check);
    }

    /// Keys per tree version while the tree is rebuilt (default
    /// 20,000): fewer bound memory further at the cost of more versions.
    pub fn set_tree_batch(&mut self, keys: u64) {
        self.tree_batch = keys.max(1);
    }

    /// The snapshot being restored.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// The index of the next chunk to apply.
    pub fn next_chunk(&self) -> u32 {
        self.next
    }

    /// Applies chunk `index`. A wrong hash or index leaves the restore as it
    /// was (the chunk may be fetched again); any other error wipes the store
    /// and ends the restore (`self` must then be dropped).
    pub fn apply(&mut self, index: u32, chunk: &[u8]) -> Result<Applied, RestoreError> {
        if index != self.next {
            return Err(RestoreError::OutOfOrder {
                index,
                expected: self.next,
            });
        }
        let expected =
            self.meta
                .chunk_hashes
                .get(index as usize)
                .ok_or(RestoreError::OutOfOrder {
                    index,
                    expected: self.next,
                })?;
        if sha256(chunk) != *expected {
            return Err(RestoreError::ChunkHash { index });
        }
        match self.write_chunk(index, chunk) {
            Ok(done) => Ok(done),
            Err(e) => {
                // Leave nothing half-restored behind; the marker goes too.
                self.backend.wipe()?;
                Err(e)
            }
        }
    }

    fn write_chunk(&mut self, index: u32, chunk: &[u8]) -> Result<Applied, RestoreError> {
        let pairs = decode_chunk(index, chunk, self.last_key.as_deref())?;
        self.pairs += pairs.len() as u64;
        if self.pairs > self.meta.pairs {
            return Err(RestoreError::PairCount {
                expected: self.meta.pairs,
                got: self.pairs,
            });
        }
        self.last_key = pairs.last().map(|(k, _)| k.clone());
        let mut writes = Vec::with_capacity(pairs.len() * 3);
        self.leaves += pairs.iter().filter(|(k, _)| !crate::is_side(k)).count() as u64;
        merkle::index_pairs(&pairs, self.meta.height, &mut writes);
        // The pairs come in key order (decode_chunk checks it).
        writes.extend(pairs.into_iter().map(|(k, v)| (k, Some(v))));
        self.backend.write_raw(&writes, false)?;
        self.next += 1;
        if self.next < self.meta.chunks() {
            return Ok(Applied::More { next: self.next });
        }
        if self.pairs != self.meta.pairs {
            return Err(RestoreError::PairCount {
                expected: self.meta.pairs,
                got: self.pairs,
            });
        }
        let root = merkle::restore_tree(
            self.backend.as_ref(),
            self.meta.height,
            self.leaves,
            self.tree_batch,
        )?;
        if root != self.meta.app_hash {
            return Err(RestoreError::AppHash {
                expected: self.meta.app_hash,
                got: root,
            });
        }
        if let Some(check) = &self.side_check {
            check(self.backend.as_ref()).map_err(RestoreError::SideState)?;
        }
        let meta = CommitMeta {
            height: self.meta.height,
            app_hash: root,
        };
        // One synced write: the metadata and the marker's removal (it also
        // makes every earlier unsynced write of the restore durable).
        self.backend
            .commit(&ChangeSet::default(), &[(MARKER.to_vec(), None)], &meta)?;
        Ok(Applied::Done(meta))
    }

    /// Gives up: wipes what was restored so far.
    pub fn abort(self) -> Result<(), StoreError> {
        self.backend.wipe()
    }

    /// Wipes what an interrupted restore left in `backend`; returns whether
    /// there was one. Called when a node opens its store.
    pub fn discard_interrupted(backend: &dyn Backend) -> Result<bool, StoreError> {
        if backend.get_raw(MARKER)?.is_none() {
            return Ok(false);
        }
        backend.wipe()?;
        Ok(true)
    }
}

//! The Merkle commitment over state: a Jellyfish Merkle tree (`jmt`, SHA-256)
//! whose root is the app hash.
//!
//! # What is committed
//!
//! Every user-space pair (key ≥ `0x01`) of the store except side state
//! (first byte `0x01`, [`crate::is_side`]) is a leaf of the tree:
//! the leaf's key hash is `sha256(key)`, its value hash `sha256(value)`. The
//! tree's version is the block height; a block's change set becomes one tree
//! version, range deletes expanded into point deletes of the committed keys
//! they cover. The root at version `H` is the app hash of block `H` (the one
//! CometBFT puts in header `H + 1`). Proofs are ICS23 `CommitmentProof`s
//! under jmt's proof spec ([`crate::proof`]).
//!
//! # Where the tree lives
//!
//! Beside the flat state, in the store's reserved `0x00` namespace, written in
//! the same atomic batch as the block's state and metadata:
//!
//! | key | value |
//! |-----|-------|
//! | `\0t/n/` + borsh(NodeKey) | borsh(Node) |
//! | `\0t/v/` + key hash (32) + version (8, BE) | the value written at that version |
//! | `\0t/s/` + stale-since version (8, BE) + `n` + borsh(NodeKey) | empty: a node no version ≥ stale-since uses |
//! | `\0t/s/` + stale-since version (8, BE) + `v` + key hash + version | empty: a value replaced or deleted at stale-since |
//! | `\0t/s/` + stale-since version (8, BE) + `k` + key hash | empty: a key deleted at stale-since (its preimage goes unless re-inserted) |
//! | `\0t/k/` + key hash | the key (non-existence proofs name their neighbours) |
//! | `\0t/latest` | latest version (8, BE) |
//! | `\0t/oldest` | oldest version still whole (8, BE) |
//!
//! Empty values are refused ([`StoreError::EmptyValue`]): ICS23 cannot prove
//! one, nor the absence of a key next to one. Deletes write no value entry: jmt reads a value only after finding the
//! key's leaf at the version asked, and a re-inserted key writes a new entry.
//!
//! # Pruning
//!
//! With `retain` versions kept (0: keep every version), committing version `H`
//! removes the nodes and values stale since a version ≤ `H + 1 - retain`, at
//! most [`MAX_PRUNE_PER_COMMIT`] of them per commit, oldest first, and records
//! the oldest version every one of whose nodes is still stored. Pruning never
//! changes a root: nodes may keep different histories, the app hash is the same.

use std::collections::BTreeMap;

use borsh::BorshDeserialize;
use jmt::storage::{HasPreimage, LeafNode, Node, NodeKey, TreeReader, TreeUpdateBatch};
use jmt::{KeyHash, OwnedValue, Sha256Jmt, Version};
use sha2::Sha256;

use crate::{is_side, Backend, ChangeSet, StoreError, TREE_SPACE_START};

pub(crate) const NODE: &[u8] = b"\x00t/n/";
pub(crate) const VALUE: &[u8] = b"\x00t/v/";
pub(crate) const STALE: &[u8] = b"\x00t/s/";
pub(crate) const PREIMAGE: &[u8] = b"\x00t/k/";
pub(crate) const LATEST: &[u8] = b"\x00t/latest";
pub(crate) const OLDEST: &[u8] = b"\x00t/oldest";

/// Most stale nodes and values one commit removes (the rest wait for the
/// next commits): bounds the work pruning adds to a block.
pub const MAX_PRUNE_PER_COMMIT: usize = 20_000;

/// Most empty versions a commit may fill between the tree's latest version
/// and the committed height (a chain starting at a high `initial_height`).
pub const MAX_VERSION_GAP: u64 = 100_000;

/// A raw write into the reserved namespace: `None` deletes.
pub type RawWrite = (Vec<u8>, Option<Vec<u8>>);

/// What committing one version costs, for benchmarks and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Leaves written or deleted (the block's key updates).
    pub key_updates: usize,
    /// Tree nodes written.
    pub nodes_written: usize,
    /// Stale nodes and values removed by pruning.
    pub pruned: usize,
    /// Bytes of the tree's raw writes (keys and values).
    pub raw_bytes: usize,
    /// Bytes of the flat state's point writes (keys and values).
    pub state_bytes: usize,
}

/// One version of the tree, computed but not yet written.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub height: u64,
    pub root: [u8; 32],
    pub raw: Vec<RawWrite>,
    pub stats: TreeStats,
}

/// Reads the tree from a backend's committed raw keys.
pub(crate) struct Reader<'a> {
    pub backend: &'a dyn Backend,
}

fn node_key(k: &NodeKey) -> Result<Vec<u8>, StoreError> {
    let mut out = NODE.to_vec();
    borsh::to_writer(&mut out, k).map_err(|e| StoreError::Corrupt(format!("node key: {e}")))?;
    Ok(out)
}

fn value_key(kh: &KeyHash, version: Version) -> Vec<u8> {
    let mut out = Vec::with_capacity(VALUE.len() + 40);
    out.extend_from_slice(VALUE);
    out.extend_from_slice(&kh.0);
    out.extend_from_slice(&version.to_be_bytes());
    out
}

fn stale_prefix(since: Version, kind: u8) -> Vec<u8> {
    let mut out = STALE.to_vec();
    out.extend_from_slice(&since.to_be_bytes());
    out.push(kind);
    out
}

pub(crate) fn read_u64(backend: &dyn Backend, key: &[u8]) -> Result<Option<u64>, StoreError> {
    match backend.get_raw(key)? {
        None => Ok(None),
        Some(b) => Ok(Some(u64::from_be_bytes(b.as_slice().try_into().map_err(
            |_| StoreError::Corrupt(format!("{} is not 8 bytes", String::from_utf8_lossy(key))),
        )?))),
    }
}

impl Reader<'_> {
    /// The latest value entry of `kh` at or before `max_version`.
    fn value_entry(
        &self,
        kh: &KeyHash,
        max_version: Version,
    ) -> Result<Option<(Version, Vec<u8>)>, StoreError> {
        let mut prefix = VALUE.to_vec();
        prefix.extend_from_slice(&kh.0);
        let Some((k, v)) = self
            .backend
            .last_at_or_before(&prefix, &value_key(kh, max_version))?
        else {
            return Ok(None);
        };
        let version = k
            .get(prefix.len()..)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| StoreError::Corrupt("tree value key".into()))?;
        Ok(Some((version, v)))
    }
}

impl TreeReader for Reader<'_> {
    fn get_node_option(&self, key: &NodeKey) -> anyhow::Result<Option<Node>> {
        match self.backend.get_raw(&node_key(key)?)? {
            None => Ok(None),
            Some(b) => Ok(Some(Node::try_from_slice(&b)?)),
        }
    }

    fn get_value_option(
        &self,
        max_version: Version,
        key_hash: KeyHash,
    ) -> anyhow::Result<Option<OwnedValue>> {
        Ok(self.value_entry(&key_hash, max_version)?.map(|(_, v)| v))
    }

    fn get_rightmost_leaf(&self) -> anyhow::Result<Option<(NodeKey, LeafNode)>> {
        // Only jmt's chunked restore asks for this; Tally never restores a
        // tree from chunks (state sync copies whole stores).
        anyhow::bail!(
            "the rightmost-leaf lookup of jmt's restore is not supported by Tally's store"
        )
    }
}

impl HasPreimage for Reader<'_> {
    fn preimage(&self, key_hash: KeyHash) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self.backend.get_raw(&preimage_key(&key_hash))?)
    }
}

fn preimage_key(kh: &KeyHash) -> Vec<u8> {
    let mut out = PREIMAGE.to_vec();
    out.extend_from_slice(&kh.0);
    out
}

fn tree_err(e: anyhow::Error) -> StoreError {
    StoreError::Tree(format!("{e:#}"))
}

/// The tree's point updates for `changes` on top of the committed state.
fn updates(
    backend: &dyn Backend,
    changes: &ChangeSet,
) -> Result<BTreeMap<Vec<u8>, Option<Vec<u8>>>, StoreError> {
    let mut out: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    for (s, e) in &changes.ranges {
        // Side state is no leaf: a range delete touches the tree only
        // where it reaches past it (and reads nothing of the side keys).
        let s = if s.as_slice() < TREE_SPACE_START {
            TREE_SPACE_START
        } else {
            s.as_slice()
        };
        if !e.is_empty() && e.as_slice() <= s {
            continue;
        }
        backend.for_each(s, e, &mut |k, _| {
            out.insert(k.to_vec(), None);
            true
        })?;
    }
    for (k, v) in changes.writes.iter().filter(|(k, _)| !is_side(k)) {
        match v {
            Some(v) => {
                out.insert(k.clone(), Some(v.clone()));
            }
            // A delete of a key the tree does not hold changes nothing (a
            // key a range delete covered is already a delete).
            None => {
                if !out.contains_key(k) && backend.get(k)?.is_some() {
                    out.insert(k.clone(), None);
                }
            }
        }
    }
    Ok(out)
}

/// Adds the writes of `batch`'s new nodes to `raw`; returns how many.
fn push_nodes(batch: &TreeUpdateBatch, raw: &mut Vec<RawWrite>) -> Result<usize, StoreError> {
    for (k, node) in batch.node_batch.nodes() {
        let v = borsh::to_vec(node).map_err(|e| StoreError::Corrupt(format!("node: {e}")))?;
        raw.push((node_key(k)?, Some(v)));
    }
    Ok(batch.node_batch.nodes().len())
}

/// Computes version `height` of the tree for `changes` (not written):
/// FinalizeBlock's part, everything the root depends on. Pruning is added
/// at Commit by [`add_pruning`].
pub(crate) fn prepare(
    backend: &dyn Backend,
    changes: &ChangeSet,
    height: u64,
) -> Result<Prepared, StoreError> {
    let latest = read_u64(backend, LATEST)?;
    let first = latest.map_or(0, |v| v + 1);
    if height < first {
        return Err(StoreError::Tree(format!(
            "height {height} is not above the tree's latest version {}",
            first - 1
        )));
    }
    let gap = height - first;
    if gap > MAX_VERSION_GAP {
        return Err(StoreError::Tree(format!(
            "height {height} is {gap} versions past the tree's next version {first}; at most {MAX_VERSION_GAP} may be filled"
        )));
    }
    let reader = Reader { backend };
    let updates = updates(backend, changes)?;
    let mut raw: Vec<RawWrite> = Vec::new();
    let mut set = Vec::with_capacity(updates.len());
    for (k, v) in &updates {
        if v.as_ref().is_some_and(Vec::is_empty) {
            // ICS23 proves no empty value, nor the absence of a key whose
            // neighbour holds one: a state machine bug, refused loudly.
            return Err(StoreError::EmptyValue(k.clone()));
        }
        let kh = KeyHash::with::<Sha256>(k);
        // The entry this write supersedes becomes stale at `height`.
        if let Some((old, _)) = reader.value_entry(&kh, height)? {
            let mut s = stale_prefix(height, b'v');
            s.extend_from_slice(&kh.0);
            s.extend_from_slice(&old.to_be_bytes());
            raw.push((s, Some(Vec::new())));
        }
        match v {
            Some(v) => {
                raw.push((value_key(&kh, height), Some(v.clone())));
                raw.push((preimage_key(&kh), Some(k.clone())));
            }
            None => {
                let mut s = stale_prefix(height, b'k');
                s.extend_from_slice(&kh.0);
                raw.push((s, Some(Vec::new())));
            }
        }
        set.push((kh, v.clone()));
    }
    let key_updates = set.len();
    let mut sets: Vec<Vec<(KeyHash, Option<OwnedValue>)>> = (0..gap).map(|_| Vec::new()).collect();
    sets.push(set);
    let tree = Sha256Jmt::new(&reader);
    let (roots, batch) = tree.put_value_sets(sets, first).map_err(tree_err)?;
    let root = roots
        .last()
        .ok_or_else(|| StoreError::Tree("jmt returned no root".into()))?
        .0;
    let nodes_written = push_nodes(&batch, &mut raw)?;
    for s in &batch.stale_node_index_batch {
        let mut k = stale_prefix(s.stale_since_version, b'n');
        borsh::to_writer(&mut k, &s.node_key)
            .map_err(|e| StoreError::Corrupt(format!("node key: {e}")))?;
        raw.push((k, Some(Vec::new())));
    }
    raw.push((LATEST.to_vec(), Some(height.to_be_bytes().to_vec())));
    Ok(Prepared {
        height,
        root,
        raw,
        stats: TreeStats {
            key_updates,
            nodes_written,
            pruned: 0,
            raw_bytes: 0,
            state_bytes: changes
                .writes
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum(),
        },
    })
}

/// Commit's part: adds to `p` the pruning of what no kept version needs
/// (it never changes the root) and completes its statistics.
pub(crate) fn add_pruning(
    backend: &dyn Backend,
    p: &mut Prepared,
    retain: u64,
) -> Result<(), StoreError> {
    p.stats.pruned = prune(backend, p.height, retain, &mut p.raw)?;
    p.stats.raw_bytes = p
        .raw
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum();
    Ok(())
}

/// Adds to `raw` the deletes of what is stale since a version no retained
/// version needs, and the new oldest whole version; returns how many
/// nodes and values go.
fn prune(
    backend: &dyn Backend,
    height: u64,
    retain: u64,
    raw: &mut Vec<RawWrite>,
) -> Result<usize, StoreError> {
    if retain == 0 || height < retain {
        return Ok(0);
    }
    let cutoff = height + 1 - retain;
    let end = stale_prefix(cutoff + 1, 0);
    let mut entries: Vec<Vec<u8>> = Vec::new();
    backend.for_each_raw(STALE, &end, &mut |k, _| {
        entries.push(k.to_vec());
        entries.len() < MAX_PRUNE_PER_COMMIT
    })?;
    let complete = entries.len() < MAX_PRUNE_PER_COMMIT;
    let mut last_since = None;
    for k in &entries {
        let rest = &k[STALE.len()..];
        let (since, rest) = rest.split_at_checked(8).ok_or_else(|| stale_corrupt(k))?;
        let since = u64::from_be_bytes(since.try_into().map_err(|_| stale_corrupt(k))?);
        let (kind, payload) = rest.split_first().ok_or_else(|| stale_corrupt(k))?;
        match kind {
            b'n' => {
                let mut nk = NODE.to_vec();
                nk.extend_from_slice(payload);
                raw.push((nk, None));
            }
            b'v' => {
                let mut vk = VALUE.to_vec();
                vk.extend_from_slice(payload);
                raw.push((vk, None));
            }
            b'k' => {
                let kh = KeyHash(payload.try_into().map_err(|_| stale_corrupt(k))?);
                // Re-inserted after the delete: the key is live again.
                let reader = Reader { backend };
                let live = reader
                    .value_entry(&kh, u64::MAX)?
                    .is_some_and(|(v, _)| v > since);
                if !live {
                    raw.push((preimage_key(&kh), None));
                }
            }
            _ => return Err(stale_corrupt(k)),
        }
        raw.push((k.clone(), None));
        last_since = Some(since);
    }
    // Versions below `oldest` may miss nodes; a version at or above it has
    // all of its own (what is stale since `s` serves only versions < `s`).
    let oldest = if complete { Some(cutoff) } else { last_since };
    if let Some(o) = oldest {
        let prev = read_u64(backend, OLDEST)?.unwrap_or(0);
        if o > prev {
            raw.push((OLDEST.to_vec(), Some(o.to_be_bytes().to_vec())));
        }
    }
    Ok(entries.len())
}

fn stale_corrupt(k: &[u8]) -> StoreError {
    StoreError::Corrupt(format!("stale index key {k:02x?}"))
}

mod rebuild;
pub(crate) use rebuild::{index_pairs, restore_tree, RESTORE_BATCH};

//! Building the Merkle tree over a store restored from a snapshot, which
//! has every pair but no tree: each pair is indexed by its key hash as its
//! chunk is written ([`index_pairs`]), then the values go into the tree in
//! key-hash order, in bounded batches on top of an empty base version
//! ([`restore_tree`]), so the root equals the one the snapshot's source
//! computed block by block (a tree is a function of its key set).

use jmt::storage::{LeafNode, Node, NodeKey, TreeReader};
use jmt::{KeyHash, OwnedValue, Sha256Jmt, Version};
use sha2::Sha256;

use super::{node_key, preimage_key, push_nodes, tree_err, value_key, RawWrite, Reader};
use super::{LATEST, OLDEST, VALUE};
use crate::{Backend, StoreError};

/// Keys a restore puts into one tree version (bounds its memory).
pub(crate) const RESTORE_BATCH: u64 = 20_000;

/// A reader that sees an empty tree at `base`: a restore builds its first
/// version on top of nothing.
struct RestoreReader<'a> {
    inner: Reader<'a>,
    /// The version whose root is the empty tree.
    base: Version,
}

impl TreeReader for RestoreReader<'_> {
    fn get_node_option(&self, key: &NodeKey) -> anyhow::Result<Option<Node>> {
        if key.version() == self.base && key.nibble_path().is_empty() {
            return Ok(Some(Node::Null));
        }
        self.inner.get_node_option(key)
    }

    fn get_value_option(
        &self,
        max_version: Version,
        key_hash: KeyHash,
    ) -> anyhow::Result<Option<OwnedValue>> {
        self.inner.get_value_option(max_version, key_hash)
    }

    fn get_rightmost_leaf(&self) -> anyhow::Result<Option<(NodeKey, LeafNode)>> {
        self.inner.get_rightmost_leaf()
    }
}

/// The tree's reserved entries for restored pairs, written as each chunk
/// is applied: per pair that is a leaf (side state is not) its value at
/// version `height` (key hash and version → value) and its preimage (key
/// hash → key). [`restore_tree`]
/// then reads the values back in key-hash order, which is the tree's own
/// order. Each kind is pushed in key-hash order, so RocksDB's memtable
/// inserts every entry next to the one before.
pub(crate) fn index_pairs(pairs: &[(Vec<u8>, Vec<u8>)], height: u64, raw: &mut Vec<RawWrite>) {
    let mut by_hash: Vec<(KeyHash, usize)> = pairs
        .iter()
        .enumerate()
        .filter(|(_, (k, _))| !crate::is_side(k))
        .map(|(i, (k, _))| (KeyHash::with::<Sha256>(k), i))
        .collect();
    by_hash.sort_unstable_by_key(|(kh, _)| kh.0);
    raw.reserve(pairs.len() * 2);
    for (kh, i) in &by_hash {
        raw.push((value_key(kh, height), Some(pairs[*i].1.clone())));
    }
    for (kh, i) in &by_hash {
        raw.push((preimage_key(kh), Some(pairs[*i].0.clone())));
    }
}

/// Builds the tree over the restored pairs of `backend` (each indexed by
/// [`index_pairs`] at version `height`, no tree yet) so that its version
/// `height` holds them all; returns its root. `pairs` is how many there
/// are.
///
/// The values are read back in key-hash order and go into the tree in
/// batches of `batch` (default [`RESTORE_BATCH`]) at the versions just
/// below `height`, each batch written before the next is read, so memory
/// stays bounded. Because each batch's key hashes all follow the previous
/// batch's, a batch adds a subtree to the right of what is built and
/// rewrites only the path along the tree's right edge: the tree is built
/// close to once, not rebuilt per batch (the nodes a batch does replace are
/// deleted at once). The oldest whole version is `height`: no version
/// below it answers proofs. A tree is a function of its key set, so the
/// root equals the one the snapshot's source computed block by block.
pub(crate) fn restore_tree(
    backend: &dyn Backend,
    height: u64,
    pairs: u64,
    batch: u64,
) -> Result<[u8; 32], StoreError> {
    if height == 0 {
        return Err(StoreError::Tree("a restore needs a height above 0".into()));
    }
    let batch = batch.max(1).max(pairs.div_ceil(height));
    let versions = pairs.div_ceil(batch).max(1);
    let first = height + 1 - versions;
    let base = first - 1;
    let mut root = None;
    let mut next: Vec<u8> = VALUE.to_vec();
    let value_end = crate::prefix_end(VALUE);
    let mut seen = 0u64;
    for version in first..=height {
        let mut set: Vec<(KeyHash, OwnedValue)> = Vec::new();
        let mut last = None;
        let mut bad = None;
        backend.for_each_raw(&next, &value_end, &mut |k, v| {
            match parse_value_key(k, height) {
                Some(kh) => set.push((kh, v.to_vec())),
                None => bad = Some(k.to_vec()),
            }
            last = Some(k.to_vec());
            bad.is_none() && (set.len() as u64) < batch
        })?;
        if let Some(k) = bad {
            return Err(StoreError::Corrupt(format!(
                "a restored value entry {k:02x?} is not at version {height}"
            )));
        }
        if let Some(mut k) = last {
            k.push(0);
            next = k;
        }
        seen += set.len() as u64;
        let reader = RestoreReader {
            inner: Reader { backend },
            base,
        };
        let jmt = Sha256Jmt::new(&reader);
        let (r, b) = if set.is_empty() {
            // A snapshot of no pairs: the empty tree's root (fewer values
            // than pairs is refused below).
            jmt.put_value_set(Vec::new(), version).map_err(tree_err)?
        } else {
            // jmt's batch insert builds each node of the batch once (one
            // insert at a time rehashes the path to the root per key).
            let (roots, b) = jmt
                .batch_put_value_sets(vec![set], None, version)
                .map_err(tree_err)?;
            let r = roots
                .last()
                .copied()
                .ok_or_else(|| StoreError::Tree("jmt returned no root".into()))?;
            (r, b)
        };
        let mut raw: Vec<RawWrite> = Vec::with_capacity(b.node_batch.nodes().len() + 1);
        push_nodes(&b, &mut raw)?;
        // Nodes of earlier batches the new one replaced serve no version a
        // query may ask for; the empty base root was never stored.
        for s in &b.stale_node_index_batch {
            if s.node_key.version() >= first {
                raw.push((node_key(&s.node_key)?, None));
            }
        }
        raw.push((LATEST.to_vec(), Some(version.to_be_bytes().to_vec())));
        // In key order RocksDB's memtable inserts each key next to the last.
        raw.sort_by(|a, b| a.0.cmp(&b.0));
        backend.write_raw(&raw, false)?;
        root = Some(r.0);
    }
    if seen != pairs {
        return Err(StoreError::Corrupt(format!(
            "the restore indexed {seen} values for {pairs} pairs"
        )));
    }
    backend.write_raw(
        &[(OLDEST.to_vec(), Some(height.to_be_bytes().to_vec()))],
        false,
    )?;
    root.ok_or_else(|| StoreError::Tree("no version was built".into()))
}

/// The key hash of a value entry at exactly `version`; `None` for any
/// other shape or version.
fn parse_value_key(k: &[u8], version: u64) -> Option<KeyHash> {
    let rest = k.strip_prefix(VALUE)?;
    if rest.len() != 40 || rest[32..] != version.to_be_bytes() {
        return None;
    }
    let mut kh = [0u8; 32];
    kh.copy_from_slice(&rest[..32]);
    Some(KeyHash(kh))
}

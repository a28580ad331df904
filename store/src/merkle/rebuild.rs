//! Building the Merkle tree over a store restored from a snapshot, which
//! has every pair but no tree: the keys go into the tree in bounded batches
//! on top of an empty base version, so the root equals the one the
//! snapshot's source computed block by block (a tree is a function of its
//! key set).

use jmt::storage::{LeafNode, Node, NodeKey, TreeReader};
use jmt::{KeyHash, OwnedValue, Sha256Jmt, Version};
use sha2::Sha256;

use super::{node_key, preimage_key, push_nodes, tree_err, value_key, RawWrite, Reader};
use super::{LATEST, OLDEST};
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

/// Builds the tree over every user-space pair of `backend` (restored from a
/// snapshot, with no tree yet) so that its version `height` holds them all;
/// returns its root. `pairs` is how many pairs there are. The keys go in
/// batches of `batch` (default [`RESTORE_BATCH`]) at the versions just below `height`, each
/// batch written before the next is read, so memory stays bounded; the
/// nodes a later batch replaces are deleted at once and the oldest whole
/// version is `height`: no version below it answers proofs. A tree is a
/// function of its key set, so the root equals the one the snapshot's
/// source computed block by block.
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
    let mut next: Vec<u8> = crate::USER_SPACE_START.to_vec();
    for version in first..=height {
        let mut kvs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        backend.for_each(&next, b"", &mut |k, v| {
            kvs.push((k.to_vec(), v.to_vec()));
            (kvs.len() as u64) < batch
        })?;
        if let Some((k, _)) = kvs.last() {
            next = k.clone();
            next.push(0);
        }
        let mut raw: Vec<RawWrite> = Vec::with_capacity(kvs.len() * 3);
        let mut set = Vec::with_capacity(kvs.len());
        for (k, v) in kvs {
            let kh = KeyHash::with::<Sha256>(&k);
            raw.push((value_key(&kh, version), Some(v.clone())));
            raw.push((preimage_key(&kh), Some(k)));
            set.push((kh, Some(v)));
        }
        let reader = RestoreReader {
            inner: Reader { backend },
            base,
        };
        let (r, b) = Sha256Jmt::new(&reader)
            .put_value_set(set, version)
            .map_err(tree_err)?;
        push_nodes(&b, &mut raw)?;
        // Nodes of earlier batches the new one replaced serve no version a
        // query may ask for; the empty base root was never stored.
        for s in &b.stale_node_index_batch {
            if s.node_key.version() >= first {
                raw.push((node_key(&s.node_key)?, None));
            }
        }
        raw.push((LATEST.to_vec(), Some(version.to_be_bytes().to_vec())));
        backend.write_raw(&raw, false)?;
        root = Some(r.0);
    }
    backend.write_raw(
        &[(OLDEST.to_vec(), Some(height.to_be_bytes().to_vec()))],
        false,
    )?;
    root.ok_or_else(|| StoreError::Tree("no version was built".into()))
}

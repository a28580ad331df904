//! State-sync snapshots: committed state as a list of chunks and a
//! metadata blob that names them.
//!
//! # Format 1
//!
//! A snapshot of height `H` holds every user-space pair (key ≥ `0x01`) of the
//! state committed at `H`, in ascending key order: exactly the leaves of the
//! Merkle tree whose root is the app hash of `H` ([`crate::merkle`]). The
//! tree itself and the store's metadata are not shipped; [`crate::restore`]
//! rebuilds the tree from the pairs, and the snapshot is accepted only when
//! the rebuilt root equals the app hash the node's light client trusts.
//!
//! The pair stream is cut at pair boundaries into chunks of about
//! [`CHUNK_TARGET`] bytes, so every chunk decodes on its own. A chunk is a
//! sequence of
//!
//! ```text
//! key length (u32, big-endian) | key | value length (u32, BE) | value
//! ```
//!
//! with no header. Keys are strictly ascending across the whole snapshot,
//! values are non-empty.
//!
//! The metadata (CometBFT's `Snapshot.metadata`) is
//!
//! ```text
//! "tally-snapshot" | format (u32 BE) = 1 | height (u64 BE) | app hash (32)
//!   | pairs (u64 BE) | chunk count n (u32 BE) | n × sha256(chunk)
//! ```
//!
//! and the snapshot hash (`Snapshot.hash`) is `sha256(metadata)`. A node
//! applying a chunk checks its hash against the metadata before reading it,
//! so a peer serving a wrong chunk is caught by that check alone.
//!
//! Every length that crosses the network is capped: [`MAX_CHUNKS`] chunks,
//! [`MAX_CHUNK_BYTES`] per chunk, [`MAX_KEY_BYTES`] per key,
//! [`MAX_VALUE_BYTES`] per value.

use sha2::{Digest, Sha256};

use crate::{Backend, StoreError, USER_SPACE_START};

/// The only snapshot format this version writes and reads.
pub const FORMAT: u32 = 1;

/// Chunks are cut at the first pair boundary at or after this many bytes.
pub const CHUNK_TARGET: usize = 4 << 20;

/// Largest chunk accepted (CometBFT's chunk message holds 16 MB).
pub const MAX_CHUNK_BYTES: usize = 12 << 20;

/// Most chunks one snapshot may have (the metadata then stays below
/// CometBFT's 4 MB snapshot message).
pub const MAX_CHUNKS: u32 = 100_000;

/// Largest key accepted in a snapshot (the store's queries refuse keys
/// above 1 KiB; the slack is for future key kinds).
pub const MAX_KEY_BYTES: usize = 4096;

/// Largest value accepted in a snapshot.
pub const MAX_VALUE_BYTES: usize = 8 << 20;

const MAGIC: &[u8] = b"tally-snapshot";

/// What is wrong with a snapshot's bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    /// The metadata does not decode.
    #[error("snapshot metadata: {0}")]
    Metadata(String),
    /// A format other than [`FORMAT`].
    #[error("snapshot format {0} is not supported (this node reads format {FORMAT})")]
    Format(u32),
    /// A chunk does not decode, or breaks the key order.
    #[error("snapshot chunk {index}: {why}")]
    Chunk {
        /// The chunk's index.
        index: u32,
        /// What is wrong.
        why: String,
    },
}

/// The decoded metadata of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// Height whose committed state the snapshot holds.
    pub height: u64,
    /// App hash of that height (the tree root over the pairs).
    pub app_hash: [u8; 32],
    /// Number of pairs in all chunks.
    pub pairs: u64,
    /// SHA-256 of each chunk, in order.
    pub chunk_hashes: Vec<[u8; 32]>,
}

impl Metadata {
    /// The metadata's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAGIC.len() + 56 + 32 * self.chunk_hashes.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_be_bytes());
        out.extend_from_slice(&self.height.to_be_bytes());
        out.extend_from_slice(&self.app_hash);
        out.extend_from_slice(&self.pairs.to_be_bytes());
        out.extend_from_slice(&(self.chunk_hashes.len() as u32).to_be_bytes());
        for h in &self.chunk_hashes {
            out.extend_from_slice(h);
        }
        out
    }

    /// Decodes metadata, refusing trailing bytes and out-of-cap counts.
    pub fn decode(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let bad = |why: &str| SnapshotError::Metadata(why.to_string());
        let rest = bytes
            .strip_prefix(MAGIC)
            .ok_or_else(|| bad("missing the tally-snapshot tag"))?;
        let mut r = Reader(rest);
        let format = r.u32().ok_or_else(|| bad("truncated"))?;
        if format != FORMAT {
            return Err(SnapshotError::Format(format));
        }
        let height = r.u64().ok_or_else(|| bad("truncated"))?;
        let app_hash = r.hash().ok_or_else(|| bad("truncated"))?;
        let pairs = r.u64().ok_or_else(|| bad("truncated"))?;
        let n = r.u32().ok_or_else(|| bad("truncated"))?;
        if n == 0 || n > MAX_CHUNKS {
            return Err(bad(&format!(
                "{n} chunks (a snapshot has 1 to {MAX_CHUNKS})"
            )));
        }
        if r.0.len() != 32 * n as usize {
            return Err(bad(&format!(
                "{} bytes of chunk hashes for {n} chunks",
                r.0.len()
            )));
        }
        let chunk_hashes = (0..n).filter_map(|_| r.hash()).collect();
        Ok(Self {
            height,
            app_hash,
            pairs,
            chunk_hashes,
        })
    }

    /// The snapshot hash: SHA-256 of the encoded metadata.
    pub fn hash(&self) -> [u8; 32] {
        sha256(&self.encode())
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u32 {
        self.chunk_hashes.len() as u32
    }
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_be_bytes)
    }
    fn hash(&mut self) -> Option<[u8; 32]> {
        self.take(32)?.try_into().ok()
    }
}

/// Decodes chunk `index`, checking that its keys are user-space keys in
/// strictly ascending order after `after` (the last key of the previous
/// chunk), values non-empty and every length within its cap.
pub fn decode_chunk(
    index: u32,
    chunk: &[u8],
    after: Option<&[u8]>,
) -> Result<crate::Pairs, SnapshotError> {
    let bad = |why: String| SnapshotError::Chunk { index, why };
    if chunk.len() > MAX_CHUNK_BYTES {
        return Err(bad(format!(
            "{} bytes (at most {MAX_CHUNK_BYTES})",
            chunk.len()
        )));
    }
    let mut r = Reader(chunk);
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    while !r.0.is_empty() {
        let klen = r.u32().ok_or_else(|| bad("truncated key length".into()))? as usize;
        if klen == 0 || klen > MAX_KEY_BYTES {
            return Err(bad(format!("key of {klen} bytes (1 to {MAX_KEY_BYTES})")));
        }
        let key = r
            .take(klen)
            .ok_or_else(|| bad("truncated key".into()))?
            .to_vec();
        let vlen = r
            .u32()
            .ok_or_else(|| bad("truncated value length".into()))? as usize;
        if vlen == 0 || vlen > MAX_VALUE_BYTES {
            return Err(bad(format!(
                "value of {vlen} bytes (1 to {MAX_VALUE_BYTES})"
            )));
        }
        let value = r
            .take(vlen)
            .ok_or_else(|| bad("truncated value".into()))?
            .to_vec();
        if key.as_slice() < USER_SPACE_START {
            return Err(bad(format!("key {key:02x?} is in the reserved namespace")));
        }
        let prev = out.last().map(|(k, _)| k.as_slice()).or(after);
        if prev.is_some_and(|p| p >= key.as_slice()) {
            return Err(bad(format!(
                "key {} is not above the key before it",
                String::from_utf8_lossy(&key)
            )));
        }
        out.push((key, value));
    }
    if out.is_empty() {
        return Err(bad("no pairs".into()));
    }
    Ok(out)
}

/// Cuts a pair stream into chunks.
#[derive(Debug, Default)]
struct Chunker {
    current: Vec<u8>,
    hashes: Vec<[u8; 32]>,
    pairs: u64,
}

impl Chunker {
    fn push(&mut self, k: &[u8], v: &[u8]) {
        self.current
            .extend_from_slice(&(k.len() as u32).to_be_bytes());
        self.current.extend_from_slice(k);
        self.current
            .extend_from_slice(&(v.len() as u32).to_be_bytes());
        self.current.extend_from_slice(v);
        self.pairs += 1;
    }

    fn cut(&mut self) -> Vec<u8> {
        let chunk = std::mem::take(&mut self.current);
        self.hashes.push(sha256(&chunk));
        chunk
    }
}

/// Writes `backend`'s committed state as a snapshot: calls `sink(index,
/// chunk)` for each chunk in order and returns the metadata. `backend` must
/// not change while this runs (a checkpoint, or a store nobody writes).
/// Refuses a store with no commit, no pairs, or a pair over a cap.
pub fn export(
    backend: &dyn Backend,
    sink: &mut dyn FnMut(u32, &[u8]) -> std::io::Result<()>,
) -> Result<Metadata, ExportError> {
    let meta = backend.meta()?.ok_or(ExportError::NoCommit)?;
    let mut c = Chunker::default();
    let mut failure: Option<ExportError> = None;
    backend.for_each(USER_SPACE_START, b"", &mut |k, v| {
        if k.len() > MAX_KEY_BYTES || v.is_empty() || v.len() > MAX_VALUE_BYTES {
            failure = Some(ExportError::Pair(String::from_utf8_lossy(k).into_owned()));
            return false;
        }
        c.push(k, v);
        if c.current.len() >= CHUNK_TARGET {
            let index = c.hashes.len() as u32;
            let chunk = c.cut();
            if let Err(e) = sink(index, &chunk) {
                failure = Some(ExportError::Io(e));
                return false;
            }
        }
        true
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if !c.current.is_empty() {
        let index = c.hashes.len() as u32;
        let chunk = c.cut();
        sink(index, &chunk).map_err(ExportError::Io)?;
    }
    if c.hashes.is_empty() {
        return Err(ExportError::Empty);
    }
    if c.hashes.len() > MAX_CHUNKS as usize {
        return Err(ExportError::TooLarge(c.hashes.len()));
    }
    Ok(Metadata {
        height: meta.height,
        app_hash: meta.app_hash,
        pairs: c.pairs,
        chunk_hashes: c.hashes,
    })
}

/// Why a snapshot could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The store has no commit yet.
    #[error("the store has no committed height to snapshot")]
    NoCommit,
    /// The store holds no pairs.
    #[error("the committed state is empty")]
    Empty,
    /// A pair breaks a cap of the format.
    #[error("key {0} is too long or its value empty or too long for a snapshot")]
    Pair(String),
    /// The state needs more chunks than the format allows.
    #[error("{0} chunks exceed the format's {MAX_CHUNKS}")]
    TooLarge(usize),
    /// Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Writing a chunk failed.
    #[error("writing a chunk: {0}")]
    Io(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_refuses_garbage() {
        let m = Metadata {
            height: 7,
            app_hash: [9; 32],
            pairs: 3,
            chunk_hashes: vec![[1; 32], [2; 32]],
        };
        let b = m.encode();
        assert_eq!(b.len(), 14 + 4 + 8 + 32 + 8 + 4 + 64);
        assert_eq!(Metadata::decode(&b).unwrap(), m);
        assert_eq!(m.hash(), sha256(&b));
        for cut in 0..b.len() {
            assert!(Metadata::decode(&b[..cut]).is_err(), "prefix of {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(Metadata::decode(&long).is_err());
        let mut f2 = b.clone();
        f2[17] = 2;
        assert_eq!(Metadata::decode(&f2), Err(SnapshotError::Format(2)));
    }

    fn chunk(pairs: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut c = Chunker::default();
        for (k, v) in pairs {
            c.push(k, v);
        }
        c.current
    }

    #[test]
    fn chunks_decode_and_keep_key_order() {
        let c = chunk(&[(b"a", b"1"), (b"b", b"22")]);
        // Hand-encoded: lengths are 4-byte big-endian.
        assert_eq!(
            c,
            [
                &[0, 0, 0, 1][..],
                b"a",
                &[0, 0, 0, 1],
                b"1",
                &[0, 0, 0, 1],
                b"b",
                &[0, 0, 0, 2],
                b"22"
            ]
            .concat()
        );
        assert_eq!(decode_chunk(0, &c, None).unwrap().len(), 2);
        assert!(decode_chunk(1, &c, Some(b"a")).is_err());
        assert!(decode_chunk(1, &c, Some(b"0")).is_ok());
        assert!(decode_chunk(0, &chunk(&[(b"b", b"1"), (b"a", b"1")]), None).is_err());
        assert!(decode_chunk(0, &chunk(&[(b"a", b"1"), (b"a", b"1")]), None).is_err());
        assert!(decode_chunk(0, &chunk(&[(b"\x00meta", b"1")]), None).is_err());
        assert!(decode_chunk(0, &chunk(&[(b"a", b"")]), None).is_err());
        assert!(decode_chunk(0, &[], None).is_err());
        // Cut anywhere but at the pair boundary (10 bytes: a whole chunk of
        // one pair), a chunk does not decode.
        for cut in (1..c.len()).filter(|&c| c != 10) {
            assert!(decode_chunk(0, &c[..cut], None).is_err(), "prefix {cut}");
        }
        assert_eq!(decode_chunk(0, &c[..10], None).unwrap().len(), 1);
    }
}

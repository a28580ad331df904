//! Proofs of single keys against the app hash, and their verification.
//!
//! A proof is an ICS23 `CommitmentProof` (protobuf, `cosmos/ics23` v1) under
//! jmt's proof spec ([`spec`]): an existence proof when the key holds a
//! value at the version asked, a non-existence proof otherwise. It verifies
//! against the root of that version, which is the app hash CometBFT carries
//! in the header one height later.

use ics23::HostFunctionsManager;
use jmt::Sha256Jmt;
use prost_ics23::Message;

use crate::merkle::{read_u64, Reader, LATEST, OLDEST};
use crate::{Backend, StoreError};

/// The `type` of the ABCI `ProofOp` that carries a Tally proof.
pub const PROOF_OP_TYPE: &str = "ics23:jmt";

/// A value (or its absence) with its proof at one version.
#[derive(Debug, Clone)]
pub struct Proven {
    /// The stored value; `None` when the key holds nothing.
    pub value: Option<Vec<u8>>,
    /// The ICS23 `CommitmentProof`, protobuf-encoded.
    pub proof: Vec<u8>,
    /// The tree's root at `version` (the app hash of that height).
    pub root: [u8; 32],
    /// The version (block height) proven at.
    pub version: u64,
}

/// Why a proof could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    /// The version is older than what this node keeps.
    #[error("height {version} is pruned on this node (oldest kept: {oldest})")]
    Pruned {
        /// Asked version.
        version: u64,
        /// Oldest version this node keeps.
        oldest: u64,
    },
    /// The version is above the latest committed one.
    #[error("height {version} is not committed yet (latest: {latest})")]
    Future {
        /// Asked version.
        version: u64,
        /// Latest committed version.
        latest: u64,
    },
    /// Nothing has been committed to the tree.
    #[error("no state has been committed yet")]
    Empty,
    /// The state held no key at all at that version: ICS23 has no
    /// non-existence proof for an empty tree.
    #[error("the state is empty at height {0}: there is nothing to prove against")]
    EmptyState(u64),
    /// The key is side state ([`crate::is_side`]): not a leaf of the tree,
    /// so no proof, of presence or absence, can be given for it.
    #[error(
        "key {0:02x?} is side state, which the Merkle tree does not hold: no proof exists for it"
    )]
    Side(Vec<u8>),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a proof does not verify.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// The proof bytes are not a `CommitmentProof`.
    #[error("proof does not decode: {0}")]
    Decode(String),
    /// The proof is well formed but does not prove the claim under the root.
    #[error("proof does not prove {claim} under root {root}")]
    Mismatch {
        /// What was to be proven.
        claim: String,
        /// The root, hex.
        root: String,
    },
}

/// jmt's ICS23 proof spec (SHA-256 leaves and inner nodes, keys and
/// values pre-hashed): what verifiers must use.
pub fn spec() -> ics23::ProofSpec {
    jmt::ics23_spec()
}

/// The latest version and the oldest one whose nodes are all kept.
pub fn versions(backend: &dyn Backend) -> Result<Option<(u64, u64)>, StoreError> {
    let Some(latest) = read_u64(backend, LATEST)? else {
        return Ok(None);
    };
    Ok(Some((read_u64(backend, OLDEST)?.unwrap_or(0), latest)))
}

/// The value of `key` at `version` with its proof.
pub fn prove(backend: &dyn Backend, key: &[u8], version: u64) -> Result<Proven, ProofError> {
    if crate::is_side(key) {
        return Err(ProofError::Side(key.to_vec()));
    }
    let (oldest, latest) = versions(backend)?.ok_or(ProofError::Empty)?;
    if version > latest {
        return Err(ProofError::Future { version, latest });
    }
    if version < oldest {
        return Err(ProofError::Pruned { version, oldest });
    }
    let reader = Reader { backend };
    let tree = Sha256Jmt::new(&reader);
    let root = match tree.get_root_hash_option(version) {
        Ok(Some(r)) => r.0,
        // Before the tree's first version (or pruned under a lagging index).
        Ok(None) => {
            return Err(ProofError::Pruned {
                version,
                oldest: oldest.max(version + 1),
            })
        }
        Err(e) => return Err(StoreError::Tree(format!("{e:#}")).into()),
    };
    if tree
        .get_leaf_count(version)
        .map_err(|e| StoreError::Tree(format!("{e:#}")))?
        == 0
    {
        return Err(ProofError::EmptyState(version));
    }
    let (value, proof) = tree
        .get_with_ics23_proof(key.to_vec(), version)
        .map_err(|e| StoreError::Tree(format!("{e:#}")))?;
    Ok(Proven {
        value,
        proof: proof.encode_to_vec(),
        root,
        version,
    })
}

/// Checks that `proof` proves `key` holds `value` (`None`: holds nothing)
/// under `root`.
pub fn verify(
    root: &[u8],
    key: &[u8],
    value: Option<&[u8]>,
    proof: &[u8],
) -> Result<(), VerifyError> {
    let p =
        ics23::CommitmentProof::decode(proof).map_err(|e| VerifyError::Decode(e.to_string()))?;
    let spec = spec();
    let root_vec = root.to_vec();
    let ok = match value {
        Some(v) => ics23::verify_membership::<HostFunctionsManager>(&p, &spec, &root_vec, key, v),
        None => ics23::verify_non_membership::<HostFunctionsManager>(&p, &spec, &root_vec, key),
    };
    if ok {
        Ok(())
    } else {
        Err(VerifyError::Mismatch {
            claim: match value {
                Some(_) => format!("key {} holds the value", hex_of(key)),
                None => format!("key {} is absent", hex_of(key)),
            },
            root: hex_of(root),
        })
    }
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

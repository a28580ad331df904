//! A validator's files for the on-chain DKG: its encryption key
//! (`<home>/config/dkg_key.json`), its CometBFT consensus key (read from
//! `priv_validator_key.json`, which signs its validator transactions), the
//! proof of possession that registers the encryption key, and the share
//! files of the keys the chain's ceremonies made
//! (`<home>/data/bls_share_epoch_<E>.json`).
//!
//! Every secret file is written through [`crate::secret`] (0600 from
//! creation, atomic). A share file can always be made again from the chain
//! and the encryption key ([`tally_settlement::dkg::derive_share`]); the
//! encryption key cannot, so `keygen` never replaces one unless asked.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use tally_settlement::bls::SecretShare;
use tally_settlement::dkg::crypto::{verify_pop, EncKey};
use tally_settlement::dkg::msg::pop_context;

use crate::fs::{FsOp, FsPathError};
use crate::secret::{write_secret, Existing};

/// Errors of the DKG files.
#[derive(Debug, thiserror::Error)]
pub enum DkgFileError {
    /// A file could not be read or written.
    #[error(transparent)]
    Io(#[from] FsPathError),
    /// A file's content is not what it should be.
    #[error("{path}: {msg}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The home has no encryption key (`tallyd dkg keygen` makes one).
    #[error("{path} does not exist; make it with `tallyd dkg keygen --home {home}`")]
    NoEncKey {
        /// The missing file.
        path: PathBuf,
        /// The home it is missing from.
        home: String,
    },
    /// An encryption-key proof was asked for no chain.
    #[error("the chain id is empty")]
    NoChainId,
    /// `keygen` would replace an encryption key.
    #[error("{0} already exists; pass --force to replace it (a validator registered with the old key can no longer decrypt its shares)")]
    Exists(PathBuf),
}

fn invalid(path: &Path, msg: impl Into<String>) -> DkgFileError {
    DkgFileError::Invalid {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn read(path: &Path) -> Result<String, DkgFileError> {
    Ok(crate::fs::read_to_string(path)?)
}

/// What `<home>/config/dkg_key.json` holds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncKeyFile {
    /// Hex 32-byte secret scalar.
    pub secret: String,
    /// Hex compressed G1 public key (48 bytes).
    pub public_key: String,
}

/// `<home>/config/dkg_key.json`.
pub fn enc_key_path(home: &Path) -> PathBuf {
    home.join("config").join("dkg_key.json")
}

/// Makes a new encryption key from OS randomness and writes it to
/// `path`; an existing file is kept (and an error returned) unless
/// `force`.
pub fn generate_enc_key(path: &Path, force: bool) -> Result<EncKey, DkgFileError> {
    if !force && path.exists() {
        return Err(DkgFileError::Exists(path.to_path_buf()));
    }
    let mut ikm = [0u8; 64];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut ikm);
    let key = EncKey::from_ikm(&ikm).map_err(|e| invalid(path, e.to_string()))?;
    let file = EncKeyFile {
        secret: hex::encode(key.to_bytes()),
        public_key: hex::encode(key.public().compress()),
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| invalid(path, e.to_string()))?;
    let mode = if force {
        Existing::Replace
    } else {
        Existing::Keep
    };
    write_secret(path, (text + "\n").as_bytes(), mode).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            DkgFileError::Exists(path.to_path_buf())
        } else {
            FsPathError::new(FsOp::Write, path, source).into()
        }
    })?;
    Ok(key)
}

/// Loads an encryption key file; its public key must match its secret.
pub fn load_enc_key(path: &Path) -> Result<EncKey, DkgFileError> {
    let f: EncKeyFile =
        serde_json::from_str(&read(path)?).map_err(|e| invalid(path, e.to_string()))?;
    let secret = hex::decode(&f.secret).map_err(|_| invalid(path, "secret is not hex"))?;
    let key = EncKey::from_bytes(&secret).map_err(|e| invalid(path, e.to_string()))?;
    if hex::encode(key.public().compress()) != f.public_key.to_ascii_lowercase() {
        return Err(invalid(path, "public_key does not match secret"));
    }
    Ok(key)
}

/// Reads CometBFT's `priv_validator_key.json` of `home`: the ed25519
/// consensus key, checked against the public key in the same file.
pub fn load_consensus_key(home: &Path) -> Result<SigningKey, DkgFileError> {
    let path = crate::dealer::validator_key_path(home);
    let v: serde_json::Value =
        serde_json::from_str(&read(&path)?).map_err(|e| invalid(&path, e.to_string()))?;
    let b64 = |field: &str| -> Result<Vec<u8>, DkgFileError> {
        let s = v[field]["value"]
            .as_str()
            .ok_or_else(|| invalid(&path, format!("no {field}.value")))?;
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|_| invalid(&path, format!("{field}.value is not base64")))
    };
    if v["priv_key"]["type"].as_str() != Some("tendermint/PrivKeyEd25519") {
        return Err(invalid(&path, "the consensus key is not ed25519"));
    }
    let private = b64("priv_key")?;
    let seed: [u8; 32] = private
        .get(..32)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| invalid(&path, "priv_key is shorter than 32 bytes"))?;
    let key = SigningKey::from_bytes(&seed);
    if b64("pub_key")? != key.verifying_key().to_bytes() {
        return Err(invalid(&path, "pub_key does not match priv_key"));
    }
    Ok(key)
}

/// The public ed25519 consensus key of `home` (from
/// `priv_validator_key.json`'s `pub_key`; the private key is not needed).
pub fn consensus_pubkey(home: &Path) -> Result<[u8; 32], DkgFileError> {
    load_consensus_key(home).map(|k| k.verifying_key().to_bytes())
}

/// An ed25519 public key as hex (64 digits) or base64 (as CometBFT prints
/// it).
pub fn parse_ed25519_pubkey(s: &str) -> Result<[u8; 32], String> {
    let s = s.trim();
    let bytes = if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode(s).map_err(|e| e.to_string())?
    } else {
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|_| format!("{s:?} is neither 64 hex digits nor base64"))?
    };
    let key: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| format!("an ed25519 key is 32 bytes, {s:?} is {}", bytes.len()))?;
    ed25519_dalek::VerifyingKey::from_bytes(&key)
        .map_err(|_| format!("{s:?} is not a valid ed25519 key"))?;
    Ok(key)
}

/// What `tallyd dkg enc-proof` prints: the entry genesis (or a proposal)
/// registers an encryption key with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncProof {
    /// Hex ed25519 consensus key.
    pub validator: String,
    /// Hex compressed G1 encryption key (48 bytes).
    pub key: String,
    /// Hex proof of possession (96 bytes).
    pub pop: String,
}

/// The proof that the holder of `enc` registers it for the validator with
/// consensus key `consensus` on `chain_id`.
fn enc_proof(enc: &EncKey, chain_id: &str, consensus: &[u8; 32]) -> EncProof {
    EncProof {
        validator: hex::encode(consensus),
        key: hex::encode(enc.public().compress()),
        pop: hex::encode(enc.prove(&pop_context(chain_id, consensus)).compress()),
    }
}

/// The encryption-key entry of the validator of `home` for `chain_id`:
/// its consensus key, `config/dkg_key.json`'s public key and the proof.
pub fn enc_proof_of(home: &Path, chain_id: &str) -> Result<EncProof, DkgFileError> {
    if chain_id.is_empty() {
        return Err(DkgFileError::NoChainId);
    }
    let enc_path = enc_key_path(home);
    if !enc_path.exists() {
        return Err(DkgFileError::NoEncKey {
            path: enc_path,
            home: home.display().to_string(),
        });
    }
    let enc = load_enc_key(&enc_path)?;
    let consensus = consensus_pubkey(home)?;
    Ok(enc_proof(&enc, chain_id, &consensus))
}

impl EncProof {
    /// Whether the proof verifies for `chain_id` (what the chain checks).
    pub fn verifies(&self, chain_id: &str) -> bool {
        let (Ok(v), Ok(k), Ok(pop)) = (
            hex::decode(&self.validator),
            hex::decode(&self.key),
            hex::decode(&self.pop),
        ) else {
            return false;
        };
        match tally_settlement::bls::parse_public_key(&k) {
            Ok(pk) => verify_pop(&pk, &pop_context(chain_id, &v), &pop),
            Err(_) => false,
        }
    }
}

/// What `<home>/data/bls_share_epoch_<E>.json` holds: a share file
/// ([`crate::dealer::ShareFile`]'s fields) and the key's epoch.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochShareFile {
    /// The key's epoch.
    pub epoch: u64,
    /// Share index, 1..=n.
    pub index: u32,
    /// Hex 32-byte big-endian secret scalar.
    pub secret: String,
    /// Hex compressed G1 public key of this share.
    pub public_share: String,
    /// Hex compressed G1 group key.
    pub group_key: String,
    /// Threshold.
    pub threshold: u32,
}

/// `<home>/data/bls_share_epoch_<epoch>.json`.
fn epoch_share_path(home: &Path, epoch: u64) -> PathBuf {
    home.join("data")
        .join(format!("bls_share_epoch_{epoch}.json"))
}

/// Writes the share of `epoch` (replacing a file of the same epoch: it
/// is derived from the chain, so the new one is the right one).
pub fn write_epoch_share(
    home: &Path,
    epoch: u64,
    share: &SecretShare,
    group_key: &str,
    threshold: u32,
) -> Result<PathBuf, DkgFileError> {
    let path = epoch_share_path(home, epoch);
    let file = EpochShareFile {
        epoch,
        index: share.index,
        secret: hex::encode(share.to_bytes()),
        public_share: hex::encode(share.public().compress()),
        group_key: group_key.to_string(),
        threshold,
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| invalid(&path, e.to_string()))?;
    write_secret(&path, (text + "\n").as_bytes(), Existing::Replace)
        .map_err(FsPathError::of(FsOp::Write, &path))?;
    Ok(path)
}

/// Loads an epoch share file; the secret must match its public share and
/// the epoch in its name.
pub fn load_epoch_share(path: &Path) -> Result<(u64, SecretShare), DkgFileError> {
    let f: EpochShareFile =
        serde_json::from_str(&read(path)?).map_err(|e| invalid(path, e.to_string()))?;
    if file_epoch(path) != Some(f.epoch) {
        return Err(invalid(
            path,
            format!("holds epoch {}, its name says otherwise", f.epoch),
        ));
    }
    let secret = hex::decode(&f.secret).map_err(|_| invalid(path, "secret is not hex"))?;
    let share =
        SecretShare::from_bytes(f.index, &secret).map_err(|e| invalid(path, e.to_string()))?;
    if hex::encode(share.public().compress()) != f.public_share.to_ascii_lowercase() {
        return Err(invalid(path, "public_share does not match secret"));
    }
    Ok((f.epoch, share))
}

fn file_epoch(path: &Path) -> Option<u64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("bls_share_epoch_")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// Deletes the epoch share files of every epoch below `epoch`; returns the
/// paths deleted (a file that cannot be deleted is an error for the caller
/// to report, and is tried again).
pub fn delete_epoch_shares_below(home: &Path, epoch: u64) -> Result<Vec<PathBuf>, DkgFileError> {
    let mut gone = Vec::new();
    for (e, path) in newest_epoch_share_files(home, usize::MAX) {
        if e < epoch {
            std::fs::remove_file(&path)
                .map_err(|err| invalid(&path, format!("cannot delete: {err}")))?;
            gone.push(path);
        }
    }
    Ok(gone)
}

/// The epoch share files in `<home>/data`, newest epoch first, at most
/// `n`.
pub fn newest_epoch_share_files(home: &Path, n: usize) -> Vec<(u64, PathBuf)> {
    let Ok(dir) = std::fs::read_dir(home.join("data")) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter_map(|p| file_epoch(&p).map(|e| (e, p)))
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.truncate(n);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_refuses_to_overwrite_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = enc_key_path(dir.path());
        let first = generate_enc_key(&path, false).unwrap();
        #[cfg(unix)]
        assert_eq!(crate::secret::mode(&path).unwrap(), 0o600);
        let before = std::fs::read(&path).unwrap();
        assert!(matches!(
            generate_enc_key(&path, false),
            Err(DkgFileError::Exists(_))
        ));
        assert_eq!(std::fs::read(&path).unwrap(), before, "kept");
        assert_eq!(load_enc_key(&path).unwrap().to_bytes(), first.to_bytes());
        let second = generate_enc_key(&path, true).unwrap();
        assert_ne!(second.to_bytes(), first.to_bytes());
        assert_eq!(load_enc_key(&path).unwrap().to_bytes(), second.to_bytes());
        // A file whose public key is not its secret's is refused.
        let mut f: EncKeyFile = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        f.public_key = hex::encode(first.public().compress());
        std::fs::write(&path, serde_json::to_string(&f).unwrap()).unwrap();
        assert!(load_enc_key(&path).is_err());
    }

    /// A `priv_validator_key.json` as `cometbft init` writes it, for `seed`.
    pub(crate) fn write_consensus_key(home: &Path, seed: [u8; 32]) -> SigningKey {
        let key = SigningKey::from_bytes(&seed);
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut private = seed.to_vec();
        private.extend_from_slice(&key.verifying_key().to_bytes());
        let addr = hex::encode_upper(tally_settlement::dkg::address_of(
            &key.verifying_key().to_bytes(),
        ));
        let text = serde_json::json!({
            "address": addr,
            "pub_key": {"type": "tendermint/PubKeyEd25519", "value": b64(&key.verifying_key().to_bytes())},
            "priv_key": {"type": "tendermint/PrivKeyEd25519", "value": b64(&private)},
        });
        std::fs::create_dir_all(home.join("config")).unwrap();
        std::fs::write(crate::dealer::validator_key_path(home), text.to_string()).unwrap();
        key
    }

    #[test]
    fn enc_proof_verifies_with_the_chains_check() {
        let dir = tempfile::tempdir().unwrap();
        let key = write_consensus_key(dir.path(), [4; 32]);
        let loaded = load_consensus_key(dir.path()).unwrap();
        assert_eq!(loaded.to_bytes(), key.to_bytes());
        let enc = generate_enc_key(&enc_key_path(dir.path()), false).unwrap();
        let pk = consensus_pubkey(dir.path()).unwrap();
        let proof = enc_proof(&enc, "chain-a", &pk);
        assert_eq!(proof.validator, hex::encode(key.verifying_key().to_bytes()));
        assert_eq!(proof.key.len(), 96);
        assert_eq!(proof.pop.len(), 192);
        // The oracle: the chain's own check, on the decoded bytes.
        let ek =
            tally_settlement::bls::parse_public_key(&hex::decode(&proof.key).unwrap()).unwrap();
        let ctx = pop_context("chain-a", &key.verifying_key().to_bytes());
        assert!(verify_pop(&ek, &ctx, &hex::decode(&proof.pop).unwrap()));
        assert!(proof.verifies("chain-a"));
        assert!(!proof.verifies("chain-b"), "bound to the chain");
        let other = enc_proof(&enc, "chain-a", &[7; 32]);
        assert!(!verify_pop(&ek, &ctx, &hex::decode(&other.pop).unwrap()));
    }

    #[test]
    fn consensus_keys_and_pubkeys_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_consensus_key(dir.path()).is_err(), "no file");
        let key = write_consensus_key(dir.path(), [5; 32]);
        let path = crate::dealer::validator_key_path(dir.path());
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        v["pub_key"]["value"] =
            serde_json::json!(base64::engine::general_purpose::STANDARD.encode([9u8; 32]));
        std::fs::write(&path, v.to_string()).unwrap();
        let e = load_consensus_key(dir.path()).unwrap_err().to_string();
        assert!(e.contains("pub_key does not match"), "{e}");
        let pk = key.verifying_key().to_bytes();
        assert_eq!(parse_ed25519_pubkey(&hex::encode(pk)).unwrap(), pk);
        let b64 = base64::engine::general_purpose::STANDARD.encode(pk);
        assert_eq!(parse_ed25519_pubkey(&b64).unwrap(), pk);
        assert!(parse_ed25519_pubkey("abcd").is_err());
        assert!(parse_ed25519_pubkey(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn epoch_share_files_round_trip_and_the_newest_come_first() {
        let dir = tempfile::tempdir().unwrap();
        let (_, shares) = tally_settlement::bls::deal(3, 2, &[[1u8; 64], [2u8; 64]]).unwrap();
        for (epoch, s) in [(1u64, &shares[0]), (3, &shares[1]), (2, &shares[2])] {
            let p = write_epoch_share(dir.path(), epoch, s, "gk", 2).unwrap();
            assert_eq!(p, epoch_share_path(dir.path(), epoch));
            #[cfg(unix)]
            assert_eq!(crate::secret::mode(&p).unwrap(), 0o600);
        }
        let (e, s) = load_epoch_share(&epoch_share_path(dir.path(), 3)).unwrap();
        assert_eq!((e, s.index), (3, shares[1].index));
        assert_eq!(s.to_bytes(), shares[1].to_bytes());
        std::fs::write(dir.path().join("data").join("other.json"), "{}").unwrap();
        let newest: Vec<u64> = newest_epoch_share_files(dir.path(), 2)
            .into_iter()
            .map(|(e, _)| e)
            .collect();
        assert_eq!(newest, [3, 2]);
        // A file renamed to another epoch is refused.
        std::fs::copy(
            epoch_share_path(dir.path(), 1),
            epoch_share_path(dir.path(), 9),
        )
        .unwrap();
        assert!(load_epoch_share(&epoch_share_path(dir.path(), 9)).is_err());
    }

    #[test]
    fn retired_epochs_are_deleted_and_newer_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (_, shares) = tally_settlement::bls::deal(3, 2, &[[1u8; 64], [2u8; 64]]).unwrap();
        for epoch in 1..=4u64 {
            write_epoch_share(dir.path(), epoch, &shares[0], "gk", 2).unwrap();
        }
        let gone = delete_epoch_shares_below(dir.path(), 3).unwrap();
        assert_eq!(gone.len(), 2);
        for epoch in 1..=4u64 {
            assert_eq!(
                epoch_share_path(dir.path(), epoch).exists(),
                epoch >= 3,
                "epoch {epoch}"
            );
        }
        assert!(delete_epoch_shares_below(dir.path(), 3).unwrap().is_empty());
    }
}

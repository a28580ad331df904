//! A validator's files for the on-chain DKG: its CometBFT consensus key
//! (read from `priv_validator_key.json`, which signs its validator
//! transactions), the encryption key of each ceremony round it takes part
//! in (`<home>/data/dkg_round_<R>.json`, made fresh for the round and
//! deleted once the round is over and its share is derived, ADR 0018),
//! and the share files of the keys the chain's ceremonies made
//! (`<home>/data/bls_share_epoch_<E>.json`).
//!
//! Every secret file is written through [`crate::secret`] (0600 from
//! creation, atomic). A round key is kept on disk while its round runs so
//! that a restarted node deals the same bytes and can still decrypt; a
//! share file can be made again from the chain only while its round key
//! exists, so a node that lost both gets a share at the next key.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use tally_settlement::bls::SecretShare;
use tally_settlement::dkg::crypto::EncKey;

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

/// What a round key file `<home>/data/dkg_round_<R>.json` holds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncKeyFile {
    /// Hex 32-byte secret scalar.
    pub secret: String,
    /// Hex compressed G1 public key (48 bytes).
    pub public_key: String,
}

/// `<home>/data/dkg_round_<round>.json`.
pub fn round_key_path(home: &Path, round: u64) -> PathBuf {
    home.join("data").join(format!("dkg_round_{round}.json"))
}

/// The encryption key of ceremony `round`: loaded from its file, or made
/// from OS randomness and written (0600) when there is none yet.
pub fn round_key(home: &Path, round: u64) -> Result<EncKey, DkgFileError> {
    let path = round_key_path(home, round);
    if path.exists() {
        return load_enc_key(&path);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(FsPathError::of(FsOp::Write, dir))?;
    }
    let mut ikm = [0u8; 64];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut ikm);
    let key = EncKey::from_ikm(&ikm).map_err(|e| invalid(&path, e.to_string()))?;
    let file = EncKeyFile {
        secret: hex::encode(key.to_bytes()),
        public_key: hex::encode(key.public().compress()),
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| invalid(&path, e.to_string()))?;
    write_secret(&path, (text + "\n").as_bytes(), Existing::Keep)
        .map_err(FsPathError::of(FsOp::Write, &path))?;
    Ok(key)
}

/// The rounds that have a key file in `<home>/data`, ascending.
pub fn round_key_files(home: &Path) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(home.join("data")) else {
        return Vec::new();
    };
    let mut out: Vec<u64> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("dkg_round_")?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect();
    out.sort_unstable();
    out
}

/// Deletes the key file of `round` (none is fine).
pub fn delete_round_key(home: &Path, round: u64) -> Result<(), DkgFileError> {
    let path = round_key_path(home, round);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(invalid(&path, format!("cannot delete: {e}"))),
    }
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
    fn round_keys_are_made_once_kept_and_deleted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        let first = round_key(dir.path(), 7).unwrap();
        let path = round_key_path(dir.path(), 7);
        #[cfg(unix)]
        assert_eq!(crate::secret::mode(&path).unwrap(), 0o600);
        // Loaded again, not made again: a restarted dealer deals the same.
        assert_eq!(
            round_key(dir.path(), 7).unwrap().to_bytes(),
            first.to_bytes()
        );
        let other = round_key(dir.path(), 8).unwrap();
        assert_ne!(other.to_bytes(), first.to_bytes(), "a fresh key per round");
        assert_eq!(round_key_files(dir.path()), vec![7, 8]);
        delete_round_key(dir.path(), 7).unwrap();
        delete_round_key(dir.path(), 7).unwrap();
        assert_eq!(round_key_files(dir.path()), vec![8]);
        // A file whose public key is not its secret's is refused.
        let p8 = round_key_path(dir.path(), 8);
        let mut f: EncKeyFile = serde_json::from_slice(&std::fs::read(&p8).unwrap()).unwrap();
        f.public_key = hex::encode(first.public().compress());
        std::fs::write(&p8, serde_json::to_string(&f).unwrap()).unwrap();
        assert!(round_key(dir.path(), 8).is_err());
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

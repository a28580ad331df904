//! The localnet dealer: one party generates the threshold key and hands
//! each validator its share. Stands in for the on-chain DKG; the chain only
//! sees the genesis `dkg` entry and each node only its share file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tally_settlement::bls::{self, SecretShare};
use tally_settlement::KeyEpoch;

use crate::fs::{FsOp, FsPathError};

/// Errors of the dealer and of share files.
#[derive(Debug, thiserror::Error)]
pub enum DealerError {
    /// A file could not be read or written.
    #[error(transparent)]
    Io(#[from] FsPathError),
    /// Bad arguments or file contents.
    #[error("{0}")]
    Invalid(String),
}

/// What `<home>/config/bls_share.json` holds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareFile {
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

/// Deals a fresh `threshold`-of-`homes.len()` key: writes each home's share
/// file and returns the genesis entry.
pub fn deal(homes: &[PathBuf], threshold: u32) -> Result<KeyEpoch, DealerError> {
    let n = u32::try_from(homes.len())
        .map_err(|_| DealerError::Invalid("too many validators".into()))?;
    if n == 0 || threshold == 0 || threshold > n {
        return Err(DealerError::Invalid(format!(
            "threshold must be 1..={n} for {n} validators, got {threshold}"
        )));
    }
    let randomness: Vec<[u8; 64]> = (0..threshold)
        .map(|_| {
            let mut b = [0u8; 64];
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
            b
        })
        .collect();
    let signers = homes
        .iter()
        .map(|h| validator_address(h))
        .collect::<Result<Vec<_>, _>>()?;
    let (pubs, shares) =
        bls::deal(n, threshold, &randomness).map_err(|e| DealerError::Invalid(e.to_string()))?;
    let group_key = hex::encode(pubs.group.compress());
    for (home, share) in homes.iter().zip(&shares) {
        let file = ShareFile {
            index: share.index,
            secret: hex::encode(share.to_bytes()),
            public_share: hex::encode(share.public().compress()),
            group_key: group_key.clone(),
            threshold,
        };
        write_share(&share_path(home), &file)?;
    }
    Ok(KeyEpoch {
        epoch: 0,
        threshold,
        group_key,
        public_shares: pubs
            .shares
            .iter()
            .map(|k| hex::encode(k.compress()))
            .collect(),
        signers,
    })
}

/// `<home>/config/priv_validator_key.json`, CometBFT's consensus key file.
pub fn validator_key_path(home: &Path) -> PathBuf {
    home.join("config").join("priv_validator_key.json")
}

/// The consensus address (lower-case hex, 20 bytes) in a home's CometBFT
/// `priv_validator_key.json`: the validator a share index is bound to.
pub fn validator_address(home: &Path) -> Result<String, DealerError> {
    let path = validator_key_path(home);
    let text = crate::fs::read_to_string(&path)?;
    let bad = |m: &str| DealerError::Invalid(format!("{}: {m}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
    let addr = v["address"]
        .as_str()
        .ok_or_else(|| bad("no \"address\" field"))?;
    match hex::decode(addr) {
        Ok(b) if b.len() == 20 => Ok(hex::encode(b)),
        _ => Err(bad("address is not 20 bytes of hex")),
    }
}

/// Checks that genesis binds share `index` to the validator with consensus
/// `address`: otherwise every vote extension of this node would be refused
/// by the others (they only accept partials under the sender's own index).
pub fn check_binding(g: &KeyEpoch, index: u32, address: &str) -> Result<(), DealerError> {
    let bound = index
        .checked_sub(1)
        .and_then(|i| g.signers.get(i as usize))
        .map(|s| s.to_ascii_lowercase());
    if bound.as_deref() != Some(address.to_ascii_lowercase().as_str()) {
        return Err(DealerError::Invalid(format!(
            "share {index} is bound in genesis to validator {}, but this node's consensus address is {address}",
            bound.unwrap_or_else(|| "none".into())
        )));
    }
    Ok(())
}

/// `<home>/config/bls_share.json`.
pub fn share_path(home: &Path) -> PathBuf {
    home.join("config").join("bls_share.json")
}

fn write_share(path: &Path, file: &ShareFile) -> Result<(), DealerError> {
    let text =
        serde_json::to_string_pretty(file).map_err(|e| DealerError::Invalid(e.to_string()))?;
    // A fresh deal replaces every home's share (the genesis entry changes
    // with it); the file is 0600 from creation and swapped in whole.
    crate::secret::write_secret(
        path,
        (text + "\n").as_bytes(),
        crate::secret::Existing::Replace,
    )
    .map_err(|e| FsPathError::new(FsOp::Write, path, e).into())
}

/// Loads a share file; checks the secret matches its public share and, if
/// given, the genesis entry.
pub fn load_share(path: &Path, genesis: Option<&KeyEpoch>) -> Result<SecretShare, DealerError> {
    let text = crate::fs::read_to_string(path)?;
    let bad = |m: String| DealerError::Invalid(format!("{}: {m}", path.display()));
    let f: ShareFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let secret = hex::decode(&f.secret).map_err(|_| bad("secret is not hex".into()))?;
    let share = SecretShare::from_bytes(f.index, &secret).map_err(|e| bad(e.to_string()))?;
    let public = hex::encode(share.public().compress());
    if public != f.public_share {
        return Err(bad("public_share does not match secret".into()));
    }
    if let Some(g) = genesis {
        let want = f
            .index
            .checked_sub(1)
            .and_then(|i| g.public_shares.get(i as usize));
        if want != Some(&public) || g.group_key != f.group_key {
            return Err(bad(format!(
                "share {} does not belong to the genesis threshold key",
                f.index
            )));
        }
    }
    Ok(share)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dealt_shares_load_and_match_genesis() {
        let dir = tempfile::tempdir().unwrap();
        let homes: Vec<PathBuf> = (0..4)
            .map(|i| dir.path().join(format!("node{i}")))
            .collect();
        // No consensus key yet: the dealer cannot bind shares.
        assert!(deal(&homes, 3).is_err());
        for (i, h) in homes.iter().enumerate() {
            std::fs::create_dir_all(h.join("config")).unwrap();
            let addr = format!("{:02X}", i + 0xA0).repeat(20);
            std::fs::write(
                validator_key_path(h),
                format!(r#"{{"address":"{addr}","pub_key":{{}},"priv_key":{{}}}}"#),
            )
            .unwrap();
        }
        let g = deal(&homes, 3).unwrap();
        assert_eq!(g.public_shares.len(), 4);
        assert_eq!(g.signers[2], "a2".repeat(20));
        for (i, h) in homes.iter().enumerate() {
            #[cfg(unix)]
            assert_eq!(crate::secret::mode(&share_path(h)).unwrap(), 0o600);
            let s = load_share(&share_path(h), Some(&g)).unwrap();
            let addr = validator_address(h).unwrap();
            check_binding(&g, s.index, &addr).unwrap();
            let other = validator_address(&homes[(i + 1) % 4]).unwrap();
            assert!(check_binding(&g, s.index, &other).is_err());
        }
        let other = deal(&homes[..2], 2).unwrap();
        assert!(load_share(&share_path(&homes[3]), Some(&other)).is_err());
        assert!(deal(&homes, 5).is_err());
    }
}

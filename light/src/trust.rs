//! The trust root and its store, `<home>/light/trust.json`:
//!
//! ```json
//! {"chain_id": "tally-localnet", "height": 12, "hash": "9A0F...32 bytes, hex"}
//! ```
//!
//! The file is public (a header hash is no secret) but it decides what the
//! light client believes: it is written whole (a temporary file renamed over
//! it) and refused when anything in it is off.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{hex_upper, LightError};

/// A height and the hash of the header at that height, trusted from
/// outside the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustRoot {
    /// The chain the header belongs to (`None`: not checked, as with
    /// `--trust-height`/`--trust-hash`; the hash pins the chain anyway).
    pub chain_id: Option<String>,
    /// The header's height.
    pub height: u64,
    /// The header's hash (32 bytes).
    pub hash: Vec<u8>,
}

/// The file's JSON.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustFile {
    chain_id: String,
    height: u64,
    hash: String,
}

impl TrustRoot {
    /// A root from a height and a hex hash (either case).
    pub fn new(chain_id: Option<String>, height: u64, hash_hex: &str) -> Result<Self, String> {
        if height == 0 {
            return Err("the trust height must be at least 1".into());
        }
        let hash = parse_hash(hash_hex)?;
        if let Some(c) = &chain_id {
            if c.is_empty() {
                return Err("the chain id is empty".into());
            }
        }
        Ok(Self {
            chain_id,
            height,
            hash,
        })
    }

    /// The hash, upper-case hex.
    pub fn hash_hex(&self) -> String {
        hex_upper(&self.hash)
    }

    /// Reads a trust file.
    pub fn load(path: &Path) -> Result<Self, LightError> {
        let err = |msg: String| LightError::TrustStore {
            path: path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(if e.kind() == std::io::ErrorKind::NotFound {
                "no trust root: run `tallyd light init` first, or give --trust-height and --trust-hash".into()
            } else {
                e.to_string()
            })
        })?;
        let f: TrustFile =
            serde_json::from_str(&text).map_err(|e| err(format!("not a trust file: {e}")))?;
        Self::new(Some(f.chain_id), f.height, &f.hash).map_err(err)
    }

    /// Writes the trust file (whole: a temporary file renamed over it).
    /// Needs a chain id.
    pub fn save(&self, path: &Path) -> Result<(), LightError> {
        let err = |msg: String| LightError::TrustStore {
            path: path.display().to_string(),
            msg,
        };
        let chain_id = self
            .chain_id
            .clone()
            .ok_or_else(|| err("a stored trust root needs its chain id".into()))?;
        let f = TrustFile {
            chain_id,
            height: self.height,
            hash: self.hash_hex(),
        };
        let mut text = serde_json::to_string_pretty(&f).map_err(|e| err(e.to_string()))?;
        text.push('\n');
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        }
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e.to_string())
        })
    }
}

/// `<home>/light/trust.json`.
pub fn path_in(home: &Path) -> PathBuf {
    home.join("light").join("trust.json")
}

/// A 32-byte hash from hex (either case).
fn parse_hash(s: &str) -> Result<Vec<u8>, String> {
    let b = hex::decode(s.trim()).map_err(|e| format!("hash {s:?} is not hex: {e}"))?;
    if b.len() != 32 {
        return Err(format!(
            "hash {s:?} is {} bytes, a header hash is 32",
            b.len()
        ));
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9A0F00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDD";

    #[test]
    fn a_trust_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        let root = TrustRoot::new(Some("tally-test".into()), 42, &HASH.to_lowercase()).unwrap();
        root.save(&path).unwrap();
        assert_eq!(TrustRoot::load(&path).unwrap(), root);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"chain_id": "tally-test", "height": 42, "hash": HASH})
        );
        // Saving again replaces it whole and leaves no temporary file.
        let newer = TrustRoot { height: 43, ..root };
        newer.save(&path).unwrap();
        assert_eq!(TrustRoot::load(&path).unwrap().height, 43);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["trust.json"]);
    }

    #[test]
    fn bad_trust_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trust.json");
        let e = TrustRoot::load(&path).unwrap_err().to_string();
        assert!(e.contains("tallyd light init"), "{e}");
        for (bad, why) in [
            ("not json", "not a trust file"),
            (r#"{"chain_id": "c", "height": 1}"#, "missing field `hash`"),
            (
                &format!(r#"{{"chain_id": "c", "height": 0, "hash": "{HASH}"}}"#),
                "at least 1",
            ),
            (
                r#"{"chain_id": "c", "height": 5, "hash": "ABCD"}"#,
                "a header hash is 32",
            ),
            (
                &format!(
                    r#"{{"chain_id": "c", "height": 5, "hash": "{}"}}"#,
                    &HASH[..63]
                ),
                "not hex",
            ),
            (
                &format!(r#"{{"chain_id": "", "height": 5, "hash": "{HASH}"}}"#),
                "chain id is empty",
            ),
            (
                &format!(r#"{{"chain_id": "c", "height": -1, "hash": "{HASH}"}}"#),
                "not a trust file",
            ),
            (
                &format!(r#"{{"chain_id": "c", "height": 5, "hash": "{HASH}", "extra": 1}}"#),
                "unknown field",
            ),
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = TrustRoot::load(&path).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // A root without a chain id (from flags) is not stored.
        let r = TrustRoot::new(None, 5, HASH).unwrap();
        assert!(r.save(&path).is_err());
    }
}

//! Key files: JSON with the ed25519 secret and public key in hex. They are
//! written as secret files ([`crate::secret`]): mode 0600 from creation,
//! atomically, and never over an existing key unless asked to.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};

use crate::fs::{FsOp, FsPathError};
use crate::secret::{write_secret, Existing};

/// Errors of key files.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or written.
    #[error(transparent)]
    Io(#[from] FsPathError),
    /// The file is not a Tally key file.
    #[error("{path}: not a Tally key file: {msg}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// `keys add` would overwrite a key.
    #[error("{0} already exists; pass --force to replace it")]
    Exists(PathBuf),
    /// A key name with characters that cannot be a file name.
    #[error("key name {0:?} must be 1-64 characters of [A-Za-z0-9._-]")]
    BadName(String),
}

/// What a key file holds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFile {
    /// The key's name.
    pub name: String,
    /// Key type, always `ed25519`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Hex public key, as registered in genesis.
    pub public_key: String,
    /// Hex 32-byte secret seed.
    pub secret_key: String,
}

/// The directory holding named keys.
pub fn keys_dir(home: &Path) -> PathBuf {
    home.join("keys")
}

/// Resolves `--from`: an existing path, or a key name in `<home>/keys/`.
pub fn resolve(home: &Path, name_or_path: &str) -> PathBuf {
    let p = Path::new(name_or_path);
    if name_or_path.contains('/')
        || name_or_path.ends_with(".json")
        || name_or_path.ends_with(".key")
        || p.exists()
    {
        p.to_path_buf()
    } else {
        keys_dir(home).join(format!("{name_or_path}.json"))
    }
}

fn check_name(name: &str) -> Result<(), KeyError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(KeyError::BadName(name.into()))
    }
}

/// Creates a new random key and writes it to `path` (mode 0600); an
/// existing file there is replaced only with `force`.
pub fn create(path: &Path, name: &str, force: bool) -> Result<SigningKey, KeyError> {
    check_name(name)?;
    if path.symlink_metadata().is_ok() && !force {
        return Err(KeyError::Exists(path.into()));
    }
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let existing = if force {
        Existing::Replace
    } else {
        Existing::Keep
    };
    write_as(path, name, &key, existing)?;
    Ok(key)
}

/// Writes `key` to `path` (mode 0600), replacing any file there atomically.
pub fn write(path: &Path, name: &str, key: &SigningKey) -> Result<(), KeyError> {
    write_as(path, name, key, Existing::Replace)
}

/// Writes `key` to `path` (mode 0600) unless a file is already there
/// ([`KeyError::Exists`], the old file untouched).
pub fn write_new(path: &Path, name: &str, key: &SigningKey) -> Result<(), KeyError> {
    write_as(path, name, key, Existing::Keep)
}

fn write_as(path: &Path, name: &str, key: &SigningKey, existing: Existing) -> Result<(), KeyError> {
    let file = KeyFile {
        name: name.into(),
        kind: "ed25519".into(),
        public_key: hex::encode(key.verifying_key().to_bytes()),
        secret_key: hex::encode(key.to_bytes()),
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| KeyError::Invalid {
        path: path.into(),
        msg: e.to_string(),
    })?;
    match write_secret(path, (text + "\n").as_bytes(), existing) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(KeyError::Exists(path.into()))
        }
        r => r.map_err(|e| FsPathError::new(FsOp::Write, path, e).into()),
    }
}

/// Loads a key file and checks its public key matches its secret.
pub fn load(path: &Path) -> Result<(String, SigningKey), KeyError> {
    let text = crate::fs::read_to_string(path)?;
    let invalid = |msg: String| KeyError::Invalid {
        path: path.into(),
        msg,
    };
    let file: KeyFile = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    if file.kind != "ed25519" {
        return Err(invalid(format!("type {:?} is not ed25519", file.kind)));
    }
    let seed: [u8; 32] = hex::decode(&file.secret_key)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| invalid("secret_key must be 32 bytes of hex".into()))?;
    let key = SigningKey::from_bytes(&seed);
    if hex::encode(key.verifying_key().to_bytes()) != file.public_key.to_lowercase() {
        return Err(invalid("public_key does not match secret_key".into()));
    }
    Ok((file.name, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_load_and_refuse_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.json");
        let k = create(&path, "gw", false).unwrap();
        #[cfg(unix)]
        assert_eq!(crate::secret::mode(&path).unwrap(), 0o600);
        let (name, k2) = load(&path).unwrap();
        assert_eq!(name, "gw");
        assert_eq!(k.to_bytes(), k2.to_bytes());
        assert!(matches!(
            create(&path, "gw", false),
            Err(KeyError::Exists(_))
        ));
        // write_new refuses too (atomically, not by a check before), and
        // the key on disk is still the first one.
        let other = SigningKey::from_bytes(&[9; 32]);
        assert!(matches!(
            write_new(&path, "gw", &other),
            Err(KeyError::Exists(_))
        ));
        assert_eq!(load(&path).unwrap().1.to_bytes(), k.to_bytes());
        // --force replaces it, still 0600.
        let k3 = create(&path, "gw", true).unwrap();
        assert_eq!(load(&path).unwrap().1.to_bytes(), k3.to_bytes());
        #[cfg(unix)]
        assert_eq!(crate::secret::mode(&path).unwrap(), 0o600);
        assert!(matches!(
            create(&path, "a b", true),
            Err(KeyError::BadName(_))
        ));
        std::fs::write(&path, "{}").unwrap();
        assert!(matches!(load(&path), Err(KeyError::Invalid { .. })));
    }
}

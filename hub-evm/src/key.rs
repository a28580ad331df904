//! The relay's secp256k1 key file: the EVM account that sends Tally's
//! transactions to the hub contract (and pays their gas).
//!
//! **Format.** One line: the 32-byte secret scalar as 64 hexadecimal
//! digits, big-endian, optionally prefixed by `0x`, followed by a newline.
//! Surrounding whitespace is ignored when reading; [`RelayKey::create`]
//! writes 64 lowercase digits without prefix and a newline. The scalar
//! must be in `[1, n)` (n the secp256k1 group order).
//!
//! **Permissions.** The file holds the account's secret, so, as ssh does
//! with its identity files, [`RelayKey::load`] refuses a file that its
//! group or other users can read or write (any of mode bits `0o077`), and
//! [`RelayKey::create`] writes it with mode `0600`, creating it only if
//! nothing is at the path yet (an existing key is never overwritten).

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use alloy_primitives::{Address, B256};
use alloy_signer_local::PrivateKeySigner;
use rand::RngCore;

/// Why a key file could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Something is at the path already; [`RelayKey::create`] never
    /// overwrites.
    #[error("{0}: already exists; refusing to overwrite a key file")]
    Exists(PathBuf),
    /// The file is readable or writable by its group or by others.
    #[error("{path}: permissions {mode:04o} are too open: a key file must not be accessible by group or others (chmod 600 {path})")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The content is not one line of 64 hex digits.
    #[error(
        "{path}: not a key file (want one line of 64 hex digits, a secp256k1 secret key): {why}"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the content).
        why: String,
    },
    /// The 32 bytes are zero or not below the curve order.
    #[error("{0}: not a valid secp256k1 secret key (zero or not below the group order)")]
    Scalar(PathBuf),
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// A relay account's secret key. `Debug` shows the address only.
#[derive(Clone)]
pub struct RelayKey {
    signer: PrivateKeySigner,
}

impl fmt::Debug for RelayKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RelayKey {{ address: {} }}", self.address())
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl RelayKey {
    /// Makes a new random key (from the operating system's generator) and
    /// writes it to `path` with mode 0600. Refuses if anything is at
    /// `path` already ([`KeyError::Exists`]).
    pub fn create(path: &Path) -> Result<Self, KeyError> {
        let key = Self::random();
        let mut f = match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(KeyError::Exists(path.to_path_buf()))
            }
            Err(e) => return Err(io(path)(e)),
        };
        // The mode given to open() is filtered by the umask, which can
        // only take bits away; set it exactly anyway.
        f.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(io(path))?;
        let line = format!("{}\n", hex::encode(key.signer.to_bytes()));
        f.write_all(line.as_bytes()).map_err(io(path))?;
        f.sync_all().map_err(io(path))?;
        Ok(key)
    }

    /// Reads the key at `path`, refusing a file open to group or others
    /// ([`KeyError::Permissions`]) before reading it.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let meta = fs::metadata(path).map_err(io(path))?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let text = fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => KeyError::Format {
                path: path.to_path_buf(),
                why: "not UTF-8 text".into(),
            },
            _ => io(path)(e),
        })?;
        Self::from_hex(&text).map_err(|e| match e {
            ParseKey::Format(why) => KeyError::Format {
                path: path.to_path_buf(),
                why,
            },
            ParseKey::Scalar => KeyError::Scalar(path.to_path_buf()),
        })
    }

    /// A key from the file format's text (64 hex digits, optional `0x`,
    /// surrounding whitespace ignored). For tests and tools that hold a
    /// well-known development key; the error never repeats the text.
    pub fn from_hex(text: &str) -> Result<Self, ParseKey> {
        let t = text.trim();
        let digits = t.strip_prefix("0x").unwrap_or(t);
        if digits.lines().count() > 1 {
            return Err(ParseKey::Format("more than one line".into()));
        }
        if digits.len() != 64 {
            return Err(ParseKey::Format(format!(
                "{} characters, want 64 hex digits",
                digits.len()
            )));
        }
        let bytes = hex::decode(digits).map_err(|_| ParseKey::Format("not hexadecimal".into()))?;
        let signer = PrivateKeySigner::from_bytes(&B256::from_slice(&bytes))
            .map_err(|_| ParseKey::Scalar)?;
        Ok(Self { signer })
    }

    /// A fresh key from the operating system's generator (not written
    /// anywhere).
    pub fn random() -> Self {
        loop {
            let mut b = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut b);
            // A draw of zero or one at or above the order (chance about
            // 2^-128) is simply drawn again.
            if let Ok(signer) = PrivateKeySigner::from_bytes(&B256::from(b)) {
                return Self { signer };
            }
        }
    }

    /// The account's address.
    pub fn address(&self) -> Address {
        self.signer.address()
    }

    /// The signer, for [`crate::tx`].
    pub(crate) fn signer(&self) -> &PrivateKeySigner {
        &self.signer
    }
}

/// Why text is not a key ([`RelayKey::from_hex`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseKey {
    /// Not 64 hex digits on one line.
    #[error("not a key: {0}")]
    Format(String),
    /// Zero or not below the group order.
    #[error("not a valid secp256k1 secret key (zero or not below the group order)")]
    Scalar,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// anvil's first development account (public knowledge).
    const ANVIL0: &str = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

    #[test]
    fn a_created_key_is_0600_loads_back_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.key");
        let k = RelayKey::create(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.len(), 65);
        assert!(text.ends_with('\n'));
        assert_eq!(RelayKey::load(&path).unwrap().address(), k.address());
        let again = RelayKey::create(&path);
        assert!(matches!(again, Err(KeyError::Exists(_))), "{again:?}");
        // The first key is still there.
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn a_key_open_to_group_or_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.key");
        RelayKey::create(&path).unwrap();
        for mode in [0o640, 0o604, 0o620, 0o602, 0o644, 0o660] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            let e = RelayKey::load(&path).unwrap_err();
            assert!(
                matches!(e, KeyError::Permissions { mode: m, .. } if m == mode),
                "{mode:o}: {e:?}"
            );
            assert!(e.to_string().contains("too open"), "{e}");
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o400)).unwrap();
        assert!(RelayKey::load(&path).is_ok());
    }

    #[test]
    fn the_well_known_anvil_key_has_its_well_known_address() {
        let k = RelayKey::from_hex(&format!("0x{ANVIL0}\n")).unwrap();
        assert_eq!(
            k.address(),
            "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
                .parse::<Address>()
                .unwrap()
        );
        assert_eq!(RelayKey::from_hex(ANVIL0).unwrap().address(), k.address());
        // Debug shows the address, not the secret.
        let shown = format!("{k:?}");
        assert!(
            !shown.contains(ANVIL0) && shown.contains("0xf39F"),
            "{shown}"
        );
    }

    #[test]
    fn bad_content_is_refused_without_echoing_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let secretish = "zz".repeat(32);
        for (text, scalar) in [
            ("".to_string(), false),
            (ANVIL0[..62].to_string(), false),
            (secretish.clone(), false),
            (format!("{ANVIL0}\n{ANVIL0}"), false),
            ("00".repeat(32), true),
            ("ff".repeat(32), true),
        ] {
            let _ = fs::remove_file(&path);
            fs::write(&path, &text).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
            let e = RelayKey::load(&path).unwrap_err();
            if scalar {
                assert!(matches!(e, KeyError::Scalar(_)), "{e:?}");
            } else {
                assert!(matches!(e, KeyError::Format { .. }), "{e:?}");
            }
            assert!(!e.to_string().contains(&secretish));
        }
        let missing = RelayKey::load(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(missing, KeyError::Io { .. }), "{missing:?}");
    }
}

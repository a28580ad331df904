//! Writing secret files (gateway and user key files, BLS key shares) so
//! that no other user can ever read them: the file is created with mode
//! 0600 under a temporary name in the same directory (`create_new`, so an
//! existing file or a planted symlink is never opened), its mode is set to
//! exactly 0600 before any byte is written (whatever the umask), its
//! content is written and fsync-ed, and only then does it get its name:
//! by `rename` when it may replace an existing file, by `hard_link` (which
//! fails if the name is taken) when it must not. The directory is fsync-ed
//! after. Nothing is ever written first and chmod-ed afterwards.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Whether [`write_secret`] may replace an existing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Replace it atomically (readers see the old or the new file, whole).
    Replace,
    /// Refuse with [`std::io::ErrorKind::AlreadyExists`]; the old file is
    /// left untouched.
    Keep,
}

/// Writes `bytes` to `path` as a secret file (mode 0600), creating the
/// parent directory if needed; see the module docs for how.
pub fn write_secret(path: &Path, bytes: &[u8], existing: Existing) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.{:016x}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        rand::random::<u64>()
    ));
    let result = write_tmp(&tmp, bytes).and_then(|()| match existing {
        Existing::Replace => std::fs::rename(&tmp, path),
        Existing::Keep => std::fs::hard_link(&tmp, path),
    });
    // After a rename the temporary name is gone; after a link or a failure
    // it is removed here.
    if tmp.exists() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    sync_dir(&dir)
}

/// Creates `tmp` (which must not exist) with mode 0600 and writes `bytes`.
fn write_tmp(tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(tmp)?;
    #[cfg(unix)]
    {
        // The umask can only have removed bits: make it exactly 0600 while
        // the file is still empty.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    file.write_all(bytes)?;
    file.sync_all()
}

/// Makes a rename or link in `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = (dir, File::open);
    Ok(())
}

/// The permission bits of `path` (for tests and checks): `mode & 0o777`.
#[cfg(unix)]
pub fn mode(path: &Path) -> std::io::Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o777)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn created_0600_and_not_clobbered_unless_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("secret.json");
        write_secret(&path, b"one", Existing::Keep).unwrap();
        // Exactly 0600, whatever the umask the tests run under.
        assert_eq!(mode(&path).unwrap(), 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"one");

        let e = write_secret(&path, b"two", Existing::Keep).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"one", "kept");

        // Replacing keeps 0600 even over a file someone made 0644.
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_secret(&path, b"two", Existing::Replace).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path).unwrap(), 0o600);

        // No temporary file is left behind, on success or refusal.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["secret.json"]);
    }

    #[test]
    fn a_planted_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"untouched").unwrap();
        let path = dir.path().join("key.json");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let e = write_secret(&path, b"secret", Existing::Keep).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&target).unwrap(), b"untouched");
    }

    use std::os::unix::fs::PermissionsExt;
}

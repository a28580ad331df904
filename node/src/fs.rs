//! [`FsPathError`]: a filesystem error that carries the path and what was
//! being done, the one I/O error of the node's file modules (key files,
//! share files, `app.toml`, the snapshot directory), in the manner of
//! reth's `fs-util`.

use std::path::{Path, PathBuf};

/// What was being done to the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsOp {
    /// Reading a file.
    Read,
    /// Writing a file.
    Write,
    /// Creating a directory (and its parents).
    CreateDir,
    /// Listing a directory.
    ReadDir,
    /// Removing a file or directory.
    Remove,
}

impl FsOp {
    /// The operation, for messages.
    pub fn name(self) -> &'static str {
        match self {
            FsOp::Read => "reading",
            FsOp::Write => "writing",
            FsOp::CreateDir => "creating the directory",
            FsOp::ReadDir => "listing the directory",
            FsOp::Remove => "removing",
        }
    }
}

/// A filesystem operation on `path` failed.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {} failed: {source}", .op.name())]
pub struct FsPathError {
    /// The file or directory.
    pub path: PathBuf,
    /// What was being done.
    pub op: FsOp,
    /// Why it failed.
    #[source]
    pub source: std::io::Error,
}

impl FsPathError {
    /// `op` on `path` failed with `source`.
    pub fn new(op: FsOp, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self {
            path: path.into(),
            op,
            source,
        }
    }

    /// A closure for `map_err` that makes the error of `op` on `path`.
    pub fn of(op: FsOp, path: &Path) -> impl Fn(std::io::Error) -> Self + '_ {
        move |source| Self::new(op, path, source)
    }
}

/// Reads `path` to a string.
pub fn read_to_string(path: &Path) -> Result<String, FsPathError> {
    std::fs::read_to_string(path).map_err(FsPathError::of(FsOp::Read, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_path_and_the_operation() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.json");
        let e = read_to_string(&missing).unwrap_err();
        assert_eq!(e.path, missing);
        assert_eq!(e.op, FsOp::Read);
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}: reading failed: ", missing.display())),
            "{text}"
        );
        assert_eq!(e.source.kind(), std::io::ErrorKind::NotFound);
    }
}

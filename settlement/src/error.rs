//! Errors of the state machine, split by whose fault they are.
//!
//! - [`Rejection`]: *this input is invalid*. It carries the result code and
//!   log a user sees; a rejected transaction changes nothing and the chain
//!   goes on.
//! - [`Fatal`]: *this node is broken*: its store failed, or it holds bytes
//!   that do not decode. The outcome would depend on a local fault, so it
//!   never becomes a result in a block: the adapter stops the node (see
//!   `docs/adr/0003-store-and-app-hash.md`). Read-only paths (mempool
//!   checks, queries) answer it as code 16 `internal` instead.
//! - [`ExecError`]: either of the two, for steps that can fail both ways.
//!
//! The split follows reth's `BlockExecutionError::{Validation, Internal}`.
//! A leaf module: it imports only [`crate::codes`] and the store's error.

use tally_store::StoreError;

use crate::codes::Code;

/// An invalid input: its result code and what was wrong, for a person.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {log}")]
pub struct Rejection {
    /// The result code.
    pub code: Code,
    /// What was wrong, for a person (the transaction's or query's log).
    pub log: String,
    /// Bytes for a program, in the result's `data` (deterministic: it is
    /// part of the block's results hash). Empty but for code 7
    /// `duplicate_report`, where it is the SHA-256 of the accepted report's
    /// body.
    pub data: Vec<u8>,
}

impl Rejection {
    /// A rejection with `code` and `log`.
    pub fn new(code: Code, log: impl Into<String>) -> Self {
        Self {
            code,
            log: log.into(),
            data: Vec::new(),
        }
    }

    /// The same rejection with `data` in the result.
    pub fn with_data(mut self, data: Vec<u8>) -> Self {
        self.data = data;
        self
    }
}

/// A local fault: the node cannot compute a trustworthy answer.
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    /// The store failed to read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored value (named here) does not decode.
    #[error("stored {0} is corrupt")]
    Corrupt(&'static str),
    /// The pending upgrade plan is due at this block and this node runs
    /// versions up to `max` only: it must stop before executing the block
    /// (ADR 0019).
    #[error(
        "upgrade {:?} switches to app version {} at height {}; this node runs app versions up to {max}: install a binary that carries version {}",
        plan.name, plan.app_version, plan.height, plan.app_version
    )]
    UpgradeNeeded {
        /// The plan.
        plan: Box<crate::proto::UpgradePlan>,
        /// The newest version this node runs.
        max: u64,
    },
}

impl Fatal {
    /// The result code a read-only path answers this fault with.
    pub const CODE: Code = Code::Internal;
}

/// A step that can fail because the input is invalid or because the node
/// is broken.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The input is invalid.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The node is broken.
    #[error("Internal: {0}")]
    Fatal(#[from] Fatal),
}

impl From<StoreError> for ExecError {
    fn from(e: StoreError) -> Self {
        ExecError::Fatal(Fatal::Store(e))
    }
}

/// Shorthand for an [`ExecError::Rejected`] with `code` and `log`.
pub fn reject(code: Code, log: impl Into<String>) -> ExecError {
    ExecError::Rejected(Rejection::new(code, log))
}

/// A `u32` on the wire or in state that names no variant of an enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{value} is not a known {what}")]
pub struct UnknownValue {
    /// The enum's name, for the message.
    pub what: &'static str,
    /// The value found.
    pub value: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_the_logs_users_and_operators_see() {
        assert_eq!(
            Rejection::new(Code::BadSystemTx, "no").to_string(),
            "BadSystemTx: no"
        );
        assert_eq!(
            Fatal::Corrupt("integer").to_string(),
            "stored integer is corrupt"
        );
        let e: ExecError = Fatal::Corrupt("batch").into();
        assert_eq!(e.to_string(), "Internal: stored batch is corrupt");
        let e: ExecError = StoreError::Backend("disk".into()).into();
        assert!(matches!(e, ExecError::Fatal(Fatal::Store(_))));
    }
}

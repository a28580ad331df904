//! [`LightError`], why a header or a value could not be verified, and the
//! helpers that format hashes and state keys in its messages.

use std::time::Duration;

use tally_client::rpc::RpcError;

/// Why a header or a value could not be verified.
#[derive(Debug, thiserror::Error)]
pub enum LightError {
    /// The node's header at the trust root's height is not the trusted one.
    #[error(
        "trust root mismatch: the node's header at height {height} has hash {got}, \
         the trust root says {want} (the node serves another chain or a fork, or the trust root is wrong)"
    )]
    TrustRootMismatch {
        /// Trust root height.
        height: u64,
        /// The node's header hash, hex.
        got: String,
        /// The trusted hash, hex.
        want: String,
    },
    /// The trust root names another chain than the node's.
    #[error(
        "chain mismatch: the trust root is for chain {want:?}, the node's headers say {got:?}"
    )]
    ChainMismatch {
        /// The trust root's chain id.
        want: String,
        /// The header's chain id.
        got: String,
    },
    /// A header did not pass light-client verification.
    #[error("verification failed for header {height}: {reason}")]
    Verification {
        /// The header's height.
        height: u64,
        /// What failed.
        reason: String,
    },
    /// The trusted header is older than the trusting period.
    #[error(
        "verification failed for header {height}: the trusted header at height {trusted} is outside \
         the trusting period ({reason}); get a recent trust root (`tallyd light init`)"
    )]
    TrustExpired {
        /// The header being verified.
        height: u64,
        /// The trusted header's height.
        trusted: u64,
        /// The verifier's message.
        reason: String,
    },
    /// A proof did not prove the answer under the verified app hash.
    #[error("proof verification failed for key {key} at height {height} (app hash {app_hash} of header {header}): {reason}")]
    Proof {
        /// The state key, shown readably.
        key: String,
        /// The height the answer is for.
        height: u64,
        /// The header whose app hash was used.
        header: u64,
        /// That app hash, hex.
        app_hash: String,
        /// What failed.
        reason: String,
    },
    /// The header a proof needs is not available from the node in time.
    #[error("header {height} is not available yet from the node (waited {waited:?}, latest height {latest})")]
    NotYetAvailable {
        /// The header asked for.
        height: u64,
        /// How long it was waited for.
        waited: Duration,
        /// The node's latest height when giving up.
        latest: u64,
    },
    /// The node's query answer was an error.
    #[error("query /key failed at height {height}: code {code} ({name}): {log}")]
    Query {
        /// The app's code.
        code: u32,
        /// The code's name.
        name: &'static str,
        /// The app's log.
        log: String,
        /// The height asked for (0: latest).
        height: u64,
    },
    /// The RPC call failed.
    #[error("RPC failure: {0}")]
    Rpc(#[from] RpcError),
    /// An answer did not have the expected shape.
    #[error("unexpected answer from the node ({what}): {msg}")]
    Decode {
        /// Which call.
        what: String,
        /// What was wrong.
        msg: String,
    },
    /// The trust store could not be read or written.
    #[error("trust store {path}: {msg}")]
    TrustStore {
        /// The file.
        path: String,
        /// What was wrong.
        msg: String,
    },
}

impl LightError {
    pub(crate) fn decode(what: impl Into<String>, msg: impl std::fmt::Display) -> Self {
        LightError::Decode {
            what: what.into(),
            msg: msg.to_string(),
        }
    }
}

/// Hex of `b`, upper case (how CometBFT prints hashes).
pub(crate) fn hex_upper(b: &[u8]) -> String {
    hex::encode_upper(b)
}

/// A state key for messages: printable ASCII as is, other bytes as `\xNN`.
pub fn show_key(key: &[u8]) -> String {
    key.iter()
        .map(|b| match b {
            0x20..=0x7e if *b != b'\\' => (*b as char).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect()
}

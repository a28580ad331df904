//! A light client of Tally's CometBFT chain, and reads of state it has
//! verified.
//!
//! Trust starts from a *trust root*: a height and the hash of the header at
//! that height, which the operator got from a source they trust
//! ([`trust::TrustRoot`], stored by `tallyd light init`). From there:
//!
//! 1. [`source`] fetches light blocks (signed header, validators, next
//!    validators) over a node's RPC: `/commit?height=H` and every page of
//!    `/validators?height=H`;
//! 2. [`client::LightClient::verify_to`] checks that the node's header at
//!    the trust root's height has the trusted hash, then verifies the target
//!    header with tendermint-rs's `ProdVerifier` (skipping verification at a
//!    trust threshold of 1/3, bisecting when the verdict is
//!    `NotEnoughTrust`); a target below the root is checked backwards along
//!    the `last_block_id` hash chain;
//! 3. [`proven::read_verified`] asks the node for state keys with `/key`
//!    (`prove=true`), waits for header `H + 1` (CometBFT carries the app hash
//!    of block `H` in header `H + 1`), verifies that header, and checks each
//!    ICS23 proof against its app hash before returning the values.
//!
//! Nothing here trusts the node: every value returned by
//! [`proven::read_verified`] is proven under a header that validators
//! holding enough voting power signed, traced back to the trust root.

use std::time::Duration;

use tally_client::rpc::RpcError;

pub mod client;
pub mod proven;
pub mod source;
pub mod trust;

#[cfg(test)]
mod tests;

pub use client::{LightClient, VerifiedHeader};
pub use source::{LightBlock, RpcSource, Source};
pub use trust::TrustRoot;

/// How long a trust root (or any verified header) may be used to verify
/// newer headers by default: 14 days. CometBFT-only chains have no unbonding
/// period; this bounds how old a validator set may be to be trusted.
pub const DEFAULT_TRUSTING_PERIOD: Duration = Duration::from_secs(14 * 24 * 3600);

/// How far a header's time may be ahead of this machine's clock.
pub const DEFAULT_CLOCK_DRIFT: Duration = Duration::from_secs(10);

/// Verification settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// How long a verified header's validators stay trusted.
    pub trusting_period: Duration,
    /// Allowed clock drift.
    pub clock_drift: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            trusting_period: DEFAULT_TRUSTING_PERIOD,
            clock_drift: DEFAULT_CLOCK_DRIFT,
        }
    }
}

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

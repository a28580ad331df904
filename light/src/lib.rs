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
//! 4. [`verified`] puts the values read in a [`verified::ReadKv`] that
//!    answers only the keys read, so the node's own query code
//!    (`tally_settlement::query`) turns them into the JSON an unverified
//!    query answers.
//!
//! Nothing here trusts the node: every value returned by
//! [`proven::read_verified`] is proven under a header that validators
//! holding enough voting power signed, traced back to the trust root.
//!
//! This crate links neither the node nor its store: a gateway or an auditor
//! verifies answers from Rust with `tally-light` alone (`tallyd query
//! --verify` is one user).

pub mod client;
pub mod error;
pub mod options;
pub mod proven;
pub mod source;
pub mod trust;
pub mod verified;

#[cfg(test)]
mod tests;

pub use client::{LightClient, VerifiedHeader};
pub use error::{show_key, LightError};
pub use options::{Options, DEFAULT_CLOCK_DRIFT, DEFAULT_TRUSTING_PERIOD};
pub use source::{LightBlock, RpcSource, Source};
pub use trust::TrustRoot;

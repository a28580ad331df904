//! `tallyd` as a library: its command line ([`cli`], which `tallyd` and
//! the test-only `tallyd-byzantine` run), configuration, key files, the
//! CometBFT RPC client of the commands, report building, the DKG
//! participant, snapshots, health checks and the node's metrics page
//! ([`metrics`]); shared by the binaries and the tests. The light client
//! and the SLA explorer are crates of their own (`tally-light`,
//! `tally-explorer`). With the test-only `byzantine` feature, also the
//! misbehaving app wrapper of `tallyd-byzantine` (module `byzantine`).

#[cfg(feature = "byzantine")]
pub mod byzantine;
pub mod cli;
pub mod config;
pub mod dealer;
pub mod dkgkey;
pub mod fs;
pub mod health;
pub mod keyfile;
pub mod metrics;
pub mod participant;
pub mod records;
pub mod rpc;
pub mod secret;
pub mod snapshots;

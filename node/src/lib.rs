//! Library side of `tallyd`: configuration, key files, the CometBFT RPC
//! client, the light client and verified state reads ([`light`]), and
//! report building, shared by the binary and the tests; the SLA explorer's
//! server and page ([`explorer`]). With the
//! test-only `byzantine` feature, also the misbehaving app wrapper of
//! `tallyd-byzantine` (module `byzantine`).

#[cfg(feature = "byzantine")]
pub mod byzantine;
pub mod config;
pub mod dealer;
pub mod dkgkey;
pub mod explorer;
pub mod health;
pub mod keyfile;
pub mod light;
pub mod participant;
pub mod records;
pub mod rpc;
pub mod secret;
pub mod snapshots;

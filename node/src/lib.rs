//! Library side of `tallyd`: configuration, key files, the CometBFT RPC
//! client and report building, shared by the binary and the tests.

pub mod config;
pub mod dealer;
pub mod keyfile;
pub mod records;
pub mod rpc;

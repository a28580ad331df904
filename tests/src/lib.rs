//! Test support for Tally: an in-process ABCI driver that runs several app
//! instances through CometBFT's call sequence with a controllable clock, and
//! a harness that runs a real CometBFT localnet on loopback.

pub mod driver;
pub mod localnet;
pub mod proxy;
pub mod traffic;

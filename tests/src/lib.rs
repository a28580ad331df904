//! Test support for Tally: an in-process ABCI driver that runs several app
//! instances through CometBFT's call sequence with a controllable clock,
//! byzantine behaviours for it and an in-process hub with every node's
//! relay, a real CometBFT localnet on loopback, a fault-injecting proxy,
//! cuttable P2P and TCP links (partitions), skewed clocks, a
//! tampering proxy that lies about query values and headers, a tiny
//! WebDriver client for headless Chromium, the runner of the end-to-end
//! tests that use them, and the network benchmark against CometBFT's kvstore.

pub mod adversary;
pub mod chaos;
pub mod depositbench;
pub mod dkgbench;
pub mod dkgnet;
pub mod driver;
pub mod e2e;
pub mod harness;
pub mod hub;
pub mod localnet;
pub mod metric_names;
pub mod netbench;
pub mod partition;
pub mod proxy;
pub mod sdk;
pub mod skew;
pub mod slobench;
pub mod smallfs;
pub mod snapbench;
pub mod statebench;
pub mod tamper;
pub mod traffic;
pub mod upgradebench;
pub mod webdriver;
pub mod worst;

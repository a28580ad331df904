//! The reference hub chain for Tally localnets and tests: a small CometBFT
//! app where users escrow credits (`Deposit`, a faucet) and the settlement
//! chain's validators settle their threshold-signed batches
//! (`SubmitBatch`), paid from escrow once per nonce, under the group key
//! the chain last handed over (`RotateKey`, [`keys`]). The relay talks to it
//! only through CometBFT's RPC, as it would to a real main chain.

pub mod app;
pub mod deposit;
pub mod keys;
mod kv;
pub mod machine;

pub use app::HubApp;

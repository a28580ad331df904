//! Tally's EVM hub, the Rust side (in progress): the contract's ABI
//! (bindings, creation code, calldata, reverts), EIP-2537 point encoding,
//! hub names and `CREATE` addresses, the relay's key file and EIP-1559
//! signing.

pub mod abi;
pub mod key;
pub mod name;
pub mod points;
pub mod tx;

pub use alloy_primitives::{Address, B256, U256};
pub use key::{KeyError, RelayKey};
pub use name::{create_address, HubName, NameError};

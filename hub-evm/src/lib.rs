//! Tally's EVM hub, the Rust side: a Solidity contract (`contract/`,
//! interface `contract/ITallyHub.sol`) escrows credits and pays Tally's
//! threshold-signed batches after checking the group's BLS signature with
//! the EIP-2537 precompiles. This crate deploys it, talks to it and reads
//! it back, for the relay and for the operator tool `tally-evm`.
//!
//! # API summary
//!
//! | module | what | main items |
//! |---|---|---|
//! | [`hub`] | one contract on one endpoint: deploy, deposit, submit, rotate, govern, withdraw (simulate first, estimate + margin, sign, send, wait) | [`EvmHub`], [`SendOptions`], [`Sent`], [`HubError`], [`MinedRevert`], [`gas_limit_for`] |
//! | [`rpc`] | blocking `eth_*` calls on one endpoint over `tally_client::rpc::RpcClient`; views; `Deposited` logs as `HubDeposit`s | [`EthRpc`], [`At`], [`EthError`], [`DepositLog`], [`BlockRef`], [`Receipt`], [`CallRequest`], [`Fees`] |
//! | [`abi`] | `sol!` bindings of `ITallyHub.sol`, creation code, constructor and calldata encoding, revert decoding and refusal codes | [`abi::DeployArgs`], [`abi::Revert`], [`abi::Refusal`], [`abi::RefusalCode`], [`abi::submit_batch_calldata`] |
//! | [`points`] | compressed BLS points to EIP-2537 form, with curve, subgroup and infinity checks | [`points::g1_to_eip2537`], [`points::g2_to_eip2537`], [`points::PointError`] |
//! | [`name`] | `evm:<chain id>:0x<address>` and `CREATE` addresses | [`HubName`], [`create_address`] |
//! | [`key`] | the relay's secp256k1 key file (0600, one hex line) | [`RelayKey`], [`KeyError`] |
//! | [`tx`] | EIP-1559 signing | [`tx::Eip1559`], [`tx::SignedTx`], [`tx::sign`] |
//!
//! The relay's typical use, per endpoint:
//!
//! ```no_run
//! # use std::time::Duration;
//! # fn demo(calls: Vec<tally_settlement::proto::HubCall>, sig: [u8; 96]) -> Result<(), tally_hub_evm::HubError> {
//! use tally_hub_evm::{At, EthRpc, EvmHub, RelayKey, SendOptions};
//! let rpc = tally_client::rpc::RpcClient::new(
//!     "http://127.0.0.1:8545",
//!     Duration::from_secs(2),
//!     Duration::from_secs(10),
//! );
//! let key = RelayKey::load("relay.key".as_ref()).expect("key");
//! let hub = EvmHub::connect(EthRpc::new(rpc), "0x5fbdb2315678afecb367f032d93f642f64180aa3".parse().unwrap())?;
//! // Tally's hub_chain parameter is hub.name().to_string().
//! let next = hub.eth().last_nonce(hub.address(), At::Latest)? + 1;
//! match hub.submit_batch(&key, next, &calls, &sig, &SendOptions::default()) {
//!     Ok(sent) => println!("settled in block {}", sent.receipt.block_number),
//!     Err(e) => match e.revert() {
//!         Some(r) if r.is_low_gas() => { /* send again with more gas */ }
//!         Some(r) => println!("refused, code {:?}: {r}", r.code().map(|c| c.value())),
//!         None => println!("node trouble: {e}"), // try another endpoint
//!     },
//! }
//! # Ok(()) }
//! ```
//!
//! Errors are typed per module (`thiserror`); nothing here panics on bad
//! input. Amounts are credits (`u64`) unless named wei (`U256`).

pub mod abi;
pub mod hub;
pub mod key;
pub mod name;
pub mod points;
pub mod rpc;
pub mod tx;

pub use alloy_primitives::{Address, B256, U256};
pub use hub::{gas_limit_for, EvmHub, HubError, MinedRevert, SendOptions, Sent};
pub use key::{KeyError, RelayKey};
pub use name::{create_address, HubName, NameError};
pub use rpc::{At, BlockRef, CallRequest, DepositLog, EthError, EthRpc, Fees, Receipt};

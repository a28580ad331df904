//! [`EvmHub`]: one hub contract on one endpoint, as the relay, the
//! operator tool and the tests use it: deploy, deposit, submit a batch,
//! rotate or govern the key, withdraw, and read it back ([`EvmHub::eth`]).
//!
//! Every transaction goes the same way ([`EvmHub::send`]):
//!
//! 1. **simulate** it with `eth_call` at the latest block from the
//!    sender's address (with the caller's gas limit if one is given): a
//!    revert is returned as [`HubError::Simulated`] and nothing is sent,
//!    so a refused batch costs no gas;
//! 2. **gas**: the caller's limit, or `eth_estimateGas` plus a margin
//!    ([`gas_limit_for`]: `estimate * 1.25 + 50 000`, at most
//!    [`MAX_GAS`]); a revert while estimating is [`HubError::Simulated`]
//!    too;
//! 3. **sign** an EIP-1559 transaction at the account's pending nonce with
//!    the node's fee suggestion ([`EthRpc::fees`]) and send it;
//! 4. **wait** for its receipt (polling, up to
//!    [`SendOptions::receipt_timeout`]). A transaction mined but reverted
//!    is [`HubError::Reverted`], with what a replay of it (same sender,
//!    data and gas limit) on the state its block left says. A reverted
//!    transaction changed nothing, so that is the state it met plus what
//!    came after it in the block: when another relay's copy of the same
//!    batch came first, the replay says `AlreadySettled`, which is why it
//!    failed; a gas limit that was too small replays as `LowGas`.
//!
//! One endpoint only: failover, retries and breakers stay with the caller.

use std::thread;
use std::time::{Duration, Instant};

use alloy_primitives::{Address, B256, U256};
use tally_settlement::proto::HubCall;

use crate::abi::{self, AbiError, DeployArgs, Revert};
use crate::key::RelayKey;
use crate::name::{create_address, HubName};
use crate::points::PointError;
use crate::rpc::{At, CallRequest, EthError, EthRpc, Receipt};
use crate::tx::{self, Eip1559, TxError};

/// The most gas a transaction is given (a margin never takes it above).
pub const MAX_GAS: u64 = 16_000_000;
/// Gas added to every estimate on top of the 25 %.
pub const GAS_EXTRA: u64 = 50_000;

/// The gas limit for a call estimated at `estimate`: `estimate * 1.25 +
/// 50 000`, capped at [`MAX_GAS`]. The margin covers the estimate's own
/// error and state that changes between estimate and inclusion; the
/// contract's `LowGas` check makes a limit that is still too small fail
/// as "more gas", never as a bad signature.
pub fn gas_limit_for(estimate: u64) -> u64 {
    estimate
        .saturating_add(estimate / 4)
        .saturating_add(GAS_EXTRA)
        .min(MAX_GAS)
}

/// How to send a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendOptions {
    /// A fixed gas limit (simulation runs with it too); `None`: estimate
    /// and add the margin ([`gas_limit_for`]).
    pub gas_limit: Option<u64>,
    /// How long to wait for the receipt.
    pub receipt_timeout: Duration,
    /// Time between receipt polls.
    pub poll_every: Duration,
}

impl Default for SendOptions {
    fn default() -> Self {
        Self {
            gas_limit: None,
            receipt_timeout: Duration::from_secs(120),
            poll_every: Duration::from_millis(250),
        }
    }
}

/// A transaction that was mined and succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Its receipt (`success` is true).
    pub receipt: Receipt,
    /// The gas limit it was sent with.
    pub gas_limit: u64,
}

/// A transaction that was mined but reverted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("transaction {tx_hash} reverted in block {block_number} ({gas_used} of {gas_limit} gas): {}", match .revert { Some(r) => r.to_string(), None => "a replay did not revert".into() })]
pub struct MinedRevert {
    /// The transaction.
    pub tx_hash: B256,
    /// Its block.
    pub block_number: u64,
    /// Gas it used.
    pub gas_used: u64,
    /// Its gas limit.
    pub gas_limit: u64,
    /// The revert a replay on the state its block left gives (`None`: the
    /// replay succeeded, so the state the transaction met differs from the
    /// state its block left; read the hub's state).
    pub revert: Option<Revert>,
}

/// Why a hub operation did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The contract would revert (simulation or gas estimate): nothing
    /// was sent.
    #[error("not sent: {0}")]
    Simulated(Revert),
    /// Sent and mined, but reverted: the gas is spent.
    #[error("{0}")]
    Reverted(Box<MinedRevert>),
    /// Sent, but no receipt within the timeout (it may still be mined).
    #[error("transaction {tx_hash} has no receipt after {waited:?}")]
    NoReceipt {
        /// The transaction.
        tx_hash: B256,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The node could not be reached or refused a call.
    #[error(transparent)]
    Eth(#[from] EthError),
    /// A key or signature that is not a valid point: nothing was sent.
    #[error(transparent)]
    Point(#[from] PointError),
    /// No creation code (an artifact-less build).
    #[error(transparent)]
    Abi(#[from] AbiError),
    /// The transaction could not be signed.
    #[error(transparent)]
    Sign(#[from] TxError),
    /// An input the hub cannot take (an amount that overflows, a contract
    /// that answers another name).
    #[error("{0}")]
    Input(String),
}

impl HubError {
    /// The contract's revert, whether found by simulation or by replaying
    /// a mined transaction.
    pub fn revert(&self) -> Option<&Revert> {
        match self {
            HubError::Simulated(r) => Some(r),
            HubError::Reverted(m) => m.revert.as_ref(),
            HubError::Eth(e) => e.revert(),
            _ => None,
        }
    }
}

/// One hub contract on one endpoint (cheap to clone).
#[derive(Clone, Debug)]
pub struct EvmHub {
    eth: EthRpc,
    name: HubName,
}

impl EvmHub {
    /// The hub at `address` on a chain known to be `chain_id` (no I/O).
    pub fn new(eth: EthRpc, chain_id: u64, address: Address) -> Self {
        Self {
            eth,
            name: HubName::new(chain_id, address),
        }
    }

    /// The hub at `address`: reads the chain id and checks that the
    /// contract answers `hubName()` with the name that follows from it.
    pub fn connect(eth: EthRpc, address: Address) -> Result<Self, HubError> {
        let chain_id = eth.chain_id()?;
        let hub = Self::new(eth, chain_id, address);
        let said = hub.eth.hub_name(address, At::Latest)?;
        if said != hub.name.to_string() {
            return Err(HubError::Input(format!(
                "contract {address} calls itself {said:?}, not {}: not a Tally hub on this chain",
                hub.name
            )));
        }
        Ok(hub)
    }

    /// Deploys a hub from `key`'s account; the returned hub is at the
    /// address the receipt gives, checked against the `CREATE` address of
    /// the account and nonce used.
    pub fn deploy(
        eth: EthRpc,
        key: &RelayKey,
        args: &DeployArgs,
        opts: &SendOptions,
    ) -> Result<(Self, Sent), HubError> {
        let chain_id = eth.chain_id()?;
        let code = abi::deploy_code(args)?;
        let (sent, nonce) = send_on(&eth, chain_id, key, None, U256::ZERO, code, opts)?;
        let want = create_address(key.address(), nonce);
        match sent.receipt.contract_address {
            Some(a) if a == want => Ok((Self::new(eth, chain_id, a), sent)),
            other => Err(HubError::Eth(EthError::Answer {
                method: "eth_getTransactionReceipt".into(),
                msg: format!("deployment created {other:?}, expected {want}"),
            })),
        }
    }

    /// The endpoint's calls (views, logs, blocks).
    pub fn eth(&self) -> &EthRpc {
        &self.eth
    }

    /// The contract.
    pub fn address(&self) -> Address {
        self.name.address
    }

    /// The chain id.
    pub fn chain_id(&self) -> u64 {
        self.name.chain_id
    }

    /// `evm:<chain id>:0x<address>`: Tally's `hub_chain` for this hub.
    pub fn name(&self) -> HubName {
        self.name
    }

    /// Sends `data` with `value` wei to the hub from `key`'s account (the
    /// four steps of the module docs).
    pub fn send(
        &self,
        key: &RelayKey,
        value: U256,
        data: Vec<u8>,
        opts: &SendOptions,
    ) -> Result<Sent, HubError> {
        send_on(
            &self.eth,
            self.name.chain_id,
            key,
            Some(self.name.address),
            value,
            data,
            opts,
        )
        .map(|(s, _)| s)
    }

    /// Escrows `credits` for `user`, sending `credits * weiPerCredit()`
    /// wei; `pubkey` (32 bytes, or empty) binds a key on the deposit that
    /// first funds `user`.
    pub fn deposit(
        &self,
        key: &RelayKey,
        user: &str,
        credits: u64,
        pubkey: &[u8],
        opts: &SendOptions,
    ) -> Result<Sent, HubError> {
        let per = self.eth.wei_per_credit(self.address(), At::Latest)?;
        let value = per.checked_mul(U256::from(credits)).ok_or_else(|| {
            HubError::Input(format!(
                "{credits} credits at {per} wei each overflow 256 bits"
            ))
        })?;
        self.send(key, value, abi::deposit_calldata(user, pubkey), opts)
    }

    /// Submits batch `nonce`: `calls` (ascending ids, as Tally signed
    /// them) and the group's 96-byte compressed `signature`. A batch the
    /// contract refuses comes back as [`HubError::Simulated`] with its
    /// [`Revert`] and nothing is sent.
    pub fn submit_batch(
        &self,
        key: &RelayKey,
        nonce: u64,
        calls: &[HubCall],
        signature: &[u8],
        opts: &SendOptions,
    ) -> Result<Sent, HubError> {
        let data = abi::submit_batch_calldata(nonce, calls, signature)?;
        self.send(key, U256::ZERO, data, opts)
    }

    /// Applies rotation `nonce` to `group_key` (48 bytes compressed) with
    /// the current key's 96-byte `signature` over its rotation digest.
    pub fn rotate_key(
        &self,
        key: &RelayKey,
        nonce: u64,
        epoch: u64,
        group_key: &[u8],
        signature: &[u8],
        opts: &SendOptions,
    ) -> Result<Sent, HubError> {
        let data = abi::rotate_key_calldata(nonce, epoch, group_key, signature)?;
        self.send(key, U256::ZERO, data, opts)
    }

    /// `key`'s account (a governor) approves governed rotation `nonce` to
    /// `group_key`.
    pub fn govern_key(
        &self,
        key: &RelayKey,
        nonce: u64,
        epoch: u64,
        group_key: &[u8],
        opts: &SendOptions,
    ) -> Result<Sent, HubError> {
        let data = abi::govern_key_calldata(nonce, epoch, group_key)?;
        self.send(key, U256::ZERO, data, opts)
    }

    /// Sends `key`'s account everything withdrawals credited to it.
    pub fn withdraw(&self, key: &RelayKey, opts: &SendOptions) -> Result<Sent, HubError> {
        self.send(key, U256::ZERO, abi::withdraw_calldata(), opts)
    }
}

/// The four steps; returns the receipt and the nonce the transaction had.
fn send_on(
    eth: &EthRpc,
    chain_id: u64,
    key: &RelayKey,
    to: Option<Address>,
    value: U256,
    data: Vec<u8>,
    opts: &SendOptions,
) -> Result<(Sent, u64), HubError> {
    let mut req = CallRequest {
        from: Some(key.address()),
        to,
        value,
        data,
        gas: opts.gas_limit,
    };
    eth.eth_call(&req, At::Latest).map_err(simulated)?;
    let gas_limit = match opts.gas_limit {
        Some(g) => g,
        None => gas_limit_for(eth.estimate_gas(&req, At::Latest).map_err(simulated)?),
    };
    let fees = eth.fees()?;
    let nonce = eth.next_nonce(key.address())?;
    let signed = tx::sign(
        key,
        &Eip1559 {
            chain_id,
            nonce,
            max_fee_per_gas: fees.max_fee_per_gas,
            max_priority_fee_per_gas: fees.max_priority_fee_per_gas,
            gas_limit,
            to,
            value,
            data: req.data.clone(),
        },
    )?;
    let hash = eth.send_raw(&signed.raw)?;
    if hash != signed.hash {
        return Err(HubError::Eth(EthError::Answer {
            method: "eth_sendRawTransaction".into(),
            msg: format!(
                "node named the transaction {hash}, its hash is {}",
                signed.hash
            ),
        }));
    }
    let receipt = wait_receipt(eth, hash, opts)?;
    if receipt.success {
        return Ok((Sent { receipt, gas_limit }, nonce));
    }
    // Replay on the state its block left to learn why it reverted.
    req.gas = Some(gas_limit);
    let revert = match eth.eth_call(&req, At::Number(receipt.block_number)) {
        Ok(_) => None,
        Err(EthError::Reverted(r)) => Some(r),
        Err(e) => return Err(e.into()),
    };
    Err(HubError::Reverted(Box::new(MinedRevert {
        tx_hash: hash,
        block_number: receipt.block_number,
        gas_used: receipt.gas_used,
        gas_limit,
        revert,
    })))
}

/// A revert while simulating or estimating means nothing is sent.
fn simulated(e: EthError) -> HubError {
    match e {
        EthError::Reverted(r) => HubError::Simulated(r),
        other => HubError::Eth(other),
    }
}

fn wait_receipt(eth: &EthRpc, hash: B256, opts: &SendOptions) -> Result<Receipt, HubError> {
    let start = Instant::now();
    loop {
        if let Some(r) = eth.receipt(hash)? {
            return Ok(r);
        }
        let waited = start.elapsed();
        if waited >= opts.receipt_timeout {
            return Err(HubError::NoReceipt {
                tx_hash: hash,
                waited,
            });
        }
        thread::sleep(opts.poll_every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gas_margin_is_a_quarter_plus_fifty_thousand_capped() {
        assert_eq!(gas_limit_for(0), 50_000);
        assert_eq!(gas_limit_for(100_000), 175_000);
        assert_eq!(gas_limit_for(400_001), 550_001);
        assert_eq!(gas_limit_for(12_760_000), 16_000_000);
        assert_eq!(gas_limit_for(20_000_000), MAX_GAS);
        assert_eq!(gas_limit_for(u64::MAX), MAX_GAS);
    }

    #[test]
    fn a_simulated_revert_is_kept_apart_from_node_errors() {
        let r = simulated(EthError::Reverted(Revert::Empty));
        assert!(matches!(r, HubError::Simulated(Revert::Empty)));
        assert_eq!(r.revert(), Some(&Revert::Empty));
        let n = simulated(EthError::Node {
            method: "eth_call".into(),
            code: -1,
            message: "x".into(),
            data: String::new(),
        });
        assert!(matches!(n, HubError::Eth(EthError::Node { .. })));
        assert_eq!(n.revert(), None);
    }
}

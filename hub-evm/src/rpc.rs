//! Blocking Ethereum JSON-RPC for the hub: the few `eth_*` methods the
//! relay and the operator tool need, over the workspace's one JSON-RPC
//! client ([`tally_client::rpc::RpcClient`], ADR 0008), on ONE endpoint.
//! Failover and circuit breakers stay with the caller (the relay).
//!
//! Errors keep three things apart ([`EthError`]):
//!
//! - [`EthError::Unreachable`]: no answer (transport failure, an HTTP
//!   status that is not a JSON-RPC answer, an oversized answer): another
//!   endpoint or a later try may do better;
//! - [`EthError::Node`]: the node answered with a JSON-RPC error that is
//!   not a revert (a nonce too low, a method it does not serve, a block it
//!   does not have);
//! - [`EthError::Reverted`]: the contract reverted, decoded
//!   ([`crate::abi::Revert`]). Only methods that execute code (`eth_call`,
//!   `eth_estimateGas`) report reverts; nodes put the revert data, hex, in
//!   the JSON-RPC error's `data` member (anvil and geth: code 3,
//!   `"execution reverted..."`). An execution error without data (out of
//!   gas: anvil answers `eth_call` with -32603 `"EVM error OutOfGas"`,
//!   `eth_estimateGas` with -32003 `"Out of gas: ..."`) is
//!   [`crate::abi::Revert::Empty`].
//!
//! A well-formed answer of the wrong shape is [`EthError::Answer`].
//! The values calls take and give ([`At`], [`BlockRef`], [`Fees`],
//! [`Receipt`], [`CallRequest`], [`DepositLog`]) and their JSON forms,
//! `0x`-prefixed hex parsed strictly, are in `rpc/types.rs`, re-exported
//! here; the contract's views in `rpc/views.rs`.
//!
//! [`EthRpc::deposits`] reads the hub's `Deposited` events of a block
//! range with `eth_getLogs` as Tally's
//! [`HubDeposit`](tally_settlement::proto::HubDeposit)s: `seq`, `user`,
//! `amount` (the credits the deposit credited, the event's `amount`, the
//! registration fee already taken off) and `pubkey` (the key the deposit
//! bound, empty when it bound none).

use alloy_primitives::{Address, B256, U256};
use alloy_sol_types::{SolCall, SolEvent};
use serde_json::{json, Value};
use tally_client::rpc::{RpcClient, RpcError};

use crate::abi::{ITallyHub, Revert};

mod types;
mod views;

use types::{hex_data, parse_b256, parse_bytes, parse_u128, parse_u256, parse_u64, quantity};
pub use types::{At, BlockRef, CallRequest, DepositLog, Fees, Receipt};

/// Why an Ethereum JSON-RPC call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EthError {
    /// No JSON-RPC answer from the endpoint.
    #[error("EVM node unreachable: {}", unreachable_text(.0))]
    Unreachable(RpcError),
    /// The node answered with an error that is not a revert.
    #[error("EVM node refused {method} ({code}): {message}{}", if .data.is_empty() { String::new() } else { format!(" [{}]", .data) })]
    Node {
        /// The method called.
        method: String,
        /// JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
        /// Its `data`, if a string.
        data: String,
    },
    /// The contract reverted.
    #[error("{0}")]
    Reverted(Revert),
    /// The answer does not have the shape the method promises.
    #[error("unexpected answer to {method}: {msg}")]
    Answer {
        /// The method called.
        method: String,
        /// What was wrong.
        msg: String,
    },
}

impl EthError {
    /// The revert, if the contract reverted.
    pub fn revert(&self) -> Option<&Revert> {
        match self {
            EthError::Reverted(r) => Some(r),
            _ => None,
        }
    }
}

fn unreachable_text(e: &RpcError) -> String {
    match e {
        RpcError::Transport { url, msg } => format!("{url}: {msg}"),
        RpcError::Http {
            url, status, body, ..
        } => format!(
            "{url} answered HTTP {status}: {}",
            body.chars().take(200).collect::<String>()
        ),
        RpcError::TooLarge { url, limit } => format!("{url}: answer larger than {limit} bytes"),
        other => other.to_string(),
    }
}

fn answer(method: &str, msg: impl Into<String>) -> EthError {
    EthError::Answer {
        method: method.to_string(),
        msg: msg.into(),
    }
}

/// One endpoint's Ethereum JSON-RPC (cheap to clone).
#[derive(Clone, Debug)]
pub struct EthRpc {
    rpc: RpcClient,
}

impl EthRpc {
    /// Ethereum calls over `rpc` (e.g. `Connector::client(url)`).
    pub fn new(rpc: RpcClient) -> Self {
        Self { rpc }
    }

    /// The underlying client.
    pub fn client(&self) -> &RpcClient {
        &self.rpc
    }

    /// Calls `method`; execution errors become reverts only when
    /// `executes` (the method runs contract code).
    fn call(&self, method: &str, params: Value, executes: bool) -> Result<Value, EthError> {
        self.rpc
            .call(method, params)
            .map_err(|e| classify(method, e, executes))
    }

    /// `eth_chainId`.
    pub fn chain_id(&self) -> Result<u64, EthError> {
        let m = "eth_chainId";
        parse_u64(m, "chain id", &self.call(m, json!([]), false)?)
    }

    /// `eth_blockNumber`.
    pub fn block_number(&self) -> Result<u64, EthError> {
        let m = "eth_blockNumber";
        parse_u64(m, "block number", &self.call(m, json!([]), false)?)
    }

    /// `eth_getBlockByNumber(at, false)`: `None` if the node has no such
    /// block (a number above its tip).
    pub fn block(&self, at: At) -> Result<Option<BlockRef>, EthError> {
        let m = "eth_getBlockByNumber";
        let b = self.call(m, json!([at.param(), false]), false)?;
        if b.is_null() {
            return Ok(None);
        }
        BlockRef::from_json(m, &b).map(Some)
    }

    /// `eth_call` of `req` at `at`: the return data, or the decoded
    /// revert ([`EthError::Reverted`]).
    pub fn eth_call(&self, req: &CallRequest, at: At) -> Result<Vec<u8>, EthError> {
        let m = "eth_call";
        let r = self.call(m, json!([req.to_json(), at.param()]), true)?;
        parse_bytes(m, "result", &r)
    }

    /// `eth_estimateGas` of `req` on the state at `at`: the gas the node
    /// found enough, or the decoded revert.
    pub fn estimate_gas(&self, req: &CallRequest, at: At) -> Result<u64, EthError> {
        let m = "eth_estimateGas";
        let r = self.call(m, json!([req.to_json(), at.param()]), true)?;
        parse_u64(m, "gas", &r)
    }

    /// `eth_getTransactionCount(address, "pending")`: the nonce of the
    /// account's next transaction.
    pub fn next_nonce(&self, address: Address) -> Result<u64, EthError> {
        let m = "eth_getTransactionCount";
        let r = self.call(m, json!([address.to_string(), "pending"]), false)?;
        parse_u64(m, "nonce", &r)
    }

    /// `eth_getBalance(address, at)` in wei.
    pub fn balance(&self, address: Address, at: At) -> Result<U256, EthError> {
        let m = "eth_getBalance";
        let r = self.call(m, json!([address.to_string(), at.param()]), false)?;
        parse_u256(m, "balance", &r)
    }

    /// Fees to offer: the priority fee the node suggests
    /// (`eth_maxPriorityFeePerGas`) and a max fee of twice the latest
    /// base fee plus that (room for six full blocks of base-fee rises).
    /// Before London (no base fee) both are `eth_gasPrice`.
    pub fn fees(&self) -> Result<Fees, EthError> {
        let latest = self
            .block(At::Latest)?
            .ok_or_else(|| answer("eth_getBlockByNumber", "no latest block"))?;
        let Some(base) = latest.base_fee else {
            let m = "eth_gasPrice";
            let p = parse_u128(m, "gas price", &self.call(m, json!([]), false)?)?;
            return Ok(Fees {
                max_fee_per_gas: p,
                max_priority_fee_per_gas: p,
            });
        };
        let m = "eth_maxPriorityFeePerGas";
        let tip = parse_u128(m, "priority fee", &self.call(m, json!([]), false)?)?;
        Ok(Fees {
            max_fee_per_gas: base.saturating_mul(2).saturating_add(tip),
            max_priority_fee_per_gas: tip,
        })
    }

    /// `eth_sendRawTransaction`: the hash the node gives the transaction.
    pub fn send_raw(&self, raw: &[u8]) -> Result<B256, EthError> {
        let m = "eth_sendRawTransaction";
        let r = self.call(m, json!([hex_data(raw)]), false)?;
        parse_b256(m, "transaction hash", &r)
    }

    /// `eth_getTransactionReceipt`: `None` while the transaction is not
    /// mined (or unknown).
    pub fn receipt(&self, tx: B256) -> Result<Option<Receipt>, EthError> {
        let m = "eth_getTransactionReceipt";
        let r = self.call(m, json!([tx.to_string()]), false)?;
        if r.is_null() {
            return Ok(None);
        }
        Receipt::from_json(m, &r).map(Some)
    }

    /// The hub's `Deposited` events in blocks `from..=to` (`eth_getLogs`),
    /// ordered by `seq`. Only logs of `contract` whose first topic is the
    /// event's signature are asked for; one that does not decode, or that
    /// the node marks `removed` (reorged out), fails the whole read. Gaps
    /// in `seq` are the caller's to check.
    pub fn deposits(
        &self,
        contract: Address,
        from: u64,
        to: u64,
    ) -> Result<Vec<DepositLog>, EthError> {
        let m = "eth_getLogs";
        let filter = json!({
            "address": contract.to_string(),
            "fromBlock": quantity(from),
            "toBlock": quantity(to),
            "topics": [ITallyHub::Deposited::SIGNATURE_HASH.to_string()],
        });
        let r = self.call(m, json!([filter]), false)?;
        let logs = r
            .as_array()
            .ok_or_else(|| answer(m, "result is not a list"))?;
        let mut out = logs
            .iter()
            .map(|log| DepositLog::from_log(m, log))
            .collect::<Result<Vec<_>, _>>()?;
        out.sort_by_key(|d| d.deposit.seq);
        Ok(out)
    }

    /// Calls view `call` of `contract` at `at` and decodes its return.
    pub fn view<C: SolCall>(
        &self,
        contract: Address,
        call: &C,
        at: At,
    ) -> Result<C::Return, EthError> {
        let req = CallRequest {
            to: Some(contract),
            data: call.abi_encode(),
            ..CallRequest::default()
        };
        let out = self.eth_call(&req, at)?;
        C::abi_decode_returns(&out).map_err(|e| {
            answer(
                "eth_call",
                format!(
                    "{} at {contract} returned {} bytes that do not decode: {e}",
                    C::SIGNATURE,
                    out.len()
                ),
            )
        })
    }
}

/// Sorts a failed call: no answer, a revert (only for methods that run
/// code), a node's error, or a malformed answer.
fn classify(method: &str, e: RpcError, executes: bool) -> EthError {
    match e {
        RpcError::Rpc {
            code,
            message,
            data,
            ..
        } => {
            if executes {
                if let Some(bytes) = data.strip_prefix("0x").and_then(|h| hex::decode(h).ok()) {
                    return EthError::Reverted(Revert::decode(&bytes));
                }
                let lower = message.to_ascii_lowercase();
                let out_of_gas = lower.contains("out of gas") || lower.contains("outofgas");
                if code == 3 || lower.contains("execution reverted") || out_of_gas {
                    return EthError::Reverted(Revert::Empty);
                }
            }
            EthError::Node {
                method: method.to_string(),
                code,
                message,
                data,
            }
        }
        RpcError::Decode { method, msg } => EthError::Answer { method, msg },
        other => EthError::Unreachable(other),
    }
}

#[cfg(test)]
mod tests;

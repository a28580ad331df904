//! The values [`EthRpc`](super::EthRpc) takes and gives, and their JSON
//! forms: blocks to read at ([`At`]), block references, fees, receipts,
//! message calls and hub deposits.
//!
//! Quantities travel as `0x`-prefixed minimal hex and data as `0x`-prefixed
//! hex (the Ethereum JSON-RPC convention); both are parsed strictly, and a
//! value of the wrong shape is an [`EthError::Answer`] naming the method
//! and the field.

use std::fmt;

use alloy_primitives::{Address, B256, U256};
use alloy_sol_types::SolEvent;
use serde_json::{json, Value};
use tally_settlement::proto::HubDeposit;

use super::{answer, EthError};
use crate::abi::ITallyHub;

/// A block to read state at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// The newest block.
    Latest,
    /// The newest block the node considers safe from reorgs.
    Safe,
    /// The newest finalized block.
    Finalized,
    /// The pending state (with the node's own pending transactions).
    Pending,
    /// Block number `n`.
    Number(u64),
}

impl At {
    /// The block parameter as JSON-RPC takes it.
    pub(super) fn param(self) -> Value {
        match self {
            At::Latest => json!("latest"),
            At::Safe => json!("safe"),
            At::Finalized => json!("finalized"),
            At::Pending => json!("pending"),
            At::Number(n) => json!(quantity(n)),
        }
    }
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Number(n) => write!(f, "block {n}"),
            other => write!(f, "{}", other.param().as_str().unwrap_or("?")),
        }
    }
}

/// A block's number and hash (and its base fee, for fee estimates).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    /// Block number.
    pub number: u64,
    /// Block hash.
    pub hash: B256,
    /// `baseFeePerGas` (absent before London).
    pub base_fee: Option<u128>,
}

impl BlockRef {
    /// A block object of `method`'s answer (`eth_getBlockByNumber`).
    pub(super) fn from_json(method: &str, b: &Value) -> Result<Self, EthError> {
        let m = method;
        Ok(BlockRef {
            number: parse_u64(m, "number", &b["number"])?,
            hash: parse_b256(m, "hash", &b["hash"])?,
            base_fee: optional(m, b, "baseFeePerGas", parse_u128)?,
        })
    }
}

/// EIP-1559 fees to offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fees {
    /// `maxFeePerGas` (wei).
    pub max_fee_per_gas: u128,
    /// `maxPriorityFeePerGas` (wei).
    pub max_priority_fee_per_gas: u128,
}

/// A mined transaction's receipt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The transaction.
    pub tx_hash: B256,
    /// The block it is in.
    pub block_number: u64,
    /// The block's hash.
    pub block_hash: B256,
    /// Whether it succeeded (`status` 1).
    pub success: bool,
    /// Gas it used.
    pub gas_used: u64,
    /// Wei paid per unit of gas (`effectiveGasPrice`; 0 if the node
    /// leaves it out): `gas_used * effective_gas_price` is what the
    /// transaction cost its sender.
    pub effective_gas_price: u128,
    /// The contract it created, if any.
    pub contract_address: Option<Address>,
}

impl Receipt {
    /// A receipt object of `method`'s answer (`eth_getTransactionReceipt`).
    pub(super) fn from_json(method: &str, r: &Value) -> Result<Self, EthError> {
        let m = method;
        Ok(Receipt {
            tx_hash: parse_b256(m, "transactionHash", &r["transactionHash"])?,
            block_number: parse_u64(m, "blockNumber", &r["blockNumber"])?,
            block_hash: parse_b256(m, "blockHash", &r["blockHash"])?,
            success: parse_u64(m, "status", &r["status"])? == 1,
            gas_used: parse_u64(m, "gasUsed", &r["gasUsed"])?,
            effective_gas_price: optional(m, r, "effectiveGasPrice", parse_u128)?.unwrap_or(0),
            contract_address: optional(m, r, "contractAddress", parse_address)?,
        })
    }
}

/// A message call to simulate or estimate (`eth_call`, `eth_estimateGas`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallRequest {
    /// Sender (`msg.sender`); the node's default when `None`.
    pub from: Option<Address>,
    /// The contract; `None` simulates a deployment.
    pub to: Option<Address>,
    /// Wei sent along.
    pub value: U256,
    /// Calldata (or creation code).
    pub data: Vec<u8>,
    /// Gas limit; the node's default when `None`.
    pub gas: Option<u64>,
}

impl CallRequest {
    /// The call object of `eth_call` and `eth_estimateGas`.
    pub(super) fn to_json(&self) -> Value {
        let mut o = serde_json::Map::new();
        if let Some(f) = self.from {
            o.insert("from".into(), json!(f.to_string()));
        }
        if let Some(t) = self.to {
            o.insert("to".into(), json!(t.to_string()));
        }
        if !self.value.is_zero() {
            o.insert("value".into(), json!(quantity(self.value)));
        }
        if let Some(g) = self.gas {
            o.insert("gas".into(), json!(quantity(g)));
        }
        o.insert("data".into(), json!(hex_data(&self.data)));
        Value::Object(o)
    }
}

/// A hub deposit with where its event is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DepositLog {
    /// The deposit as Tally credits it.
    pub deposit: HubDeposit,
    /// Credits the deposit paid as registration fee (not credited).
    pub fee: u64,
    /// Who sent it.
    pub from: Address,
    /// The block it is in.
    pub block_number: u64,
    /// The transaction that made it.
    pub tx_hash: B256,
}

impl DepositLog {
    /// A log object of `method`'s answer (`eth_getLogs`) that must be a
    /// hub's `Deposited` event; a log the node marks `removed` (reorged
    /// out) is an error.
    pub(super) fn from_log(method: &str, log: &Value) -> Result<Self, EthError> {
        let m = method;
        if log.get("removed").and_then(Value::as_bool) == Some(true) {
            return Err(answer(m, "a log was removed (reorg): read the range again"));
        }
        let topics = log["topics"]
            .as_array()
            .ok_or_else(|| answer(m, "log without topics"))?
            .iter()
            .map(|t| parse_b256(m, "topic", t))
            .collect::<Result<Vec<_>, _>>()?;
        let data = parse_bytes(m, "log data", &log["data"])?;
        let ev = ITallyHub::Deposited::decode_raw_log(topics, &data)
            .map_err(|e| answer(m, format!("not a Deposited event: {e}")))?;
        Ok(DepositLog {
            deposit: HubDeposit {
                seq: ev.seq,
                user: ev.user,
                amount: ev.amount,
                pubkey: ev.pubkey.to_vec(),
            },
            fee: ev.fee,
            from: ev.from,
            block_number: parse_u64(m, "blockNumber", &log["blockNumber"])?,
            tx_hash: parse_b256(m, "transactionHash", &log["transactionHash"])?,
        })
    }
}

/// `0x`-prefixed minimal hex of `n`.
pub(super) fn quantity(n: impl fmt::LowerHex) -> String {
    format!("{n:#x}")
}

/// `0x`-prefixed hex of `b`.
pub(super) fn hex_data(b: &[u8]) -> String {
    format!("0x{}", hex::encode(b))
}

/// Parses a JSON-RPC quantity (`"0x0"`, `"0x1a"`; no empty digits).
pub(super) fn parse_u256(method: &str, what: &str, v: &Value) -> Result<U256, EthError> {
    let s = v
        .as_str()
        .ok_or_else(|| answer(method, format!("{what} is not a hex string: {v}")))?;
    let digits = s
        .strip_prefix("0x")
        .filter(|d| !d.is_empty() && d.len() <= 64)
        .ok_or_else(|| answer(method, format!("{what} is not a 0x quantity: {s:?}")))?;
    U256::from_str_radix(digits, 16)
        .map_err(|_| answer(method, format!("{what} is not a 0x quantity: {s:?}")))
}

pub(super) fn parse_u64(method: &str, what: &str, v: &Value) -> Result<u64, EthError> {
    let n = parse_u256(method, what, v)?;
    u64::try_from(n).map_err(|_| answer(method, format!("{what} {n} does not fit 64 bits")))
}

pub(super) fn parse_u128(method: &str, what: &str, v: &Value) -> Result<u128, EthError> {
    let n = parse_u256(method, what, v)?;
    u128::try_from(n).map_err(|_| answer(method, format!("{what} {n} does not fit 128 bits")))
}

/// Parses `0x`-prefixed hex bytes (`"0x"` is empty).
pub(super) fn parse_bytes(method: &str, what: &str, v: &Value) -> Result<Vec<u8>, EthError> {
    let s = v
        .as_str()
        .and_then(|s| s.strip_prefix("0x"))
        .ok_or_else(|| answer(method, format!("{what} is not 0x hex: {v}")))?;
    hex::decode(s).map_err(|e| answer(method, format!("{what} is not hex: {e}")))
}

/// Parses `0x`-prefixed hex of exactly `N` bytes.
fn parse_fixed<const N: usize>(method: &str, what: &str, v: &Value) -> Result<[u8; N], EthError> {
    let b = parse_bytes(method, what, v)?;
    <[u8; N]>::try_from(b.as_slice())
        .map_err(|_| answer(method, format!("{what} has {} bytes, not {N}", b.len())))
}

pub(super) fn parse_b256(method: &str, what: &str, v: &Value) -> Result<B256, EthError> {
    parse_fixed::<32>(method, what, v).map(B256::from)
}

pub(super) fn parse_address(method: &str, what: &str, v: &Value) -> Result<Address, EthError> {
    parse_fixed::<20>(method, what, v).map(Address::from)
}

/// Parses member `key` of object `v` with `parse`; `None` if it is absent
/// or null.
fn optional<T>(
    method: &str,
    v: &Value,
    key: &str,
    parse: fn(&str, &str, &Value) -> Result<T, EthError>,
) -> Result<Option<T>, EthError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => parse(method, key, x).map(Some),
    }
}

#[cfg(test)]
mod tests;

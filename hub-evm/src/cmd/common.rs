//! Argument groups the commands share, and value parsers that turn bad
//! input into clear messages before anything is sent.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tally_client::rpc::RpcClient;
use tally_hub_evm::{Address, At, EthRpc, EvmHub, RelayKey, SendOptions};

/// The endpoint.
#[derive(Debug, clap::Args)]
pub struct Endpoint {
    /// Ethereum JSON-RPC URL of the hub chain (e.g. http://127.0.0.1:8545).
    #[arg(long, env = "TALLY_EVM_RPC")]
    pub rpc: String,
    /// Seconds a JSON-RPC call may take.
    #[arg(long, default_value_t = 30)]
    pub timeout_secs: u64,
}

impl Endpoint {
    /// Ethereum calls on the endpoint.
    pub fn eth(&self) -> EthRpc {
        EthRpc::new(RpcClient::new(
            &self.rpc,
            Duration::from_secs(5),
            Duration::from_secs(self.timeout_secs.max(1)),
        ))
    }
}

/// The sending account.
#[derive(Debug, clap::Args)]
pub struct Key {
    /// The sender's key file (one line of 64 hex digits, mode 0600; see
    /// `tally-evm keygen`).
    #[arg(long)]
    pub key: PathBuf,
}

impl Key {
    /// Loads the key file.
    pub fn load(&self) -> anyhow::Result<RelayKey> {
        Ok(RelayKey::load(&self.key)?)
    }
}

/// The hub contract.
#[derive(Debug, clap::Args)]
pub struct Contract {
    /// The hub contract's address (0x and 40 hex digits).
    #[arg(long, value_parser = parse_address)]
    pub contract: Address,
}

impl Contract {
    /// The hub on `endpoint`, checked to answer its own hub name.
    pub fn hub(&self, endpoint: &Endpoint) -> anyhow::Result<EvmHub> {
        EvmHub::connect(endpoint.eth(), self.contract)
            .with_context(|| format!("hub contract {} at {}", self.contract, endpoint.rpc))
    }
}

/// A transaction to a hub contract: the endpoint, the sending account and
/// the contract.
#[derive(Debug, clap::Args)]
pub struct HubSender {
    #[command(flatten)]
    pub endpoint: Endpoint,
    #[command(flatten)]
    pub key: Key,
    #[command(flatten)]
    pub contract: Contract,
}

impl HubSender {
    /// The key and the hub (checked as [`Contract::hub`] checks it).
    pub fn open(&self) -> anyhow::Result<(RelayKey, EvmHub)> {
        let key = self.key.load()?;
        let hub = self.contract.hub(&self.endpoint)?;
        Ok((key, hub))
    }
}

/// How transactions are sent.
#[derive(Debug, clap::Args)]
pub struct Sending {
    /// A fixed gas limit (default: the node's estimate * 1.25 + 50000).
    #[arg(long)]
    pub gas_limit: Option<u64>,
    /// Seconds to wait for the receipt.
    #[arg(long, default_value_t = 120)]
    pub wait_secs: u64,
}

impl Sending {
    /// The options.
    pub fn options(&self) -> SendOptions {
        SendOptions {
            gas_limit: self.gas_limit,
            receipt_timeout: Duration::from_secs(self.wait_secs),
            ..SendOptions::default()
        }
    }
}

/// `0x` and 40 hex digits (any case; checksums are not checked).
pub fn parse_address(s: &str) -> Result<Address, String> {
    let digits = s.strip_prefix("0x").unwrap_or(s);
    if digits.len() != 40 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{s:?} is not an address (0x and 40 hex digits)"));
    }
    s.parse::<Address>().map_err(|e| format!("{s:?}: {e}"))
}

/// Bytes given in hex on the command line (a newtype: clap reads a bare
/// `Vec<u8>` field as many `u8` values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HexBytes(pub Vec<u8>);

/// Hex bytes (optional `0x`) of exactly `n` bytes.
pub fn parse_hex_len(s: &str, n: usize, what: &str) -> Result<Vec<u8>, String> {
    let digits = s.strip_prefix("0x").unwrap_or(s);
    let b = hex::decode(digits).map_err(|e| format!("{what} is not hex: {e}"))?;
    if b.len() != n {
        return Err(format!("{what} has {} bytes, want {n}", b.len()));
    }
    Ok(b)
}

/// A 48-byte compressed group key that is a valid G1 point.
pub fn parse_group_key(s: &str) -> Result<HexBytes, String> {
    let b = parse_hex_len(s, 48, "group key")?;
    tally_hub_evm::points::g1_to_eip2537(&b).map_err(|e| format!("group key: {e}"))?;
    Ok(HexBytes(b))
}

/// A 32-byte ed25519 key.
pub fn parse_pubkey(s: &str) -> Result<HexBytes, String> {
    parse_hex_len(s, 32, "pubkey").map(HexBytes)
}

/// `latest`, `safe`, `finalized`, `pending` or a block number.
pub fn parse_at(s: &str) -> Result<At, String> {
    match s {
        "latest" => Ok(At::Latest),
        "safe" => Ok(At::Safe),
        "finalized" => Ok(At::Finalized),
        "pending" => Ok(At::Pending),
        n => n.parse().map(At::Number).map_err(|_| {
            format!("{s:?} is not a block: latest, safe, finalized, pending or a number")
        }),
    }
}

//! The CLI's view of a CometBFT node: [`Rpc`], one endpoint with the CLI's
//! timeouts, and the answers it reads. The JSON-RPC itself is the
//! workspace's one client, `tally_client::rpc`; this module only fixes the
//! timeouts and keeps the shapes the commands and tests use.

use std::time::Duration;

use serde_json::Value;
use tally_client::rpc::RpcClient;

pub use tally_client::rpc::{Committed, QueryAnswer, RpcError, Status};

/// How long the CLI waits to connect to a node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one call may take (`broadcast_tx_commit` waits for a block).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A CometBFT RPC endpoint.
#[derive(Clone, Debug)]
pub struct Rpc {
    client: RpcClient,
}

impl Rpc {
    /// A client for `url` (e.g. `http://127.0.0.1:26657`).
    pub fn new(url: &str) -> Self {
        Self {
            client: RpcClient::new(url, CONNECT_TIMEOUT, CALL_TIMEOUT),
        }
    }

    /// The workspace client underneath, with the CLI's timeouts (what
    /// `tally_light` and `tally_explorer` read through).
    pub fn client(&self) -> &RpcClient {
        &self.client
    }

    /// The endpoint.
    pub fn url(&self) -> &str {
        self.client.url()
    }

    /// Calls `method` with `params`; returns the `result` member.
    pub fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.client.call(method, params)
    }

    /// `/status`.
    pub fn status(&self) -> Result<Status, RpcError> {
        self.client.status()
    }

    /// `/abci_query` at the latest height.
    pub fn abci_query(&self, path: &str) -> Result<QueryAnswer, RpcError> {
        self.client.abci_query(path)
    }

    /// `/broadcast_tx_commit`: waits until the transaction is in a block
    /// (or refused by CheckTx).
    pub fn broadcast_tx_commit(&self, tx: &[u8]) -> Result<Committed, RpcError> {
        self.client.broadcast_tx_commit(tx)
    }

    /// `/broadcast_tx_sync`: returns CheckTx's code, log and the tx hash.
    pub fn broadcast_tx_sync(&self, tx: &[u8]) -> Result<(u32, String, String), RpcError> {
        let c = self.client.broadcast_tx_sync(tx)?;
        Ok((c.code, c.log, c.hash))
    }
}

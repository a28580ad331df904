//! Talking to CometBFT nodes from async code: broadcast a report and wait
//! for its block, or look a transaction up by hash. [`HttpTransport`] does
//! it with the workspace's JSON-RPC client ([`crate::rpc`], blocking calls
//! on tokio's blocking pool); tests plug in a fake.

use std::future::Future;
use std::time::Duration;

use crate::retry::Failure;
use crate::rpc::{Connector, RpcError};

/// What `broadcast_tx_commit` said about a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Broadcast {
    /// CheckTx or the block gave this code (0: included and accepted).
    Result {
        /// Result code (CheckTx's if it refused, else the block's).
        code: u32,
        /// Log.
        log: String,
        /// Block height (0 if not included).
        height: u64,
        /// The result's `data` (CheckTx's if it refused, else the
        /// block's). For Tally's code 7 (duplicate report) it is the
        /// SHA-256 of the body of the report already accepted under that id.
        data: Vec<u8>,
    },
    /// CometBFT's mempool cache already holds these bytes: they are in a
    /// mempool or already in a block. Look them up to know which.
    InCache,
}

/// A transaction found in a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Included {
    /// The block's height.
    pub height: u64,
    /// Its result code in that block.
    pub code: u32,
    /// Its result's `data`.
    pub data: Vec<u8>,
}

/// A transport to CometBFT nodes.
pub trait Transport: Send + Sync + 'static {
    /// `broadcast_tx_commit` of `tx` on `endpoint`.
    fn broadcast_commit(
        &self,
        endpoint: String,
        tx: Vec<u8>,
    ) -> impl Future<Output = Result<Broadcast, Failure>> + Send;
    /// The committed result of the transaction with `hash` (SHA-256 of
    /// its bytes), if it is in a block.
    fn lookup(
        &self,
        endpoint: String,
        hash: [u8; 32],
    ) -> impl Future<Output = Result<Option<Included>, Failure>> + Send;
}

/// JSON-RPC over HTTP/1.1 (loopback or any reachable node), through the
/// workspace's one client ([`crate::rpc`]).
#[derive(Clone, Debug)]
pub struct HttpTransport {
    http: Connector,
}

impl HttpTransport {
    /// A transport whose HTTP calls time out after `timeout` (the retry
    /// policy's per-try timeout bounds them too).
    pub fn new(timeout: Duration) -> Self {
        Self {
            http: Connector::new(Duration::from_secs(2), timeout),
        }
    }
}

impl Transport for HttpTransport {
    async fn broadcast_commit(&self, endpoint: String, tx: Vec<u8>) -> Result<Broadcast, Failure> {
        let client = self.http.client(&endpoint);
        let r = tokio::task::spawn_blocking(move || client.broadcast_tx_commit(&tx))
            .await
            .map_err(|e| Failure::Transport(e.to_string()))?;
        match r {
            Ok(c) => Ok(Broadcast::Result {
                code: c.final_code(),
                log: c.final_log().to_string(),
                height: c.height,
                data: c.final_data().to_vec(),
            }),
            Err(e) if e.is_tx_in_cache() => Ok(Broadcast::InCache),
            // Mempool full, timed out waiting for a block, node catching
            // up, a proxy's 429: the retry policy decides.
            Err(e) => Err(e.into_failure()),
        }
    }

    async fn lookup(&self, endpoint: String, hash: [u8; 32]) -> Result<Option<Included>, Failure> {
        let client = self.http.client(&endpoint);
        let r = tokio::task::spawn_blocking(move || client.tx(&hash))
            .await
            .map_err(|e| Failure::Transport(e.to_string()))?;
        r.map(|found| {
            found.map(|t| Included {
                height: t.height,
                code: t.code,
                data: t.data,
            })
        })
        .map_err(RpcError::into_failure)
    }
}

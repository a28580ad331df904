//! Talking to CometBFT nodes from async code: broadcast a transaction and
//! wait for its block (`broadcast_tx_commit`, the relay's way), hand it to
//! a mempool and get CheckTx's answer only (`broadcast_tx_sync`, the
//! reporter's way), follow committed blocks, or look a transaction up by
//! hash. [`HttpTransport`] does it with the workspace's JSON-RPC client
//! ([`crate::rpc`], blocking calls on tokio's blocking pool); tests plug
//! in a fake.

use std::future::Future;
use std::time::Duration;

use sha2::{Digest, Sha256};

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

/// What `broadcast_tx_sync` said about a transaction: CheckTx's verdict
/// on one node, nothing about a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// CheckTx passed: the transaction waits in that node's mempool (it
    /// may still be dropped before any block takes it).
    Accepted,
    /// CheckTx refused it with this code.
    Refused {
        /// Result code.
        code: u32,
        /// Log.
        log: String,
        /// CheckTx's `data` (for Tally's code 7, the SHA-256 of the body of
        /// the report already accepted under that id).
        data: Vec<u8>,
    },
    /// CometBFT's mempool cache already holds these bytes: they are in a
    /// mempool or already in a block.
    InCache,
}

/// A committed block, as far as a follower of the chain needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Its height.
    pub height: u64,
    /// Its header time, whole seconds since the Unix epoch.
    pub time: u64,
    /// Its transactions with their results, in block order.
    pub txs: Vec<BlockTx>,
}

/// One transaction of a committed block and its FinalizeBlock result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTx {
    /// SHA-256 of the transaction's bytes (CometBFT's tx hash).
    pub hash: [u8; 32],
    /// Result code.
    pub code: u32,
    /// Log.
    pub log: String,
    /// The result's `data`.
    pub data: Vec<u8>,
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
    /// its bytes), if it is in a block (needs the node's tx indexer).
    fn lookup(
        &self,
        endpoint: String,
        hash: [u8; 32],
    ) -> impl Future<Output = Result<Option<Included>, Failure>> + Send;
    /// `broadcast_tx_sync` of `tx` on `endpoint`: CheckTx's answer only.
    fn broadcast_sync(
        &self,
        endpoint: String,
        tx: Vec<u8>,
    ) -> impl Future<Output = Result<Admission, Failure>> + Send;
    /// The latest committed height `endpoint` knows; a node that is still
    /// catching up is a failure (its view of the chain is stale).
    fn latest_height(&self, endpoint: String) -> impl Future<Output = Result<u64, Failure>> + Send;
    /// The committed block at `height` with its transactions' results.
    fn block(
        &self,
        endpoint: String,
        height: u64,
    ) -> impl Future<Output = Result<Block, Failure>> + Send;
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

    async fn broadcast_sync(&self, endpoint: String, tx: Vec<u8>) -> Result<Admission, Failure> {
        let client = self.http.client(&endpoint);
        let r = tokio::task::spawn_blocking(move || client.broadcast_tx_sync(&tx))
            .await
            .map_err(|e| Failure::Transport(e.to_string()))?;
        match r {
            Ok(c) if c.code == 0 => Ok(Admission::Accepted),
            Ok(c) => Ok(Admission::Refused {
                code: c.code,
                log: c.log,
                data: c.data,
            }),
            Err(e) if e.is_tx_in_cache() => Ok(Admission::InCache),
            // Mempool full, node catching up, a proxy's 429: the retry
            // policy decides.
            Err(e) => Err(e.into_failure()),
        }
    }

    async fn latest_height(&self, endpoint: String) -> Result<u64, Failure> {
        let client = self.http.client(&endpoint);
        let s = tokio::task::spawn_blocking(move || client.status())
            .await
            .map_err(|e| Failure::Transport(e.to_string()))?
            .map_err(RpcError::into_failure)?;
        if s.catching_up {
            return Err(Failure::Transport(format!(
                "node is catching up (at height {})",
                s.height
            )));
        }
        Ok(s.height)
    }

    async fn block(&self, endpoint: String, height: u64) -> Result<Block, Failure> {
        let client = self.http.client(&endpoint);
        let (b, results) = tokio::task::spawn_blocking(move || {
            Ok::<_, RpcError>((client.block(height)?, client.block_results(height)?))
        })
        .await
        .map_err(|e| Failure::Transport(e.to_string()))?
        .map_err(RpcError::into_failure)?;
        if b.height != height || b.txs.len() != results.len() {
            return Err(Failure::Transport(format!(
                "block {height}: {} transactions at height {} but {} results",
                b.txs.len(),
                b.height,
                results.len()
            )));
        }
        Ok(Block {
            height,
            time: b.time,
            txs: b
                .txs
                .iter()
                .zip(results)
                .map(|(tx, r)| BlockTx {
                    hash: Sha256::digest(tx).into(),
                    code: r.code,
                    log: r.log,
                    data: r.data,
                })
                .collect(),
        })
    }
}

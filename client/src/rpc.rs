//! The workspace's one CometBFT JSON-RPC client (ADR 0008).
//!
//! Blocking HTTP through `ureq`, the JSON-RPC 2.0 envelope, and typed
//! answers for the methods Tally uses: [`RpcClient::status`],
//! [`RpcClient::abci_query`], [`RpcClient::broadcast_tx_sync`],
//! [`RpcClient::broadcast_tx_commit`], [`RpcClient::tx`],
//! [`RpcClient::block`] and [`RpcClient::block_results`]. Transactions
//! and hashes travel base64-encoded, as CometBFT's JSON-RPC expects.
//!
//! Errors keep what a retry policy needs ([`RpcError`]): an HTTP status that
//! is not a JSON-RPC answer comes back with its `Retry-After` header and its
//! body (which may carry `RetryInfo.retryDelay`), and
//! [`RpcError::into_failure`] turns any error into the
//! [`Failure`](crate::retry::Failure) the retry policy classifies.
//!
//! Calls block: async callers run them on tokio's blocking pool, as
//! [`HttpTransport`](crate::HttpTransport) does. One [`Connector`] (timeouts
//! and a connection pool) serves the clients of many endpoints.

use std::io::Read;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::redact::{redact_url, redact_urls_in};
use crate::retry::Failure;

mod blocks;
pub use blocks::{parse_utc_secs, BlockTxs, ExecResult};

/// Answers larger than this are refused ([`RpcError::TooLarge`]).
pub const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// Why a call failed. Endpoint URLs in it have their credentials hidden
/// ([`redact_url`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// The node could not be reached, or the HTTP exchange broke off.
    #[error("cannot reach CometBFT RPC at {url}: {msg}")]
    Transport {
        /// The endpoint.
        url: String,
        /// Why.
        msg: String,
    },
    /// An HTTP status that is not a JSON-RPC answer (a proxy's 429 or 503,
    /// a 404 for a wrong URL): status, `Retry-After` and body are kept for
    /// the retry policy.
    #[error("CometBFT RPC at {url} answered HTTP {status}: {}", head(.body))]
    Http {
        /// The endpoint.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The `Retry-After` header, if any.
        retry_after: Option<String>,
        /// The response body.
        body: String,
    },
    /// The node answered with a JSON-RPC error.
    #[error("CometBFT RPC {method} failed ({code}): {message} {data}")]
    Rpc {
        /// The method called.
        method: String,
        /// JSON-RPC error code.
        code: i64,
        /// Message.
        message: String,
        /// Details.
        data: String,
    },
    /// The answer did not have the expected shape.
    #[error("unexpected answer from CometBFT RPC {method}: {msg}")]
    Decode {
        /// The method called.
        method: String,
        /// What was wrong.
        msg: String,
    },
    /// The answer was larger than [`MAX_ANSWER_BYTES`].
    #[error("answer from CometBFT RPC at {url} is larger than {limit} bytes")]
    TooLarge {
        /// The endpoint.
        url: String,
        /// The limit.
        limit: u64,
    },
}

/// The first 200 characters of `s`, for messages.
fn head(s: &str) -> String {
    s.chars().take(200).collect()
}

impl RpcError {
    /// The JSON-RPC error's message and data, if it is one.
    fn rpc_text(&self) -> Option<String> {
        match self {
            RpcError::Rpc { message, data, .. } => Some(format!("{message} {data}")),
            _ => None,
        }
    }

    /// Whether CometBFT refused a broadcast because its mempool cache
    /// already holds the same bytes (in a mempool or already in a block).
    pub fn is_tx_in_cache(&self) -> bool {
        self.rpc_text()
            .is_some_and(|t| t.contains("already exists in cache"))
    }

    /// Whether the node said the thing asked for does not exist (a `tx`
    /// lookup of a hash that is in no block).
    pub fn is_not_found(&self) -> bool {
        self.rpc_text().is_some_and(|t| t.contains("not found"))
    }

    /// The retry policy's view of this error: statuses keep their
    /// `Retry-After` and body; transport faults, malformed answers and
    /// JSON-RPC errors (mempool full, a broadcast that timed out waiting
    /// for its block, a node catching up) are worth another try; an answer
    /// that is too large is not.
    pub fn into_failure(self) -> Failure {
        match self {
            RpcError::Transport { msg, .. } => Failure::Transport(msg),
            RpcError::Http {
                status,
                retry_after,
                body,
                ..
            } => Failure::Status {
                code: status,
                retry_after,
                body,
            },
            RpcError::Rpc { message, data, .. } => Failure::Transport(format!("{message} {data}")),
            RpcError::Decode { msg, .. } => Failure::Transport(msg),
            RpcError::TooLarge { .. } => Failure::TooLarge,
        }
    }
}

/// Node status (`/status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Chain id (CometBFT's `network`).
    pub chain_id: String,
    /// Latest block height.
    pub height: u64,
    /// Latest app hash, hex.
    pub app_hash: String,
    /// Whether the node is still catching up.
    pub catching_up: bool,
}

/// The answer to an `abci_query`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryAnswer {
    /// The app's result code (0 = ok).
    pub code: u32,
    /// Error message.
    pub log: String,
    /// The value, base64-decoded.
    pub value: Vec<u8>,
    /// Height the answer is from.
    pub height: u64,
}

/// The outcome of `broadcast_tx_commit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// CheckTx code.
    pub check_code: u32,
    /// CheckTx log.
    pub check_log: String,
    /// FinalizeBlock code (when CheckTx passed).
    pub code: u32,
    /// FinalizeBlock log.
    pub log: String,
    /// CheckTx `data`, base64-decoded.
    pub check_data: Vec<u8>,
    /// FinalizeBlock `data`, base64-decoded.
    pub data: Vec<u8>,
    /// Block height (0 when not included).
    pub height: u64,
    /// Transaction hash, hex.
    pub hash: String,
}

impl Committed {
    /// The code that decides the outcome: CheckTx's when it refused,
    /// otherwise the block's.
    pub fn final_code(&self) -> u32 {
        if self.check_code != 0 {
            self.check_code
        } else {
            self.code
        }
    }

    /// The log that goes with [`Committed::final_code`].
    pub fn final_log(&self) -> &str {
        if self.check_code != 0 {
            &self.check_log
        } else {
            &self.log
        }
    }

    /// The `data` that goes with [`Committed::final_code`].
    pub fn final_data(&self) -> &[u8] {
        if self.check_code != 0 {
            &self.check_data
        } else {
            &self.data
        }
    }
}

/// The outcome of `broadcast_tx_sync`: CheckTx's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// CheckTx code.
    pub code: u32,
    /// CheckTx log.
    pub log: String,
    /// CheckTx `data`, base64-decoded.
    pub data: Vec<u8>,
    /// Transaction hash, hex.
    pub hash: String,
}

/// A transaction found in a block (`/tx`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxResult {
    /// The block it is in.
    pub height: u64,
    /// Its FinalizeBlock code.
    pub code: u32,
    /// Its FinalizeBlock log.
    pub log: String,
    /// Its FinalizeBlock `data`, base64-decoded.
    pub data: Vec<u8>,
}

/// Timeouts, an answer size limit and a connection pool, shared by the
/// clients of any number of endpoints ([`Connector::client`]).
#[derive(Clone, Debug)]
pub struct Connector {
    agent: ureq::Agent,
    limit: u64,
}

impl Connector {
    /// Connections time out after `connect`; a whole call (connect, send,
    /// read the answer) after `timeout`.
    pub fn new(connect: Duration, timeout: Duration) -> Self {
        Self {
            agent: ureq::AgentBuilder::new()
                .timeout_connect(connect)
                .timeout(timeout)
                .build(),
            limit: MAX_ANSWER_BYTES,
        }
    }

    /// A client for `url` (e.g. `http://127.0.0.1:26657`) over this pool.
    pub fn client(&self, url: &str) -> RpcClient {
        RpcClient {
            url: url.trim_end_matches('/').to_string(),
            http: self.clone(),
        }
    }
}

/// A client of one CometBFT RPC endpoint.
#[derive(Clone, Debug)]
pub struct RpcClient {
    url: String,
    http: Connector,
}

/// A number CometBFT may send as a JSON string or a JSON number; 0 if
/// absent.
fn u64_field(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

fn u32_field(v: &Value) -> u32 {
    u32::try_from(u64_field(v)).unwrap_or(u32::MAX)
}

fn str_field(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

/// A base64 bytes field (CometBFT's encoding of `data`); empty if absent.
fn bytes_field(method: &str, what: &str, v: &Value) -> Result<Vec<u8>, RpcError> {
    match v.as_str() {
        None | Some("") => Ok(Vec::new()),
        Some(s) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| RpcError::Decode {
                method: method.into(),
                msg: format!("{what} is not base64: {e}"),
            }),
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl RpcClient {
    /// A client for `url` with its own pool (see [`Connector`] to share one).
    pub fn new(url: &str, connect: Duration, timeout: Duration) -> Self {
        Connector::new(connect, timeout).client(url)
    }

    /// The endpoint, as configured (credentials included).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The endpoint with any credentials hidden, for logs and messages.
    pub fn shown_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Reads a body of at most the connector's limit.
    fn read_body(&self, resp: ureq::Response) -> Result<Vec<u8>, RpcError> {
        let mut buf = Vec::new();
        resp.into_reader()
            .take(self.http.limit + 1)
            .read_to_end(&mut buf)
            .map_err(|e| RpcError::Transport {
                url: self.shown_url(),
                msg: redact_urls_in(&e.to_string()),
            })?;
        if buf.len() as u64 > self.http.limit {
            return Err(RpcError::TooLarge {
                url: self.shown_url(),
                limit: self.http.limit,
            });
        }
        Ok(buf)
    }

    /// Calls `method` with `params`; returns the `result` member.
    ///
    /// A 2xx answer must be a JSON-RPC envelope. CometBFT answers some
    /// JSON-RPC errors with HTTP 500 and an envelope; those are
    /// [`RpcError::Rpc`] too. Any other status is [`RpcError::Http`].
    pub fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let envelope = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let (status, retry_after, body) = match self.http.agent.post(&self.url).send_json(envelope)
        {
            Ok(r) => (r.status(), None, self.read_body(r)?),
            Err(ureq::Error::Status(status, r)) => {
                let retry_after = r.header("Retry-After").map(str::to_string);
                (status, retry_after, self.read_body(r)?)
            }
            Err(e) => {
                return Err(RpcError::Transport {
                    url: self.shown_url(),
                    msg: redact_urls_in(&e.to_string()),
                })
            }
        };
        let parsed = serde_json::from_slice::<Value>(&body);
        match (status, parsed) {
            (200..=299, Ok(v)) => self.unwrap_envelope(method, v),
            (200..=299, Err(e)) => Err(RpcError::Decode {
                method: method.into(),
                msg: format!("bad JSON from {}: {e}", self.shown_url()),
            }),
            (500, Ok(v)) if v.get("jsonrpc").is_some() && v.get("error").is_some() => {
                self.unwrap_envelope(method, v)
            }
            _ => Err(RpcError::Http {
                url: self.shown_url(),
                status,
                retry_after,
                body: String::from_utf8_lossy(&body).into_owned(),
            }),
        }
    }

    fn unwrap_envelope(&self, method: &str, mut v: Value) -> Result<Value, RpcError> {
        if let Some(err) = v.get("error") {
            return Err(RpcError::Rpc {
                method: method.into(),
                code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: str_field(&err["message"]),
                data: str_field(&err["data"]),
            });
        }
        match v.get_mut("result") {
            Some(r) => Ok(r.take()),
            None => Err(RpcError::Decode {
                method: method.into(),
                msg: "no result".into(),
            }),
        }
    }

    /// `/status`.
    pub fn status(&self) -> Result<Status, RpcError> {
        let r = self.call("status", json!({}))?;
        Ok(Status {
            chain_id: str_field(&r["node_info"]["network"]),
            height: u64_field(&r["sync_info"]["latest_block_height"]),
            app_hash: str_field(&r["sync_info"]["latest_app_hash"]),
            catching_up: r["sync_info"]["catching_up"].as_bool().unwrap_or(false),
        })
    }

    /// `/abci_query` of `path` at the latest height; the value is decoded
    /// from base64 (a value that is not base64 is a [`RpcError::Decode`]).
    pub fn abci_query(&self, path: &str) -> Result<QueryAnswer, RpcError> {
        self.abci_query_at(path, 0)
    }

    /// `/abci_query` of `path` at `height` (0: the latest). The answer's
    /// [`QueryAnswer::height`] is the height the app says it answered
    /// from; a caller that needs state at or above some height checks it.
    pub fn abci_query_at(&self, path: &str, height: u64) -> Result<QueryAnswer, RpcError> {
        let r = self.call(
            "abci_query",
            json!({"path": path, "data": "", "height": height.to_string(), "prove": false}),
        )?;
        let resp = &r["response"];
        let value = match resp["value"].as_str() {
            None => Vec::new(),
            Some(s) => base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| RpcError::Decode {
                    method: "abci_query".into(),
                    msg: format!("{path}: value is not base64: {e}"),
                })?,
        };
        Ok(QueryAnswer {
            code: u32_field(&resp["code"]),
            log: str_field(&resp["log"]),
            value,
            height: u64_field(&resp["height"]),
        })
    }

    /// `/broadcast_tx_commit`: waits until the transaction is in a block
    /// (or refused by CheckTx).
    pub fn broadcast_tx_commit(&self, tx: &[u8]) -> Result<Committed, RpcError> {
        let m = "broadcast_tx_commit";
        let r = self.call(m, json!({ "tx": b64(tx) }))?;
        Ok(Committed {
            check_code: u32_field(&r["check_tx"]["code"]),
            check_log: str_field(&r["check_tx"]["log"]),
            code: u32_field(&r["tx_result"]["code"]),
            log: str_field(&r["tx_result"]["log"]),
            check_data: bytes_field(m, "check_tx.data", &r["check_tx"]["data"])?,
            data: bytes_field(m, "tx_result.data", &r["tx_result"]["data"])?,
            height: u64_field(&r["height"]),
            hash: str_field(&r["hash"]),
        })
    }

    /// `/broadcast_tx_sync`: CheckTx's code and log, and the hash.
    pub fn broadcast_tx_sync(&self, tx: &[u8]) -> Result<Checked, RpcError> {
        let r = self.call("broadcast_tx_sync", json!({ "tx": b64(tx) }))?;
        Ok(Checked {
            code: u32_field(&r["code"]),
            log: str_field(&r["log"]),
            data: bytes_field("broadcast_tx_sync", "data", &r["data"])?,
            hash: str_field(&r["hash"]),
        })
    }

    /// `/tx`: the committed result of the transaction whose SHA-256 is
    /// `hash`, or `None` if it is in no block (yet).
    pub fn tx(&self, hash: &[u8; 32]) -> Result<Option<TxResult>, RpcError> {
        match self.call("tx", json!({ "hash": b64(hash), "prove": false })) {
            Ok(r) => Ok(Some(TxResult {
                height: u64_field(&r["height"]),
                code: u32_field(&r["tx_result"]["code"]),
                log: str_field(&r["tx_result"]["log"]),
                data: bytes_field("tx", "tx_result.data", &r["tx_result"]["data"])?,
            })),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;

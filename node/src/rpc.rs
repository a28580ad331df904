//! A small blocking client for CometBFT's JSON-RPC (loopback HTTP).

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

/// Errors talking to a CometBFT node.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The node could not be reached or the HTTP exchange failed.
    #[error("cannot reach CometBFT RPC at {url}: {msg}")]
    Transport {
        /// The endpoint.
        url: String,
        /// Why.
        msg: String,
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
}

/// Node status.
#[derive(Clone, Debug)]
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
#[derive(Clone, Debug)]
pub struct QueryAnswer {
    /// Tally result code (0 = ok).
    pub code: u32,
    /// Error message.
    pub log: String,
    /// The JSON value.
    pub value: Vec<u8>,
    /// Height the answer is from.
    pub height: u64,
}

/// The outcome of `broadcast_tx_commit`.
#[derive(Clone, Debug)]
pub struct Committed {
    /// CheckTx code.
    pub check_code: u32,
    /// CheckTx log.
    pub check_log: String,
    /// FinalizeBlock code (when CheckTx passed).
    pub code: u32,
    /// FinalizeBlock log.
    pub log: String,
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
}

/// A CometBFT RPC endpoint.
#[derive(Clone, Debug)]
pub struct Rpc {
    url: String,
    agent: ureq::Agent,
}

fn u64_field(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

fn b64(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

impl Rpc {
    /// A client for `url` (e.g. `http://127.0.0.1:26657`).
    pub fn new(url: &str) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(3))
            .timeout(Duration::from_secs(30))
            .build();
        Self {
            url: url.trim_end_matches('/').to_string(),
            agent,
        }
    }

    /// The endpoint.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Calls `method` with `params`; returns the `result` member.
    pub fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let resp = match self.agent.post(&self.url).send_json(body) {
            Ok(r) => r,
            // CometBFT answers JSON-RPC errors with HTTP 500 and a JSON body.
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => {
                return Err(RpcError::Transport {
                    url: self.url.clone(),
                    msg: e.to_string(),
                })
            }
        };
        let v: Value = resp.into_json().map_err(|e| RpcError::Decode {
            method: method.into(),
            msg: e.to_string(),
        })?;
        if let Some(err) = v.get("error") {
            return Err(RpcError::Rpc {
                method: method.into(),
                code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: err
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .into(),
                data: err.get("data").and_then(Value::as_str).unwrap_or("").into(),
            });
        }
        v.get("result").cloned().ok_or_else(|| RpcError::Decode {
            method: method.into(),
            msg: "no result".into(),
        })
    }

    /// `/status`.
    pub fn status(&self) -> Result<Status, RpcError> {
        let r = self.call("status", json!({}))?;
        Ok(Status {
            chain_id: r["node_info"]["network"].as_str().unwrap_or("").into(),
            height: u64_field(&r["sync_info"]["latest_block_height"]),
            app_hash: r["sync_info"]["latest_app_hash"]
                .as_str()
                .unwrap_or("")
                .into(),
            catching_up: r["sync_info"]["catching_up"].as_bool().unwrap_or(false),
        })
    }

    /// `/abci_query` at the latest height.
    pub fn abci_query(&self, path: &str) -> Result<QueryAnswer, RpcError> {
        let r = self.call(
            "abci_query",
            json!({"path": path, "data": "", "height": "0", "prove": false}),
        )?;
        let resp = &r["response"];
        Ok(QueryAnswer {
            code: u64_field(&resp["code"]) as u32,
            log: resp["log"].as_str().unwrap_or("").into(),
            value: b64(&resp["value"]),
            height: u64_field(&resp["height"]),
        })
    }

    /// `/broadcast_tx_commit`: waits until the transaction is in a block
    /// (or refused by CheckTx).
    pub fn broadcast_tx_commit(&self, tx: &[u8]) -> Result<Committed, RpcError> {
        let tx = base64::engine::general_purpose::STANDARD.encode(tx);
        let r = self.call("broadcast_tx_commit", json!({ "tx": tx }))?;
        Ok(Committed {
            check_code: u64_field(&r["check_tx"]["code"]) as u32,
            check_log: r["check_tx"]["log"].as_str().unwrap_or("").into(),
            code: u64_field(&r["tx_result"]["code"]) as u32,
            log: r["tx_result"]["log"].as_str().unwrap_or("").into(),
            height: u64_field(&r["height"]),
            hash: r["hash"].as_str().unwrap_or("").into(),
        })
    }

    /// `/broadcast_tx_sync`: returns CheckTx's code, log and the tx hash.
    pub fn broadcast_tx_sync(&self, tx: &[u8]) -> Result<(u32, String, String), RpcError> {
        let tx = base64::engine::general_purpose::STANDARD.encode(tx);
        let r = self.call("broadcast_tx_sync", json!({ "tx": tx }))?;
        Ok((
            u64_field(&r["code"]) as u32,
            r["log"].as_str().unwrap_or("").into(),
            r["hash"].as_str().unwrap_or("").into(),
        ))
    }
}

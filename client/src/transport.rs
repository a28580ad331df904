//! Talking to CometBFT's JSON-RPC: broadcast a report and wait for its
//! block, or look a transaction up by hash. [`HttpTransport`] does it over
//! HTTP (blocking `ureq` calls on tokio's blocking pool); tests plug in a
//! fake.

use std::future::Future;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::retry::Failure;

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
    },
    /// CometBFT's mempool cache already holds these bytes: they are in a
    /// mempool or already in a block. Look them up to know which.
    InCache,
}

/// A transport to CometBFT nodes.
pub trait Transport: Send + Sync + 'static {
    /// `broadcast_tx_commit` of `tx` on `endpoint`.
    fn broadcast_commit(
        &self,
        endpoint: String,
        tx: Vec<u8>,
    ) -> impl Future<Output = Result<Broadcast, Failure>> + Send;
    /// The committed result (height, code) of the transaction with `hash`
    /// (SHA-256 of its bytes), if it is in a block.
    fn lookup(
        &self,
        endpoint: String,
        hash: [u8; 32],
    ) -> impl Future<Output = Result<Option<(u64, u32)>, Failure>> + Send;
}

/// JSON-RPC over HTTP/1.1 (loopback or any reachable node).
#[derive(Clone, Debug)]
pub struct HttpTransport {
    agent: ureq::Agent,
}

impl HttpTransport {
    /// A transport whose HTTP calls time out after `timeout` (the retry
    /// policy's per-try timeout bounds them too).
    pub fn new(timeout: Duration) -> Self {
        Self {
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(2))
                .timeout(timeout)
                .build(),
        }
    }

    fn call(
        agent: &ureq::Agent,
        endpoint: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, Failure> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let resp = match agent.post(endpoint).send_json(body) {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                let retry_after = r.header("Retry-After").map(str::to_string);
                let text = r.into_string().unwrap_or_default();
                // CometBFT answers JSON-RPC errors with HTTP 500 and a
                // JSON-RPC body; anything else (a proxy's 429 or 503) keeps
                // its status, Retry-After and body for the retry policy.
                if code == 500 {
                    if let Ok(v) = serde_json::from_str::<Value>(&text) {
                        if v.get("jsonrpc").is_some() && v.get("error").is_some() {
                            return Ok(v);
                        }
                    }
                }
                return Err(Failure::Status {
                    code,
                    retry_after,
                    body: text,
                });
            }
            Err(e) => return Err(Failure::Transport(e.to_string())),
        };
        let text = resp
            .into_string()
            .map_err(|e| Failure::Transport(e.to_string()))?;
        if text.len() > 16 << 20 {
            return Err(Failure::TooLarge);
        }
        serde_json::from_str(&text)
            .map_err(|e| Failure::Transport(format!("bad JSON from {endpoint}: {e}")))
    }
}

fn num(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

impl Transport for HttpTransport {
    async fn broadcast_commit(&self, endpoint: String, tx: Vec<u8>) -> Result<Broadcast, Failure> {
        let agent = self.agent.clone();
        let v = tokio::task::spawn_blocking(move || {
            let tx = base64::engine::general_purpose::STANDARD.encode(tx);
            Self::call(
                &agent,
                &endpoint,
                "broadcast_tx_commit",
                json!({ "tx": tx }),
            )
        })
        .await
        .map_err(|e| Failure::Transport(e.to_string()))??;
        if let Some(err) = v.get("error") {
            let data = format!(
                "{} {}",
                err["message"].as_str().unwrap_or(""),
                err["data"].as_str().unwrap_or("")
            );
            if data.contains("already exists in cache") {
                return Ok(Broadcast::InCache);
            }
            // Mempool full, timed out waiting for a block, node catching up:
            // all worth another try.
            return Err(Failure::Transport(data));
        }
        let r = &v["result"];
        let check = num(&r["check_tx"]["code"]) as u32;
        let (code, log) = if check != 0 {
            (
                check,
                r["check_tx"]["log"].as_str().unwrap_or("").to_string(),
            )
        } else {
            (
                num(&r["tx_result"]["code"]) as u32,
                r["tx_result"]["log"].as_str().unwrap_or("").to_string(),
            )
        };
        Ok(Broadcast::Result {
            code,
            log,
            height: num(&r["height"]),
        })
    }

    async fn lookup(
        &self,
        endpoint: String,
        hash: [u8; 32],
    ) -> Result<Option<(u64, u32)>, Failure> {
        let agent = self.agent.clone();
        let v = tokio::task::spawn_blocking(move || {
            let h = base64::engine::general_purpose::STANDARD.encode(hash);
            Self::call(
                &agent,
                &endpoint,
                "tx",
                json!({ "hash": h, "prove": false }),
            )
        })
        .await
        .map_err(|e| Failure::Transport(e.to_string()))??;
        if let Some(err) = v.get("error") {
            let data = err["data"].as_str().unwrap_or("").to_string();
            if data.contains("not found") {
                return Ok(None);
            }
            return Err(Failure::Transport(data));
        }
        let r = &v["result"];
        Ok(Some((
            num(&r["height"]),
            num(&r["tx_result"]["code"]) as u32,
        )))
    }
}

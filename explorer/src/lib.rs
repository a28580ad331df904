//! The SLA explorer behind `tallyd explorer`: a small web page, embedded in
//! the binary, that shows a node's SLA records, balances and settlement
//! pipeline, and the HTTP server that serves it.
//!
//! The browser never talks to the node. It asks this server, which answers
//! from a fixed node endpoint and only for the query paths in
//! [`route::ALLOWED`], checked and rebuilt by [`route::route`]; answers
//! larger than [`MAX_ANSWER_BYTES`] are refused. [`handle`] turns one
//! request into one [`Reply`] and is what the unit tests drive; [`serve`]
//! runs it on a few threads with [`http::serve`], the HTTP helper the
//! node's metrics page uses too. [`Config`] checks the page's settings.
//!
//! API (JSON): `/api/status` (`{"chain_id", "height", "app_hash",
//! "catching_up", "node"}`), `/api/config` (`{"providers", "chain",
//! "refresh_secs"}`), `/api/q/<node query path>` (`{"height", "value"}`,
//! `value` being the node's answer). Errors are `{"error", "code"?,
//! "code_name"?}` with a 4xx status for a bad request, 404 when the node
//! has nothing under that key (code 22), 502 when the node cannot be read.

use std::sync::Arc;

use serde_json::{json, Value};
use tally_client::rpc::{QueryAnswer, RpcClient, RpcError, Status};
use tally_settlement::Code;

pub mod config;
pub mod http;
pub mod route;

pub use config::{Config, ConfigError};
pub use http::{Answer, ServeError, Server};
use route::{RequestError, Route};

/// Largest node answer the explorer passes on.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;
/// Threads answering requests.
pub const WORKERS: usize = 4;

/// What the explorer reads: a node's `abci_query` and `/status`.
pub trait Node: Send + Sync {
    /// `abci_query` of `path` at the latest height.
    fn query(&self, path: &str) -> Result<QueryAnswer, RpcError>;
    /// The node's status.
    fn status(&self) -> Result<Status, RpcError>;
}

impl Node for RpcClient {
    fn query(&self, path: &str) -> Result<QueryAnswer, RpcError> {
        self.abci_query(path)
    }

    fn status(&self) -> Result<Status, RpcError> {
        RpcClient::status(self)
    }
}

/// One answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
}

const JSON: &str = "application/json";

impl Reply {
    fn json(status: u16, v: &Value) -> Self {
        Self {
            status,
            content_type: JSON,
            body: v.to_string().into_bytes(),
        }
    }

    fn error(status: u16, msg: impl std::fmt::Display) -> Self {
        Self::json(status, &json!({ "error": msg.to_string() }))
    }

    /// The body as text (for tests and logs).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl From<RequestError> for Reply {
    fn from(e: RequestError) -> Self {
        Reply::error(e.status(), e)
    }
}

/// Answers `method` on `target` (the request line's path and query).
pub fn handle(node: &dyn Node, cfg: &Config, method: &str, target: &str) -> Reply {
    let route = match route::route(method, target) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    match route {
        Route::Asset(a) => Reply {
            status: 200,
            content_type: a.content_type,
            body: a.body.as_bytes().to_vec(),
        },
        Route::Config => Reply::json(
            200,
            &json!({
                "providers": cfg.providers,
                "chain": cfg.chain,
                "refresh_secs": cfg.refresh_secs,
                "node": cfg.node,
            }),
        ),
        Route::Status => match node.status() {
            Ok(s) => Reply::json(
                200,
                &json!({
                    "chain_id": s.chain_id,
                    "height": s.height,
                    "app_hash": s.app_hash,
                    "catching_up": s.catching_up,
                    "node": cfg.node,
                }),
            ),
            Err(e) => Reply::error(502, format!("node: {e}")),
        },
        Route::Query(path) => query(node, &path.to_string()),
    }
}

/// Asks the node for `path` and wraps its answer.
fn query(node: &dyn Node, path: &str) -> Reply {
    let a = match node.query(path) {
        Ok(a) => a,
        Err(e) => return Reply::error(502, format!("node: {e}")),
    };
    if a.code != 0 {
        let name = Code::from_value(a.code).map(Code::name).unwrap_or("?");
        let status = match Code::from_value(a.code) {
            Some(Code::NotFound) => 404,
            Some(Code::BadArgument | Code::UnknownPath) => 400,
            _ => 502,
        };
        return Reply::json(
            status,
            &json!({
                "error": format!("{path}: code {} ({name}): {}", a.code, a.log),
                "code": a.code,
                "code_name": name,
            }),
        );
    }
    if a.value.len() > MAX_ANSWER_BYTES {
        return Reply::error(
            502,
            format!(
                "{path}: the node's answer is {} bytes, more than the explorer passes on ({MAX_ANSWER_BYTES})",
                a.value.len()
            ),
        );
    }
    match serde_json::from_slice::<Value>(&a.value) {
        Ok(v) => Reply::json(200, &json!({ "height": a.height, "value": v })),
        Err(e) => Reply::error(502, format!("{path}: the node's answer is not JSON: {e}")),
    }
}

/// Serves the explorer at `addr` on [`WORKERS`] threads; dropping the
/// [`Server`] stops it.
pub fn serve(addr: &str, node: Arc<dyn Node>, cfg: Config) -> Result<Server, ServeError> {
    let handler =
        move |method: &str, target: &str| answer(handle(node.as_ref(), &cfg, method, target));
    http::serve(
        "explorer on",
        "tally-explorer",
        addr,
        WORKERS,
        Arc::new(handler),
    )
}

/// Headers every answer carries: no caching, no sniffing, no framing, and
/// a page that may only load its own files and call its own API.
const HEADERS: &[(&str, &str)] = &[
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
];

/// `reply` as sent: with [`HEADERS`], its content type, and `Allow` on a 405.
fn answer(reply: Reply) -> Answer {
    let mut headers: Vec<(&'static str, String)> =
        HEADERS.iter().map(|(k, v)| (*k, v.to_string())).collect();
    headers.push(("Content-Type", reply.content_type.to_string()));
    if reply.status == 405 {
        headers.push(("Allow", "GET, HEAD".to_string()));
    }
    Answer {
        status: reply.status,
        headers,
        body: reply.body,
    }
}

#[cfg(test)]
mod tests;

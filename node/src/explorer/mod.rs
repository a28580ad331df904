//! The SLA explorer behind `tallyd explorer`: a small web page, embedded in
//! the binary, that shows a node's SLA records, balances and settlement
//! pipeline, and the HTTP server that serves it.
//!
//! The browser never talks to the node. It asks this server, which answers
//! from a fixed node endpoint and only for the query paths in
//! [`route::ALLOWED`], checked and rebuilt by [`route::route`]; answers
//! larger than [`MAX_ANSWER_BYTES`] are refused. [`handle`] turns one
//! request into one [`Reply`] and is what the unit tests drive; [`serve`]
//! runs it on a few threads over `tiny_http`.
//!
//! API (JSON): `/api/status` (`{"chain_id", "height", "app_hash",
//! "catching_up", "node"}`), `/api/config` (`{"providers", "chain",
//! "refresh_secs"}`), `/api/q/<node query path>` (`{"height", "value"}`,
//! `value` being the node's answer). Errors are `{"error", "code"?,
//! "code_name"?}` with a 4xx status for a bad request, 404 when the node
//! has nothing under that key (code 22), 502 when the node cannot be read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tally_client::rpc::{QueryAnswer, RpcError, Status};
use tally_settlement::Code;

pub mod route;

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

impl Node for crate::rpc::Rpc {
    fn query(&self, path: &str) -> Result<QueryAnswer, RpcError> {
        self.abci_query(path)
    }

    fn status(&self) -> Result<Status, RpcError> {
        crate::rpc::Rpc::status(self)
    }
}

/// What `tallyd explorer` was started with, for the page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// The node's RPC URL, credentials hidden (shown on the page).
    pub node: String,
    /// Providers the page shows when its URL names none.
    pub providers: Vec<String>,
    /// The hub chain whose pipeline is shown (`None`: the chain's
    /// `hub_chain` parameter).
    pub chain: Option<String>,
    /// Seconds between the page's refreshes (0: never).
    pub refresh_secs: u64,
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

/// Why the explorer could not start.
#[derive(Debug, thiserror::Error)]
#[error("explorer on {addr}: {msg}")]
pub struct ServeError {
    addr: String,
    msg: String,
}

/// A running explorer; dropping it stops serving and closes the port.
pub struct Explorer {
    server: Arc<tiny_http::Server>,
    stopping: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Explorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Explorer")
            .field("addr", &self.local_addr())
            .finish_non_exhaustive()
    }
}

impl Explorer {
    /// The address it listens on (useful when asked for port 0).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.server_addr().to_ip()
    }

    /// Blocks until the server stops (it does not stop on its own).
    pub fn wait(mut self) {
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
    }
}

impl Drop for Explorer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        for _ in &self.threads {
            self.server.unblock();
        }
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
    }
}

/// Serves the explorer at `addr` on [`WORKERS`] threads.
pub fn serve(addr: &str, node: Arc<dyn Node>, cfg: Config) -> Result<Explorer, ServeError> {
    let err = |msg: String| ServeError {
        addr: addr.into(),
        msg,
    };
    let server = Arc::new(tiny_http::Server::http(addr).map_err(|e| err(e.to_string()))?);
    let stopping = Arc::new(AtomicBool::new(false));
    let cfg = Arc::new(cfg);
    let mut threads = Vec::with_capacity(WORKERS);
    for i in 0..WORKERS {
        let (s, stop, node, cfg) = (server.clone(), stopping.clone(), node.clone(), cfg.clone());
        let t = std::thread::Builder::new()
            .name(format!("tally-explorer-{i}"))
            .spawn(move || answer_requests(&s, &stop, node.as_ref(), &cfg))
            .map_err(|e| err(e.to_string()))?;
        threads.push(t);
    }
    Ok(Explorer {
        server,
        stopping,
        threads,
    })
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

fn answer_requests(
    server: &tiny_http::Server,
    stopping: &AtomicBool,
    node: &dyn Node,
    cfg: &Config,
) {
    loop {
        let rq = match server.recv() {
            Ok(rq) => rq,
            Err(_) if stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                tracing::debug!(error = %e, "explorer: accept failed");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        let method = rq.method().as_str().to_string();
        let target = rq.url().to_string();
        let reply = handle(node, cfg, &method, &target);
        tracing::debug!(%method, target = %target.chars().take(200).collect::<String>(), status = reply.status, "explorer request");
        let mut resp = tiny_http::Response::from_data(reply.body).with_status_code(reply.status);
        let ct = [("Content-Type", reply.content_type)];
        for (k, v) in HEADERS.iter().chain(ct.iter()) {
            if let Ok(h) = tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()) {
                resp.add_header(h);
            }
        }
        if reply.status == 405 {
            if let Ok(h) = tiny_http::Header::from_bytes(&b"Allow"[..], &b"GET, HEAD"[..]) {
                resp.add_header(h);
            }
        }
        if let Err(e) = rq.respond(resp) {
            tracing::debug!(error = %e, "explorer: answer not sent");
        }
    }
}

#[cfg(test)]
mod tests;

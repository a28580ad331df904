//! What the explorer answers, decided from the request line alone, before
//! anything is sent to the node.
//!
//! The explorer is not a proxy: of the node's query paths it forwards only
//! the read-only ones its page uses ([`ALLOWED`]), and it forwards them
//! rebuilt from checked pieces, never as the text it received. Every
//! identifier must be one the chain accepts (`[A-Za-z0-9._:/-]`, 1-64 bytes
//! for users, providers and hub chains, 1-128 for models and routes),
//! windows and nonces are decimal `u64`s, and the only query parameters are
//! `limit` (1-1000) and `cursor` (hex) on the paged paths and `from` (a
//! window) on `/slo/verdicts`, each at most once.

use tally_settlement::ident;
use tally_settlement::query::MAX_LIMIT;
use tally_settlement::query_path::{self, QueryPath};

/// Longest request target (path and query string) the explorer reads.
pub const MAX_TARGET_BYTES: usize = 2048;
/// Longest `cursor` value, in hex digits (a cursor is a state key suffix).
pub const MAX_CURSOR_HEX: usize = 1024;
/// Where the node's query paths are served: `/api/q` + the node's path.
pub const QUERY_PREFIX: &str = "/api/q";

/// The node query paths the explorer forwards, for messages and docs.
pub const ALLOWED: &[&str] = &[
    "/sla/provider/{provider}[/{window}]",
    "/sla/user/{user}[/{window}]",
    "/sla/route/{user}/{provider}/{model}/{route}[/{window}]",
    "/windows",
    "/balance/{user}",
    "/params",
    "/sync/{chain}",
    "/batch/{chain}/{nonce}",
    "/hubcalls/{chain}",
    "/slo/policies",
    "/slo/policy/{provider}",
    "/slo/verdicts/{provider}[?from={window}]",
    "/slo/verdict/{provider}/{window}",
    "/slo/reputation/{provider}",
    "/latency/{provider}/{window}",
];

/// A static file of the page, embedded in the binary.
#[derive(Debug, PartialEq, Eq)]
pub struct Asset {
    /// The request path it is served at.
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its text.
    pub body: &'static str,
}

/// The page: HTML, script and style sheet. No CDN, no build step.
pub const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("assets/index.html"),
    },
    Asset {
        path: "/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/app.js"),
    },
    Asset {
        path: "/slo.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/slo.js"),
    },
    Asset {
        path: "/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/style.css"),
    },
];

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// A file of the page.
    Asset(&'static Asset),
    /// `/api/status`: the node's chain id, height and app hash.
    Status,
    /// `/api/config`: what `tallyd explorer` was started with.
    Config,
    /// `/api/q/...`: this node query path, rebuilt from checked pieces.
    Query(QueryPath),
}

/// Why a request is refused, with the HTTP status it gets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not GET or HEAD.
    #[error("method {0} is not allowed: the explorer answers GET and HEAD only")]
    Method(String),
    /// The request target is longer than [`MAX_TARGET_BYTES`].
    #[error("the request target is longer than {MAX_TARGET_BYTES} bytes")]
    TooLong,
    /// No page or API at that path.
    #[error(
        "not found: {0} (the page is at /, the API under /api/status, /api/config and /api/q/...)"
    )]
    NotFound(String),
    /// A node query path the explorer does not forward.
    #[error("{0} is not a query path the explorer forwards; allowed: {allowed}", allowed = ALLOWED.join(", "))]
    NotForwarded(String),
    /// A malformed argument.
    #[error("{0}")]
    BadArgument(String),
}

impl RequestError {
    /// The HTTP status of the refusal.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::Method(_) => 405,
            RequestError::TooLong => 414,
            RequestError::NotFound(_) => 404,
            RequestError::NotForwarded(_) => 403,
            RequestError::BadArgument(_) => 400,
        }
    }
}

fn bad(msg: impl Into<String>) -> RequestError {
    RequestError::BadArgument(msg.into())
}

/// Decides what `method` on `target` (the request line's path and query,
/// still percent-encoded) asks for.
pub fn route(method: &str, target: &str) -> Result<Route, RequestError> {
    if target.len() > MAX_TARGET_BYTES {
        return Err(RequestError::TooLong);
    }
    if !matches!(method, "GET" | "HEAD") {
        return Err(RequestError::Method(method.to_string()));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let no_query = |r: Route| match query {
        Some(q) if !q.is_empty() => Err(bad(format!("{path} takes no parameters (got {q:?})"))),
        _ => Ok(r),
    };
    match path {
        "/api/status" => no_query(Route::Status),
        "/api/config" => no_query(Route::Config),
        _ => {
            if let Some(rest) = path.strip_prefix(QUERY_PREFIX) {
                if rest.starts_with('/') {
                    return forwarded(rest, query).map(Route::Query);
                }
            }
            // The page's own query string (`/?provider=p`) is the page's.
            ASSETS
                .iter()
                .find(|a| a.path == path || (path == "/index.html" && a.path == "/"))
                .map(Route::Asset)
                .ok_or_else(|| RequestError::NotFound(path.to_string()))
        }
    }
}

/// The query parameters a path takes.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Params {
    None,
    /// `limit` and `cursor`.
    Paged,
    /// `from`: the first window (`/slo/verdicts`).
    FromWindow,
}

/// Checks `path` (after [`QUERY_PREFIX`], still encoded) and its query
/// string against [`ALLOWED`]; the path to send the node.
fn forwarded(path: &str, query: Option<&str>) -> Result<QueryPath, RequestError> {
    let parsed = query_path::parse(path).map_err(|e| bad(format!("bad query path: {e}")))?;
    let segs: Vec<&str> = parsed.segments.iter().map(String::as_str).collect();
    let not_forwarded = || RequestError::NotForwarded(path.to_string());
    let params = match segs.as_slice() {
        ["sla", "provider", p] => {
            party("provider", p)?;
            Params::Paged
        }
        ["sla", "provider", p, w] => {
            party("provider", p)?;
            number("window", w)?;
            Params::Paged
        }
        ["sla", "user", u] => {
            party("user", u)?;
            Params::Paged
        }
        ["sla", "user", u, w] => {
            party("user", u)?;
            number("window", w)?;
            Params::None
        }
        ["sla", "route", u, p, m, r, rest @ ..] if rest.len() <= 1 => {
            party("user", u)?;
            party("provider", p)?;
            name("model", m)?;
            name("route", r)?;
            match rest {
                [w] => {
                    number("window", w)?;
                    Params::None
                }
                _ => Params::Paged,
            }
        }
        ["windows"] => Params::Paged,
        ["balance", u] => {
            party("user", u)?;
            Params::None
        }
        ["params"] => Params::None,
        ["sync", c] => {
            party("chain", c)?;
            Params::None
        }
        ["batch", c, n] => {
            party("chain", c)?;
            number("nonce", n)?;
            Params::None
        }
        ["hubcalls", c] => {
            party("chain", c)?;
            Params::Paged
        }
        ["slo", "policies"] => Params::None,
        ["slo", "policy" | "reputation", p] => {
            party("provider", p)?;
            Params::None
        }
        ["slo", "verdicts", p] => {
            party("provider", p)?;
            Params::FromWindow
        }
        ["slo", "verdict", p, w] | ["latency", p, w] => {
            party("provider", p)?;
            number("window", w)?;
            Params::None
        }
        _ => return Err(not_forwarded()),
    };
    let mut out = QueryPath::from_segments(segs.iter().copied());
    let pairs = query_path::parse_params(query).map_err(|e| bad(format!("bad parameter: {e}")))?;
    if params == Params::None {
        if let Some((k, _)) = pairs.first() {
            return Err(bad(format!("{path} takes no parameters (got {k:?})")));
        }
        return Ok(out);
    }
    if params == Params::FromWindow {
        return from_window(out, path, pairs);
    }
    let (mut limit, mut cursor) = (None, None);
    for (k, v) in pairs {
        match k.as_str() {
            "limit" if limit.is_none() => {
                let n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| {
                        (1..=MAX_LIMIT).contains(n) && v.bytes().all(|b| b.is_ascii_digit())
                    })
                    .ok_or_else(|| bad(format!("limit must be 1..={MAX_LIMIT}, got {v:?}")))?;
                limit = Some(n);
            }
            "cursor" if cursor.is_none() => {
                if v.is_empty()
                    || v.len() > MAX_CURSOR_HEX
                    || v.len() % 2 != 0
                    || !v.bytes().all(|b| b.is_ascii_hexdigit())
                {
                    return Err(bad(format!(
                        "cursor must be an even number of hex digits, at most {MAX_CURSOR_HEX}"
                    )));
                }
                cursor = Some(v);
            }
            "limit" | "cursor" => return Err(bad(format!("{k} given twice"))),
            _ => {
                return Err(bad(format!(
                    "unknown parameter {k:?}; paged paths take limit and cursor"
                )))
            }
        }
    }
    out = out.page(limit, cursor.as_deref());
    Ok(out)
}

/// `out` with the `from` window of `pairs`, if given (at most once, no
/// other parameter).
fn from_window(
    out: QueryPath,
    path: &str,
    pairs: Vec<(String, String)>,
) -> Result<QueryPath, RequestError> {
    let mut from = None;
    for (k, v) in pairs {
        match k.as_str() {
            "from" if from.is_none() => from = Some(number("from", &v)?),
            "from" => return Err(bad("from given twice")),
            _ => return Err(bad(format!("unknown parameter {k:?}; {path} takes from"))),
        }
    }
    Ok(match from {
        Some(w) => out.param("from", w.to_string()),
        None => out,
    })
}

fn party(what: &str, s: &str) -> Result<(), RequestError> {
    ident::check_party(what, s).map_err(|r| bad(r.log))
}

fn name(what: &str, s: &str) -> Result<(), RequestError> {
    ident::check_name(what, s).map_err(|r| bad(r.log))
}

fn number(what: &str, s: &str) -> Result<u64, RequestError> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(format!("{what} must be a decimal number, got {s:?}")));
    }
    s.parse::<u64>()
        .map_err(|_| bad(format!("{what} {s} does not fit in 64 bits")))
}

#[cfg(test)]
mod tests;

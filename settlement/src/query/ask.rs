//! What every query handler is given and shares: the request ([`Ask`]: the
//! state, the path as sent, its query string and the arguments its route
//! pattern bound), the paging parameters, the page shape and the errors of
//! a bad argument or corrupt state.

use serde::Serialize;
use tally_store::{KvRead, Pairs, StoreError};

use crate::codes::Code;
use crate::error::{reject, ExecError, Fatal};
use crate::query_path;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page size.
pub const MAX_LIMIT: usize = 1000;

/// Committed state behind a handler (any [`KvRead`], so the route table
/// can hold plain function pointers).
#[derive(Clone, Copy)]
pub struct Reader<'a>(pub &'a dyn KvRead);

impl std::fmt::Debug for Reader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reader(..)")
    }
}

impl KvRead for Reader<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(key)
    }

    fn for_each(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.0.for_each(start, end, f)
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Pairs, StoreError> {
        self.0.scan(start, end, limit)
    }

    fn scan_prefix(&self, prefix: &[u8], limit: usize) -> Result<Pairs, StoreError> {
        self.0.scan_prefix(prefix, limit)
    }
}

/// One query, matched to its route.
#[derive(Debug)]
pub struct Ask<'a> {
    /// Committed state.
    pub kv: Reader<'a>,
    /// The path before `?`, still encoded (for messages).
    pub path: &'a str,
    /// The query string after `?`, still encoded; `None` without a `?`.
    pub query: Option<&'a str>,
    /// The route pattern's placeholders and their decoded segments.
    pub args: query_path::Args<'a, 'a>,
}

impl<'a> Ask<'a> {
    /// The decoded segment bound to `{name}` in the route's pattern (a
    /// handler asking for a name its pattern lacks is refused, never
    /// answered from a guess).
    pub fn arg(&self, name: &str) -> Result<&'a str, ExecError> {
        self.opt(name)
            .ok_or_else(|| bad(format!("{} has no {{{name}}} segment", self.path)))
    }

    /// The segment bound to an optional `[/{name}]`, if the path has it.
    pub fn opt(&self, name: &str) -> Option<&'a str> {
        self.args.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// Refuses any query string: unpaged paths take no parameters.
    pub fn no_params(&self) -> Result<(), ExecError> {
        match self.query {
            Some(q) if !q.is_empty() => Err(bad(format!(
                "{} takes no query parameters (got {q:?})",
                self.path
            ))),
            _ => Ok(()),
        }
    }

    /// The paging parameters `limit` and `cursor`; any other is refused.
    pub fn paging(&self) -> Result<Paging, ExecError> {
        let mut p = Paging {
            limit: DEFAULT_LIMIT,
            cursor: None,
        };
        let pairs = query_path::parse_params(self.query).map_err(|e| bad(e.to_string()))?;
        for (k, v) in &pairs {
            match k.as_str() {
                "limit" => {
                    p.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| bad(format!("limit must be 1..={MAX_LIMIT}, got {v:?}")))?;
                }
                "cursor" => {
                    p.cursor =
                        Some(hex::decode(v).map_err(|_| bad(format!("cursor {v:?} is not hex")))?);
                }
                _ => {
                    return Err(bad(format!(
                        "unknown query parameter {k:?}; use limit and cursor"
                    )))
                }
            }
        }
        Ok(p)
    }
}

/// A paged query's `limit` and `cursor` (decoded from hex).
#[derive(Debug)]
pub struct Paging {
    /// Most items on the page.
    pub limit: usize,
    /// The page starts strictly after this state key.
    pub cursor: Option<Vec<u8>>,
}

/// A page of results: the items' fields and `next_cursor`.
#[derive(Debug, Serialize)]
pub struct Page<T: Serialize> {
    /// The listed items, under their own name.
    #[serde(flatten)]
    pub items: T,
    /// Hex of the last item's state key when more follow, else `null`.
    pub next_cursor: Option<String>,
}

/// A malformed argument (code 21).
pub fn bad(msg: impl Into<String>) -> ExecError {
    reject(Code::BadArgument, msg)
}

/// A fault reading state; a record that does not decode is reported as
/// corrupt `state`, as every query has always named it.
pub fn state_fault(e: Fatal) -> ExecError {
    match e {
        Fatal::Corrupt(_) => ExecError::Fatal(Fatal::Corrupt("state")),
        other => ExecError::Fatal(other),
    }
}

/// A cursor from another listing.
pub fn foreign_cursor() -> ExecError {
    bad("cursor does not belong to this query")
}

/// `window` as a window number.
pub fn parse_window(s: &str) -> Result<u64, ExecError> {
    s.parse()
        .map_err(|_| bad(format!("window must be a non-negative integer, got {s:?}")))
}

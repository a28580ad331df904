//! Query paths as text: how a client writes one and how the server reads it.
//!
//! A query path is `/seg/seg/...` optionally followed by `?key=value&...`.
//! Identifiers may hold `/` (`llama/3-70b`, `/v1/chat`), so each segment,
//! parameter key and parameter value is percent-encoded on its own; the
//! server splits the path on `/` (and the query string on `&` and `=`)
//! first and decodes each piece after. Both sides use this module:
//! [`QueryPath`] and its constructors build paths (`tallyd query`), and
//! [`parse`] and [`parse_params`] take them apart ([`crate::query`]), so the
//! two cannot disagree on the encoding. [`match_pattern`] matches the
//! decoded segments against a pattern of the server's route table
//! (`/sla/provider/{provider}[/{window}]`) and names the arguments.
//!
//! Characters an identifier may use other than `/` (`A-Z a-z 0-9 . _ : -`)
//! are written as they are; every other byte, `/` included, as `%XX`. So a
//! path to valid identifiers reads as plainly as the identifiers allow.
//! Decoding is strict: a `%` must be followed by two hex digits and the
//! decoded bytes must be UTF-8.
//!
//! Limitation: the server ignores every leading `/`, so a path whose first
//! segment is empty does not survive the trip (no served path has one).

use std::fmt;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Bytes written as `%XX` in a segment, key or value: everything but
/// ASCII letters, digits and `. _ : -`.
pub const ENCODE_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'.')
    .remove(b'_')
    .remove(b':')
    .remove(b'-');

/// Why a query path could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A `%` not followed by two hex digits.
    #[error("bad percent-escape in {0:?}")]
    BadEscape(String),
    /// The decoded bytes are not UTF-8.
    #[error("{0:?} is not UTF-8")]
    NotUtf8(String),
}

/// Percent-encodes one segment, parameter key or value.
pub fn encode(s: &str) -> String {
    utf8_percent_encode(s, ENCODE_SET).to_string()
}

/// Decodes one segment, parameter key or value, strictly.
pub fn decode(s: &str) -> Result<String, PathError> {
    if !escapes_are_well_formed(s) {
        return Err(PathError::BadEscape(s.to_string()));
    }
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| PathError::NotUtf8(s.to_string()))
}

fn escapes_are_well_formed(s: &str) -> bool {
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            match (bytes.next(), bytes.next()) {
                (Some(h), Some(l)) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {}
                _ => return false,
            }
        }
    }
    true
}

/// A path as the server reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedPath<'a> {
    /// The part before `?`, still encoded (for messages).
    pub path: &'a str,
    /// The part after `?`, still encoded; `None` without a `?`.
    pub query: Option<&'a str>,
    /// The decoded segments; leading `/`s are ignored, so `/params` and
    /// `params` are both `["params"]`.
    pub segments: Vec<String>,
}

/// Splits `full` at the first `?` and decodes the path's segments.
pub fn parse(full: &str) -> Result<ParsedPath<'_>, PathError> {
    let (path, query) = match full.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (full, None),
    };
    let segments = path
        .trim_start_matches('/')
        .split('/')
        .map(decode)
        .collect::<Result<_, _>>()?;
    Ok(ParsedPath {
        path,
        query,
        segments,
    })
}

/// Decodes a query string's `key=value` pairs, in order. Empty pairs
/// (`a=1&&b=2`) are skipped; a pair without `=` has an empty value.
pub fn parse_params(query: Option<&str>) -> Result<Vec<(String, String)>, PathError> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// The arguments a path's segments give a route pattern: each
/// placeholder's name and its decoded segment, in pattern order.
pub type Args<'p, 's> = Vec<(&'p str, &'s str)>;

/// Matches decoded `segments` against a route `pattern`: literal segments,
/// `{name}` placeholders (any segment, even empty) and at most one
/// optional trailing `[/{name}]`; a `?...` tail documents the route's own
/// parameters and is not matched. `None` when the path is not this route.
/// `/sla/provider/{provider}[/{window}]` matches `["sla", "provider", "p"]`
/// with `[("provider", "p")]`.
pub fn match_pattern<'p, 's>(pattern: &'p str, segments: &'s [String]) -> Option<Args<'p, 's>> {
    let path = pattern.split('?').next().unwrap_or_default();
    let (required, optional) = match path.split_once("[/") {
        Some((r, o)) => (r, Some(placeholder(o.strip_suffix(']')?)?)),
        None => (path, None),
    };
    let required: Vec<&str> = required.trim_start_matches('/').split('/').collect();
    let extra = segments.len().checked_sub(required.len())?;
    if extra > usize::from(optional.is_some()) {
        return None;
    }
    let mut args = Vec::new();
    for (p, s) in required.iter().zip(segments) {
        match placeholder(p) {
            Some(name) => args.push((name, s.as_str())),
            None if *p == s.as_str() => {}
            None => return None,
        }
    }
    if let (Some(name), Some(s)) = (optional, segments.get(required.len())) {
        args.push((name, s.as_str()));
    }
    Some(args)
}

/// `name` for a `{name}` pattern segment.
fn placeholder(p: &str) -> Option<&str> {
    p.strip_prefix('{')?.strip_suffix('}')
}

/// A query path being built; [`fmt::Display`] writes it encoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryPath {
    segments: Vec<String>,
    params: Vec<(String, String)>,
}

impl QueryPath {
    /// An empty path (`/`).
    pub fn new() -> Self {
        Self::default()
    }

    /// A path of the given segments.
    pub fn from_segments<I, S>(segments: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            segments: segments.into_iter().map(Into::into).collect(),
            params: Vec::new(),
        }
    }

    /// Appends a segment.
    pub fn segment(mut self, s: impl Into<String>) -> Self {
        self.segments.push(s.into());
        self
    }

    /// Appends a segment when there is one.
    pub fn opt_segment(self, s: Option<impl Into<String>>) -> Self {
        match s {
            Some(s) => self.segment(s),
            None => self,
        }
    }

    /// Appends a query parameter.
    pub fn param(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.params.push((key.into(), value.into()));
        self
    }

    /// Appends the paging parameters that are given: `limit`, then `cursor`.
    pub fn page(mut self, limit: Option<usize>, cursor: Option<&str>) -> Self {
        if let Some(l) = limit {
            self = self.param("limit", l.to_string());
        }
        if let Some(c) = cursor {
            self = self.param("cursor", c);
        }
        self
    }

    /// The segments, decoded.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The query parameters, decoded.
    pub fn params(&self) -> &[(String, String)] {
        &self.params
    }
}

impl fmt::Display for QueryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.segments.is_empty() {
            f.write_str("/")?;
        }
        for s in &self.segments {
            write!(f, "/{}", utf8_percent_encode(s, ENCODE_SET))?;
        }
        for (i, (k, v)) in self.params.iter().enumerate() {
            write!(
                f,
                "{}{}={}",
                if i == 0 { '?' } else { '&' },
                utf8_percent_encode(k, ENCODE_SET),
                utf8_percent_encode(v, ENCODE_SET)
            )?;
        }
        Ok(())
    }
}

/// `/sla/route/{user}/{provider}/{model}/{route}`: a route over all
/// windows (paged).
pub fn sla_route(user: &str, provider: &str, model: &str, route: &str) -> QueryPath {
    QueryPath::from_segments(["sla", "route", user, provider, model, route])
}

/// `/sla/route/{user}/{provider}/{model}/{route}/{window}`: one record.
pub fn sla_route_window(
    user: &str,
    provider: &str,
    model: &str,
    route: &str,
    window: u64,
) -> QueryPath {
    sla_route(user, provider, model, route).segment(window.to_string())
}

/// `/sla/provider/{provider}[/{window}]` (paged).
pub fn sla_provider(provider: &str, window: Option<u64>) -> QueryPath {
    QueryPath::from_segments(["sla", "provider", provider])
        .opt_segment(window.map(|w| w.to_string()))
}

/// `/sla/user/{user}[/{window}]` (paged).
pub fn sla_user(user: &str, window: Option<u64>) -> QueryPath {
    QueryPath::from_segments(["sla", "user", user]).opt_segment(window.map(|w| w.to_string()))
}

/// `/windows` (paged).
pub fn windows() -> QueryPath {
    QueryPath::from_segments(["windows"])
}

/// `/allowances/{user}`.
pub fn allowances(user: &str) -> QueryPath {
    QueryPath::from_segments(["allowances", user])
}

/// `/withdrawals/{user}`.
pub fn withdrawals(user: &str) -> QueryPath {
    QueryPath::from_segments(["withdrawals", user])
}

/// `/balance/{user}`.
pub fn balance(user: &str) -> QueryPath {
    QueryPath::from_segments(["balance", user])
}

/// `/params`.
pub fn params() -> QueryPath {
    QueryPath::from_segments(["params"])
}

/// `/gateways`.
pub fn gateways() -> QueryPath {
    QueryPath::from_segments(["gateways"])
}

/// `/sync/{chain}`.
pub fn sync(chain: &str) -> QueryPath {
    QueryPath::from_segments(["sync", chain])
}

/// `/batch/{chain}/{nonce}`.
pub fn batch(chain: &str, nonce: u64) -> QueryPath {
    QueryPath::from_segments(["batch", chain]).segment(nonce.to_string())
}

/// `/hubcalls/{chain}` (paged).
pub fn hubcalls(chain: &str) -> QueryPath {
    QueryPath::from_segments(["hubcalls", chain])
}

/// `/dkg`.
pub fn dkg() -> QueryPath {
    QueryPath::from_segments(["dkg"])
}

/// `/validators`.
pub fn validators() -> QueryPath {
    QueryPath::from_segments(["validators"])
}

/// `/proposals[?from={id}]`.
pub fn proposals(from: Option<u64>) -> QueryPath {
    let p = QueryPath::from_segments(["proposals"]);
    match from {
        Some(id) => p.param("from", id.to_string()),
        None => p,
    }
}

/// `/rotations[?from=nonce]`.
pub fn rotations(from: Option<u64>) -> QueryPath {
    let p = QueryPath::from_segments(["rotations"]);
    match from {
        Some(n) => p.param("from", n.to_string()),
        None => p,
    }
}

/// `/upgrade`.
pub fn upgrade() -> QueryPath {
    QueryPath::from_segments(["upgrade"])
}

/// `/slo/policies`.
pub fn slo_policies() -> QueryPath {
    QueryPath::from_segments(["slo", "policies"])
}

/// `/slo/policy/{provider}`.
pub fn slo_policy(provider: &str) -> QueryPath {
    QueryPath::from_segments(["slo", "policy", provider])
}

/// `/slo/verdicts/{provider}[?from={window}]`.
pub fn slo_verdicts(provider: &str, from: Option<u64>) -> QueryPath {
    let p = QueryPath::from_segments(["slo", "verdicts", provider]);
    match from {
        Some(w) => p.param("from", w.to_string()),
        None => p,
    }
}

/// `/slo/verdict/{provider}/{window}`.
pub fn slo_verdict(provider: &str, window: u64) -> QueryPath {
    QueryPath::from_segments(["slo", "verdict", provider, &window.to_string()])
}

/// `/slo/reputation/{provider}`.
pub fn slo_reputation(provider: &str) -> QueryPath {
    QueryPath::from_segments(["slo", "reputation", provider])
}

/// `/latency/{provider}/{window}`.
pub fn latency(provider: &str, window: u64) -> QueryPath {
    QueryPath::from_segments(["latency", provider, &window.to_string()])
}

/// `/upgrade/applied/{name}`.
pub fn upgrade_applied(name: &str) -> QueryPath {
    QueryPath::from_segments(["upgrade", "applied", name])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn valid_identifiers_read_plainly_and_slashes_are_escaped() {
        let p = sla_route("alice", "acme-ai", "llama/3-70b", "/v1/chat").page(Some(5), Some("0a"));
        assert_eq!(
            p.to_string(),
            "/sla/route/alice/acme-ai/llama%2F3-70b/%2Fv1%2Fchat?limit=5&cursor=0a"
        );
        assert_eq!(
            sla_route_window("u.1", "p:x", "m_1", "r", 7).to_string(),
            "/sla/route/u.1/p:x/m_1/r/7"
        );
        assert_eq!(sla_provider("p", None).to_string(), "/sla/provider/p");
        assert_eq!(sla_user("u", Some(3)).to_string(), "/sla/user/u/3");
        assert_eq!(windows().page(None, None).to_string(), "/windows");
        assert_eq!(
            windows().page(Some(2), None).to_string(),
            "/windows?limit=2"
        );
        assert_eq!(batch("hub", 1).to_string(), "/batch/hub/1");
        assert_eq!(hubcalls("a/b").to_string(), "/hubcalls/a%2Fb");
        assert_eq!(QueryPath::new().to_string(), "/");
        assert_eq!(validators().to_string(), "/validators");
        assert_eq!(proposals(None).to_string(), "/proposals");
        assert_eq!(proposals(Some(7)).to_string(), "/proposals?from=7");
        assert_eq!(
            QueryPath::from_segments(["a b", "%", "?", "é"]).to_string(),
            "/a%20b/%25/%3F/%C3%A9"
        );
    }

    #[test]
    fn decoding_is_strict() {
        assert_eq!(decode("a%2Fb%2f").unwrap(), "a/b/");
        for bad in ["%", "%2", "%zz", "a%+1", "%é1"] {
            assert_eq!(decode(bad), Err(PathError::BadEscape(bad.into())), "{bad}");
        }
        assert_eq!(decode("%FF"), Err(PathError::NotUtf8("%FF".into())));
        assert_eq!(
            PathError::BadEscape("%zz".into()).to_string(),
            "bad percent-escape in \"%zz\""
        );
    }

    #[test]
    fn parse_splits_path_and_query() {
        let p = parse("//sla/provider/p%2Fq?limit=5&&cursor").unwrap();
        assert_eq!(p.path, "//sla/provider/p%2Fq");
        assert_eq!(p.query, Some("limit=5&&cursor"));
        assert_eq!(p.segments, ["sla", "provider", "p/q"]);
        assert_eq!(
            parse_params(p.query).unwrap(),
            [
                (String::from("limit"), String::from("5")),
                (String::from("cursor"), String::new())
            ]
        );
        assert_eq!(parse("/params").unwrap().query, None);
        assert!(parse_params(None).unwrap().is_empty());
        assert!(parse_params(Some("cursor=%g0")).is_err());
    }

    #[test]
    fn patterns_match_literal_segments_and_bind_placeholders() {
        let segs = |s: &str| parse(s).unwrap().segments;
        let p = "/sla/provider/{provider}[/{window}]";
        assert_eq!(
            match_pattern(p, &segs("/sla/provider/a%2Fb")),
            Some(vec![("provider", "a/b")])
        );
        assert_eq!(
            match_pattern(p, &segs("/sla/provider/a/7")),
            Some(vec![("provider", "a"), ("window", "7")])
        );
        assert_eq!(
            match_pattern(p, &segs("/sla/provider/a/")),
            Some(vec![("provider", "a"), ("window", "")])
        );
        assert_eq!(match_pattern(p, &segs("/sla/provider/a/7/8")), None);
        assert_eq!(match_pattern(p, &segs("/sla/provider")), None);
        assert_eq!(match_pattern(p, &segs("/sla/user/a")), None);
        assert_eq!(match_pattern("/params", &segs("params")), Some(vec![]));
        assert_eq!(match_pattern("/params", &segs("/params/")), None);
        assert_eq!(
            match_pattern("/proposals?from={id}", &segs("/proposals")),
            Some(vec![])
        );
        assert_eq!(match_pattern("/windows", &segs("")), None);
        assert_eq!(match_pattern("/a[/{b}", &segs("/a")), None, "malformed");
    }

    proptest! {
        #[test]
        fn built_paths_parse_back_to_the_same_pieces(
            first in "\\PC+",
            rest in proptest::collection::vec("[/?%& =#+a-z\u{e9}\u{1F600}]{0,6}|\\PC*", 0..6),
            params in proptest::collection::vec(("\\PC*", "\\PC*"), 0..4),
        ) {
            let mut path = QueryPath::new().segment(first.clone());
            for s in &rest {
                path = path.segment(s.clone());
            }
            for (k, v) in &params {
                path = path.param(k.clone(), v.clone());
            }
            let text = path.to_string();
            let parsed = parse(&text).unwrap();
            prop_assert_eq!(&parsed.segments, path.segments());
            prop_assert_eq!(parse_params(parsed.query).unwrap(), path.params());
            prop_assert_eq!(parsed.query.is_some(), !params.is_empty());
        }
    }
}

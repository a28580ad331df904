//! The documented query paths are the served ones: the path table of the
//! `query` module's doc and the README's query reference must list the
//! patterns of `query::ROUTES` in its order, with the same paging flag (the
//! README then the adapter's `/key`); every pattern is served by its own
//! row and named in the "unknown path" answer. A route added, renamed or
//! removed without its doc rows fails here.

use std::sync::Arc;

use tally_settlement::query::{known_paths, query, KEY_PATH, ROUTES};
use tally_settlement::query_path::{self, match_pattern};
use tally_settlement::Code;
use tally_store::{MemBackend, Pending};

/// `(pattern, paged)` of each row of the first table after `heading` whose
/// first cell is a code span starting with `/`, each line stripped of
/// `prefix` (`//! ` in a module doc).
fn documented(doc: &str, heading: &str, prefix: &str) -> Result<Vec<(String, bool)>, String> {
    let start = doc
        .find(heading)
        .ok_or_else(|| format!("no {heading:?} in the doc"))?;
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in doc[start..].lines() {
        let line = line.strip_prefix(prefix).unwrap_or(line);
        let Some(rest) = line.strip_prefix("| `/") else {
            if in_table && !line.starts_with('|') {
                break;
            }
            continue;
        };
        in_table = true;
        let cells: Vec<&str> = rest.split(" | ").collect();
        let pattern = cells[0]
            .strip_suffix('`')
            .ok_or_else(|| format!("first cell is not one code span: {line:?}"))?;
        let paged = match cells.get(1).map(|c| c.trim()) {
            Some("yes") => true,
            Some("no") => false,
            other => return Err(format!("paged cell {other:?} is not yes/no: {line:?}")),
        };
        rows.push((format!("/{pattern}"), paged));
    }
    Ok(rows)
}

fn served() -> Vec<(String, bool)> {
    ROUTES
        .iter()
        .map(|r| (r.pattern.to_string(), r.paged))
        .collect()
}

fn compare(doc: &[(String, bool)], code: &[(String, bool)]) -> Result<(), String> {
    if doc == code {
        return Ok(());
    }
    let undocumented: Vec<_> = code.iter().filter(|r| !doc.contains(r)).collect();
    let stale: Vec<_> = doc.iter().filter(|r| !code.contains(r)).collect();
    Err(format!(
        "the route table and the doc disagree: served but not documented {undocumented:?}; \
         documented but not served {stale:?} (or the order differs)"
    ))
}

const MODULE: &str = include_str!("../src/query/mod.rs");
const README: &str = include_str!("../../README.md");

#[test]
fn the_module_doc_lists_every_route_in_order() {
    let doc = documented(MODULE, "//! | path |", "//! ").unwrap();
    if let Err(e) = compare(&doc, &served()) {
        panic!("settlement/src/query/mod.rs: {e}");
    }
}

#[test]
fn the_readme_lists_every_route_then_the_adapters() {
    let doc = documented(README, "\n## Query reference", "").unwrap();
    let mut code = served();
    code.push((KEY_PATH.to_string(), false));
    if let Err(e) = compare(&doc, &code) {
        panic!("README.md: {e}");
    }
}

#[test]
fn a_route_without_a_doc_row_is_reported() {
    let doc = documented(MODULE, "//! | path |", "//! ").unwrap();
    let mut code = served();
    code.insert(3, ("/sla/model/{model}".into(), true));
    let e = compare(&doc, &code).expect_err("an extra route must be caught");
    assert!(e.contains("/sla/model/{model}"), "{e}");
    let mut flipped = served();
    flipped[4].1 = !flipped[4].1;
    assert!(
        compare(&doc, &flipped).is_err(),
        "a paging flag must be compared"
    );
}

/// A path to `pattern`: each `{name}` an identifier, with or without the
/// optional tail.
fn instance(pattern: &str, with_optional: bool) -> String {
    let path = pattern.split('?').next().unwrap();
    let (required, optional) = match path.split_once("[/") {
        Some((r, o)) => (r, Some(o.trim_end_matches(']'))),
        None => (path, None),
    };
    let mut out: Vec<&str> = required.split('/').collect();
    if with_optional {
        out.extend(optional);
    }
    let fill = |s: &str| match s {
        "{window}" | "{nonce}" => "7".to_string(),
        s if s.starts_with('{') => "id.1".to_string(),
        s => s.to_string(),
    };
    out.into_iter().map(fill).collect::<Vec<_>>().join("/")
}

#[test]
fn each_pattern_is_served_by_its_own_row_and_named_when_unknown() {
    let kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    for (i, r) in ROUTES.iter().enumerate() {
        for opt in [false, true] {
            let path = instance(r.pattern, opt);
            let segs = query_path::parse(&path).unwrap().segments;
            let first = ROUTES
                .iter()
                .position(|x| match_pattern(x.pattern, &segs).is_some());
            assert_eq!(first, Some(i), "{path} is not served by {}", r.pattern);
            let a = query(&kv, &path);
            assert_ne!(a.code, Code::UnknownPath, "{path}: {}", a.log);
        }
    }
    let a = query(&kv, "/nope");
    assert_eq!(a.code, Code::UnknownPath);
    assert_eq!(
        a.log,
        format!("unknown query path \"/nope\"; known: {}", known_paths())
    );
    for r in ROUTES {
        assert!(a.log.contains(r.pattern), "{} not listed", r.pattern);
    }
    assert!(a.log.ends_with(", /key"), "{}", a.log);
}

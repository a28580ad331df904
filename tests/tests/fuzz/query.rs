//! Target 4: query paths, on arbitrary strings, on strings made of the
//! served paths' own words, escapes and parameters, and on mutations of
//! paths the client builds (`query_path`). Properties: no panic; the code
//! is one a query documents (`ok`, `unknown_path`, `bad_argument`,
//! `not_found`); an answer is valid JSON with an empty log, a refusal has
//! a log and no value; the adapter answers the same; every built path of
//! valid identifiers is served (`ok` or `not_found`).

use proptest::prelude::*;
use tally_settlement::query::query;
use tally_settlement::query_path::{self as qp, QueryPath};
use tally_settlement::Code;
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::RequestQuery;

use crate::env::{Env, T0};
use crate::mutate::{apply, mutation, Mutation};

#[derive(Clone, Debug)]
enum Input {
    Raw(String),
    /// Words, separators, escapes and parameters.
    Words(Vec<String>),
    /// A built path: (constructor, identifiers, number, paging), mutated.
    Built(
        u8,
        Vec<String>,
        u64,
        Option<(usize, Option<String>)>,
        Vec<Mutation>,
    ),
}

const WORDS: &[&str] = &[
    "/",
    "sla",
    "route",
    "provider",
    "user",
    "windows",
    "balance",
    "params",
    "gateways",
    "sync",
    "batch",
    "hubcalls",
    "dkg",
    "hub",
    "alice",
    "p",
    "m",
    "r",
    "1",
    "0",
    "18446744073709551616",
    "?",
    "&",
    "=",
    "limit",
    "cursor",
    "%",
    "%2F",
    "%zz",
    "%C3%28",
    "%00",
    "..",
    "ä",
];

fn ident() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["alice", "p", "m", "r", "hub", "org/prov", "/v1/chat"])
            .prop_map(String::from),
        2 => "[A-Za-z0-9._:/-]{1,70}",
        1 => ".{0,12}",
    ]
}

fn input() -> impl Strategy<Value = Input> {
    let word = prop_oneof![
        6 => prop::sample::select(WORDS).prop_map(String::from),
        1 => ".{0,6}",
    ];
    let cursor = prop::option::of("[0-9a-fA-Fxz]{0,18}");
    let paging = prop::option::of((0usize..1200, cursor));
    let path_bytes = prop::collection::vec(any::<u8>(), 1..8);
    prop_oneof![
        2 => ".{0,80}".prop_map(Input::Raw),
        3 => prop::collection::vec(word, 0..12).prop_map(Input::Words),
        4 => (
            0u8..12,
            prop::collection::vec(ident(), 4),
            any::<u64>(),
            paging,
            prop_oneof![2 => Just(Vec::new()), 1 => prop::collection::vec(mutation(path_bytes), 1..3)],
        )
            .prop_map(|(c, ids, n, pg, m)| Input::Built(c, ids, n, pg, m)),
    ]
}

fn built(c: u8, ids: &[String], n: u64) -> QueryPath {
    let w = if n.is_multiple_of(2) { Some(n) } else { None };
    match c {
        0 => qp::sla_route(&ids[0], &ids[1], &ids[2], &ids[3]),
        1 => qp::sla_route_window(&ids[0], &ids[1], &ids[2], &ids[3], n),
        2 => qp::sla_provider(&ids[1], w),
        3 => qp::sla_user(&ids[0], w),
        4 => qp::windows(),
        5 => qp::balance(&ids[0]),
        6 => qp::params(),
        7 => qp::gateways(),
        8 => qp::sync(&ids[0]),
        9 => qp::batch(&ids[0], n),
        10 => qp::hubcalls(&ids[0]),
        _ => qp::dkg(),
    }
}

/// Whether the identifiers a constructor uses are ones the chain accepts
/// (then the built path must be served).
fn valid_ids(c: u8, ids: &[String]) -> bool {
    let party = |s: &String| tally_settlement::ident::check_party("x", s).is_ok();
    let name = |s: &String| tally_settlement::ident::check_name("x", s).is_ok();
    match c {
        0 | 1 => party(&ids[0]) && party(&ids[1]) && name(&ids[2]) && name(&ids[3]),
        2 => party(&ids[1]),
        3 | 5 => party(&ids[0]),
        // sync, batch, hubcalls take any non-empty chain name.
        8..=10 => !ids[0].is_empty(),
        _ => true,
    }
}

/// The path and whether the oracle knows it is served.
fn build(input: &Input) -> (String, bool) {
    match input {
        Input::Raw(s) => (s.clone(), false),
        Input::Words(ws) => (ws.concat(), false),
        Input::Built(c, ids, n, paging, ms) => {
            let mut q = built(*c, ids, *n);
            // Only the listing paths take paging.
            let pages = matches!(c, 0 | 2 | 3 | 4 | 10);
            let mut served = valid_ids(*c, ids);
            if let Some((limit, cursor)) = paging {
                q = q.page(Some(*limit), cursor.as_deref());
                // A cursor is a key from an earlier page: a made-up one
                // may be refused.
                served &= pages && (1..=1000).contains(limit) && cursor.is_none();
            }
            let s = q.to_string();
            if ms.is_empty() {
                (s, served)
            } else {
                let b = apply(s.into_bytes(), ms);
                (String::from_utf8_lossy(&b).into_owned(), false)
            }
        }
    }
}

#[test]
fn query_paths_on_arbitrary_and_mutated_strings() {
    let env = Env::new();
    let backend = env.app.committed_state().clone();
    let mut runner = crate::runner(file!(), 16);
    let r = runner.run(&input(), |input| {
        let (path, served) = build(&input);
        let r = query(&backend, &path);
        prop_assert!(
            matches!(
                r.code,
                Code::Ok | Code::UnknownPath | Code::BadArgument | Code::NotFound
            ),
            "{path:?}: code {:?} ({})",
            r.code,
            r.log
        );
        if r.code == Code::Ok {
            prop_assert!(r.log.is_empty());
            let v: Result<serde_json::Value, _> = serde_json::from_slice(&r.value);
            prop_assert!(
                v.is_ok(),
                "{path:?}: not JSON: {:?}",
                String::from_utf8_lossy(&r.value)
            );
        } else {
            prop_assert!(r.value.is_empty() && !r.log.is_empty(), "{path:?}: {r:?}");
        }
        if served {
            prop_assert!(
                matches!(r.code, Code::Ok | Code::NotFound),
                "{path:?} is built from valid identifiers but answered {:?}: {}",
                r.code,
                r.log
            );
        }
        let a = env.app.query(RequestQuery {
            data: Default::default(),
            path: path.clone(),
            height: 0,
            prove: false,
        });
        prop_assert_eq!(a.code, r.code.value());
        prop_assert_eq!(a.value.as_ref(), r.value.as_slice());
        Ok(())
    });
    crate::report("query", r);
    // A path known to answer, so the target is not vacuous.
    let w = query(
        &backend,
        &qp::sla_route_window("alice", "p", "m", "r", T0 / 60).to_string(),
    );
    assert_eq!(w.code, Code::Ok, "{}", w.log);
}

//! Read-only queries over committed state, answered as JSON: one route
//! table, [`ROUTES`], and one small handler per path in the file of its
//! concern.
//!
//! Paths (segments are percent-encoded; a `/` inside a model or route is
//! sent as `%2F`; [`crate::query_path`] builds and splits them); the paged
//! ones take `?limit=N&cursor=C`:
//!
//! | path | paged | value |
//! |---|---|---|
//! | `/sla/route/{user}/{provider}/{model}/{route}` | yes | `{"records": [...], "next_cursor"}` over all windows |
//! | `/sla/route/{user}/{provider}/{model}/{route}/{window}` | no | one route record |
//! | `/sla/provider/{provider}[/{window}]` | yes | `{"records": [...], "next_cursor"}` |
//! | `/sla/user/{user}[/{window}]` | yes | `{"records": [...], "next_cursor"}` |
//! | `/windows` | yes | `{"windows": [...], "next_cursor"}` |
//! | `/balance/{user}` | no | `{"user", "balance"}` |
//! | `/allowances/{user}` | no | `{"user", "key", "sequence", "window", "allowances": [{"gateway", "max_per_window", "expires_at", "expired", "used"}]}` |
//! | `/withdrawals/{user}` | no | `{"user", "withdrawals": [{"call_id", "amount", "sequence", "window", "height", "status", "settled_nonce"}], "more"}` |
//! | `/params` | no | the parameters in force, `since_window`, `scheduled` |
//! | `/gateways` | no | `{"gateways": [{"name", "pubkey", "status"}]}` |
//! | `/sync/{chain}` | no | the hub chain's sync state |
//! | `/batch/{chain}/{nonce}` | no | a batch: calls, digest, status, group signature |
//! | `/hubcalls/{chain}` | yes | `{"calls": [...], "next_cursor"}`: pending hub calls |
//! | `/dkg` | no | the active key (epoch, threshold, group key, public shares, signers), the running ceremony, the key waiting to activate, the last ceremony |
//! | `/validators` | no | `{"validators": [{"address", "pubkey", "power", "share_index"}], "total_power"}` |
//! | `/proposals?from={id}` | no | `{"proposals": [...], "next_from"}`: validator-set proposals, 100 at most |
//! | `/rotations?from={nonce}` | no | `{"rotations": [...], "next_from"}`: key rotations (the history of keys) with their signatures, 100 at most |
//! | `/upgrade` | no | `{"app_version", "pending"}`: the app version the state runs under and the pending upgrade plan (null without one) |
//! | `/upgrade/applied/{name}` | no | `{"name", "app_version", "height", "binary_sha256", "info"}`: an upgrade plan carried out at `height` |
//! | `/slo/policies` | no | `{"policies": [{"provider", "policy", "since_window", "proposal"}], "more", "scheduled": [{"from_window", "provider", "policy", "proposal"}]}` |
//! | `/slo/policy/{provider}` | no | `{"provider", "policy", "since_window", "scheduled"}` |
//! | `/slo/verdicts/{provider}?from={window}` | no | `{"provider", "verdicts": [...], "next_from"}`: 100 at most, oldest first |
//! | `/slo/verdict/{provider}/{window}` | no | a verdict: `status`, `reasons`, the counts, `fail_ppm`, `policy`, `credited`, `reputation_ppm` |
//! | `/slo/reputation/{provider}` | no | `{"provider", "score_ppm", "judged", "breached", "last_window"}` |
//! | `/latency/{provider}/{window}` | no | `{"provider", "window", "latency", "ttft", "routes": [{"model", "route", "latency", "ttft"}], "more"}`: p50/p95/p99 as bucket bounds |
//!
//! The ABCI adapter answers [`KEY_PATH`] (raw state with a Merkle proof)
//! itself, before a query reaches this module.
//!
//! A new path is one row of [`ROUTES`] and one handler; the table above,
//! the README's query reference and the "unknown path" answer list the
//! same patterns (`settlement/tests/query_doc.rs` checks the docs).
//! Handlers read through [`crate::state`] accessors only.

mod ask;
mod balances;
mod dkg;
mod params;
mod sla;
mod slo;
mod sync;
mod upgrade;
mod windows;

use serde_json::Value;
use tally_store::KvRead;

pub use ask::{Ask, Page, Paging, Reader, DEFAULT_LIMIT, MAX_LIMIT};

use crate::codes::Code;
use crate::error::{reject, ExecError, Fatal};
use crate::query_path;

/// The path the ABCI adapter serves itself: a raw state key in `data`,
/// answered from the Merkle tree with its proof.
pub const KEY_PATH: &str = "/key";

/// A handler: the answer's JSON value, or why there is none.
pub type Handler = fn(&Ask<'_>) -> Result<Value, ExecError>;

/// One served path.
#[derive(Debug)]
pub struct Route {
    /// `/seg/{arg}[/{optional}]`, with the route's own `?params` if it
    /// takes any besides paging ([`query_path::match_pattern`]).
    pub pattern: &'static str,
    /// What it answers, in one line.
    pub about: &'static str,
    /// Takes `?limit=N&cursor=C` and answers `next_cursor`.
    pub paged: bool,
    /// Answers it.
    pub handler: Handler,
}

/// A paged route ([`Route::paged`]).
const PAGED: bool = true;
/// A route that answers one value, unpaged.
const ONE: bool = false;

const fn route(pattern: &'static str, about: &'static str, paged: bool, handler: Handler) -> Route {
    Route {
        pattern,
        about,
        paged,
        handler,
    }
}

/// Every served path, in the order the docs list them. A path matches at
/// most one pattern. Columns: pattern, what it answers, paged, handler.
#[rustfmt::skip]
pub const ROUTES: &[Route] = &[
    route("/sla/route/{user}/{provider}/{model}/{route}", "a route's records over all windows", PAGED, sla::route_all),
    route("/sla/route/{user}/{provider}/{model}/{route}/{window}", "one route record", ONE, sla::route_window),
    route("/sla/provider/{provider}[/{window}]", "a provider's records", PAGED, sla::provider),
    route("/sla/user/{user}[/{window}]", "a user's records", PAGED, sla::user),
    route("/windows", "windows with their totals", PAGED, windows::windows),
    route("/balance/{user}", "a user's balance", ONE, balances::balance),
    route("/allowances/{user}", "a user's allowances and their use", ONE, balances::allowances),
    route("/withdrawals/{user}", "a user's withdrawals", ONE, balances::withdrawals),
    route("/params", "the chain parameters", ONE, params::params),
    route("/gateways", "the registered gateways", ONE, params::gateways),
    route("/sync/{chain}", "a hub chain's sync state", ONE, sync::sync_state),
    route("/batch/{chain}/{nonce}", "one batch", ONE, sync::batch),
    route("/hubcalls/{chain}", "hub calls not yet in a batch", PAGED, sync::hubcalls),
    route("/dkg", "the threshold key and its ceremonies", ONE, dkg::dkg),
    route("/validators", "the validator set", ONE, dkg::validators),
    route("/proposals?from={id}", "validator-set proposals", ONE, dkg::proposals),
    route("/rotations?from={nonce}", "key rotations handed to the hub", ONE, dkg::rotations),
    route("/upgrade", "the app version and the pending upgrade plan", ONE, upgrade::upgrade),
    route("/upgrade/applied/{name}", "an upgrade plan carried out", ONE, upgrade::applied),
    route("/slo/policies", "service-level objectives in force and scheduled", ONE, slo::policies),
    route("/slo/policy/{provider}", "a provider's objectives", ONE, slo::policy),
    route("/slo/verdicts/{provider}?from={window}", "a provider's verdicts by window", ONE, slo::verdicts),
    route("/slo/verdict/{provider}/{window}", "a provider's verdict in one window", ONE, slo::verdict),
    route("/slo/reputation/{provider}", "a provider's reputation", ONE, slo::reputation),
    route("/latency/{provider}/{window}", "latency and TTFT percentiles of a provider and its routes", ONE, slo::latency),
];

/// A query's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryResult {
    /// 0 on success.
    pub code: Code,
    /// Error message, empty on success.
    pub log: String,
    /// JSON value on success.
    pub value: Vec<u8>,
}

/// Answers `path` from `kv`.
pub fn query(kv: &impl KvRead, path: &str) -> QueryResult {
    match answer(Reader(kv), path) {
        Ok(value) => QueryResult {
            code: Code::Ok,
            log: String::new(),
            value: serde_json::to_vec(&value).unwrap_or_default(),
        },
        Err(ExecError::Rejected(r)) => QueryResult {
            code: r.code,
            log: r.log,
            value: Vec::new(),
        },
        Err(ExecError::Fatal(f)) => QueryResult {
            code: Fatal::CODE,
            log: f.to_string(),
            value: Vec::new(),
        },
    }
}

fn answer(kv: Reader<'_>, full: &str) -> Result<Value, ExecError> {
    let parsed = query_path::parse(full).map_err(|e| reject(Code::BadArgument, e.to_string()))?;
    for r in ROUTES {
        if let Some(args) = query_path::match_pattern(r.pattern, &parsed.segments) {
            let ask = Ask {
                kv,
                path: parsed.path,
                query: parsed.query,
                args,
            };
            return (r.handler)(&ask);
        }
    }
    Err(reject(
        Code::UnknownPath,
        format!(
            "unknown query path {:?}; known: {}",
            parsed.path,
            known_paths()
        ),
    ))
}

/// The served patterns, comma-separated, for the "unknown path" answer.
pub fn known_paths() -> String {
    let mut all: Vec<&str> = ROUTES.iter().map(|r| r.pattern).collect();
    all.push(KEY_PATH);
    all.join(", ")
}

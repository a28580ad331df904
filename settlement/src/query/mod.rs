//! Read-only queries over committed state, answered as JSON.
//!
//! Paths (segments are percent-encoded; a `/` inside a model or route is
//! sent as `%2F`; [`crate::query_path`] builds and splits them), each
//! optionally followed by `?limit=N&cursor=C`:
//!
//! | path | value |
//! |---|---|
//! | `/sla/route/{user}/{provider}/{model}/{route}` | `{"records": [...], "next_cursor"}` over all windows |
//! | `/sla/route/{user}/{provider}/{model}/{route}/{window}` | one route record |
//! | `/sla/provider/{provider}[/{window}]` | `{"records": [...], "next_cursor"}` |
//! | `/sla/user/{user}[/{window}]` | `{"records": [...], "next_cursor"}` |
//! | `/windows` | `{"windows": [...], "next_cursor"}` |
//! | `/balance/{user}` | `{"user", "balance"}` |
//! | `/allowances/{user}` | `{"user", "key", "sequence", "window", "allowances": [{"gateway", "max_per_window", "expires_at", "expired", "used"}]}` |
//! | `/params` | the chain parameters |
//! | `/gateways` | `{"gateways": [{"name", "pubkey"}]}` |
//! | `/sync/{chain}` | the hub chain's sync state |
//! | `/batch/{chain}/{nonce}` | a batch: calls, digest, status, group signature |
//! | `/hubcalls/{chain}` | `{"calls": [...], "next_cursor"}`: pending hub calls |
//! | `/dkg` | the active key (epoch, threshold, group key, public shares, signers), the running ceremony, the key waiting to activate, the last ceremony |
//! | `/validators` | `{"validators": [{"address", "pubkey", "power", "enc_key", "share_index"}], "total_power"}` |
//! | `/proposals?from={id}` | `{"proposals": [...], "next_from"}`: validator-set proposals, 100 at most |
//!
//! The last three are in [`crate::query_validators`].

use serde::Serialize;
use serde_json::json;
use tally_store::{prefix_end, KvRead, Pairs};

use crate::codes::Code;
use crate::error::{reject, ExecError, Fatal};
use crate::ident;
use crate::keys;
use crate::query_path;
use crate::query_validators;
use crate::record::{Counters, RouteId, RouteRecordView, WindowView};
use crate::state::allowance;
use crate::state::chain::{balance, is_closing, last_time, params};
use crate::state::sync::batch_status;
use crate::sync;
use crate::time::rfc3339;
use crate::types::WindowInfo;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page size.
pub const MAX_LIMIT: usize = 1000;

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

/// A page of results.
#[derive(Debug, Serialize)]
struct Page<T: Serialize> {
    #[serde(flatten)]
    items: T,
    next_cursor: Option<String>,
}

/// Answers `path` from `kv`.
pub fn query(kv: &impl KvRead, path: &str) -> QueryResult {
    match route_query(kv, path) {
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

fn bad(msg: impl Into<String>) -> ExecError {
    reject(Code::BadArgument, msg)
}

struct Paging {
    limit: usize,
    cursor: Option<Vec<u8>>,
}

fn parse_paging(qs: Option<&str>) -> Result<Paging, ExecError> {
    let mut p = Paging {
        limit: DEFAULT_LIMIT,
        cursor: None,
    };
    let pairs = query_path::parse_params(qs).map_err(|e| bad(e.to_string()))?;
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

fn parse_window(s: &str) -> Result<u64, ExecError> {
    s.parse()
        .map_err(|_| bad(format!("window must be a non-negative integer, got {s:?}")))
}

fn route_query(kv: &impl KvRead, full: &str) -> Result<serde_json::Value, ExecError> {
    let parsed = query_path::parse(full).map_err(|e| bad(e.to_string()))?;
    let (path, qs) = (parsed.path, parsed.query);
    let segs: Vec<&str> = parsed.segments.iter().map(String::as_str).collect();
    let no_params = || -> Result<(), ExecError> {
        match qs {
            Some(q) if !q.is_empty() => {
                Err(bad(format!("{path} takes no query parameters (got {q:?})")))
            }
            _ => Ok(()),
        }
    };
    let unknown = || {
        reject(
            Code::UnknownPath,
            format!(
                "unknown query path {path:?}; known: /sla/route/{{user}}/{{provider}}/{{model}}/{{route}}[/{{window}}], \
                 /sla/provider/{{provider}}[/{{window}}], /sla/user/{{user}}[/{{window}}], /windows, \
                 /balance/{{user}}, /allowances/{{user}}, /params, /gateways, /sync/{{chain}}, /batch/{{chain}}/{{nonce}}, /hubcalls/{{chain}}, /dkg, /validators, /proposals?from={{id}}"
            ),
        )
    };
    match segs.as_slice() {
        ["sla", "route", user, provider, model, route, rest @ ..] if rest.len() <= 1 => {
            ident::check_party("user", user).map_err(|e| bad(e.log))?;
            ident::check_party("provider", provider).map_err(|e| bad(e.log))?;
            ident::check_name("model", model).map_err(|e| bad(e.log))?;
            ident::check_name("route", route).map_err(|e| bad(e.log))?;
            let id = RouteId {
                user: user.to_string(),
                provider: provider.to_string(),
                model: model.to_string(),
                route: route.to_string(),
            };
            let secs = params(kv)?.settlement_window_secs;
            match rest {
                [w] => {
                    no_params()?;
                    let w = parse_window(w)?;
                    let c = load_route(kv, &id, w)?.ok_or_else(|| {
                        reject(
                            Code::NotFound,
                            format!("no record for that route in window {w}"),
                        )
                    })?;
                    Ok(json!(RouteRecordView::new(&id, w, secs, &c)))
                }
                _ => {
                    let paging = parse_paging(qs)?;
                    let prefix = keys::route_prefix(&id);
                    let (rows, next) = scan_page(kv, &prefix, &paging)?;
                    let mut records = Vec::with_capacity(rows.len());
                    for (k, v) in rows {
                        let w = u64::from_be_bytes(
                            k[prefix.len()..].try_into().map_err(|_| corrupt())?,
                        );
                        let c = Counters::decode(&v).ok_or_else(corrupt)?;
                        records.push(RouteRecordView::new(&id, w, secs, &c));
                    }
                    Ok(json!(Page {
                        items: json!({ "records": records }),
                        next_cursor: next
                    }))
                }
            }
        }
        ["sla", kind @ ("provider" | "user"), party, rest @ ..] if rest.len() <= 1 => {
            let by_provider = *kind == "provider";
            ident::check_party(kind, party).map_err(|e| bad(e.log))?;
            let window = rest.first().map(|w| parse_window(w)).transpose()?;
            let prefix = if by_provider {
                keys::by_provider_prefix(party, window)
            } else {
                keys::by_user_prefix(party, window)
            };
            let paging = parse_paging(qs)?;
            let secs = params(kv)?.settlement_window_secs;
            let (rows, next) = scan_page(kv, &prefix, &paging)?;
            let mut records = Vec::with_capacity(rows.len());
            for (k, _) in rows {
                let (id, w) = keys::parse_index(&k, by_provider).ok_or_else(corrupt)?;
                let c = load_route(kv, &id, w)?.ok_or_else(corrupt)?;
                records.push(RouteRecordView::new(&id, w, secs, &c));
            }
            Ok(json!(Page {
                items: json!({ "records": records }),
                next_cursor: next
            }))
        }
        ["windows"] => {
            let paging = parse_paging(qs)?;
            let secs = params(kv)?.settlement_window_secs;
            let (rows, next) = scan_page(kv, keys::WINDOW, &paging)?;
            let mut windows = Vec::with_capacity(rows.len());
            for (k, v) in rows {
                let w =
                    u64::from_be_bytes(k[keys::WINDOW.len()..].try_into().map_err(|_| corrupt())?);
                let info = WindowInfo::decode(&v).ok_or_else(corrupt)?;
                let start = w.saturating_mul(secs);
                windows.push(WindowView {
                    window: w,
                    window_start: rfc3339(start),
                    window_end: rfc3339(start.saturating_add(secs)),
                    closed: info.closed,
                    converting: info.closed && is_closing(kv, w)?,
                    routes: info.routes,
                    requests: info.totals.requests,
                    fail_count: info.totals.fail_count(),
                    cancel: info.totals.cancel,
                    client: info.totals.client,
                    units: info.totals.units,
                    amount: info.totals.amount,
                });
            }
            Ok(json!(Page {
                items: json!({ "windows": windows }),
                next_cursor: next
            }))
        }
        ["balance", user] => {
            no_params()?;
            ident::check_party("user", user).map_err(|e| bad(e.log))?;
            Ok(json!({ "user": user, "balance": balance(kv, user)? }))
        }
        ["allowances", user] => {
            no_params()?;
            ident::check_party("user", user).map_err(|e| bad(e.log))?;
            let now = last_time(kv)?;
            let window = now / params(kv)?.settlement_window_secs;
            let mut rows = Vec::new();
            for (gateway, a) in allowance::allowances_of(kv, user, None, MAX_LIMIT)? {
                let used = allowance::spent(kv, user, &gateway, window)?;
                rows.push(json!({
                    "gateway": gateway,
                    "max_per_window": a.max_per_window,
                    "expires_at": a.expires_at,
                    "expired": a.expires_at <= now,
                    "used": used,
                }));
            }
            Ok(json!({
                "user": user,
                "key": allowance::user_key(kv, user)?.map(hex::encode),
                "sequence": allowance::user_seq(kv, user)?,
                "window": window,
                "allowances": rows,
            }))
        }
        ["sync", chain] => {
            no_params()?;
            let p = params(kv)?;
            let st = sync::sync_state(kv, chain)?;
            let running = st.attempt > 0 && sync::is_running(&st, last_time(kv)?, &p);
            let pending = sync::pending_calls(kv, chain, None, MAX_LIMIT)?.len();
            Ok(json!({
                "chain": chain,
                "running": running,
                "last_sync": st.last_sync,
                "last_sync_time": rfc3339(st.last_sync),
                "attempt": st.attempt,
                "nonce": if st.current_nonce == 0 { None } else { Some(st.current_nonce) },
                "next_nonce": st.next_nonce.max(1),
                "attempts": st.attempts_total,
                "failures": st.failures,
                "settled_batches": st.settled_batches,
                "last_error": if st.last_error.is_empty() { None } else { Some(st.last_error.clone()) },
                "last_result_at": if st.last_result_at == 0 { None } else { Some(rfc3339(st.last_result_at)) },
                "next_attempt_not_before": sync::next_attempt_not_before(&st, &p),
                "pending_calls": pending,
                "sync_window_secs": p.sync_window_secs,
                "hub_cursor": sync::hub_cursor(kv, chain)?.height,
                "next_deposit_seq": sync::hub_cursor(kv, chain)?.deposit_seq,
                "failure_backdate_secs": p.failure_backdate_secs,
            }))
        }
        ["batch", chain, nonce] => {
            no_params()?;
            let n: u64 = nonce
                .parse()
                .map_err(|_| bad(format!("nonce must be an integer, got {nonce:?}")))?;
            let b = sync::batch(kv, chain, n)?
                .ok_or_else(|| reject(Code::NotFound, format!("no batch {n} on {chain}")))?;
            let status = batch_status(&b)?;
            let settled = status == crate::types::BatchStatus::Settled;
            let mut calls = Vec::with_capacity(b.call_ids.len());
            for id in &b.call_ids {
                calls.push(match sync::hub_call(kv, *id)? {
                    Some(c) => json!({"id": c.id, "user": c.user, "provider": c.provider, "amount": c.amount, "window": c.window, "settled": settled}),
                    // Past `settled_retention_windows`: only the id is left.
                    None => json!({"id": id, "settled": true, "pruned": true}),
                });
            }
            let status = status.name();
            Ok(json!({
                "chain": b.chain, "nonce": b.nonce, "status": status,
                "digest": hex::encode(&b.digest),
                "signature": if b.signature.is_empty() { None } else { Some(hex::encode(&b.signature)) },
                "formed_height": b.formed_height, "total": b.total, "calls": calls,
            }))
        }
        ["hubcalls", chain] => {
            let paging = parse_paging(qs)?;
            let after = match &paging.cursor {
                Some(c) => Some(u64::from_be_bytes(
                    c.as_slice()
                        .try_into()
                        .map_err(|_| bad("cursor is not a hub call cursor"))?,
                )),
                None => None,
            };
            let mut calls = sync::pending_calls(kv, chain, after, paging.limit + 1)?;
            let next = if calls.len() > paging.limit {
                calls.truncate(paging.limit);
                calls.last().map(|c| hex::encode(c.id.to_be_bytes()))
            } else {
                None
            };
            let calls: Vec<_> = calls
                .iter()
                .map(|c| json!({"id": c.id, "user": c.user, "provider": c.provider, "amount": c.amount, "window": c.window}))
                .collect();
            Ok(json!({"calls": calls, "next_cursor": next}))
        }
        ["dkg"] => {
            no_params()?;
            query_validators::dkg(kv)
        }
        ["validators"] => {
            no_params()?;
            query_validators::validators(kv)
        }
        ["proposals"] => query_validators::proposals(kv, qs),
        ["params"] => {
            no_params()?;
            Ok(json!(params(kv)?))
        }
        ["gateways"] => {
            no_params()?;
            let mut gateways = Vec::new();
            kv.for_each(keys::GATEWAY, &prefix_end(keys::GATEWAY), &mut |k, v| {
                gateways.push(json!({
                    "name": String::from_utf8_lossy(v),
                    "pubkey": hex::encode(&k[keys::GATEWAY.len()..]),
                }));
                true
            })?;
            Ok(json!({ "gateways": gateways }))
        }
        _ => Err(unknown()),
    }
}

fn corrupt() -> ExecError {
    ExecError::Fatal(Fatal::Corrupt("state"))
}

fn load_route(kv: &impl KvRead, id: &RouteId, w: u64) -> Result<Option<Counters>, ExecError> {
    match kv.get(&keys::route(id, w))? {
        None => Ok(None),
        Some(b) => Ok(Some(Counters::decode(&b).ok_or_else(corrupt)?)),
    }
}

/// One page of `prefix`, starting after the cursor.
fn scan_page(
    kv: &impl KvRead,
    prefix: &[u8],
    paging: &Paging,
) -> Result<(Pairs, Option<String>), ExecError> {
    let start = match &paging.cursor {
        Some(c) => {
            if !c.starts_with(prefix) {
                return Err(bad("cursor does not belong to this query"));
            }
            let mut s = c.clone();
            s.push(0);
            s
        }
        None => prefix.to_vec(),
    };
    let mut rows = kv.scan(&start, &prefix_end(prefix), paging.limit + 1)?;
    let next = if rows.len() > paging.limit {
        rows.truncate(paging.limit);
        rows.last().map(|(k, _)| hex::encode(k))
    } else {
        None
    };
    Ok((rows, next))
}

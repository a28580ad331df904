//! The service-level objective queries (ADR 0021): policies, verdicts,
//! reputations and latency percentiles (`/slo/...`, `/latency/...`).

use serde_json::{json, Value};

use super::ask::{bad, parse_window, state_fault, Ask, MAX_LIMIT};
use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::ident;
use crate::keys;
use crate::slo::judge::{
    provider_histogram, reputation as rep, verdict as stored_verdict, Verdict,
};
use crate::slo::latency::Histogram;
use crate::slo::policy::{all_in_force, all_scheduled, in_force};
use tally_store::KvRead;

/// Verdicts one `/slo/verdicts` answer carries at most.
pub const VERDICTS_PAGE: usize = 100;

fn provider_arg<'a>(a: &Ask<'a>) -> Result<&'a str, ExecError> {
    let p = a.arg("provider")?;
    ident::check_party("provider", p).map_err(|e| bad(e.log))?;
    Ok(p)
}

/// `/slo/policies`: the policies in force (the first 1000 by provider)
/// and every scheduled change.
pub fn policies(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let all = all_in_force(&a.kv)?;
    let more = all.len() > MAX_LIMIT;
    let list: Vec<Value> = all
        .into_iter()
        .take(MAX_LIMIT)
        .map(|(provider, f)| json!({"provider": provider, "policy": f.policy, "since_window": f.since_window, "proposal": f.proposal}))
        .collect();
    let scheduled: Vec<Value> = all_scheduled(&a.kv)?
        .into_iter()
        .take(MAX_LIMIT)
        .map(|(w, provider, s)| json!({"from_window": w, "provider": provider, "policy": s.policy, "proposal": s.proposal}))
        .collect();
    Ok(json!({"policies": list, "more": more, "scheduled": scheduled}))
}

/// `/slo/policy/{provider}`: the policy in force and the scheduled change.
pub fn policy(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let provider = provider_arg(a)?;
    let f = in_force(&a.kv, provider)?;
    let next = all_scheduled(&a.kv)?
        .into_iter()
        .find(|(_, p, _)| p == provider)
        .map(|(w, _, s)| json!({"from_window": w, "policy": s.policy, "proposal": s.proposal}));
    Ok(json!({
        "provider": provider,
        "policy": f.map(|f| f.policy),
        "since_window": f.map(|f| f.since_window),
        "scheduled": next,
    }))
}

/// `/slo/verdict/{provider}/{window}`: one verdict (provable: `slov/`).
pub fn verdict(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let provider = provider_arg(a)?;
    let w = parse_window(a.arg("window")?)?;
    let v = stored_verdict(&a.kv, provider, w)?.ok_or_else(|| {
        reject(
            Code::NotFound,
            format!("no verdict for {provider} in window {w} (no policy, or no calls)"),
        )
    })?;
    Ok(json!(v))
}

/// `/slo/verdicts/{provider}?from={window}`: verdicts from a window on,
/// oldest first, 100 at most.
pub fn verdicts(a: &Ask) -> Result<Value, ExecError> {
    let provider = provider_arg(a)?;
    let from = crate::dkg::query::from_param(a.query, "window")?;
    let start = keys::slo_verdict(provider, from);
    let end = tally_store::prefix_end(&keys::slo_verdict_prefix(provider));
    let rows =
        a.kv.scan(&start, &end, VERDICTS_PAGE + 1)
            .map_err(|e| state_fault(e.into()))?;
    let mut list: Vec<Verdict> = rows
        .iter()
        .map(|(_, v)| serde_json::from_slice(v))
        .collect::<Result<_, _>>()
        .map_err(|_| state_fault(crate::error::Fatal::Corrupt("slo verdict")))?;
    let next = (list.len() > VERDICTS_PAGE).then(|| list[VERDICTS_PAGE].window);
    list.truncate(VERDICTS_PAGE);
    Ok(json!({"provider": provider, "verdicts": list, "next_from": next}))
}

/// `/slo/reputation/{provider}`: the reputation (provable: `rep/`).
pub fn reputation(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let provider = provider_arg(a)?;
    let r = rep(&a.kv, provider)?;
    Ok(json!({
        "provider": provider,
        "score_ppm": r.score_ppm,
        "judged": r.judged,
        "breached": r.breached,
        "last_window": r.last_window,
    }))
}

fn percentiles(h: &Histogram) -> Value {
    json!({"latency": h.latency.percentiles(), "ttft": h.ttft.percentiles()})
}

/// `/latency/{provider}/{window}`: the provider's p50/p95/p99 latency and
/// TTFT in a window, and each route's (the first 1000 by model and route);
/// code 28 for a window whose SLA records were pruned.
pub fn latency(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let provider = provider_arg(a)?;
    let w = parse_window(a.arg("window")?)?;
    crate::state::prune::check_kept(&a.kv, w)?;
    let whole = provider_histogram(&a.kv, provider, w)?;
    let prefix = keys::route_latency_prefix(provider, w);
    let rows =
        a.kv.scan_prefix(&prefix, MAX_LIMIT + 1)
            .map_err(|e| state_fault(e.into()))?;
    let more = rows.len() > MAX_LIMIT;
    let mut routes = Vec::new();
    for (k, v) in rows.iter().take(MAX_LIMIT) {
        let rest = &k[prefix.len()..];
        let mut parts = rest.splitn(2, |&b| b == 0);
        let (model, route) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let h = Histogram::decode(v)
            .ok_or_else(|| state_fault(crate::error::Fatal::Corrupt("latency histogram")))?;
        let mut row = percentiles(&h);
        row["model"] = json!(String::from_utf8_lossy(model));
        row["route"] = json!(String::from_utf8_lossy(route));
        routes.push(row);
    }
    let mut out = percentiles(&whole);
    out["provider"] = json!(provider);
    out["window"] = json!(w);
    out["routes"] = json!(routes);
    out["more"] = json!(more);
    Ok(out)
}

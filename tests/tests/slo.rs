//! Service-level objectives (ADR 0021) through the in-process driver, on a
//! keyed net of 4 whose genesis starts at app version 4, with the modelled
//! hub and relays. The oracles: the test's own ledger of the calls it
//! sends (fail rates, charges, credits rounded up by hand), a sorted list
//! of the latencies it sent (nearest-rank percentiles), the hub model's
//! payouts, and the driver's check that every node reaches the same app
//! hash at every height.

use anyhow::{ensure, Context, Result};
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::proto::{
    Outcome as CallOutcome, ReportUsage, RouteCalls, SloChange, SloPolicy, UsageRecord,
    ValidatorProposal,
};
use tally_settlement::slo::latency::{bounds, bucket_of};
use tally_settlement::Code;
use tally_tests::dkgnet::{DkgNet, CHAIN};
use tally_tests::traffic::gateway_key;

fn query(net: &DkgNet, i: usize, path: &str) -> Result<serde_json::Value> {
    let r = tally_settlement::query::query(net.net.nodes[i].app.committed_state(), path);
    ensure!(r.code == Code::Ok, "{path}: {}", r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

fn balance(net: &DkgNet, user: &str) -> Result<u64> {
    Ok(tally_settlement::balance(
        net.net.nodes[0].app.committed_state(),
        user,
    )?)
}

fn window_of(net: &DkgNet) -> u64 {
    net.net.now as u64 / 60
}

fn policy(provider: &str, max_fail_ppm: u32, min_requests: u64, credit_ppm: u32) -> SloPolicy {
    SloPolicy {
        provider: provider.into(),
        max_fail_ppm,
        min_requests,
        credit_ppm,
        ..SloPolicy::default()
    }
}

fn slo(from_window: u64, policies: Vec<SloPolicy>) -> ValidatorProposal {
    ValidatorProposal {
        action: ProposalAction::Slo.into(),
        slo: Some(SloChange {
            from_window,
            policies,
        }),
        ..ValidatorProposal::default()
    }
}

/// Proposes `p` from node 0 and approves it from 1 and 2; the status (or
/// the code and log of a refusal to open).
fn pass(net: &mut DkgNet, p: ValidatorProposal) -> Result<Result<ProposalStatus, String>> {
    let (code, id, log) = net.propose_gov(0, p)?;
    if code != Code::Ok {
        return Ok(Err(format!("{code:?}: {log}")));
    }
    for v in [1, 2] {
        if net.status(id)? != ProposalStatus::Open {
            break;
        }
        ensure!(net.approve(v, id)? == Code::Ok, "approval by {v}");
    }
    Ok(Ok(net.status(id)?))
}

/// `n` calls of one class on `provider` for `user`, each charged
/// `amount` (failures 0) and measured at `latency_ms` (if any).
fn calls(
    user: &str,
    provider: &str,
    outcome: CallOutcome,
    n: usize,
    amount: u64,
    latency_ms: Option<u64>,
) -> Vec<UsageRecord> {
    let rec = UsageRecord {
        user: user.into(),
        provider: provider.into(),
        model: "org/m".into(),
        route: "/v1/chat".into(),
        outcome: outcome.into(),
        units: 1,
        amount,
        latency_bucket: latency_ms.map_or(0, |ms| bucket_of(ms).into()),
        ttft_bucket: latency_ms.map_or(0, |ms| bucket_of(ms / 4).into()),
    };
    vec![rec; n]
}

/// Runs a block carrying one report of `records` (compact form, as the
/// SDK sends); its result code.
fn report(net: &mut DkgNet, records: Vec<UsageRecord>) -> Result<Code> {
    let now = net.net.now as u64;
    let tx = net.traffic.report(records, now, 120);
    let o = net.block(false, vec![tx.clone()])?;
    let pos = o.block.txs.iter().position(|t| t.as_ref() == tx.as_slice());
    let pos = pos.context("report not included")?;
    Code::from_value(o.tx_results[pos].code).context("unknown code")
}

/// Blocks without usage until one ran in window `w`; the events of the
/// block that entered it (`window_of` is the next block's window: the
/// driver's clock moves on after each block).
fn until_window(net: &mut DkgNet, w: u64) -> Result<Vec<String>> {
    let mut kinds = Vec::new();
    while (net.net.now as u64 - 5) / 60 < w {
        let o = net.block(false, Vec::new())?;
        kinds = o.events.iter().map(|e| e.r#type.clone()).collect();
    }
    Ok(kinds)
}

/// Ceil(a * ppm / 1e6), written out separately from the chain's.
fn credit(a: u64, ppm: u64) -> u64 {
    (a * ppm).div_ceil(1_000_000)
}

#[test]
fn a_breach_credits_its_users_and_the_hub_pays_only_the_rest() -> Result<()> {
    let mut net = DkgNet::new_at(4, 3, 4)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    net.pin_hub()?;
    let (u0, u1) = ("user-0", "user-1");
    let w = window_of(&net) + 2;
    let status = pass(
        &mut net,
        slo(
            w,
            vec![
                policy("prov-slo", 100_000, 10, 250_000),
                policy("prov-good", 100_000, 10, 250_000),
                policy("prov-few", 100_000, 1_000, 250_000),
                SloPolicy {
                    p95_latency_ms: 512,
                    ..policy("prov-slow", 1_000_000, 10, 500_000)
                },
            ],
        ),
    )?;
    ensure!(status == Ok(ProposalStatus::Applied), "{status:?}");
    let p = query(&net, 0, "/slo/policy/prov-slo")?;
    ensure!(
        p["policy"].is_null() && p["scheduled"]["from_window"] == w,
        "{p}"
    );

    // The window before W breaks every ceiling but has no objectives yet.
    until_window(&mut net, w - 1)?;
    ensure!(
        report(
            &mut net,
            calls(u0, "prov-slo", CallOutcome::Transient, 30, 0, None)
        )? == Code::Ok
    );
    until_window(&mut net, w)?;
    ensure!(query(&net, 0, "/slo/policy/prov-slo")?["since_window"] == w);

    // Window W. prov-slo: 25 ok calls (16 for user-0 at 7, 9 for user-1 at
    // 5), 3 transient, and 50 cancelled and 10 client errors that never
    // count: 3 / 28 = 107142 ppm > 100000.
    let before = (balance(&net, u0)?, balance(&net, u1)?);
    let mut slo_calls = calls(u0, "prov-slo", CallOutcome::Ok, 16, 7, None);
    slo_calls.extend(calls(u1, "prov-slo", CallOutcome::Ok, 9, 5, None));
    slo_calls.extend(calls(u0, "prov-slo", CallOutcome::Transient, 3, 0, None));
    slo_calls.extend(calls(u0, "prov-slo", CallOutcome::Cancel, 50, 0, None));
    slo_calls.extend(calls(u1, "prov-slo", CallOutcome::Client, 10, 0, None));
    ensure!(report(&mut net, slo_calls)? == Code::Ok);
    // prov-good: 1 / 21 fails, met. prov-few: 5 calls, under its minimum.
    let mut good = calls(u0, "prov-good", CallOutcome::Ok, 20, 3, None);
    good.extend(calls(u0, "prov-good", CallOutcome::RateLimit, 1, 0, None));
    good.extend(calls(u0, "prov-few", CallOutcome::Ok, 5, 2, None));
    ensure!(report(&mut net, good)? == Code::Ok);
    // prov-slow: no failure, but 2 of 30 measured calls at or over 512 ms
    // is within p95 (2 * 20 <= 30)... and a third makes 3 * 20 > 31.
    let mut lat: Vec<u64> = (0..28).map(|i| 40 + i * 13).collect();
    lat.extend([600, 900, 512]);
    let slow: Vec<UsageRecord> = lat
        .iter()
        .flat_map(|&ms| calls(u1, "prov-slow", CallOutcome::Ok, 1, 4, Some(ms)))
        .collect();
    ensure!(report(&mut net, slow)? == Code::Ok);
    let charged = (16 * 7 + 20 * 3 + 5 * 2, 9 * 5 + 31 * 4);
    ensure!(
        (balance(&net, u0)?, balance(&net, u1)?) == (before.0 - charged.0, before.1 - charged.1)
    );

    // The percentiles of what was sent, from the sorted list.
    let mut sorted = lat.clone();
    sorted.sort_unstable();
    let l = query(&net, 0, &format!("/latency/prov-slow/{w}"))?;
    for (p, key) in [(50, "p50"), (95, "p95"), (99, "p99")] {
        let truth = sorted[(p * sorted.len()).div_ceil(100) - 1];
        let (lo, hi) = bounds(bucket_of(truth)).context("bucket")?;
        let e = &l["latency"][key];
        ensure!(
            e["lo_ms"] == lo && e["hi_ms"] == serde_json::json!(hi),
            "{key}: {truth} ms vs {e}"
        );
        ensure!(e["lo_ms"].as_u64() <= Some(truth), "{key}");
    }
    ensure!(
        l["latency"]["measured"] == 31 && l["ttft"]["measured"] == 31,
        "{l}"
    );
    ensure!(l["routes"][0]["route"] == "/v1/chat", "{l}");

    // Window W closes: verdicts, reputations, credits on every node.
    let kinds = until_window(&mut net, w + 1)?;
    ensure!(
        kinds.iter().filter(|k| *k == "slo_breach").count() == 2,
        "{kinds:?}"
    );
    ensure!(kinds.iter().any(|k| k == "slo_credited"), "{kinds:?}");
    for i in 0..4 {
        let v = query(&net, i, &format!("/slo/verdict/prov-slo/{w}"))?;
        ensure!(
            v["status"] == "breached" && v["reasons"] == serde_json::json!(["fail_rate"]),
            "{v}"
        );
        ensure!(
            (
                v["judged"].as_u64(),
                v["fail_count"].as_u64(),
                v["fail_ppm"].as_u64()
            ) == (Some(28), Some(3), Some(107_142)),
            "{v}"
        );
        ensure!(
            v["credited"] == credit(112, 250_000) + credit(45, 250_000),
            "{v}"
        );
        ensure!(
            v["credited_users"] == 2 && v["reputation_ppm"] == 937_500,
            "{v}"
        );
        let g = query(&net, i, &format!("/slo/verdict/prov-good/{w}"))?;
        ensure!(
            g["status"] == "met" && g["fail_ppm"] == 47_619 && g["credited"] == 0,
            "{g}"
        );
        let f = query(&net, i, &format!("/slo/verdict/prov-few/{w}"))?;
        ensure!(f["status"] == "not_judged" && f["judged"] == 5, "{f}");
        let s = query(&net, i, &format!("/slo/verdict/prov-slow/{w}"))?;
        ensure!(
            s["status"] == "breached" && s["reasons"] == serde_json::json!(["latency"]),
            "{s}"
        );
        ensure!(
            s["slow_latency"] == 3 && s["credited"] == credit(31 * 4, 500_000),
            "{s}"
        );
        let r = query(&net, i, "/slo/reputation/prov-slo")?;
        ensure!(
            r["score_ppm"] == 937_500 && r["judged"] == 1 && r["breached"] == 1,
            "{r}"
        );
        let r = query(&net, i, "/slo/reputation/prov-few")?;
        ensure!(r["score_ppm"] == 1_000_000 && r["judged"] == 0, "{r}");
    }
    // The window before W has no verdict.
    let none = tally_settlement::query::query(
        net.net.nodes[0].app.committed_state(),
        &format!("/slo/verdict/prov-slo/{}", w - 1),
    );
    ensure!(none.code == Code::NotFound, "{none:?}");
    // Credits are back in the balances at once.
    let back = (
        credit(112, 250_000),
        credit(45, 250_000) + credit(124, 500_000),
    );
    ensure!(balance(&net, u0)? == before.0 - charged.0 + back.0);
    ensure!(balance(&net, u1)? == before.1 - charged.1 + back.1);

    // The hub pays each provider exactly what is left, once.
    let want = [
        ((u0, "prov-slo"), 112 - credit(112, 250_000)),
        ((u1, "prov-slo"), 45 - credit(45, 250_000)),
        ((u0, "prov-good"), 60),
        ((u0, "prov-few"), 10),
        ((u1, "prov-slow"), 124 - credit(124, 500_000)),
    ];
    net.until(40, |s| {
        let hub = s.net.hub.as_ref().context("hub")?;
        Ok(want
            .iter()
            .all(|((u, p), _)| hub.paid.contains_key(&(u.to_string(), p.to_string()))))
    })?;
    let hub = net.net.hub.as_ref().context("hub")?;
    for ((u, p), amount) in want {
        let paid = hub.paid.get(&(u.to_string(), p.to_string())).copied();
        ensure!(
            paid == Some(amount),
            "{u} -> {p}: paid {paid:?}, want {amount}"
        );
    }
    Ok(())
}

#[test]
fn below_version_4_objectives_and_latency_are_refused_with_their_reasons() -> Result<()> {
    let mut net = DkgNet::new_at(4, 3, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    let w = window_of(&net) + 2;
    let r = pass(&mut net, slo(w, vec![policy("prov-slo", 1, 1, 1)]))?;
    ensure!(
        matches!(&r, Err(e) if e.contains("needs app version 4")),
        "{r:?}"
    );
    let code = report(
        &mut net,
        calls("user-0", "p", CallOutcome::Ok, 1, 1, Some(30)),
    )?;
    ensure!(code == Code::BadLatency, "{code:?}");
    // The same call unmeasured is fine.
    ensure!(report(&mut net, calls("user-0", "p", CallOutcome::Ok, 1, 1, None))? == Code::Ok);
    Ok(())
}

#[test]
fn bad_objectives_and_bad_buckets_are_refused_and_change_nothing() -> Result<()> {
    let mut net = DkgNet::new_at(4, 3, 4)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    let now = window_of(&net);
    let refusals = [
        (
            slo(now, vec![policy("a", 1, 1, 1)]),
            "is not after the current window",
        ),
        (
            slo(now + 2, vec![policy("a", 1_000_001, 1, 1)]),
            "max_fail_ppm",
        ),
        (slo(now + 2, vec![policy("a", 1, 0, 1)]), "min_requests"),
        (
            slo(now + 2, vec![policy("a", 1, 1, 2_000_000)]),
            "credit_ppm",
        ),
        (
            slo(
                now + 2,
                vec![SloPolicy {
                    p95_latency_ms: 500,
                    ..policy("a", 1, 1, 1)
                }],
            ),
            "not a bucket bound",
        ),
        (
            slo(now + 2, vec![policy("a", 1, 1, 1), policy("a", 2, 1, 1)]),
            "named twice",
        ),
        (
            slo(
                now + 2,
                vec![SloPolicy {
                    remove: true,
                    ..policy("a", 0, 0, 0)
                }],
            ),
            "no policy to remove",
        ),
        (slo(now + 2, vec![]), "1 to 256"),
    ];
    for (p, why) in refusals {
        let r = pass(&mut net, p)?;
        ensure!(
            matches!(&r, Err(e) if e.contains(why)),
            "want {why:?}, got {r:?}"
        );
    }
    ensure!(query(&net, 0, "/slo/policies")?["scheduled"] == serde_json::json!([]));
    // A second change for a provider with one scheduled is refused.
    ensure!(
        pass(&mut net, slo(now + 3, vec![policy("a", 1, 1, 1)]))? == Ok(ProposalStatus::Applied)
    );
    let r = pass(&mut net, slo(now + 4, vec![policy("a", 2, 1, 1)]))?;
    ensure!(
        matches!(&r, Err(e) if e.contains("already has a change scheduled")),
        "{r:?}"
    );

    // Buckets: above 31, and a list that does not match the calls.
    let bad = calls("user-0", "p", CallOutcome::Ok, 1, 1, None)
        .into_iter()
        .map(|r| UsageRecord {
            latency_bucket: 32,
            ..r
        })
        .collect();
    ensure!(report(&mut net, bad)? == Code::BadLatency);
    let before = balance(&net, "user-0")?;
    let group = RouteCalls {
        user: "user-0".into(),
        provider: "p".into(),
        model: "m".into(),
        route: "r".into(),
        outcomes: vec![CallOutcome::Ok.into(); 3],
        units: vec![1; 3],
        amounts: vec![1; 3],
        latency: vec![5, 6],
        ttft: Vec::new(),
    };
    let now_s = net.net.now as u64;
    let mut r = ReportUsage {
        chain_id: CHAIN.into(),
        report_id: vec![7; 16],
        expires_at: now_s + 120,
        records: Vec::new(),
        route_calls: vec![group],
    };
    let tx = tally_settlement::sign_report(&gateway_key(3), &r);
    let o = net.block(false, vec![tx])?;
    ensure!(
        o.tx_results[0].code == Code::BadLatency.value(),
        "{:?}",
        o.tx_results[0]
    );
    ensure!(
        balance(&net, "user-0")? == before,
        "a refused report charged"
    );
    r.route_calls[0].latency.push(7);
    let tx = tally_settlement::sign_report(&gateway_key(3), &r);
    let o = net.block(false, vec![tx])?;
    ensure!(o.tx_results[0].code == 0, "{:?}", o.tx_results[0]);
    Ok(())
}

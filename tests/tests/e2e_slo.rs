//! End to end with real CometBFT processes: service-level objectives with
//! consequences (ADR 0021) on a four-validator localnet with the hub, at
//! the newest app version. The tests, in order:
//!
//! 1. `a_breach_is_judged_credited_and_paid_reduced`: `tallyd tx slo
//!    propose` for `prov-bad` (10% ceiling, 10 calls minimum, 25% credit)
//!    and `prov-few` (minimum 1,000) from a window two ahead; in that
//!    window the gateway SDK reports 25 billed calls, 3 failures, 40
//!    cancellations and 10 client errors on `prov-bad` (3 / 28 over the
//!    ceiling) and 5 calls on `prov-few`. When the window closes every
//!    validator holds the same verdicts (`prov-bad` breached with the
//!    test's own figures, `prov-few` not judged), the block that closed it
//!    carries the `slo_breach` event, the users' balances get exactly the
//!    credits (rounded up by the test's own arithmetic), and the hub pays
//!    `prov-bad` exactly the rest and `prov-few` in full;
//! 2. `latency_through_the_sdk_lands_in_its_buckets`: the same window's
//!    calls on `prov-lat` were timed with the SDK's `CallTimer` over a
//!    known spread of durations; `/latency` answers p50, p95 and p99 whose
//!    bucket bounds hold the nearest-rank percentiles of the durations the
//!    test sent, and the measured counts are exact.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED),
//! built `tallyd` and `tally-hub`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use tally_client::timing::CallTimer;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_settlement::slo::latency::{bounds, bucket_of};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, Localnet};
use tally_tests::sdk::send_all;

/// Ports from here (validator i: +10 i; hub +100), or the next free block.
const PORT_BASE: u16 = 28656;
const WINDOW_SECS: u64 = 20;

const TESTS: [Test<Net>; 2] = [
    Test {
        name: "a_breach_is_judged_credited_and_paid_reduced",
        needs: &[],
        run: a_breach_is_judged_credited_and_paid_reduced,
    },
    Test {
        name: "latency_through_the_sdk_lands_in_its_buckets",
        needs: &["a_breach_is_judged_credited_and_paid_reduced"],
        run: latency_through_the_sdk_lands_in_its_buckets,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture: the localnet and the window test 1 reported in.
struct Net {
    net: Localnet,
    chain_id: String,
    window: Option<u64>,
    /// The durations (ms) of `prov-lat`'s timed calls.
    latencies: Vec<u64>,
    /// alice's and bob's balances before the test (the localnet funds them
    /// from hub deposits).
    start: (u64, u64),
}

impl Net {
    fn start() -> Result<Self> {
        let base = free_port_base(PORT_BASE, 4)?;
        let net = Localnet::launch(4, base, "500ms", WINDOW_SECS, &Default::default())?;
        let chain_id = net.rpc(0).status()?.chain_id;
        net.wait_for_key(Duration::from_secs(120))?;
        let start = (net.balance(0, "alice")?, net.balance(0, "bob")?);
        ensure!(
            start.0 > 1_000 && start.1 > 1_000,
            "alice and bob are not funded: {start:?}"
        );
        Ok(Self {
            net,
            chain_id,
            window: None,
            latencies: Vec::new(),
            start,
        })
    }
}

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let r = rpc.abci_query(path)?;
    ensure!(r.code == 0, "{path}: code {} {}", r.code, r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

fn hub_query(f: &Net, path: &str) -> Result<Value> {
    query(&Rpc::new(&f.net.hub_rpc_url()), path)
}

/// Polls `done` every 200 ms until it holds, at most `secs`.
fn wait(f: &Net, secs: u64, what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let t = Instant::now();
    loop {
        if done()? {
            return Ok(());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(secs),
            "{what}: not after {secs} s\n{}",
            f.net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The latest block's height and settlement window on validator 0.
fn latest(f: &Net) -> Result<(u64, u64)> {
    let rpc = f.net.rpc(0);
    let h = rpc.status()?.height;
    let v = rpc.call("block", json!({"height": h.to_string()}))?;
    let t = v["block"]["header"]["time"]
        .as_str()
        .context("block time")?;
    Ok((h, window_of(t)))
}

/// The settlement window of RFC 3339 time `t` (`YYYY-MM-DDTHH:MM:SS...`).
fn window_of(t: &str) -> u64 {
    let want: String = t.chars().take(19).collect();
    let (mut lo, mut hi) = (0u64, u64::from(u32::MAX) / WINDOW_SECS);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let s: String = tally_settlement::time::rfc3339(mid * WINDOW_SECS)
            .chars()
            .take(19)
            .collect();
        if s <= want {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// `n` calls of one class for `user` on `provider`, each charged `amount`.
fn calls(user: &str, provider: &str, outcome: Outcome, n: usize, amount: u64) -> Vec<UsageRecord> {
    let r = UsageRecord {
        user: user.into(),
        provider: provider.into(),
        model: "org/slo".into(),
        route: "/v1/chat".into(),
        outcome: outcome as i32,
        units: 1,
        amount,
        ..Default::default()
    };
    vec![r; n]
}

/// Sends `records` through the SDK's reporter; every one must land.
fn send(f: &Net, records: Vec<UsageRecord>) -> Result<()> {
    let endpoints = vec![f.net.rpc_url(0), f.net.rpc_url(1)];
    let (flush, within) = (Some(Duration::from_millis(200)), Duration::from_secs(60));
    send_all(
        endpoints,
        &f.chain_id,
        f.net.gateway_key()?,
        records,
        flush,
        within,
    )
}

/// Ceil(a * ppm / 1e6), the users' rounding, written out by hand.
fn credit(a: u64, ppm: u64) -> u64 {
    (a * ppm).div_ceil(1_000_000)
}

/// The durations of `prov-lat`'s calls: a known spread from 20 ms to 3 s.
fn spread() -> Vec<u64> {
    (0..120u64).map(|i| 20 + (i * i * 37) % 3000).collect()
}

/// `prov-lat`'s calls timed by the SDK's `CallTimer` over `durations`
/// (TTFT a quarter of each).
fn timed(durations: &[u64]) -> Vec<UsageRecord> {
    let t0 = tokio::time::Instant::now();
    durations
        .iter()
        .map(|&ms| {
            let timer = CallTimer::start_at(t0);
            timer.first_token_at(t0 + Duration::from_millis(ms / 4));
            let mut r = calls("bob", "prov-lat", Outcome::Ok, 1, 1).remove(0);
            timer
                .finish_at(t0 + Duration::from_millis(ms))
                .apply(&mut r);
            r
        })
        .collect()
}

fn a_breach_is_judged_credited_and_paid_reduced(f: &mut Net) -> Result<()> {
    let (_, now) = latest(f)?;
    let w = now + 2;
    for (provider, min) in [("prov-bad", "10"), ("prov-few", "1000")] {
        let p = f.net.pass_proposal(&[
            "tx",
            "slo",
            "propose",
            "--from-window",
            &w.to_string(),
            "--provider",
            provider,
            "--max-fail-ppm",
            "100000",
            "--min-requests",
            min,
            "--credit-ppm",
            "250000",
        ])?;
        ensure!(p["status"] == "applied", "{p}");
    }
    let p = query(&f.net.rpc(0), "/slo/policy/prov-bad")?;
    ensure!(p["scheduled"]["from_window"] == w, "{p}");
    ensure!(latest(f)?.1 < w, "the proposals took past window {w}");

    // Report at the start of window W, all of it inside W.
    wait(f, 3 * WINDOW_SECS, "window W", || Ok(latest(f)?.1 >= w))?;
    ensure!(latest(f)?.1 == w, "window {w} was missed");
    let mut records = calls("alice", "prov-bad", Outcome::Ok, 16, 7);
    records.extend(calls("bob", "prov-bad", Outcome::Ok, 9, 5));
    records.extend(calls("alice", "prov-bad", Outcome::Transient, 3, 0));
    records.extend(calls("alice", "prov-bad", Outcome::Cancel, 40, 0));
    records.extend(calls("bob", "prov-bad", Outcome::Client, 10, 0));
    records.extend(calls("alice", "prov-few", Outcome::Ok, 5, 2));
    f.latencies = spread();
    records.extend(timed(&f.latencies));
    send(f, records)?;
    ensure!(latest(f)?.1 == w, "the reports ran past window {w}");
    f.window = Some(w);
    let charged = (16 * 7 + 5 * 2, 9 * 5 + f.latencies.len() as u64);

    // Window W closes: the same verdicts on every validator.
    wait(f, 3 * WINDOW_SECS, "verdicts", || {
        Ok((0..4).all(|i| query(&f.net.rpc(i), &format!("/slo/verdict/prov-bad/{w}")).is_ok()))
    })?;
    let (alice_back, bob_back) = (credit(112, 250_000), credit(45, 250_000));
    wait(f, 30, "credits", || {
        Ok((0..4).all(|i| {
            query(&f.net.rpc(i), &format!("/slo/verdict/prov-bad/{w}"))
                .is_ok_and(|v| v["credited_users"] == 2)
        }))
    })?;
    for i in 0..4 {
        let v = query(&f.net.rpc(i), &format!("/slo/verdict/prov-bad/{w}"))?;
        ensure!(
            v["status"] == "breached" && v["reasons"] == json!(["fail_rate"]),
            "{v}"
        );
        ensure!(
            v["requests"] == 78 && v["judged"] == 28 && v["fail_count"] == 3,
            "{v}"
        );
        ensure!(v["fail_ppm"] == 107_142 && v["charged"] == 157, "{v}");
        ensure!(
            v["credited"] == alice_back + bob_back && v["reputation_ppm"] == 937_500,
            "{v}"
        );
        let few = query(&f.net.rpc(i), &format!("/slo/verdict/prov-few/{w}"))?;
        ensure!(
            few["status"] == "not_judged" && few["judged"] == 5 && few["credited"] == 0,
            "{few}"
        );
        ensure!(
            f.net.balance(i, "alice")? == f.start.0 - charged.0 + alice_back,
            "node{i} alice"
        );
        ensure!(
            f.net.balance(i, "bob")? == f.start.1 - charged.1 + bob_back,
            "node{i} bob"
        );
    }

    // The block that closed W carries the breach, with its figures.
    let rpc = f.net.rpc(0);
    let (top, _) = latest(f)?;
    let mut found = None;
    for h in (1..=top).rev().take(200) {
        // Results of old heights may be discarded: only recent ones count.
        let Ok(r) = rpc.call("block_results", json!({"height": h.to_string()})) else {
            continue;
        };
        let events = r["finalize_block_events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(e) = events.iter().find(|e| e["type"] == "slo_breach") {
            found = Some(e.clone());
            break;
        }
    }
    let e = found.context("no slo_breach event in the last 200 blocks")?;
    let attr = |k: &str| {
        e["attributes"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["key"] == k))
            .map(|x| x["value"].clone())
    };
    ensure!(
        attr("provider") == Some(json!("prov-bad")) && attr("window") == Some(json!(w.to_string())),
        "{e}"
    );
    ensure!(attr("fail_ppm") == Some(json!("107142")), "{e}");

    // The hub pays prov-bad exactly the rest and prov-few in full.
    let bad_paid = 112 - alice_back + 45 - bob_back;
    wait(f, 120, "hub payouts", || {
        Ok(hub_query(f, "/payout/prov-bad")?["paid"] == bad_paid
            && hub_query(f, "/payout/prov-few")?["paid"] == 10
            && hub_query(f, "/payout/prov-lat")?["paid"] == f.latencies.len() as u64)
    })?;
    Ok(())
}

fn latency_through_the_sdk_lands_in_its_buckets(f: &mut Net) -> Result<()> {
    let w = f.window.context("test 1 did not report")?;
    let mut sorted = f.latencies.clone();
    sorted.sort_unstable();
    let mut ttft: Vec<u64> = f.latencies.iter().map(|ms| ms / 4).collect();
    ttft.sort_unstable();
    for i in 0..4 {
        let l = query(&f.net.rpc(i), &format!("/latency/prov-lat/{w}"))?;
        ensure!(
            l["latency"]["measured"] == sorted.len() && l["ttft"]["measured"] == ttft.len(),
            "{l}"
        );
        for (values, what) in [(&sorted, "latency"), (&ttft, "ttft")] {
            for (p, key) in [(50, "p50"), (95, "p95"), (99, "p99")] {
                let truth = values[(p * values.len()).div_ceil(100) - 1];
                let e = &l[what][key];
                let lo = e["lo_ms"].as_u64().context("lo")?;
                ensure!(
                    lo <= truth && e["hi_ms"].as_u64().is_none_or(|hi| truth < hi),
                    "{what} {key}: {truth} ms outside {e}"
                );
                ensure!(
                    bounds(bucket_of(truth)).map(|b| b.0) == Some(lo),
                    "{what} {key}"
                );
            }
        }
        let route = &l["routes"][0];
        ensure!(
            route["model"] == "org/slo" && route["route"] == "/v1/chat",
            "{l}"
        );
        ensure!(
            route["latency"] == l["latency"],
            "one route: its percentiles are the provider's"
        );
    }
    Ok(())
}

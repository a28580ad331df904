//! `tally-bench slo-close [--policies N]`: what judging a closed window
//! costs with N service-level objectives in force (ADR 0021; default and
//! cap 10,000). Builds a RocksDB store at app version 4 with N policies,
//! and for each provider its window totals and latency histogram in one
//! window (every provider served, a third of them over their fail-rate
//! ceiling, a third over their p95 latency ceiling), committed through the
//! Merkle tree; then runs the start-of-block step of the block that closes
//! the window (`tally_settlement::slo::begin_block`: every verdict and
//! reputation) inside a change set, commits it, and checks the verdicts
//! against the counts it wrote.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Result};
use tally_settlement::slo::judge::{verdict, Status};
use tally_settlement::slo::latency::{bucket_of, Histogram};
use tally_settlement::slo::policy::{InForce, Policy};
use tally_settlement::{keys, Counters, PartyWindow};
use tally_store::{Kv, Pending, RocksBackend};

/// The window judged.
const WINDOW: u64 = 30_000_000;

fn provider(i: u64) -> String {
    format!("bench-prov-{i:05}")
}

/// Runs the benchmark with `n` policies and prints its figures.
pub fn run(n: u64) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let backend = Arc::new(RocksBackend::open(&dir.path().join("db"))?);
    let t = Instant::now();
    let mut p = Pending::open(backend.clone())?;
    p.put(keys::APP_VERSION.to_vec(), 4u64.to_be_bytes().to_vec());
    let policy = Policy {
        max_fail_ppm: 100_000,
        min_requests: 10,
        p95_latency_ms: 512,
        p95_ttft_ms: 0,
        credit_ppm: 250_000,
    };
    for i in 0..n {
        let name = provider(i);
        let f = InForce {
            policy,
            since_window: WINDOW - 1,
            proposal: 1,
        };
        p.put(keys::slo_policy(&name), serde_json::to_vec(&f)?);
        // 100 calls: i % 3 == 1 fails 20 of them, i % 3 == 2 is slow.
        let fails = if i % 3 == 1 { 20 } else { 0 };
        let totals = Counters {
            requests: 100,
            ok: 100 - fails,
            transient: fails,
            amount: 1_000,
            ..Counters::default()
        };
        let pw = PartyWindow { totals, routes: 3 };
        p.put(keys::provider_window(&name, WINDOW), pw.encode());
        let mut h = Histogram::default();
        let slow = if i % 3 == 2 { 20 } else { 1 };
        h.latency.add(bucket_of(100), 100 - slow);
        h.latency.add(bucket_of(800), slow);
        h.ttft.add(bucket_of(30), 100);
        p.put(keys::provider_latency(&name, WINDOW), h.encode());
    }
    p.commit(1)?;
    println!(
        "state: {n} policies, each provider's window totals and histogram ({:.1} s)",
        t.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    let mut p = Pending::open(backend.clone())?;
    let events = tally_settlement::slo::begin_block(&mut p, Some(WINDOW), WINDOW + 1)?;
    let judged = t0.elapsed();
    let t1 = Instant::now();
    p.commit(2)?;
    let committed = t1.elapsed();
    let breaches = events.iter().filter(|e| e.kind == "slo_breach").count() as u64;
    println!(
        "window close with {n} policies: judging {:.1} ms ({:.1} us per policy), commit {:.1} ms; {breaches} breaches",
        judged.as_secs_f64() * 1e3,
        judged.as_secs_f64() * 1e6 / n as f64,
        committed.as_secs_f64() * 1e3,
    );
    // The verdicts are the ones the counts above imply.
    let p = Pending::open(backend)?;
    ensure!(
        breaches == (2 * n) / 3 + u64::from(n % 3 == 2),
        "breaches {breaches}"
    );
    for i in [0, 1, 2, n - 1] {
        let v = verdict(&p, &provider(i), WINDOW)?;
        let want = if i % 3 == 0 {
            Status::Met
        } else {
            Status::Breached
        };
        ensure!(v.is_some_and(|v| v.status == want), "provider {i}");
    }
    Ok(())
}

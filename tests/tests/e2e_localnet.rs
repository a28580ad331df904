//! End to end with real CometBFT processes: four validators and the hub
//! chain on loopback, one localnet shared by the named tests below, which
//! run in this order (the runner is `tally_tests::harness`):
//!
//! 1. `records_reach_every_validator`: reports of every outcome class sent
//!    over RPC are reflected exactly in every validator's SLA queries;
//! 2. `duplicate_report_changes_nothing`: resubmitting those exact bytes is
//!    refused (mempool cache or `duplicate_report`, 7), totals unchanged;
//! 3. `batch_signed_and_settled_on_hub`: the closed windows' payments form
//!    batches that t validators sign through real vote extensions (checked
//!    against the group key), the relays submit them and the hub pays each
//!    credit once;
//! 4. `deposit_credited_on_every_validator`: a hub deposit is credited once;
//! 5. `validator_killed_under_load_catches_up`: a validator SIGKILLed under
//!    load; the chain keeps going, the validator catches up with the same
//!    app hashes and every validator agrees on the load's totals;
//! 6. `relay_metrics_served`: the relay's metrics beside validator 0;
//! 7. `hub_outage_settles_after_return`: the hub down for 3 minutes, an
//!    attempt about every 60 s, settlement after it returns;
//! 8. `reporter_exactly_once_with_a_killed_validator`: 100,000 records
//!    through the gateway SDK's reporter with a validator SIGKILLed and
//!    restarted and one endpoint unreachable land exactly once.
//!
//! Needs `cometbft` on PATH (localnet/install-cometbft.sh; without it every
//! test is reported SKIPPED) and built `tallyd` and `tally-hub` binaries
//! (`$TALLYD`, `$TALLY_HUB_BIN`, or beside the test binary);
//! `scripts/test.sh` provides all three.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use tally_node::records::build_report;
use tally_node::rpc::Rpc;
use tally_settlement::bls::{self, Kind, PublicShares};
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_settlement::RouteRecordView;
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, tallyd_path, Localnet};
use tally_tests::traffic::{totals, Traffic};

/// Ports from here, or the next free block (`free_port_base`); below
/// Linux's ephemeral range (32768+), so that no outgoing connection can be
/// holding a port a restarted node must bind.
const PORT_BASE: u16 = 29656;
const WINDOW_SECS: u64 = 10;

const TESTS: [Test<Net>; 8] = [
    Test {
        name: "records_reach_every_validator",
        needs: &[],
        run: records_reach_every_validator,
    },
    Test {
        name: "duplicate_report_changes_nothing",
        needs: &["records_reach_every_validator"],
        run: duplicate_report_changes_nothing,
    },
    Test {
        name: "batch_signed_and_settled_on_hub",
        needs: &["records_reach_every_validator"],
        run: batch_signed_and_settled_on_hub,
    },
    Test {
        name: "deposit_credited_on_every_validator",
        needs: &[],
        run: deposit_credited_on_every_validator,
    },
    Test {
        name: "validator_killed_under_load_catches_up",
        needs: &[],
        run: validator_killed_under_load_catches_up,
    },
    Test {
        name: "relay_metrics_served",
        needs: &[],
        run: relay_metrics_served,
    },
    Test {
        name: "hub_outage_settles_after_return",
        needs: &[],
        run: hub_outage_settles_after_return,
    },
    Test {
        name: "reporter_exactly_once_with_a_killed_validator",
        needs: &[],
        run: reporter_exactly_once_with_a_killed_validator,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture: the localnet and what the tests did to it.
struct Net {
    net: Localnet,
    key: SigningKey,
    chain_id: String,
    /// Credits of every report the chain accepted so far: what the hub must
    /// end up settling.
    credits: u64,
    /// `records_reach_every_validator`'s reports: the node each went to and
    /// its transaction bytes.
    reports: Vec<(usize, Vec<u8>)>,
    /// What `records_reach_every_validator`'s routes must total.
    expected: BTreeMap<(String, String), [u64; 9]>,
}

impl Net {
    fn start() -> Result<Self> {
        let base = free_port_base(PORT_BASE, 4)?;
        let net = Localnet::start(4, base, "500ms", WINDOW_SECS)?;
        let key = net.gateway_key()?;
        let chain_id = net.rpc(0).status()?.chain_id;
        Ok(Self {
            net,
            key,
            chain_id,
            credits: 0,
            reports: Vec::new(),
            expected: BTreeMap::new(),
        })
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn rec(user: &str, route: &str, outcome: Outcome, amount: u64) -> UsageRecord {
    UsageRecord {
        user: user.into(),
        provider: "e2e-prov".into(),
        model: "org/e2e-model".into(),
        route: route.into(),
        outcome: outcome as i32,
        units: 10,
        amount,
    }
}

/// Sum of a route's records over all windows, from one node.
fn route_totals(rpc: &Rpc, user: &str, route: &str) -> Result<[u64; 9]> {
    let path = format!(
        "/sla/route/{user}/e2e-prov/org%2Fe2e-model/{}?limit=1000",
        route.replace('/', "%2F")
    );
    let a = rpc.abci_query(&path)?;
    ensure!(a.code == 0, "{path}: code {} {}", a.code, a.log);
    let v: serde_json::Value = serde_json::from_slice(&a.value)?;
    let recs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
    let mut t = [0u64; 9];
    for r in recs {
        for (slot, x) in t.iter_mut().zip([
            r.requests,
            r.ok,
            r.fail_count,
            r.rate_limit,
            r.auth,
            r.transient,
            r.unknown,
            r.client,
            r.cancel,
        ]) {
            *slot += x;
        }
    }
    Ok(t)
}

/// Every validator's totals of `records_reach_every_validator`'s routes
/// equal what was reported, once every validator is past `height`.
fn check_expected(f: &Net, height: u64) -> Result<()> {
    for i in 0..4 {
        f.net.wait_height(i, height, Duration::from_secs(30))?;
        for ((user, route), want) in &f.expected {
            let got = route_totals(&f.net.rpc(i), user, route)?;
            ensure!(
                &got == want,
                "node{i} {user} {route}: got {got:?}, want {want:?}"
            );
        }
    }
    Ok(())
}

fn records_reach_every_validator(f: &mut Net) -> Result<()> {
    let plan = [
        (
            "alice",
            "/v1/chat",
            vec![
                Outcome::Ok,
                Outcome::Ok,
                Outcome::Cancel,
                Outcome::RateLimit,
                Outcome::Client,
            ],
        ),
        (
            "alice",
            "/v1/embed",
            vec![
                Outcome::Auth,
                Outcome::Transient,
                Outcome::Transient,
                Outcome::Unknown,
            ],
        ),
        (
            "bob",
            "/v1/chat",
            vec![
                Outcome::Cancel,
                Outcome::Cancel,
                Outcome::Client,
                Outcome::Ok,
            ],
        ),
    ];
    let mut last_height = 0;
    for (round, (user, route, outcomes)) in plan.iter().enumerate() {
        let recs: Vec<_> = outcomes.iter().map(|o| rec(user, route, *o, 3)).collect();
        let e = f
            .expected
            .entry((user.to_string(), route.to_string()))
            .or_default();
        for o in outcomes {
            e[0] += 1;
            let i = match o {
                Outcome::Ok => 1,
                Outcome::RateLimit => 3,
                Outcome::Auth => 4,
                Outcome::Transient => 5,
                Outcome::Unknown => 6,
                Outcome::Client => 7,
                _ => 8,
            };
            e[i] += 1;
            if (3..=6).contains(&i) {
                e[2] += 1;
            }
        }
        let built = build_report(&f.key, &f.chain_id, recs, now() + 300);
        let node = round % 4;
        let r = f.net.rpc(node).broadcast_tx_commit(&built.tx)?;
        ensure!(
            r.final_code() == 0,
            "report {} refused: {}",
            built.report_id,
            r.final_log()
        );
        f.credits += 3 * outcomes.len() as u64;
        f.reports.push((node, built.tx));
        last_height = last_height.max(r.height);
    }
    check_expected(f, last_height + 1)
}

fn duplicate_report_changes_nothing(f: &mut Net) -> Result<()> {
    ensure!(!f.reports.is_empty(), "no accepted reports to resubmit");
    // Resubmitting the same bytes (to another node) changes nothing:
    // CometBFT's mempool cache refuses it, or the app does with
    // duplicate_report (7).
    for (node, tx) in &f.reports {
        match f.net.rpc(3 - node).broadcast_tx_commit(tx) {
            Ok(again) => ensure!(
                again.final_code() == 7,
                "duplicate gave code {}",
                again.final_code()
            ),
            Err(e) => ensure!(
                e.to_string().contains("already exists in cache"),
                "resubmit: {e}"
            ),
        }
    }
    // Nothing was counted twice.
    let h = (0..4).map(|i| f.net.height(i)).max().unwrap_or(0) + 1;
    check_expected(f, h)
}

fn batch_signed_and_settled_on_hub(f: &mut Net) -> Result<()> {
    // The closed windows' payments (39 credits: 13 records x 3) become
    // batches that t validators sign through real vote extensions (visible
    // with `tallyd query batch`); the relays submit them to the hub chain,
    // which pays each once, and the chain ends each sync when t validators
    // sign the hub's answer.
    let want = f.credits;
    ensure!(want > 0, "no credits were reported: nothing to settle");
    let net = &f.net;
    let chain_id = &f.chain_id;
    let dkg: serde_json::Value = serde_json::from_slice(&net.rpc(0).abci_query("/dkg")?.value)?;
    let group = bls::parse_public_key(&hex::decode(dkg["group_key"].as_str().unwrap_or(""))?)?;
    let pubs = PublicShares {
        threshold: 3,
        group,
        shares: Vec::new(),
    };
    let start = Instant::now();
    let mut checked = std::collections::BTreeSet::new();
    loop {
        let s: serde_json::Value =
            serde_json::from_slice(&net.rpc(1).abci_query("/sync/hub")?.value)?;
        let formed = s["next_nonce"].as_u64().unwrap_or(1) - 1;
        let mut signed_total = 0;
        for nonce in 1..=formed {
            let out = std::process::Command::new(tallyd_path()?)
                .args([
                    "query",
                    "batch",
                    "--chain",
                    "hub",
                    "--nonce",
                    &nonce.to_string(),
                    "--output",
                    "json",
                    "--node",
                ])
                .arg(net.rpc_url(2))
                .output()?;
            ensure!(
                out.status.success(),
                "tallyd query batch: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let b: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            if b["status"] == "pending" {
                continue;
            }
            signed_total += b["total"].as_u64().unwrap_or(0);
            if checked.insert(nonce) {
                let digest: [u8; 32] = hex::decode(b["digest"].as_str().unwrap_or(""))?
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("digest is not 32 bytes"))?;
                let sig =
                    bls::parse_signature(&hex::decode(b["signature"].as_str().unwrap_or(""))?)?;
                ensure!(
                    pubs.verify_group(&bls::message(chain_id, Kind::Batch, &digest), &sig),
                    "batch {nonce} signature does not verify against the group key: {b}"
                );
            }
        }
        let settled = s["settled_batches"].as_u64().unwrap_or(0);
        if signed_total == want && settled == formed {
            // Every credit was paid once on the hub (escrow shortfall counted).
            let mut hub_total = 0;
            for nonce in 1..=formed {
                let h = Rpc::new(&net.hub_rpc_url()).abci_query(&format!("/batch/hub/{nonce}"))?;
                ensure!(
                    h.code == 0,
                    "hub has no result for batch {nonce}: {}",
                    h.log
                );
                let h: serde_json::Value = serde_json::from_slice(&h.value)?;
                hub_total += h["paid"].as_u64().unwrap_or(0) + h["shortfall"].as_u64().unwrap_or(0);
            }
            ensure!(
                hub_total == want,
                "hub settled {hub_total} credits, want {want}"
            );
            return Ok(());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(WINDOW_SECS * 3 + 60),
            "batches not signed and settled after {:?} (signed {signed_total} of {want} credits): {s}\n{}",
            start.elapsed(),
            net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn deposit_credited_on_every_validator(f: &mut Net) -> Result<()> {
    // A deposit on the hub is credited once on the chain, after its range is
    // `confirmations` hub blocks deep and t validators signed it.
    let net = &f.net;
    net.hub_deposit("dave", 77)?;
    let start = Instant::now();
    let balance = |i: usize| net.balance(i, "dave");
    while balance(0)? != 77 {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "deposit not credited: {}",
            balance(0)?
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..4 {
        ensure!(balance(i)? == 77, "node{i}: dave has {}", balance(i)?);
    }
    Ok(())
}

/// Reports from a background thread until stopped (at the latest after
/// 60 s); dropping it stops and joins the thread.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    fn start(f: &Net) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (stop2, sent2, key, chain_id) = (
            stop.clone(),
            sent.clone(),
            f.key.clone(),
            f.chain_id.clone(),
        );
        let urls = [f.net.rpc_url(0), f.net.rpc_url(1)];
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) && Instant::now() < deadline {
                let recs: Vec<_> = (0..100)
                    .map(|i| {
                        rec(
                            "carol",
                            &format!("/load/{}", i % 10),
                            Outcome::ALL[(i % 7) as usize],
                            0,
                        )
                    })
                    .collect();
                let built = build_report(&key, &chain_id, recs, now() + 300);
                if Rpc::new(&urls[(n % 2) as usize])
                    .broadcast_tx_sync(&built.tx)
                    .is_ok()
                {
                    sent2.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    /// Stops the thread; returns how many reports it sent.
    fn finish(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| anyhow::anyhow!("load thread panicked"))?;
        }
        Ok(self.sent.load(Ordering::Relaxed))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn validator_killed_under_load_catches_up(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let load = Load::start(f);
    std::thread::sleep(Duration::from_secs(3));
    let down = net.take_down("kill", Some(3))?;
    let h0 = net.height(0);
    // The chain keeps committing with one validator down.
    net.wait_height(0, h0 + 5, Duration::from_secs(30))
        .context("chain stalled with one validator down")?;
    std::thread::sleep(Duration::from_secs(2));
    down.now()?;
    std::thread::sleep(Duration::from_secs(3));
    let sent = load.finish()?;
    ensure!(sent > 20, "load sent too little ({sent} reports)");

    // The restarted validator catches up with the same app hashes.
    let target = net.height(0) + 3;
    net.wait_height(3, target, Duration::from_secs(60))?;
    let mut seen: Vec<BTreeMap<u64, String>> = vec![BTreeMap::new(); 4];
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        for (i, m) in seen.iter_mut().enumerate() {
            if let Ok(s) = net.rpc(i).status() {
                m.insert(s.height, s.app_hash);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut compared = 0;
    for (h, hash) in &seen[3] {
        for (i, m) in seen.iter().enumerate().take(3) {
            if let Some(other) = m.get(h) {
                ensure!(
                    other == hash,
                    "app hash at height {h}: node3 {hash} vs node{i} {other}"
                );
                compared += 1;
            }
        }
    }
    ensure!(
        compared >= 3,
        "too few common heights to compare ({compared})"
    );

    // Every validator answers the load's route totals identically.
    let h = net.height(0);
    for i in 0..4 {
        net.wait_height(i, h, Duration::from_secs(30))?;
    }
    let reference = route_totals(&net.rpc(0), "carol", "/load/0")?;
    ensure!(reference[0] > 0, "load reached no block");
    for i in 1..4 {
        // Heights may differ by a block; retry briefly until they agree.
        let mut ok = false;
        for _ in 0..20 {
            if route_totals(&net.rpc(i), "carol", "/load/0")?
                == route_totals(&net.rpc(0), "carol", "/load/0")?
            {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        ensure!(ok, "node{i} disagrees on the load totals");
    }
    Ok(())
}

fn sync_state(net: &Localnet) -> Result<serde_json::Value> {
    Ok(serde_json::from_slice(
        &net.rpc(0).abci_query("/sync/hub")?.value,
    )?)
}

fn relay_metrics_served(f: &mut Net) -> Result<()> {
    // The relay's metrics are served beside each node (validator 0's here).
    let port = f.net.port_base() + 5;
    let metrics = ureq::get(&format!("http://127.0.0.1:{port}/metrics"))
        .call()?
        .into_string()?;
    ensure!(
        metrics.contains("tally_relay_submissions_total")
            && metrics.contains("tally_hub_circuit_state"),
        "{metrics}"
    );
    Ok(())
}

fn hub_outage_settles_after_return(f: &mut Net) -> Result<()> {
    // The hub down for 3 minutes: each attempt fails and the next comes
    // about 60 s later; the batch settles after the hub returns, paid once.
    let net = &f.net;
    let before = sync_state(net)?;
    let settled_before = before["settled_batches"].as_u64().unwrap_or(0);
    let failures_before = before["failures"].as_u64().unwrap_or(0);

    let down = net.take_down("stop", None).context("stopping the hub")?;
    let down_at = Instant::now();
    let built = build_report(
        &f.key,
        &f.chain_id,
        vec![rec("alice", "/v1/outage", Outcome::Ok, 5)],
        now() + 300,
    );
    let r = net.rpc(0).broadcast_tx_commit(&built.tx)?;
    ensure!(r.final_code() == 0, "{}", r.final_log());
    f.credits += 5;
    let mut attempts_seen = Vec::new();
    while down_at.elapsed() < Duration::from_secs(180) {
        let s = sync_state(net)?;
        let a = s["attempts"].as_u64().unwrap_or(0);
        if attempts_seen.last().map(|(n, _)| *n) != Some(a) {
            attempts_seen.push((a, down_at.elapsed()));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let s = sync_state(net)?;
    let failures = s["failures"].as_u64().unwrap_or(0) - failures_before;
    ensure!(
        failures >= 2,
        "expected failed attempts while the hub was down: {s}"
    );
    // Attempts came about every 60 s, not every 360 s.
    let gaps: Vec<u64> = attempts_seen
        .windows(2)
        .map(|w| (w[1].1 - w[0].1).as_secs())
        .collect();
    ensure!(
        gaps.iter().skip(1).all(|g| (50..=100).contains(g)),
        "attempt spacing {gaps:?} ({attempts_seen:?})"
    );
    down.now().context("starting the hub")?;
    let back = Instant::now();
    loop {
        let s = sync_state(net)?;
        if s["settled_batches"].as_u64().unwrap_or(0) > settled_before {
            eprintln!(
                "hub outage: settled {:.1} s after the hub came back; attempts {attempts_seen:?}",
                back.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        ensure!(
            back.elapsed() < Duration::from_secs(75),
            "not settled 75 s after the hub came back: {s}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn reporter_exactly_once_with_a_killed_validator(f: &mut Net) -> Result<()> {
    // 100,000 records of mixed classes through the gateway SDK's reporter
    // while validator 2 is SIGKILLed and restarted and one RPC endpoint is
    // unreachable: afterwards the chain's totals equal what was recorded.
    use tally_client::{HttpTransport, ReportOutcome, Reporter, ReporterConfig};
    const N: usize = 100_000;
    let (net, key, chain_id) = (&f.net, &f.key, f.chain_id.as_str());
    let mut traffic = Traffic::new(99, key.clone(), chain_id, [5, 3, 2, 4]);
    let records: Vec<UsageRecord> = (0..N / 1000)
        .flat_map(|_| traffic.records(1000, 0))
        .collect();
    let want = totals(&records);
    let endpoints = vec![
        "http://127.0.0.1:1".to_string(),
        net.rpc_url(2),
        net.rpc_url(0),
        net.rpc_url(1),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let outcomes = runtime.block_on(async {
        let mut cfg = ReporterConfig::new(endpoints, chain_id);
        cfg.ttl = Duration::from_secs(300);
        let reporter = Reporter::start(
            cfg,
            key.clone(),
            HttpTransport::new(Duration::from_secs(10)),
        )?;
        let mut down = None;
        let mut restarted = false;
        for (i, r) in records.into_iter().enumerate() {
            reporter.record(r).await?;
            if down.is_none() && !restarted && i >= N / 4 {
                down = Some(net.take_down("kill", Some(2))?);
            }
            if !restarted && i >= N / 2 {
                if let Some(d) = down.take() {
                    d.now()?;
                }
                restarted = true;
            }
        }
        Ok::<_, anyhow::Error>(reporter.shutdown().await)
    })?;
    let landed: usize = outcomes
        .iter()
        .map(|o| match o {
            ReportOutcome::Landed { records, .. } => *records,
            _ => 0,
        })
        .sum();
    ensure!(
        landed == N,
        "landed {landed} of {N}: {:?}",
        outcomes
            .iter()
            .find(|o| !matches!(o, ReportOutcome::Landed { .. }))
    );
    eprintln!(
        "reporter: {N} records landed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Every landed report is in a block at or below the highest node's height.
    let h = (0..4).map(|i| net.height(i)).max().unwrap_or(0) + 1;
    for i in 0..4 {
        net.wait_height(i, h, Duration::from_secs(60))?;
    }
    for node in [0usize, 2] {
        let rpc = net.rpc(node);
        for (id, c) in &want {
            let path = tally_tests::traffic::route_path(id);
            let a = rpc.abci_query(&path)?;
            ensure!(a.code == 0, "node{node} {path}: {}", a.log);
            let v: serde_json::Value = serde_json::from_slice(&a.value)?;
            let recs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
            let sum = |f: fn(&RouteRecordView) -> u64| recs.iter().map(f).sum::<u64>();
            let got = [
                sum(|r| r.requests),
                sum(|r| r.ok),
                sum(|r| r.fail_count),
                sum(|r| r.cancel),
                sum(|r| r.client),
                sum(|r| r.units),
            ];
            let exp = [
                c.requests,
                c.ok,
                c.fail_count(),
                c.cancel,
                c.client,
                c.units,
            ];
            ensure!(got == exp, "node{node} {path}: got {got:?}, want {exp:?}");
        }
    }
    Ok(())
}

//! `tally-bench chaos --minutes N` (run by `scripts/chaos.sh`): a localnet
//! with the hub, several gateways reporting through the SDK for several
//! users under allowances, and a repeating schedule of faults; then, once
//! everything settled, an audit of the money, printed line by line and
//! checked (a non-zero exit when an invariant fails).
//!
//! The schedule, one 6-minute cycle after another (the last may be cut):
//! - 0:00 a 429 storm at validator 0's relay (through the fault proxy in
//!   front of its hub endpoint), and 60 s of stale hub tips from the proxy;
//! - 1:00 a validator (1, 2, 3 in turn) SIGKILLed, restarted 20 s later;
//! - 2:00 the hub chain stopped for 150 s, then started again;
//! - 5:00 validator 0 (whose relay goes through the proxy) SIGKILLed,
//!   restarted 10 s later, and a 503 storm.
//!
//! Audit (every amount in credits):
//! - deposits made on the hub vs credited on Tally (count and sum);
//! - Σ user debits on Tally (route records' amounts), Σ balances:
//!   balances + debits = deposits;
//! - Σ paid by the hub (provider payouts), Σ pending on Tally (hub calls
//!   not settled, owed not yet converted): debits = paid + pending, and
//!   pending is 0 once settled;
//! - hub escrow = deposits - paid;
//! - nonces paid twice: each nonce settled once on the hub with exactly the
//!   chain's calls, no call id in two batches (must be 0);
//! - records the SDK says landed vs records counted on every validator.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tally_client::{HttpTransport, ReportOutcome, Reporter, ReporterConfig};
use tally_node::keyfile;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};

use crate::localnet::{free_port_base, Localnet};
use crate::proxy::{Fault, FaultProxy, ProxyState};

const USERS: [&str; 6] = ["cu-0", "cu-1", "cu-2", "cu-3", "cu-4", "cu-5"];
const PROVIDERS: [&str; 3] = ["cp-a", "cp-b", "cp-c"];
const GATEWAYS: [&str; 2] = ["chaos-gw-b", "chaos-gw-c"];
const DEPOSIT: u64 = 50_000_000;
/// Records per second each gateway offers.
const RATE: u64 = 40;

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let r = rpc.abci_query(path)?;
    ensure!(r.code == 0, "{path}: code {} {}", r.code, r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

fn log(start: Instant, what: &str) {
    eprintln!("[chaos {:>6.0}s] {what}", start.elapsed().as_secs_f64());
}

/// Runs the chaos for `minutes`, then settles and audits.
pub fn run(minutes: u64) -> Result<()> {
    let start = Instant::now();
    // Below the ephemeral range (32768+): no outgoing connection can hold a
    // port a restarted node must bind.
    let base = free_port_base(28656, 4)?;
    let hub_upstream = format!("127.0.0.1:{}", base + 101);
    let proxy = FaultProxy::start(&hub_upstream, ProxyState::default())?;
    let endpoints = format!("{},http://127.0.0.1:1", proxy.url());
    let users = USERS.join(" ");
    let gateways = GATEWAYS.join(" ");
    let net = Localnet::start_with(
        4,
        base,
        "1s",
        60,
        &[
            ("TALLY_HUB_ENDPOINTS_0", &endpoints),
            ("TALLY_USERS", &users),
            ("TALLY_GATEWAYS", &gateways),
            ("TALLY_HUB_CONFIRMATIONS", "2"),
        ],
    )?;
    log(start, &format!("localnet up in {}", net.dir().display()));
    let rpc0 = net.rpc(0);
    let chain_id = rpc0.status()?.chain_id;

    // Deposits (escrow on the hub, credited on Tally after confirmations).
    // The localnet's own deposits (its demo users) came before: the audit
    // counts from here.
    let credited_before = query(&rpc0, "/sync/hub")?["next_deposit_seq"]
        .as_u64()
        .unwrap_or(1);
    let mut made = 0u64;
    for u in USERS {
        net.hub_deposit(u, DEPOSIT)?;
        made += DEPOSIT;
    }
    let wait = Instant::now();
    for u in USERS {
        while net.balance(0, u)? != DEPOSIT {
            ensure!(
                wait.elapsed() < Duration::from_secs(180),
                "deposit for {u} not credited"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    log(start, "deposits credited; traffic starts");

    // Gateways: the demo gateway and the extra ones, each its own reporter.
    let mut keys = vec![net.gateway_key()?];
    for g in GATEWAYS {
        let (_, k) = keyfile::load(&net.dir().join("gateways").join(format!("{g}.key")))?;
        keys.push(k);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // The reporters start their tasks on this runtime.
    let _in_runtime = runtime.enter();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut senders = Vec::new();
    for (gi, key) in keys.into_iter().enumerate() {
        let rpcs: Vec<String> = (0..4).map(|i| net.rpc_url((gi + i) % 4)).collect();
        let mut cfg = ReporterConfig::new(rpcs, &chain_id);
        cfg.ttl = Duration::from_secs(300);
        let reporter = Reporter::start(cfg, key, HttpTransport::new(Duration::from_secs(10)))?;
        let stop = stop.clone();
        senders.push(runtime.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(gi as u64);
            let mut sent = 0u64;
            let tick = Duration::from_millis(1000 / RATE.max(1));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let o = Outcome::ALL[rng.gen_range(0..Outcome::ALL.len())];
                let r = UsageRecord {
                    user: USERS[rng.gen_range(0..USERS.len())].into(),
                    provider: PROVIDERS[rng.gen_range(0..PROVIDERS.len())].into(),
                    model: "chaos/model".into(),
                    route: format!("/chaos/{}", rng.gen_range(0..4)),
                    outcome: o as i32,
                    units: rng.gen_range(1..100),
                    amount: if o.may_carry_amount() {
                        rng.gen_range(1..20)
                    } else {
                        0
                    },
                };
                if reporter.record(r).await.is_err() {
                    break;
                }
                sent += 1;
                tokio::time::sleep(tick).await;
            }
            (sent, reporter.shutdown().await)
        }));
    }

    // The fault schedule.
    let end = Instant::now() + Duration::from_secs(minutes * 60);
    let mut cycle = 0u64;
    let sleep_until = |at: Instant| {
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
    };
    while Instant::now() < end {
        let c0 = Instant::now();
        let at = |s: u64| c0 + Duration::from_secs(s);
        log(
            start,
            &format!("cycle {cycle}: 429 storm and stale hub tips at relay 0"),
        );
        {
            let mut st = proxy.state();
            st.script.extend((0..8).map(|_| Fault::too_many(2)));
            st.stale_status = true;
        }
        sleep_until(at(60).min(end));
        proxy.state().stale_status = false;
        if Instant::now() >= end {
            break;
        }
        let victim = 1 + (cycle as usize % 3);
        log(
            start,
            &format!("cycle {cycle}: SIGKILL validator {victim} for 20 s"),
        );
        let down = net.take_down("kill", Some(victim))?;
        std::thread::sleep(Duration::from_secs(20));
        down.now()?;
        sleep_until(at(120).min(end));
        if Instant::now() >= end {
            break;
        }
        log(start, &format!("cycle {cycle}: hub stopped for 150 s"));
        let down = net.take_down("stop", None)?;
        sleep_until(at(270).min(end + Duration::from_secs(150)));
        down.now()?;
        log(start, &format!("cycle {cycle}: hub back"));
        sleep_until(at(300).min(end));
        if Instant::now() >= end {
            break;
        }
        log(
            start,
            &format!("cycle {cycle}: SIGKILL validator 0 for 10 s, 503 storm"),
        );
        let down = net.take_down("kill", Some(0))?;
        std::thread::sleep(Duration::from_secs(10));
        down.now()?;
        proxy
            .state()
            .script
            .extend((0..5).map(|_| Fault::unavailable(5)));
        sleep_until(at(360).min(end));
        cycle += 1;
    }
    proxy.state().stale_status = false;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    log(start, "traffic stops; waiting for every report's outcome");
    let mut sent = 0u64;
    let mut landed = 0u64;
    let mut other: BTreeMap<String, u64> = BTreeMap::new();
    for s in senders {
        let (n, outcomes) = runtime.block_on(s)?;
        sent += n;
        for o in outcomes {
            match o {
                ReportOutcome::Landed { records, .. } => landed += records as u64,
                o => {
                    let kind = format!("{o:?}")
                        .split([' ', '{'])
                        .next()
                        .unwrap_or("?")
                        .to_string();
                    *other.entry(kind).or_default() += o.records() as u64;
                }
            }
        }
    }
    let stale_answers = proxy.state().stale_answers;
    log(
        start,
        "waiting for the last windows to close and every batch to settle",
    );
    let settle_budget = Instant::now() + Duration::from_secs(15 * 60);
    loop {
        let s = query(&rpc0, "/sync/hub")?;
        let windows = query(&rpc0, "/windows?limit=1000")?;
        let open = windows["windows"]
            .as_array()
            .map(|w| {
                w.iter()
                    .any(|w| w["closed"] != true || w["converting"] == true)
            })
            .unwrap_or(true);
        if !open && s["pending_calls"] == 0 && s["running"] == false && s["nonce"].is_null() {
            break;
        }
        ensure!(
            Instant::now() < settle_budget,
            "not settled 15 min after the traffic stopped: {s}"
        );
        std::thread::sleep(Duration::from_secs(5));
    }
    let counts = (made, credited_before);
    audit(&net, counts, sent, landed, &other, stale_answers, start)
}

fn audit(
    net: &Localnet,
    (made, credited_before): (u64, u64),
    sent: u64,
    landed: u64,
    other: &BTreeMap<String, u64>,
    stale_answers: u64,
    start: Instant,
) -> Result<()> {
    let hub = Rpc::new(&net.hub_rpc_url());
    let mut failures = Vec::new();
    let mut check = |ok: bool, what: String| {
        println!("audit: {what} {}", if ok { "ok" } else { "MISMATCH" });
        if !ok {
            failures.push(what);
        }
    };
    let sync = query(&net.rpc(0), "/sync/hub")?;
    let credited_count = sync["next_deposit_seq"]
        .as_u64()
        .unwrap_or(1)
        .saturating_sub(credited_before);
    let mut balances = 0u64;
    let mut debits = 0u64;
    let mut counted = [0u64; 4];
    for u in USERS {
        balances += net.balance(0, u)?;
        for (i, c) in counted.iter_mut().enumerate() {
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    Some(c) => format!("/sla/user/{u}?limit=1000&cursor={c}"),
                    None => format!("/sla/user/{u}?limit=1000"),
                };
                let v = query(&net.rpc(i), &path)?;
                for r in v["records"].as_array().context("records")? {
                    *c += r["requests"].as_u64().unwrap_or(0);
                    if i == 0 {
                        debits += r["amount"].as_u64().unwrap_or(0);
                    }
                }
                match v["next_cursor"].as_str() {
                    Some(n) => cursor = Some(n.to_string()),
                    None => break,
                }
            }
        }
    }
    let mut paid = 0u64;
    for p in PROVIDERS {
        paid += query(&hub, &format!("/payout/{p}"))?["paid"]
            .as_u64()
            .unwrap_or(0);
    }
    let mut escrow = 0u64;
    for u in USERS {
        escrow += query(&hub, &format!("/escrow/{u}"))?["escrow"]
            .as_u64()
            .unwrap_or(0);
    }
    let pending: u64 = query(&net.rpc(0), "/hubcalls/hub?limit=1000")?["calls"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["amount"].as_u64()).sum())
        .unwrap_or(0);
    // Nonces: each settled once on the hub, with the chain's calls.
    let formed = sync["next_nonce"].as_u64().unwrap_or(1) - 1;
    let last = query(&hub, "/last_nonce/hub")?["last_nonce"]
        .as_u64()
        .unwrap_or(0);
    let mut twice = 0u64;
    let mut ids = BTreeSet::new();
    for n in 1..=formed {
        let b = query(&net.rpc(0), &format!("/batch/hub/{n}"))?;
        let calls = b["calls"].as_array().context("calls")?;
        let mut dup = false;
        for c in calls {
            dup |= !ids.insert(c["id"].as_u64().unwrap_or(0));
        }
        let h = query(&hub, &format!("/batch/hub/{n}"))?;
        if dup || h["calls"].as_u64() != Some(calls.len() as u64) || b["status"] != "settled" {
            twice += 1;
            eprintln!("batch {n}: chain {b}\nhub {h}");
        }
    }
    println!(
        "audit: ran {:.0} min; proxy served {stale_answers} stale tips; batches {formed}, hub last nonce {last}",
        start.elapsed().as_secs_f64() / 60.0
    );
    println!("audit: records offered {sent}, landed (SDK) {landed}, not landed {other:?}");
    check(
        credited_count == USERS.len() as u64,
        format!(
            "deposits made {} ({made}), credited {credited_count}",
            USERS.len()
        ),
    );
    check(
        balances + debits == made,
        format!("Σ balances {balances} + Σ user debits {debits} = Σ deposits {made}"),
    );
    check(
        debits == paid + pending,
        format!("Σ user debits {debits} = Σ paid by the hub {paid} + Σ pending {pending}"),
    );
    check(
        pending == 0,
        format!("Σ pending after settling {pending} = 0"),
    );
    check(
        escrow + paid == made,
        format!("hub escrow {escrow} + paid {paid} = deposits {made}"),
    );
    check(
        last == formed,
        format!("hub last nonce {last} = batches formed {formed}"),
    );
    check(
        twice == 0,
        format!("nonces paid twice or not as formed: {twice}"),
    );
    for (i, c) in counted.iter().enumerate() {
        check(
            *c == landed,
            format!("records counted on validator {i} {c} = landed {landed}"),
        );
    }
    ensure!(failures.is_empty(), "audit failed: {failures:?}");
    println!("audit: every invariant holds");
    Ok(())
}

//! End to end under network partitions and skewed clocks (real CometBFT,
//! the hub chain). Every P2P link goes through `tally_tests::partition`'s
//! mesh (validator `i` dials `j` through a proxy that can cut the pair) and
//! every relay reaches the hub through one cuttable `Link`. One localnet is
//! shared by the named tests below, in this order; each ends in an exact
//! audit against the test's own books (every user's request count, debits
//! and balance on every validator; every provider's hub payout; every
//! settled batch paid on the hub exactly what the chain batched):
//!
//! 1. `halt_on_even_split`: validators {0, 1} cut from {2, 3}: no node
//!    makes a height while split (neither side has > 2/3 of the power);
//!    reports handed to a node of each side meanwhile land once after the
//!    heal (a copy sent again after the heal changes nothing);
//! 2. `minority_catches_up`: validator 3 isolated: the other three keep
//!    committing (reports land), validator 3 makes no height; after the heal
//!    it catches up with the same app hash at every height;
//! 3. `relay_cut_from_hub`: every relay cut from the hub while the chain
//!    runs: the window's batch is signed, nothing reaches the hub (checked
//!    at every poll), its attempts fail and the chain's cooldown starts new
//!    ones; after the heal it is paid exactly once;
//! 4. `skewed_relay`: validator 3's tallyd (app and relay) with its wall
//!    clock 5 minutes ahead, then 5 minutes behind (libfaketime): the app
//!    reads block time only, so its app hash stays equal to the others'; its
//!    relay's wrong view of the attempt deadline is one validator's and
//!    changes nothing (the design: a relay that is wrong on its own changes
//!    nothing): each batch settles in its first attempt, paid once;
//! 5. `skewed_gateway`: a gateway process (the SDK's reporter) with its clock
//!    6 minutes ahead or behind: a report's `expires_at` is the gateway's
//!    clock plus its TTL and the chain takes it only within
//!    `(block time, block time + 600 s]`, so the TTL decides: ahead with TTL
//!    200 s and behind with 540 s, every record lands once; ahead with the
//!    default 300 s, every report is refused with `expiry_too_far` (6) and
//!    nothing is counted; behind with 300 s (no resealing), every report
//!    ends expired (`Expired`, or refused with `report_expired`, 5) and
//!    nothing is counted.
//!
//! Needs `cometbft` on PATH (without it every test is SKIPPED) and, for the
//! skew tests, Debian's `faketime` (`localnet/install-deps.sh`).
//!
//! Seen failing, each with its protection removed in a throwaway edit of
//! this file (then reverted): with the 2/2 cut doing nothing,
//! `halt_on_even_split` failed with `heights moved while split 2/2: [42,
//! 42, 42, 42] -> [65, 65, 65, 65]`; with validator 3 never isolated,
//! `minority_catches_up` failed with `isolated validator 3 moved 68 -> 83`;
//! with the hub link never cut, `relay_cut_from_hub` failed within 5 s with
//! `batch 1 reached the hub through the cut link (attempt 1)` (that check,
//! made at every poll while cut, was added then: before it the test only
//! found out after waiting 240 s for a second attempt); with validators 1
//! and 2 skewed as well (three relays, a signing threshold, at +5 min),
//! `skewed_relay` failed with `batch 2 not settled with validator 3 at +5m`
//! (`failures: 2`: every attempt reported failed at once); with the gateway
//! child started without libfaketime, `skewed_gateway` failed with `the
//! child's clock is off by -1 s, not +6m`. The first sabotaged run also
//! showed `skewed_relay` timing a batch formed before the skew (a failed
//! test before it left one in flight): each round now waits for every
//! earlier batch to settle first.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tally_client::{HttpTransport, ReportOutcome, Reporter, ReporterConfig};
use tally_node::records::build_report;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, Localnet, Options};
use tally_tests::partition::Link;
use tally_tests::skew;

const PORT_BASE: u16 = 12656;
const WINDOW_SECS: u64 = 10;
const USERS: [&str; 4] = ["user-0", "user-1", "user-2", "user-3"];
const DEPOSIT: u64 = 1_000_000;
/// The gateway child process's variable (see [`gateway_child`]).
const CHILD: &str = "TALLY_PARTITION_GATEWAY";

const TESTS: [Test<Net>; 5] = [
    Test {
        name: "halt_on_even_split",
        needs: &[],
        run: halt_on_even_split,
    },
    Test {
        name: "minority_catches_up",
        needs: &[],
        run: minority_catches_up,
    },
    Test {
        name: "relay_cut_from_hub",
        needs: &[],
        run: relay_cut_from_hub,
    },
    Test {
        name: "skewed_relay",
        needs: &[],
        run: skewed_relay,
    },
    Test {
        name: "skewed_gateway",
        needs: &[],
        run: skewed_gateway,
    },
];

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return match gateway_child() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gateway child: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    harness::run(&TESTS, Net::start)
}

/// What the tests sent, the oracle of every audit.
#[derive(Debug, Default)]
struct Books {
    /// Records per user.
    requests: BTreeMap<String, u64>,
    /// Credits debited per user.
    debits: BTreeMap<String, u64>,
    /// Credits owed per provider.
    owed: BTreeMap<String, u64>,
}

impl Books {
    fn add(&mut self, r: &UsageRecord) {
        *self.requests.entry(r.user.clone()).or_default() += 1;
        *self.debits.entry(r.user.clone()).or_default() += r.amount;
        *self.owed.entry(r.provider.clone()).or_default() += r.amount;
    }
}

/// The fixture. The network is declared first: it stops before the link.
struct Net {
    net: Localnet,
    hub_link: Link,
    hub: Rpc,
    key: SigningKey,
    chain_id: String,
    books: Books,
}

impl Net {
    fn start() -> Result<Self> {
        let base = free_port_base(PORT_BASE, 4)?;
        let hub_link = Link::start(&format!("127.0.0.1:{}", base + 101))?;
        let opts = Options {
            up_env: vec![
                ("TALLY_HUB_ENDPOINTS".into(), hub_link.url()),
                ("TALLY_HUB_CONFIRMATIONS".into(), "2".into()),
            ],
            p2p_mesh: true,
            ..Options::default()
        };
        let net = Localnet::launch(4, base, "500ms", WINDOW_SECS, &opts)?;
        for u in USERS {
            net.hub_deposit(u, DEPOSIT)?;
        }
        let start = Instant::now();
        for u in USERS {
            while net.balance(0, u)? != DEPOSIT {
                ensure!(
                    start.elapsed() < Duration::from_secs(120),
                    "deposit for {u} not credited\n{}",
                    net.logs_tail()
                );
                std::thread::sleep(Duration::from_millis(300));
            }
        }
        Ok(Self {
            key: net.gateway_key()?,
            chain_id: net.rpc(0).status()?.chain_id,
            hub: Rpc::new(&net.hub_rpc_url()),
            net,
            hub_link,
            books: Books::default(),
        })
    }

    fn records(&self, provider: &str, n: usize, amount: u64) -> Vec<UsageRecord> {
        (0..n)
            .map(|k| UsageRecord {
                user: USERS[k % USERS.len()].into(),
                provider: provider.into(),
                model: "part/model".into(),
                route: "/v1/part".into(),
                outcome: Outcome::Ok as i32,
                units: 1 + k as u64,
                amount: amount + k as u64,
                ..Default::default()
            })
            .collect()
    }

    /// A signed report of `records`, expiring in 500 s.
    fn tx(&self, records: Vec<UsageRecord>) -> Result<Vec<u8>> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        Ok(build_report(&self.key, &self.chain_id, records, now + 500).tx)
    }

    /// Sends a report through validator `i` and waits for its block.
    fn send(&mut self, i: usize, records: Vec<UsageRecord>) -> Result<()> {
        let r = self
            .net
            .rpc(i)
            .broadcast_tx_commit(&self.tx(records.clone())?)?;
        ensure!(r.final_code() == 0, "report refused: {}", r.final_log());
        records.iter().for_each(|r| self.books.add(r));
        Ok(())
    }
}

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let r = rpc.abci_query(path)?;
    ensure!(r.code == 0, "{path}: code {} {}", r.code, r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

fn sync(net: &Localnet, i: usize) -> Value {
    query(&net.rpc(i), "/sync/hub").unwrap_or_default()
}

/// The app hash in validator `i`'s header of height `h`.
fn app_hash(net: &Localnet, i: usize, h: u64) -> Result<String> {
    let b = net
        .rpc(i)
        .call("block", json!({ "height": h.to_string() }))?;
    b["block"]["header"]["app_hash"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("node{i}: no header at {h}"))
}

/// Every validator has the same app hash at every height in `from..=to`.
fn same_hashes(net: &Localnet, from: u64, to: u64) -> Result<()> {
    for h in from..=to {
        let h0 = app_hash(net, 0, h)?;
        for i in 1..net.validators {
            let hi = app_hash(net, i, h)?;
            ensure!(hi == h0, "height {h}: node0 {h0}, node{i} {hi}");
        }
    }
    Ok(())
}

fn heights(net: &Localnet) -> Vec<u64> {
    (0..net.validators).map(|i| net.height(i)).collect()
}

/// Compares every node's records and balances with the books; `Ok(None)`
/// when they agree, else the first difference.
fn records_differ(f: &Net) -> Result<Option<String>> {
    for i in 0..f.net.validators {
        for u in USERS {
            let (mut requests, mut debits) = (0u64, 0u64);
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    Some(c) => format!("/sla/user/{u}?limit=1000&cursor={c}"),
                    None => format!("/sla/user/{u}?limit=1000"),
                };
                let v = query(&f.net.rpc(i), &path)?;
                for r in v["records"].as_array().context("records")? {
                    requests += r["requests"].as_u64().unwrap_or(0);
                    debits += r["amount"].as_u64().unwrap_or(0);
                }
                match v["next_cursor"].as_str() {
                    Some(n) if !n.is_empty() => cursor = Some(n.to_string()),
                    _ => break,
                }
            }
            let want_r = f.books.requests.get(u).copied().unwrap_or(0);
            let want_d = f.books.debits.get(u).copied().unwrap_or(0);
            let balance = f.net.balance(i, u)?;
            if (requests, debits, balance) != (want_r, want_d, DEPOSIT - want_d) {
                return Ok(Some(format!(
                    "node{i} {u}: {requests} records, {debits} debited, balance {balance}; \
                     sent {want_r} records, {want_d} credits (balance {})",
                    DEPOSIT - want_d
                )));
            }
        }
    }
    Ok(None)
}

/// Waits (at most `budget`) until every node agrees with the books.
fn wait_records(f: &Net, budget: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        match records_differ(f)? {
            None => return Ok(()),
            Some(d) if start.elapsed() > budget => bail!("after {budget:?}: {d}"),
            Some(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// Waits until every batch formed so far is settled on validator 0 (and
/// none is in flight), at most `budget`; the last nonce.
fn wait_all_settled(f: &Net, budget: Duration) -> Result<u64> {
    let start = Instant::now();
    loop {
        let s = sync(&f.net, 0);
        let pending = s["pending_calls"].as_u64().unwrap_or(1);
        if pending == 0 && s["nonce"].is_null() {
            return Ok(s["settled_batches"].as_u64().unwrap_or(0));
        }
        ensure!(
            start.elapsed() < budget,
            "not settled in {budget:?}: {s}\n{}",
            f.net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The exact audit: records and balances on every node, then (once every
/// batch settled) every batch paid once with exactly its calls, every
/// provider paid exactly what it is owed.
fn audit(f: &Net) -> Result<()> {
    wait_records(f, Duration::from_secs(60))?;
    // A window still open holds debits not yet batched: wait for it.
    std::thread::sleep(Duration::from_secs(WINDOW_SECS + 2));
    let last = wait_all_settled(f, Duration::from_secs(240))?;
    let hub_last = query(&f.hub, "/last_nonce/hub")?["last_nonce"]
        .as_u64()
        .unwrap_or(0);
    ensure!(
        hub_last == last,
        "hub's last nonce {hub_last}, chain settled {last}"
    );
    for n in 1..=last {
        let b = query(&f.net.rpc(0), &format!("/batch/hub/{n}"))?;
        let calls = b["calls"].as_array().context("calls")?;
        let sum: u64 = calls.iter().filter_map(|c| c["amount"].as_u64()).sum();
        let h = query(&f.hub, &format!("/batch/hub/{n}"))?;
        ensure!(
            h["paid"].as_u64() == Some(sum)
                && h["shortfall"].as_u64().unwrap_or(0) == 0
                && h["calls"].as_u64() == Some(calls.len() as u64),
            "batch {n}: chain {b}\nhub {h}"
        );
    }
    for (p, owed) in &f.books.owed {
        let paid = query(&f.hub, &format!("/payout/{p}"))?["paid"]
            .as_u64()
            .unwrap_or(0);
        ensure!(paid == *owed, "hub paid {p} {paid}, owed {owed}");
    }
    records_differ(f)?.map_or(Ok(()), |d| bail!("{d}"))
}

fn halt_on_even_split(f: &mut Net) -> Result<()> {
    f.send(0, f.records("split-p", 4, 10))?;
    let mesh = f.net.mesh()?;
    mesh.partition(&[0, 1], &[2, 3]);
    // Let a height already voted on finish, then no more may come.
    std::thread::sleep(Duration::from_secs(3));
    let before = heights(&f.net);
    let a = f.tx(f.records("split-p", 3, 20))?;
    let b = f.tx(f.records("split-p", 2, 30))?;
    for (i, tx) in [(0, &a), (2, &b)] {
        let (code, log, _) = f.net.rpc(i).broadcast_tx_sync(tx)?;
        ensure!(code == 0, "CheckTx on node{i} while split: {code} {log}");
    }
    std::thread::sleep(Duration::from_secs(20));
    let during = heights(&f.net);
    ensure!(
        during == before,
        "heights moved while split 2/2: {before:?} -> {during:?}"
    );
    ensure!(
        !mesh.open_links().iter().any(|(x, y)| (*x < 2) != (*y < 2)),
        "a link across the split is open: {:?}",
        mesh.open_links()
    );
    mesh.heal();
    let top = *during.iter().max().unwrap_or(&0);
    for i in 0..4 {
        f.net.wait_height(i, top + 3, Duration::from_secs(90))?;
    }
    f.books.add_all(&f.records("split-p", 3, 20));
    f.books.add_all(&f.records("split-p", 2, 30));
    // A gateway retrying the same bytes on another node changes nothing.
    let _ = f.net.rpc(3).broadcast_tx_sync(&a);
    let _ = f.net.rpc(1).broadcast_tx_sync(&b);
    wait_records(f, Duration::from_secs(60))?;
    let h = f.net.height(0).min(f.net.height(3));
    same_hashes(&f.net, before[0].saturating_sub(2).max(1), h)?;
    eprintln!(
        "split at heights {before:?}, held 20 s, healed; {} dials refused",
        mesh.refused()
    );
    audit(f)
}

impl Books {
    fn add_all(&mut self, rs: &[UsageRecord]) {
        rs.iter().for_each(|r| self.add(r));
    }
}

fn minority_catches_up(f: &mut Net) -> Result<()> {
    f.net.mesh()?.isolate(3);
    std::thread::sleep(Duration::from_secs(3));
    let h3 = f.net.height(3);
    let h0 = f.net.height(0);
    for k in 0..3 {
        f.send(k, f.records("minority-p", 2, 5 + k as u64))?;
    }
    std::thread::sleep(Duration::from_secs(10));
    let (h0_after, h3_after) = (f.net.height(0), f.net.height(3));
    ensure!(
        h0_after >= h0 + 8,
        "the majority made {} heights in 10 s",
        h0_after - h0
    );
    ensure!(
        h3_after == h3,
        "isolated validator 3 moved {h3} -> {h3_after}"
    );
    f.net.mesh()?.heal();
    let target = f.net.height(0);
    f.net.wait_height(3, target + 2, Duration::from_secs(90))?;
    same_hashes(&f.net, h3.saturating_sub(2).max(1), target + 1)?;
    eprintln!("validator 3 held at {h3} while the others went {h0} -> {h0_after}; caught up");
    audit(f)
}

fn relay_cut_from_hub(f: &mut Net) -> Result<()> {
    let settled_before = sync(&f.net, 0)["settled_batches"].as_u64().unwrap_or(0);
    let nonce = settled_before + 1;
    f.hub_link.cut();
    let cut_at = Instant::now();
    let result = (|| {
        f.send(1, f.records("cut-p", 3, 40))?;
        // Wait for the batch to be signed, then for a second attempt (the
        // first failed: no relay reached the hub; the chain's cooldown
        // starts the next).
        let start = Instant::now();
        let h0 = f.net.height(0);
        loop {
            let s = sync(&f.net, 0);
            // Nothing may reach the hub while cut: the batch is neither on
            // the hub nor settled on the chain.
            ensure!(
                s["settled_batches"].as_u64().unwrap_or(0) < nonce
                    && query(&f.hub, &format!("/batch/hub/{nonce}")).is_err(),
                "batch {nonce} reached the hub through the cut link (attempt {}): {s}",
                s["attempt"]
            );
            if s["nonce"].as_u64() == Some(nonce) && s["attempt"].as_u64().unwrap_or(0) >= 2 {
                break;
            }
            ensure!(
                start.elapsed() < Duration::from_secs(240),
                "no second attempt of batch {nonce} while cut: {s}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        ensure!(
            f.net.height(0) > h0 + 20,
            "the chain stalled while the hub was cut"
        );
        ensure!(
            query(&f.hub, &format!("/batch/hub/{nonce}")).is_err(),
            "batch {nonce} reached the hub through a cut link"
        );
        Ok(())
    })();
    f.hub_link.heal();
    result?;
    let cut_for = cut_at.elapsed();
    let s = sync(&f.net, 0);
    eprintln!(
        "hub cut for {cut_for:?} ({} dials refused); {s}",
        f.hub_link.refused()
    );
    ensure!(f.hub_link.refused() > 0, "no relay tried the hub while cut");
    audit(f)
}

fn skewed_relay(f: &mut Net) -> Result<()> {
    if skew::libfaketime().is_none() {
        return Err(harness::skip("libfaketime not installed"));
    }
    let tallyd = tally_tests::localnet::tallyd_path()?;
    for (offset, amount) in [("+5m", 50), ("-5m", 60)] {
        let wrapper = skew::wrapper(
            f.net.dir(),
            &format!("tallyd-skew{offset}"),
            &tallyd,
            offset,
        )?;
        let w = wrapper.display().to_string();
        f.net.node("stop", 3)?;
        let restarted = f.net.node_with_env("start", 3, &[("TALLYD_3", &w)]);
        let outcome = restarted.and_then(|()| skewed_round(f, offset, amount));
        // Back to the plain binary, also after a failure.
        f.net.node("stop", 3)?;
        f.net.node("start", 3)?;
        outcome?;
    }
    f.net
        .wait_height(3, f.net.height(0), Duration::from_secs(60))?;
    audit(f)
}

/// One batch with validator 3 skewed by `offset`: settled in its first
/// attempt, paid once, app hashes equal.
fn skewed_round(f: &mut Net, offset: &str, amount: u64) -> Result<()> {
    let from = f.net.height(0);
    f.net.wait_height(3, from, Duration::from_secs(60))?;
    // The skew reached the process: its own log lines carry its clock.
    let pid: u32 = std::fs::read_to_string(f.net.dir().join("node3/tallyd.pid"))?
        .trim()
        .parse()?;
    let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
    ensure!(
        String::from_utf8_lossy(&environ).contains(&format!("FAKETIME={offset}")),
        "validator 3's tallyd (pid {pid}) runs without FAKETIME={offset}"
    );
    // Every earlier batch settled (after the open window closed), so the
    // next one is this round's and not one formed before the skew.
    std::thread::sleep(Duration::from_secs(WINDOW_SECS + 2));
    let nonce = wait_all_settled(f, Duration::from_secs(240))? + 1;
    f.send(3, f.records("skew-p", 4, amount))?;
    let start = Instant::now();
    let mut attempts = 0;
    loop {
        let s = sync(&f.net, 0);
        if s["nonce"].as_u64() == Some(nonce) {
            attempts = attempts.max(s["attempt"].as_u64().unwrap_or(0));
        }
        if s["settled_batches"].as_u64().unwrap_or(0) >= nonce {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "batch {nonce} not settled with validator 3 at {offset}: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(
        attempts <= 1,
        "batch {nonce} needed attempt {attempts} with validator 3's clock at {offset}"
    );
    let to = f.net.height(0).min(f.net.height(3));
    same_hashes(&f.net, from, to)?;
    eprintln!("validator 3 at {offset}: batch {nonce} settled in its first attempt; hashes equal over {from}..={to}");
    Ok(())
}

/// One run of a skewed gateway: its clock offset, the reporter's TTL, and
/// whether its records must land.
struct GatewayRun {
    offset: &'static str,
    ttl_secs: u64,
    lands: bool,
    /// The refusal code each report must end with when it does not land
    /// (`None`: `Expired`, or refused with 5).
    code: Option<u32>,
}

const GATEWAY_RUNS: [GatewayRun; 4] = [
    GatewayRun {
        offset: "+6m",
        ttl_secs: 200,
        lands: true,
        code: None,
    },
    GatewayRun {
        offset: "-6m",
        ttl_secs: 540,
        lands: true,
        code: None,
    },
    GatewayRun {
        offset: "+6m",
        ttl_secs: 300,
        lands: false,
        code: Some(6),
    },
    GatewayRun {
        offset: "-6m",
        ttl_secs: 300,
        lands: false,
        code: None,
    },
];

fn skewed_gateway(f: &mut Net) -> Result<()> {
    if skew::libfaketime().is_none() {
        return Err(harness::skip("libfaketime not installed"));
    }
    let key_path = f.net.dir().join("gateway.key");
    for (k, run) in GATEWAY_RUNS.iter().enumerate() {
        let provider = format!("gwskew-{k}");
        let records = f.records(&provider, 6, 3 + k as u64);
        let endpoints: Vec<String> = (0..4).map(|i| f.net.rpc_url(i)).collect();
        let out = skew::command(&std::env::current_exe()?, run.offset)?
            .env(CHILD, "1")
            .env("GW_ENDPOINTS", endpoints.join(","))
            .env("GW_CHAIN_ID", &f.chain_id)
            .env("GW_KEY", &key_path)
            .env("GW_TTL", run.ttl_secs.to_string())
            .env(
                "GW_RECORDS",
                serde_json::to_string(&records_json(&records))?,
            )
            .output()
            .context("running the gateway child")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "gateway at {} failed: {stdout}\n{}",
            run.offset,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_str(stdout.trim()).context("the child's answer")?;
        let skewed_by = v["clock"].as_i64().unwrap_or(0)
            - SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
        let want = if run.offset.starts_with('+') {
            360
        } else {
            -360
        };
        ensure!(
            (skewed_by - want).abs() < 30,
            "the child's clock is off by {skewed_by} s, not {}",
            run.offset
        );
        let outcomes = v["outcomes"].as_array().context("outcomes")?;
        let landed: u64 = outcomes
            .iter()
            .filter(|o| o["kind"] == "landed")
            .map(|o| o["records"].as_u64().unwrap_or(0))
            .sum();
        if run.lands {
            ensure!(
                landed == records.len() as u64,
                "gateway at {} ttl {}: {landed} of {} landed: {v}",
                run.offset,
                run.ttl_secs,
                records.len()
            );
            f.books.add_all(&records);
        } else {
            ensure!(
                landed == 0,
                "gateway at {}: {landed} landed: {v}",
                run.offset
            );
            for o in outcomes {
                let ok = match run.code {
                    Some(c) => o["kind"] == "rejected" && o["code"] == c,
                    None => o["kind"] == "expired" || (o["kind"] == "rejected" && o["code"] == 5),
                };
                ensure!(
                    ok,
                    "gateway at {} ttl {}: outcome {o}",
                    run.offset,
                    run.ttl_secs
                );
            }
            let total: u64 = outcomes
                .iter()
                .map(|o| o["records"].as_u64().unwrap_or(0))
                .sum();
            ensure!(total == records.len() as u64, "records unaccounted: {v}");
        }
        eprintln!(
            "gateway at {} ttl {} s: {landed} landed, {}",
            run.offset, run.ttl_secs, v["outcomes"]
        );
        wait_records(f, Duration::from_secs(30))?;
    }
    audit(f)
}

fn records_json(rs: &[UsageRecord]) -> Vec<Value> {
    rs.iter()
        .map(|r| {
            json!({"user": r.user, "provider": r.provider, "model": r.model,
                   "route": r.route, "units": r.units, "amount": r.amount})
        })
        .collect()
}

/// The gateway process (run by [`skewed_gateway`] under libfaketime): sends
/// `GW_RECORDS` (outcome ok) through the SDK's reporter with `GW_TTL`,
/// prints its clock and the outcomes as one JSON line.
fn gateway_child() -> Result<()> {
    let var = |k: &str| std::env::var(k).with_context(|| format!("{k} unset"));
    let endpoints: Vec<String> = var("GW_ENDPOINTS")?.split(',').map(String::from).collect();
    let chain_id = var("GW_CHAIN_ID")?;
    let (_, key) = tally_node::keyfile::load(std::path::Path::new(&var("GW_KEY")?))?;
    let ttl = Duration::from_secs(var("GW_TTL")?.parse()?);
    let recs: Vec<Value> = serde_json::from_str(&var("GW_RECORDS")?)?;
    let records: Vec<UsageRecord> = recs
        .iter()
        .map(|r| UsageRecord {
            user: r["user"].as_str().unwrap_or_default().into(),
            provider: r["provider"].as_str().unwrap_or_default().into(),
            model: r["model"].as_str().unwrap_or_default().into(),
            route: r["route"].as_str().unwrap_or_default().into(),
            outcome: Outcome::Ok as i32,
            units: r["units"].as_u64().unwrap_or(0),
            amount: r["amount"].as_u64().unwrap_or(0),
            ..Default::default()
        })
        .collect();
    let clock = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcomes = runtime.block_on(async move {
        let mut cfg = ReporterConfig::new(endpoints, &chain_id);
        cfg.ttl = ttl;
        cfg.flush_interval = Duration::from_millis(200);
        cfg.max_records = 2;
        // A report that expired stays expired: no new signature.
        cfg.reseal_for = Duration::ZERO;
        let reporter = Reporter::start(cfg, key, HttpTransport::new(Duration::from_secs(5)))?;
        for r in records {
            reporter.record(r).await?;
        }
        anyhow::Ok(
            tokio::time::timeout(Duration::from_secs(120), reporter.shutdown())
                .await
                .context("the reporter did not finish in 120 s")?,
        )
    })?;
    let outcomes: Vec<Value> = outcomes
        .iter()
        .map(|o| match o {
            ReportOutcome::Landed { records, .. } => json!({"kind": "landed", "records": records}),
            ReportOutcome::Rejected { records, code, .. } => {
                json!({"kind": "rejected", "records": records, "code": code})
            }
            ReportOutcome::Expired { records, .. } => {
                json!({"kind": "expired", "records": records})
            }
            o => json!({"kind": "other", "records": o.records(), "debug": format!("{o:?}")}),
        })
        .collect();
    println!("{}", json!({"clock": clock, "outcomes": outcomes}));
    Ok(())
}

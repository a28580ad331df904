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
//! - 2:00 the hub chain stopped for 150 s, then started again; meanwhile,
//!   from 2:30, validators {0, 1} cut from {2, 3} for 30 s (the chain
//!   halts) and, from 3:30, one validator (3, 0, 1, 2 in turn) cut from all
//!   others for 30 s (the rest go on, it catches up), through the P2P mesh
//!   (`crate::partition`, every validator peers through a cuttable proxy);
//! - 5:00 validator 0 (whose relay goes through the proxy) SIGKILLed,
//!   restarted 10 s later, and a 503 storm;
//! - 0:10 (as root) validator 3's tallyd, whose `data/` sits on a tmpfs
//!   (`crate::smallfs`), meets a full disk: it must stop with a FATAL line
//!   naming ENOSPC while the others go on, and, with the space freed and
//!   the node started again, catch up within 90 s with the network's app
//!   hash (without root: skipped with a log line);
//! - 5:15 a validator (2, 3, 1 in turn) restarted with its tallyd's wall
//!   clock 5 minutes ahead (even cycles) or behind (odd), with libfaketime
//!   (`crate::skew`; skipped with a log line when not installed): at 5:50
//!   it must be within 3 blocks of validator 0 with the network's app
//!   hash, then it is restarted with the plain clock.
//!
//! Growth (ADR 0020), while the traffic runs: two users unknown at genesis
//! register by a keyed hub deposit, grant every gateway an allowance and
//! join the traffic; `max_batch_calls` drops to 50 from a window two
//! windows ahead; in cycle 0 at 1:40 `chaos-gw-b`'s key is rotated (its
//! reporter drains, one with the new key takes over); at 4:40 of every
//! cycle each user withdraws 1,000 credits.
//!
//! Audit (every amount in credits):
//! - deposits made on the hub vs credited on Tally (count and sum);
//! - Σ user debits on Tally (route records' amounts), Σ balances, Σ
//!   withdrawn (paid to users by the hub): balances + debits + withdrawn =
//!   deposits (net of registration fees);
//! - withdrawals the chain took = Σ withdrawn on the hub;
//! - Σ paid by the hub (provider payouts), Σ pending on Tally (hub calls
//!   not settled, owed not yet converted): debits = paid + pending, and
//!   pending is 0 once settled;
//! - hub escrow = deposits - paid - withdrawn;
//! - the parameter change in force, the rotated key retired;
//! - nonces paid twice: each nonce settled once on the hub with exactly the
//!   chain's calls, no call id in two batches (must be 0);
//! - records the SDK says landed vs records counted on every validator.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tally_client::{HttpTransport, ReportOutcome, Reporter, ReporterConfig};
use tally_node::keyfile;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};

use crate::localnet::{free_port_base, Localnet, Options};

mod audit;
mod growth;
use crate::proxy::{Fault, FaultProxy, ProxyState};
use growth::NEWCOMERS;

const USERS: [&str; 6] = ["cu-0", "cu-1", "cu-2", "cu-3", "cu-4", "cu-5"];
const PROVIDERS: [&str; 3] = ["cp-a", "cp-b", "cp-c"];
const GATEWAYS: [&str; 2] = ["chaos-gw-b", "chaos-gw-c"];
const DEPOSIT: u64 = 50_000_000;
/// Records per second each gateway offers.
const RATE: u64 = 40;
/// The validator whose tallyd data sits on a small filesystem (root only).
const DISK_VICTIM: usize = 3;
/// Its size: room for the store of an hour's traffic; the ballast fills
/// the rest.
const DISK_SIZE: &str = "2g";

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
    let up_env = [
        ("TALLY_HUB_ENDPOINTS_0", endpoints.as_str()),
        ("TALLY_USERS", &users),
        ("TALLY_GATEWAYS", &gateways),
        ("TALLY_HUB_CONFIRMATIONS", "2"),
    ];
    let opts = Options {
        up_env: up_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        p2p_mesh: true,
        ..Options::default()
    };
    let net = Localnet::launch(4, base, "1s", 60, &opts)?;
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
    let users: Users = Arc::new(Mutex::new(USERS.iter().map(|u| u.to_string()).collect()));
    let mut senders = Vec::new();
    for (gi, key) in keys.into_iter().enumerate() {
        senders.push(spawn_sender(
            &runtime,
            &net,
            &chain_id,
            key,
            gi,
            users.clone(),
        )?);
    }

    // Growth: newcomers join the traffic, a parameter changes.
    let all_gateways: Vec<&str> = std::iter::once("demo-gateway").chain(GATEWAYS).collect();
    for (i, u) in NEWCOMERS.iter().enumerate() {
        growth::register(&net, u, 0xc0 + i as u8, &all_gateways)?;
        made += growth::NEWCOMER_DEPOSIT - growth::FEE;
        users
            .lock()
            .map_err(|_| anyhow::anyhow!("users lock"))?
            .push(u.to_string());
        log(
            start,
            &format!("{u} registered by its deposit and joins the traffic"),
        );
    }
    let param_window = growth::current_window(&net)? + 2;
    let status = growth::pass(
        &net,
        &[
            "tx",
            "params",
            "propose",
            "--from-window",
            &param_window.to_string(),
            "--set",
            "max_batch_calls=50",
        ],
    )?;
    ensure!(status == "applied", "the parameter change is {status}");
    log(
        start,
        &format!("max_batch_calls = 50 from window {param_window}"),
    );
    let mut withdrawals = 0u64;
    let mut rotated = None;
    // Full disks: validator 3's tallyd keeps its data on a tmpfs (root
    // only), filled at 0:10 of every cycle.
    let small_fs = if crate::smallfs::is_root() {
        let fs = crate::smallfs::move_tallyd_data(&net, DISK_VICTIM, DISK_SIZE)?;
        log(
            start,
            &format!("validator {DISK_VICTIM}'s tallyd data on a tmpfs of {DISK_SIZE}"),
        );
        Some(fs)
    } else {
        log(start, "not root: no tmpfs, so no full-disk faults");
        None
    };

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
        if let Some(fs) = &small_fs {
            sleep_until(at(10).min(end));
            if Instant::now() < end {
                disk_full(&net, fs, cycle, start)?;
            }
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
        if rotated.is_none() {
            sleep_until(at(100).min(end));
            let key = SigningKey::from_bytes(&[0xb2; 32]);
            let pubkey = hex::encode(key.verifying_key().to_bytes());
            let old = senders.remove(1);
            let status = growth::pass(
                &net,
                &[
                    "tx",
                    "gateway",
                    "propose",
                    "rotate",
                    "--name",
                    GATEWAYS[0],
                    "--pubkey",
                    &pubkey,
                ],
            )?;
            ensure!(status == "applied", "the rotation is {status}");
            old.stop.store(true, Ordering::Relaxed);
            senders.push(spawn_sender(
                &runtime,
                &net,
                &chain_id,
                key,
                1,
                users.clone(),
            )?);
            senders.push(old);
            rotated = Some(pubkey);
            log(
                start,
                &format!("cycle {cycle}: {} rotated its key", GATEWAYS[0]),
            );
        }
        sleep_until(at(120).min(end));
        if Instant::now() >= end {
            break;
        }
        log(start, &format!("cycle {cycle}: hub stopped for 150 s"));
        let down = net.take_down("stop", None)?;
        partitions(&net, cycle, &at, end, start)?;
        sleep_until(at(270).min(end + Duration::from_secs(150)));
        down.now()?;
        log(start, &format!("cycle {cycle}: hub back"));
        sleep_until(at(280).min(end));
        if Instant::now() < end {
            let mut took = 0;
            for u in USERS {
                let key = net.dir().join("users").join(format!("{u}.key"));
                took += u64::from(growth::withdraw(&net, &key, u)?);
            }
            for u in NEWCOMERS {
                took += u64::from(growth::withdraw(&net, &growth::newcomer_key(&net, u), u)?);
            }
            withdrawals += took * growth::WITHDRAWAL;
            log(
                start,
                &format!(
                    "cycle {cycle}: {took} withdrawals of {}",
                    growth::WITHDRAWAL
                ),
            );
        }
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
        sleep_until(at(315).min(end));
        if Instant::now() < end {
            skewed_validator(&net, cycle, at(350).min(end), start)?;
        }
        sleep_until(at(360).min(end));
        cycle += 1;
    }
    proxy.state().stale_status = false;
    for s in &senders {
        s.stop.store(true, Ordering::Relaxed);
    }
    log(start, "traffic stops; waiting for every report's outcome");
    let mut sent = 0u64;
    let mut landed = 0u64;
    let mut other: BTreeMap<String, u64> = BTreeMap::new();
    for s in senders {
        let (n, outcomes) = runtime.block_on(s.task)?;
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
    let grown = Grown {
        withdrawals,
        param_window,
        rotated,
    };
    audit::audit(
        &net,
        counts,
        &grown,
        sent,
        landed,
        &other,
        stale_answers,
        start,
    )
}

/// The partitions of a cycle (while the hub is down): a 2/2 split from
/// 2:30 and one validator isolated from 3:30, 30 s each. The split must
/// freeze every height (after 5 s for a block already voted on), the three
/// connected validators must go on without the isolated one, and it must
/// catch up within 90 s of the heal; otherwise the run fails.
fn partitions(
    net: &Localnet,
    cycle: u64,
    at: &dyn Fn(u64) -> Instant,
    end: Instant,
    start: Instant,
) -> Result<()> {
    let mesh = net.mesh()?;
    let hold = |s: u64| {
        let now = Instant::now();
        let until = at(s).min(end);
        if until > now {
            std::thread::sleep(until - now);
        }
    };
    hold(150);
    if Instant::now() >= end {
        return Ok(());
    }
    log(
        start,
        &format!("cycle {cycle}: validators 0,1 cut from 2,3 for 30 s"),
    );
    let top = || (0..4).map(|i| net.height(i)).max().unwrap_or(0);
    let before = top();
    mesh.partition(&[0, 1], &[2, 3]);
    // A block already voted on may still land; after that neither half
    // holds more than 2/3 of the power, so no height may move.
    std::thread::sleep(Duration::from_secs(5));
    let frozen = top();
    std::thread::sleep(Duration::from_secs(25));
    let during = top();
    mesh.heal();
    log(
        start,
        &format!("cycle {cycle}: healed (the highest validator went {before} -> {frozen} -> {during} while split)"),
    );
    ensure!(
        during == frozen,
        "cycle {cycle}: the chain moved from {frozen} to {during} while split 2/2"
    );
    hold(210);
    if Instant::now() >= end {
        return Ok(());
    }
    let lone = (3 + cycle as usize) % 4;
    let others = |lone: usize| {
        (0..4)
            .filter(|&i| i != lone)
            .map(|i| net.height(i))
            .max()
            .unwrap_or(0)
    };
    log(
        start,
        &format!("cycle {cycle}: validator {lone} isolated for 30 s"),
    );
    let at_cut = others(lone);
    mesh.isolate(lone);
    std::thread::sleep(Duration::from_secs(30));
    let at_heal = others(lone);
    mesh.heal();
    ensure!(
        at_heal > at_cut,
        "cycle {cycle}: the three connected validators stayed at {at_cut} while {lone} was isolated"
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    while net.height(lone) < at_heal {
        ensure!(
            Instant::now() < deadline,
            "cycle {cycle}: validator {lone} at {} did not catch up to {at_heal} within 90 s of the heal",
            net.height(lone)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    log(
        start,
        &format!(
            "cycle {cycle}: validator {lone} reconnected and caught up ({at_cut} -> {at_heal} without it)"
        ),
    );
    Ok(())
}

/// Fills validator [`DISK_VICTIM`]'s tmpfs: its tallyd must stop on its
/// own (a FATAL line naming ENOSPC in its log) while the other three go on;
/// with the ballast gone and the node started again it must catch up
/// within 90 s with the network's app hash. The run fails otherwise.
fn disk_full(
    net: &Localnet,
    fs: &crate::smallfs::SmallFs,
    cycle: u64,
    start: Instant,
) -> Result<()> {
    let v = DISK_VICTIM;
    let home = net.dir().join(format!("node{v}"));
    let pid = std::fs::read_to_string(home.join("tallyd.pid"))?
        .trim()
        .to_string();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                // The state follows the parenthesised command name.
                let state = s.rsplit(')').next().unwrap_or("").trim_start();
                !state.starts_with('Z') && !state.starts_with('X')
            })
            .unwrap_or(false)
    };
    ensure!(
        alive(),
        "cycle {cycle}: validator {v}'s tallyd (pid {pid}) is not running before the fill"
    );
    let log_len = std::fs::metadata(home.join("tallyd.log"))?.len();
    let filled = crate::smallfs::fill(fs.path())?;
    log(
        start,
        &format!("cycle {cycle}: validator {v}'s disk full after {filled} bytes of ballast"),
    );
    let full_at = net.height(0);
    let t = Instant::now();
    while alive() {
        ensure!(
            t.elapsed() < Duration::from_secs(120),
            "cycle {cycle}: validator {v}'s tallyd still runs 120 s after its disk filled"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let text = std::fs::read(home.join("tallyd.log"))?;
    let tail = String::from_utf8_lossy(&text[(log_len as usize).min(text.len())..]).to_string();
    ensure!(
        tail.lines()
            .any(|l| l.contains("FATAL") && l.contains("No space left on device")),
        "cycle {cycle}: validator {v}'s tallyd stopped without a FATAL line naming ENOSPC"
    );
    net.wait_height(0, full_at + 3, Duration::from_secs(60))
        .context("the other validators stopped with validator 3's disk")?;
    std::fs::remove_file(fs.path().join("ballast"))?;
    net.node("stop", v)?;
    net.node("start", v)?;
    let target = net.height(0);
    net.wait_height(v, target, Duration::from_secs(90))
        .with_context(|| {
            format!("cycle {cycle}: validator {v} did not catch up within 90 s of the space freed")
        })?;
    net.app_hash_agrees(v, 0)?;
    log(
        start,
        &format!("cycle {cycle}: validator {v} stopped on the full disk, restarted, caught up to {target} with the network's app hash"),
    );
    Ok(())
}

/// Restarts a validator with its tallyd's clock 5 minutes off until
/// `until`, then with the plain clock again. While skewed it must keep
/// following the chain (within 3 blocks of validator 0) with the
/// network's app hash; the run fails otherwise.
fn skewed_validator(net: &Localnet, cycle: u64, until: Instant, start: Instant) -> Result<()> {
    if crate::skew::libfaketime().is_none() {
        log(start, "no libfaketime: no clock skew this cycle");
        return Ok(());
    }
    let v = 1 + (cycle as usize + 1) % 3;
    let offset = if cycle.is_multiple_of(2) {
        "+5m"
    } else {
        "-5m"
    };
    let bin = crate::localnet::tallyd_path()?;
    let name = format!("tallyd-chaos{offset}");
    let wrapper = crate::skew::wrapper(net.dir(), &name, &bin, offset)?;
    log(
        start,
        &format!("cycle {cycle}: validator {v}'s tallyd at {offset}"),
    );
    net.node("stop", v)?;
    let (var, path) = (format!("TALLYD_{v}"), wrapper.display().to_string());
    let skewed = net.node_with_env("start", v, &[(var.as_str(), path.as_str())]);

    let now = Instant::now();
    if skewed.is_ok() && until > now {
        std::thread::sleep(until - now);
    }
    let checked = skewed.and_then(|()| {
        let (mine, lead) = (net.height(v), net.height(0));
        ensure!(
            mine + 3 >= lead,
            "cycle {cycle}: validator {v} with its clock at {offset} fell behind: {mine} against {lead}"
        );
        net.app_hash_agrees(v, 0)?;
        log(
            start,
            &format!("cycle {cycle}: validator {v} at {offset} followed the chain to {mine} with its app hash"),
        );
        Ok(())
    });
    net.node("stop", v)?;
    net.node("start", v)?;
    log(
        start,
        &format!("cycle {cycle}: validator {v}'s clock plain again"),
    );
    checked
}

/// The users the traffic charges (newcomers join once registered).
type Users = Arc<Mutex<Vec<String>>>;

/// One gateway's reporter task and its stop flag.
struct Sender {
    task: tokio::task::JoinHandle<(u64, Vec<ReportOutcome>)>,
    stop: Arc<AtomicBool>,
}

/// Starts a reporter signing with `key` that offers [`RATE`] records a
/// second for the current `users` until stopped (gateway `gi` picks its
/// validators from `gi` on).
fn spawn_sender(
    runtime: &tokio::runtime::Runtime,
    net: &Localnet,
    chain_id: &str,
    key: SigningKey,
    gi: usize,
    users: Users,
) -> Result<Sender> {
    let rpcs: Vec<String> = (0..4).map(|i| net.rpc_url((gi + i) % 4)).collect();
    let mut cfg = ReporterConfig::new(rpcs, chain_id);
    cfg.ttl = Duration::from_secs(300);
    let reporter = Reporter::start(cfg, key, HttpTransport::new(Duration::from_secs(10)))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = runtime.spawn(async move {
        let mut rng = rand::rngs::StdRng::seed_from_u64(gi as u64);
        let mut sent = 0u64;
        let tick = Duration::from_millis(1000 / RATE.max(1));
        while !flag.load(Ordering::Relaxed) {
            let o = Outcome::ALL[rng.gen_range(0..Outcome::ALL.len())];
            let user = match users.lock() {
                Ok(u) => u[rng.gen_range(0..u.len())].clone(),
                Err(_) => break,
            };
            let r = UsageRecord {
                user,
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
                ..Default::default()
            };
            if reporter.record(r).await.is_err() {
                break;
            }
            sent += 1;
            tokio::time::sleep(tick).await;
        }
        (sent, reporter.shutdown().await)
    });
    Ok(Sender { task, stop })
}

/// What the growth actions did, for the audit.
struct Grown {
    /// Credits the chain took as withdrawals.
    withdrawals: u64,
    /// The window `max_batch_calls = 50` governs from.
    param_window: u64,
    /// The rotated gateway's new key (hex).
    rotated: Option<String>,
}

//! End to end with faults between a relay and the hub (real CometBFT on
//! both chains, a fault proxy on loopback in front of validator 0's relay;
//! the other relays talk to the hub directly and, with a 20 s stagger, stay
//! out of the way unless validator 0 fails). One localnet is shared by the
//! named tests below, which run in this order (the runner is
//! `tally_tests::harness`):
//!
//! 1. `relay_failover_on_429_and_dead_endpoint`: validator 0's hub
//!    endpoints are the proxy and a dead port; the proxy resets the first
//!    broadcast and answers the second with 429, a body retry delay of 3 s
//!    and `Retry-After: 0`: the relay fails over, waits at least the asked
//!    delay, and the batch settles, paid once;
//! 2. `killed_relay_resubmits_and_hub_pays_once`: the next batch's
//!    broadcast is held by the proxy for 15 s and validator 0 is killed with
//!    SIGKILL meanwhile, then restarted: its relay submits the same signed
//!    bytes again (every submission the proxy saw is compared byte for
//!    byte), the held copy reaches the hub later, and the hub pays once;
//! 3. `deposit_credited_once_after_confirmations`: a hub deposit is
//!    credited once, and only once it is `hub_confirmations` (12) hub blocks
//!    deep: the hub tip is read at the moment of the credit.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED) and
//! built `tallyd` and `tally-hub` binaries, like `e2e_localnet`.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use tally_node::records::build_report;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, Localnet};
use tally_tests::proxy::{Fault, FaultProxy, ProxyState};

/// Ports from here, or the next free block (`free_port_base`); below
/// Linux's ephemeral range (32768+), so that no outgoing connection can be
/// holding a port a restarted node must bind.
const PORT_BASE: u16 = 30656;
const CONFIRMATIONS: u64 = 12;

const TESTS: [Test<Net>; 3] = [
    Test {
        name: "relay_failover_on_429_and_dead_endpoint",
        needs: &[],
        run: relay_failover_on_429_and_dead_endpoint,
    },
    Test {
        name: "killed_relay_resubmits_and_hub_pays_once",
        needs: &[],
        run: killed_relay_resubmits_and_hub_pays_once,
    },
    Test {
        name: "deposit_credited_once_after_confirmations",
        needs: &[],
        run: deposit_credited_once_after_confirmations,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture: the localnet, the proxy in front of validator 0's
/// relay, and the hub's RPC. (The network is declared first, so it stops
/// before the proxy does.)
struct Net {
    net: Localnet,
    proxy: FaultProxy,
    hub: Rpc,
}

impl Net {
    fn start() -> Result<Self> {
        // The proxy forwards everything until a test gives it a script.
        let base = free_port_base(PORT_BASE, 4)?;
        let hub_upstream = format!("127.0.0.1:{}", base + 101);
        let proxy = FaultProxy::start(&hub_upstream, ProxyState::default())?;
        let endpoints = format!("{},http://127.0.0.1:1", proxy.url());
        let confirmations = CONFIRMATIONS.to_string();
        let net = Localnet::start_with(
            4,
            base,
            "500ms",
            10,
            &[
                // The proxy sits in front of the relay that submits first:
                // the holder of share 1. A dealer deals share 1 to
                // validator 0; the on-chain DKG orders shares by address.
                ("TALLY_DEALER", "1"),
                ("TALLY_HUB_ENDPOINTS_0", &endpoints),
                ("TALLY_RELAY_STAGGER_SECS", "20"),
                ("TALLY_HUB_CONFIRMATIONS", &confirmations),
            ],
        )?;
        let hub = Rpc::new(&net.hub_rpc_url());
        Ok(Self { net, proxy, hub })
    }
}

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let r = rpc.abci_query(path)?;
    ensure!(r.code == 0, "{path}: code {}", r.code);
    Ok(serde_json::from_slice(&r.value)?)
}

fn settled(net: &Localnet, i: usize) -> u64 {
    query(&net.rpc(i), "/sync/hub")
        .map(|s| s["settled_batches"].as_u64().unwrap_or(0))
        .unwrap_or(0)
}

fn wait_settled(net: &Localnet, i: usize, n: u64, budget: Duration) -> Result<Duration> {
    let start = Instant::now();
    while settled(net, i) < n {
        if start.elapsed() > budget {
            let s = query(&net.rpc(i), "/sync/hub").unwrap_or_default();
            bail!(
                "node{i}: {n} batches not settled in {budget:?}: {s}\n{}",
                net.logs_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(start.elapsed())
}

fn report(net: &Localnet, provider: &str, amount: u64) -> Result<()> {
    let key = net.gateway_key()?;
    let chain_id = net.rpc(1).status()?.chain_id;
    let rec = UsageRecord {
        user: "alice".into(),
        provider: provider.into(),
        model: "m".into(),
        route: "r".into(),
        outcome: Outcome::Ok as i32,
        units: 1,
        amount,
        ..Default::default()
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let r = net
        .rpc(1)
        .broadcast_tx_commit(&build_report(&key, &chain_id, vec![rec], now + 300).tx)?;
    ensure!(r.final_code() == 0, "{}", r.final_log());
    Ok(())
}

/// What the hub paid for batch `nonce`; fails unless the batch settled in
/// full (`shortfall` exactly 0).
fn hub_batch_total(hub: &Rpc, nonce: u64) -> Result<u64> {
    let b = query(hub, &format!("/batch/hub/{nonce}"))?;
    ensure!(
        b["settled"] == true && b["shortfall"] == 0,
        "hub batch {nonce} not settled in full: {b}"
    );
    b["paid"]
        .as_u64()
        .with_context(|| format!("hub batch {nonce} has no paid: {b}"))
}

fn relay_log(net: &Localnet, i: usize) -> String {
    std::fs::read_to_string(net.dir().join(format!("node{i}/tallyd.log")))
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("relay") || l.contains("hub") || l.contains("retry") || l.contains("submi")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn metrics(port: u16) -> Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // Read to the end: ask the server to close (HTTP/1.1 keeps it open).
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(-1.0)
}

fn relay_failover_on_429_and_dead_endpoint(f: &mut Net) -> Result<()> {
    // Reset, 429 with a body delay, a dead endpoint: fail over, wait, settle.
    let (net, proxy, hub) = (&f.net, &f.proxy, &f.hub);
    let (seen_before, settled_before) = {
        let mut st = proxy.state();
        st.script.clear();
        st.script.extend([Fault::Reset, Fault::too_many(3)]);
        (st.broadcasts.len(), settled(net, 1))
    };
    let nonce = settled_before + 1;
    report(net, "fault-prov", 11)?;
    let took = wait_settled(net, 1, nonce, Duration::from_secs(90))?;
    {
        let st = proxy.state();
        let tl = st.timeline();
        ensure!(
            st.labels()[seen_before..] == ["reset", "429", "forwarded"],
            "proxy saw {tl:?}\n{}",
            relay_log(net, 0)
        );
        let gap = st.broadcasts[seen_before + 2].at - st.broadcasts[seen_before + 1].at;
        ensure!(
            gap >= Duration::from_secs(3),
            "retried {gap:?} after the 429 that asked for 3 s: {tl:?}\n{}",
            relay_log(net, 0)
        );
    }
    let log0 = relay_log(net, 0);
    ensure!(
        log0.contains("127.0.0.1:1") && log0.contains("wait_ms"),
        "validator 0's relay did not fail over to the dead endpoint and wait:\n{log0}"
    );
    ensure!(
        hub_batch_total(hub, nonce)? == 11,
        "{}",
        hub_batch_total(hub, nonce)?
    );
    let m = metrics(net.port_base() + 5)?;
    // The reset and the 429 each cost a retry; a try of the dead endpoint
    // adds one only when its breaker is not already open from the deposit
    // reads (timing: seen both ways), so at least 2.
    ensure!(
        metric(&m, "tally_relay_submissions_total{outcome=\"ok\"}") == nonce as f64
            && metric(&m, "tally_retries_total{layer=\"transport\"}") >= 2.0,
        "validator 0's metrics:\n{m}"
    );
    eprintln!(
        "batch {nonce} settled {took:?} after the report; proxy: {:?}",
        proxy.state().timeline()
    );
    Ok(())
}

fn killed_relay_resubmits_and_hub_pays_once(f: &mut Net) -> Result<()> {
    // Validator 0 killed while its submission is on the wire, restarted.
    let (net, proxy, hub) = (&f.net, &f.proxy, &f.hub);
    let (seen_before, nonce) = {
        let mut st = proxy.state();
        st.script.clear();
        st.script.push_back(Fault::Delay(Duration::from_secs(15)));
        (st.broadcasts.len(), settled(net, 1) + 1)
    };
    report(net, "fault-prov", 22)?;
    let start = Instant::now();
    while proxy.state().broadcasts.len() <= seen_before {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "batch {nonce} never reached the proxy: {:?}\n{}",
            proxy.state().timeline(),
            relay_log(net, 0)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let down = net.take_down("kill", Some(0))?;
    let killed = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    down.now()?;
    wait_settled(net, 1, nonce, Duration::from_secs(90))?;
    let settled_after_kill = killed.elapsed();
    // Let the held copy (15 s after it arrived) reach the hub, and node 0
    // catch up.
    std::thread::sleep(
        Duration::from_secs(17).saturating_sub(proxy.state().broadcasts[seen_before].at.elapsed()),
    );
    wait_settled(net, 0, nonce, Duration::from_secs(60))?;
    let labels = proxy.state().labels();
    ensure!(
        labels.len() >= seen_before + 2 && labels[seen_before] == "delayed",
        "validator 0 did not resubmit after its restart: {:?}\n{}",
        proxy.state().timeline(),
        relay_log(net, 0)
    );
    // Every submission of this batch (the held one and the resubmissions
    // after the restart) carries the same signed transaction, byte for byte.
    let txs: Vec<Option<String>> = proxy.state().broadcasts[seen_before..]
        .iter()
        .map(|s| s.tx_base64())
        .collect();
    ensure!(
        txs.iter().all(|t| t.is_some() && *t == txs[0]),
        "submissions of batch {nonce} differ: {txs:?}"
    );
    ensure!(
        hub_batch_total(hub, nonce)? == 22,
        "{}",
        hub_batch_total(hub, nonce)?
    );
    ensure!(
        hub.abci_query(&format!("/batch/hub/{}", nonce + 1))?.code != 0,
        "batch {} settled too",
        nonce + 1
    );
    let paid = query(hub, "/payout/fault-prov")?["paid"]
        .as_u64()
        .unwrap_or(0);
    let paid_by_batches = (1..=nonce)
        .map(|n| query(hub, &format!("/batch/hub/{n}")).map(|b| b["paid"].as_u64().unwrap_or(0)))
        .sum::<Result<u64>>()?;
    ensure!(
        paid == paid_by_batches,
        "provider paid {paid}, batches paid {paid_by_batches}"
    );
    eprintln!(
        "batch {nonce} settled {settled_after_kill:?} after validator 0 was killed; proxy: {:?}",
        proxy.state().timeline()
    );
    Ok(())
}

/// Hub blocks a validator's deposit cursor must read past a credited
/// deposit before "credited once" is judged on it.
const CURSOR_PAST: u64 = 6;

fn deposit_credited_once_after_confirmations(f: &mut Net) -> Result<()> {
    // A deposit: credited once, only once it is CONFIRMATIONS hub blocks
    // deep. The hub tip is read right before and right after each balance
    // read, so the tip read after the read that first shows the credit is
    // at least the tip when the credit happened (an upper bound): if even
    // that is less than CONFIRMATIONS blocks above the deposit's height,
    // the credit came too early. The credit path alone (relay poll, vote
    // extension, proposal) takes about 6 hub blocks of 500 ms here, so the
    // depth is 12: with the relay's confirmation wait removed this check
    // fails (seen: tip at most height + 6).
    let (net, hub) = (&f.net, &f.hub);
    net.hub_deposit("erin", 55)?;
    let tip_at_deposit = hub.status()?.height;
    let deposits = query(
        hub,
        &format!(
            "/deposits/{}/{tip_at_deposit}",
            tip_at_deposit.saturating_sub(20)
        ),
    )?;
    let height = deposits["deposits"]
        .as_array()
        .and_then(|d| {
            d.iter()
                .find(|d| d["user"] == "erin" && d["amount"] == 55)
                .and_then(|d| d["height"].as_u64())
        })
        .with_context(|| format!("the deposit is not on the hub: {deposits}"))?;
    let balance = |i: usize| net.balance(i, "erin");
    let start = Instant::now();
    let tip_at_credit = loop {
        let credited = balance(1)? != 0;
        let tip = hub.status()?.height;
        if credited {
            break tip;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(90),
            "deposit not credited\n{}",
            net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("deposit at hub height {height}, credited with the hub tip at most {tip_at_credit}");
    ensure!(
        tip_at_credit >= height + CONFIRMATIONS,
        "deposit at hub height {height} credited with the hub tip at most {tip_at_credit} (< {CONFIRMATIONS} confirmations)"
    );
    let cursor = query(&net.rpc(1), "/sync/hub")?["hub_cursor"]
        .as_u64()
        .context("no hub_cursor")?;
    ensure!(
        cursor > height,
        "credited, but the hub cursor {cursor} is not past the deposit's height {height}"
    );
    // Once: judged on each validator after its cursor read several hub
    // blocks beyond the deposit (ranges that would have credited it again).
    for i in 0..4 {
        loop {
            let c = query(&net.rpc(i), "/sync/hub")?["hub_cursor"]
                .as_u64()
                .context("no hub_cursor")?;
            if c > height + CURSOR_PAST {
                break;
            }
            ensure!(
                start.elapsed() < Duration::from_secs(150),
                "node{i}: the hub cursor is at {c}, the deposit at hub height {height}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        ensure!(balance(i)? == 55, "node{i}: erin has {}", balance(i)?);
    }
    Ok(())
}

//! End to end with faults between a relay and the hub (real CometBFT on
//! both chains, a fault proxy on loopback in front of validator 0's relay;
//! the other relays talk to the hub directly and, with a 20 s stagger, stay
//! out of the way unless validator 0 fails):
//!
//! 1. validator 0's hub endpoints are the proxy and a dead port; the proxy
//!    resets the first broadcast and answers the second with 429, a body
//!    retry delay of 3 s and `Retry-After: 0`: the relay fails over, waits
//!    at least the asked delay, and the batch settles, paid once;
//! 2. the next batch's broadcast is held by the proxy for 15 s and
//!    validator 0 is killed with SIGKILL meanwhile, then restarted: its
//!    relay submits the same signed bytes again, the held copy reaches the
//!    hub later, and the hub pays once;
//! 3. a hub deposit is credited once, and only after its range is
//!    `hub_confirmations` (4) hub blocks deep.

use std::io::{Read, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use tally_node::records::build_report;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::localnet::Localnet;
use tally_tests::proxy::{Fault, FaultProxy, ProxyState};

const PORT_BASE: u16 = 38656;
const CONFIRMATIONS: u64 = 4;

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
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let r = net
        .rpc(1)
        .broadcast_tx_commit(&build_report(&key, &chain_id, vec![rec], now + 300).tx)?;
    ensure!(r.final_code() == 0, "{}", r.final_log());
    Ok(())
}

/// `paid + shortfall` of batch `nonce` on the hub (what it settled).
fn hub_batch_total(hub: &Rpc, nonce: u64) -> Result<u64> {
    let b = query(hub, &format!("/batch/hub/{nonce}"))?;
    Ok(b["paid"].as_u64().unwrap_or(0) + b["shortfall"].as_u64().unwrap_or(0))
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

#[test]
fn relay_faults_end_to_end() -> Result<()> {
    if std::env::var_os("TALLY_SKIP_E2E").is_some() {
        return Ok(());
    }
    let hub_upstream = format!("127.0.0.1:{}", PORT_BASE + 101);
    let proxy = FaultProxy::start(
        &hub_upstream,
        ProxyState::with([Fault::Reset, Fault::too_many(3)]),
    )?;
    let endpoints = format!("{},http://127.0.0.1:1", proxy.url());
    let confirmations = CONFIRMATIONS.to_string();
    let net = Localnet::start_with(
        4,
        PORT_BASE,
        "500ms",
        10,
        &[
            ("TALLY_HUB_ENDPOINTS_0", &endpoints),
            ("TALLY_RELAY_STAGGER_SECS", "20"),
            ("TALLY_HUB_CONFIRMATIONS", &confirmations),
        ],
    )?;
    let hub = Rpc::new(&net.hub_rpc_url());

    // 1. Reset, 429 with a body delay, a dead endpoint: fail over, wait, settle.
    report(&net, "fault-prov", 11)?;
    let took = wait_settled(&net, 1, 1, Duration::from_secs(90))?;
    {
        let st = proxy.state();
        let tl = st.timeline();
        ensure!(
            st.labels() == ["reset", "429", "forwarded"],
            "proxy saw {tl:?}\n{}",
            relay_log(&net, 0)
        );
        let gap = st.broadcasts[2].at - st.broadcasts[1].at;
        ensure!(
            gap >= Duration::from_secs(3),
            "retried {gap:?} after the 429 that asked for 3 s: {tl:?}\n{}",
            relay_log(&net, 0)
        );
    }
    let log0 = relay_log(&net, 0);
    ensure!(
        log0.contains("127.0.0.1:1") && log0.contains("wait_ms"),
        "validator 0's relay did not fail over to the dead endpoint and wait:\n{log0}"
    );
    ensure!(
        hub_batch_total(&hub, 1)? == 11,
        "{}",
        hub_batch_total(&hub, 1)?
    );
    let m = metrics(PORT_BASE + 5)?;
    ensure!(
        metric(&m, "tally_relay_submissions_total{outcome=\"ok\"}") == 1.0
            && metric(&m, "tally_retries_total{layer=\"transport\"}") >= 3.0,
        "validator 0's metrics:\n{m}"
    );
    eprintln!(
        "batch 1 settled {took:?} after the report; proxy: {:?}",
        proxy.state().timeline()
    );

    // 2. Validator 0 killed while its submission is on the wire, restarted.
    proxy
        .state()
        .script
        .push_back(Fault::Delay(Duration::from_secs(15)));
    report(&net, "fault-prov", 22)?;
    let start = Instant::now();
    while proxy.state().broadcasts.len() < 4 {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "batch 2 never reached the proxy: {:?}\n{}",
            proxy.state().timeline(),
            relay_log(&net, 0)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    net.node("kill", 0)?;
    let killed = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    net.node("start", 0)?;
    wait_settled(&net, 1, 2, Duration::from_secs(90))?;
    let settled_after_kill = killed.elapsed();
    // Let the held copy (15 s after it arrived) reach the hub, and node 0
    // catch up.
    std::thread::sleep(
        Duration::from_secs(17).saturating_sub(proxy.state().broadcasts[3].at.elapsed()),
    );
    wait_settled(&net, 0, 2, Duration::from_secs(60))?;
    let labels = proxy.state().labels();
    ensure!(
        labels.len() >= 5 && labels[3] == "delayed",
        "validator 0 did not resubmit after its restart: {:?}\n{}",
        proxy.state().timeline(),
        relay_log(&net, 0)
    );
    ensure!(
        hub_batch_total(&hub, 2)? == 22,
        "{}",
        hub_batch_total(&hub, 2)?
    );
    ensure!(
        hub.abci_query("/batch/hub/3")?.code != 0,
        "a third batch settled"
    );
    let paid = query(&hub, "/payout/fault-prov")?["paid"]
        .as_u64()
        .unwrap_or(0);
    let paid_by_batches = [1, 2]
        .iter()
        .map(|n| query(&hub, &format!("/batch/hub/{n}")).map(|b| b["paid"].as_u64().unwrap_or(0)))
        .sum::<Result<u64>>()?;
    ensure!(
        paid == paid_by_batches,
        "provider paid {paid}, batches paid {paid_by_batches}"
    );
    eprintln!(
        "batch 2 settled {settled_after_kill:?} after validator 0 was killed; proxy: {:?}",
        proxy.state().timeline()
    );

    // 3. A deposit: credited once, only once its range is CONFIRMATIONS deep.
    net.hub_deposit("erin", 55)?;
    let balance = |i: usize| net.balance(i, "erin");
    let start = Instant::now();
    while balance(1)? == 0 {
        ensure!(
            start.elapsed() < Duration::from_secs(90),
            "deposit not credited\n{}",
            net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let tip = hub.status()?.height;
    let cursor = query(&net.rpc(1), "/sync/hub")?["hub_cursor"]
        .as_u64()
        .context("no hub_cursor")?;
    // The credited range ends at cursor - 1; it had to be CONFIRMATIONS
    // blocks under the hub's tip when the relays handed it in.
    ensure!(
        tip >= cursor - 1 + CONFIRMATIONS,
        "credited range ending at {} with the hub tip at {tip}",
        cursor - 1
    );
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..4 {
        ensure!(balance(i)? == 55, "node{i}: erin has {}", balance(i)?);
    }
    Ok(())
}

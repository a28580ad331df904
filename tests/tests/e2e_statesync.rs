//! End to end on real CometBFT: a full node joins a running 4-validator
//! localnet by state sync (`localnet/node.sh join 4`): it restores the
//! newest snapshot the validators serve instead of replaying from genesis,
//! reaches the validators' app hashes, keeps following the chain, and
//! answers (and proves) the SLA records that were reported before it
//! existed.
//!
//! Oracles: the counters are computed here from the records the test sends;
//! the app hashes are the validators'; "restored, not replayed" is
//! CometBFT's own `earliest_block_height` (1 after block sync).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde_json::Value;
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, tallyd_ok, Localnet, Options};

const PORT_BASE: u16 = 23656;
const WINDOW_SECS: u64 = 3600;
const SNAPSHOT_INTERVAL: u64 = 10;
const JOINER: usize = 4;

const TESTS: [Test<Net>; 1] = [Test {
    name: "a_full_node_joins_by_state_sync",
    needs: &[],
    run: a_full_node_joins_by_state_sync,
}];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

struct Net {
    net: Localnet,
}

impl Net {
    fn start() -> Result<Self> {
        // Five nodes' ports: the joiner's too.
        let base = free_port_base(PORT_BASE, JOINER + 1)?;
        let opts = Options {
            env: vec![(
                "TALLY_SNAPSHOT_INTERVAL".into(),
                SNAPSHOT_INTERVAL.to_string(),
            )],
            ..Options::default()
        };
        let net = Localnet::launch(4, base, "500ms", WINDOW_SECS, &opts)?;
        Ok(Self { net })
    }
}

/// `(outcome, units, amount)` of the records sent; failed calls carry no amount.
const SENT: [(&str, u64, u64); 5] = [
    ("ok", 10, 5),
    ("ok", 20, 7),
    ("transient", 3, 0),
    ("rate_limit", 4, 0),
    ("cancel", 1, 0),
];

/// What the route's record must hold, counted by hand from [`SENT`]:
/// cancel is not a failure.
const WANT: [(&str, u64); 9] = [
    ("requests", 5),
    ("ok", 2),
    ("fail_count", 2),
    ("transient", 1),
    ("rate_limit", 1),
    ("cancel", 1),
    ("client", 0),
    ("units", 38),
    ("amount", 12),
];

fn status(net: &Localnet, i: usize) -> Result<Value> {
    let v = net.rpc(i).call("status", serde_json::json!({}))?;
    Ok(v["sync_info"].clone())
}

/// The app hash in the header at `height` (that of height - 1's state).
fn header_app_hash(net: &Localnet, i: usize, height: u64) -> Result<String> {
    let v = net
        .rpc(i)
        .call("block", serde_json::json!({"height": height.to_string()}))?;
    v["block"]["header"]["app_hash"]
        .as_str()
        .map(str::to_string)
        .context("no app_hash in the header")
}

fn a_full_node_joins_by_state_sync(n: &mut Net) -> Result<()> {
    let net = &n.net;
    let dir = net.dir();
    let file = dir.join("statesync.jsonl");
    let lines: Vec<String> = SENT
        .iter()
        .map(|(o, u, a)| {
            serde_json::json!({"user": "carol", "provider": "ss-prov", "model": "org/ss-model",
                "route": "/v1/ss", "outcome": o, "units": u, "amount": a})
            .to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n")?;
    let key = dir.join("gateway.key");
    let sent = tallyd_ok(&[
        "tx",
        "report",
        "--from",
        key.to_str().context("path")?,
        "--file",
        file.to_str().context("path")?,
        "--node",
        &net.rpc_url(0),
        "--output",
        "json",
    ])?;
    let sent: Value = serde_json::from_str(sent.trim()).with_context(|| format!("{sent:?}"))?;
    let landed = sent["height"]
        .as_u64()
        .with_context(|| format!("report: {sent}"))?;
    // A snapshot taken after the report: the next multiple of the interval,
    // plus a few blocks for the validators to write it.
    let snap = (landed / SNAPSHOT_INTERVAL + 1) * SNAPSHOT_INTERVAL;
    net.wait_height(0, snap + 3, Duration::from_secs(60))?;

    let started = Instant::now();
    net.node("join", JOINER).context("localnet/node.sh join")?;
    let joined_in = started.elapsed();
    eprintln!(
        "[e2e] node{JOINER} joined by state sync in {:.1} s",
        joined_in.as_secs_f64()
    );

    let s = status(net, JOINER)?;
    ensure!(
        s["catching_up"] == Value::Bool(false),
        "still catching up: {s}"
    );
    let earliest: u64 = s["earliest_block_height"]
        .as_str()
        .and_then(|h| h.parse().ok())
        .context("earliest_block_height")?;
    ensure!(
        earliest > snap,
        "node{JOINER} holds blocks from {earliest}: it replayed instead of restoring a snapshot at or after {snap}"
    );
    let log = std::fs::read_to_string(dir.join(format!("node{JOINER}/tallyd.log")))?;
    ensure!(
        log.contains("snapshot restored"),
        "tallyd of node{JOINER} restored no snapshot"
    );

    // It follows the chain: same app hashes as a validator, a few blocks on.
    let h = net.height(JOINER);
    net.wait_height(JOINER, h + 3, Duration::from_secs(30))?;
    for height in [earliest + 1, h + 2] {
        let a = header_app_hash(net, JOINER, height)?;
        let b = header_app_hash(net, 1, height)?;
        ensure!(
            a == b,
            "app hash in header {height}: node{JOINER} {a}, node1 {b}"
        );
    }

    // It answers what was reported before it existed, with a proof that
    // verifies against a header of validator 0's chain.
    let route = [
        "--user",
        "carol",
        "--provider",
        "ss-prov",
        "--model",
        "org/ss-model",
        "--route",
        "/v1/ss",
    ];
    let mut args = vec!["query", "sla", "route"];
    args.extend(route);
    let joiner_url = net.rpc_url(JOINER);
    args.extend(["--node", &joiner_url, "--output", "json"]);
    let page: Value = serde_json::from_str(tallyd_ok(&args)?.trim())?;
    let rec = page["records"]
        .get(0)
        .or_else(|| page.get(0))
        .cloned()
        .with_context(|| format!("no record: {page}"))?;
    let window = rec["window"]
        .as_u64()
        .with_context(|| format!("window: {rec}"))?;
    for (field, want) in WANT {
        ensure!(
            rec[field].as_u64() == Some(want),
            "{field} is {}, want {want}: {rec}",
            rec[field]
        );
    }
    let trust = net.height(0).saturating_sub(1).max(1);
    let trust_hash = net
        .rpc(0)
        .call("block", serde_json::json!({"height": trust.to_string()}))?["block_id"]["hash"]
        .as_str()
        .context("block_id")?
        .to_string();
    let home = tempfile::tempdir()?;
    let window_s = window.to_string();
    let trust_s = trust.to_string();
    let mut args = vec![
        "query",
        "sla",
        "route",
        "--home",
        home.path().to_str().context("path")?,
    ];
    args.extend(route);
    args.extend([
        "--window",
        &window_s,
        "--verify",
        "--trust-height",
        &trust_s,
        "--trust-hash",
        &trust_hash,
        "--node",
        &joiner_url,
        "--output",
        "json",
    ]);
    let verified: Value = serde_json::from_str(tallyd_ok(&args)?.trim())?;
    ensure!(
        verified["verified"] == Value::Bool(true),
        "not verified: {verified}"
    );
    for (field, want) in WANT {
        ensure!(
            verified[field].as_u64() == Some(want),
            "verified {field}: {verified}"
        );
    }
    Ok(())
}

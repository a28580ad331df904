//! End to end on real CometBFT: paths issue 32 found untried, on one
//! 4-validator localnet with the hub (ports from 13656). The tests, in
//! order, each ending in an exact audit against what the test itself sent:
//!
//! 1. `allowance_grant_and_revoke_through_cometbft`: `dave` (a genesis user
//!    with a key and no credits) is funded by a hub deposit of 1,000; he
//!    grants the demo gateway 100 credits per window with the real
//!    `tallyd tx allowance grant` against validator 0's RPC. The gateway's
//!    reports through validator 1 (`tallyd tx report`): 60 lands, 41 is
//!    refused `allowance_exceeded` (25: 60 + 41 > 100), 40 lands (exactly
//!    the 100), 1 is refused 25, a failed call (amount 0) still lands at
//!    the limit (ADR 0011: the check covers failure records, and 100 + 0
//!    stays within 100). After `tallyd tx allowance revoke` the next
//!    report, charged or not, is refused `no_allowance` (24). On every
//!    validator: balance 900, the allowance's `used` 100 (then no
//!    allowance to the gateway), and the route's record exactly the three
//!    calls that landed.
//! 2. `light_client_verifies_across_a_validator_set_change`: a route record
//!    is reported and a trust root (height, header hash) taken while four
//!    validators sign; a fifth is added by the governance path of
//!    `e2e_validators.rs` (`localnet/node.sh add`, the printed propose and
//!    approvals, CometBFT then lists five and `/dkg` shows epoch 2). A
//!    `query sla route --verify` from the old root, asked of the new
//!    validator, verifies the record at a height whose header five
//!    validators sign (CometBFT's `/validators` at that height, against
//!    four at the root) with the values the test sent; with the root in a
//!    home (`tallyd light init`) the root advances past the change. Behind
//!    `tests/src/tamper.rs` (a value changed, or every header's app hash
//!    above the root), the same query fails and prints nothing.
//!
//! 3. `state_sync_join_while_a_batch_is_in_flight`: once every earlier
//!    batch settled, the hub is stopped and carol is charged 9 by
//!    `prov-ss`; the window closes and the validators sign the batch,
//!    which cannot settle. A full node joins by state sync
//!    (`localnet/node.sh join`) from a snapshot taken after the signing
//!    (CometBFT's `earliest_block_height` above it) and shows the batch
//!    signed, not settled. With the hub back the batch settles: on the
//!    joiner and on every validator it is `settled` under the same nonce,
//!    the hub paid exactly its calls' sum with no shortfall and `prov-ss`
//!    exactly 9 (once), and the joiner's app hash equals every validator's.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED),
//! built `tallyd` and `tally-hub`.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use tally_node::rpc::Rpc;
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, run_tallyd, tallyd_ok, Localnet, Options};
use tally_tests::tamper::{Tamper, TamperProxy};

/// Ports from here (validator i: +10 i, the added one +40; hub +100), or
/// the next free block.
const PORT_BASE: u16 = 13656;
/// Short windows, so that test 3's batch forms; tests 1 and 2 wait for a
/// fresh one before charges that must fall in one window.
const WINDOW_SECS: u64 = 30;
/// Snapshots every 10 blocks, for the state-sync join.
const SNAPSHOT_INTERVAL: u64 = 10;
/// Test 3's provider.
const SS_PROVIDER: &str = "prov-ss";
const SS_AMOUNT: u64 = 9;
/// Blocks per DKG phase (as e2e_validators.rs): a reshare takes ~5 s.
const PHASE_BLOCKS: &str = "3";
const GATEWAY: &str = "demo-gateway";
/// The allowance test's user and what it is funded with.
const DAVE: &str = "dave";
const DEPOSIT: u64 = 1_000;
const MAX_PER_WINDOW: u64 = 100;
/// The light-client test's route (carol has credits from up.sh).
const CAROL: &str = "carol";
const LIGHT_PROVIDER: &str = "prov-light";

const TESTS: [Test<Net>; 3] = [
    Test {
        name: "allowance_grant_and_revoke_through_cometbft",
        needs: &[],
        run: allowance_grant_and_revoke_through_cometbft,
    },
    Test {
        name: "light_client_verifies_across_a_validator_set_change",
        needs: &[],
        run: light_client_verifies_across_a_validator_set_change,
    },
    Test {
        name: "state_sync_join_while_a_batch_is_in_flight",
        needs: &[],
        run: state_sync_join_while_a_batch_is_in_flight,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture.
struct Net {
    net: Localnet,
}

impl Net {
    fn start() -> Result<Self> {
        // Six nodes' ports: the validator test 2 adds and test 3's joiner.
        let base = free_port_base(PORT_BASE, 6)?;
        let opts = Options {
            up_env: vec![("TALLY_DKG_PHASE_BLOCKS".into(), PHASE_BLOCKS.into())],
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

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let a = rpc.abci_query(path)?;
    ensure!(a.code == 0, "{path}: code {} {}", a.code, a.log);
    Ok(serde_json::from_slice(&a.value)?)
}

/// Polls `done` every 300 ms until it holds, at most `secs`.
fn wait(
    net: &Localnet,
    secs: u64,
    what: &str,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let t = Instant::now();
    let mut last = String::new();
    loop {
        match done() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if t.elapsed() > Duration::from_secs(secs) {
            bail!(
                "{what}: not after {secs} s (last error: {last})\n{}",
                net.logs_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The current settlement window, after waiting for the next one if this
/// one ends within `need` seconds (block time follows this machine's clock
/// on the localnet).
fn fresh_window(need: u64) -> u64 {
    let now = now_unix();
    let left = WINDOW_SECS - now % WINDOW_SECS;
    if left < need {
        eprintln!("[e2e] waiting {left} s for the next window");
        std::thread::sleep(Duration::from_secs(left + 3));
    }
    now_unix() / WINDOW_SECS
}

/// One record through `tallyd tx report` signed by the localnet's gateway
/// and sent to validator `node`: `(code, code_name)` of the report.
fn report(
    net: &Localnet,
    node: usize,
    user: &str,
    provider: &str,
    outcome: &str,
    amount: u64,
) -> Result<(u64, String)> {
    let key = net.dir().join("gateway.key").display().to_string();
    let (url, amount) = (net.rpc_url(node), amount.to_string());
    let out = run_tallyd(&[
        "tx",
        "report",
        "--from",
        &key,
        "--user",
        user,
        "--provider",
        provider,
        "--model",
        "org/paths",
        "--route",
        "/v1/paths",
        "--outcome",
        outcome,
        "--units",
        "2",
        "--amount",
        &amount,
        "--node",
        &url,
        "--output",
        "json",
    ])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line: Value = serde_json::from_str(text.trim()).with_context(|| {
        format!(
            "tx report printed {text:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let code = line["code"].as_u64().with_context(|| format!("{line}"))?;
    ensure!(
        out.status.success() == (code == 0),
        "exit status {} for code {code}",
        out.status
    );
    let name = line["code_name"].as_str().unwrap_or("").to_string();
    Ok((code, name))
}

/// Sends one report and checks its code.
fn expect_report(
    net: &Localnet,
    user: &str,
    provider: &str,
    outcome: &str,
    amount: u64,
    want: (u64, &str),
) -> Result<()> {
    let got = report(net, 1, user, provider, outcome, amount)?;
    ensure!(
        got.0 == want.0 && got.1 == want.1,
        "{user} {outcome} amount {amount}: code {} ({}), want {} ({})",
        got.0,
        got.1,
        want.0,
        want.1
    );
    Ok(())
}

/// `tallyd tx allowance ACTION` for dave against validator 0; its stdout.
fn allowance(net: &Localnet, action: &str, extra: &[&str]) -> Result<String> {
    let from = net.dir().join("users").join(format!("{DAVE}.key"));
    let from = from.display().to_string();
    let url = net.rpc_url(0);
    let mut args = vec![
        "tx",
        "allowance",
        action,
        "--from",
        &from,
        "--user",
        DAVE,
        "--gateway",
        GATEWAY,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--node", &url]);
    tallyd_ok(&args)
}

/// Dave's allowance to the demo gateway on validator `i` (`None` without one).
fn dave_allowance(net: &Localnet, i: usize) -> Result<(u64, Option<Value>)> {
    let a = query(&net.rpc(i), &format!("/allowances/{DAVE}"))?;
    let seq = a["sequence"].as_u64().with_context(|| format!("{a}"))?;
    let gw = a["allowances"]
        .as_array()
        .with_context(|| format!("{a}"))?
        .iter()
        .find(|x| x["gateway"] == GATEWAY)
        .cloned();
    Ok((seq, gw))
}

/// The route record of `user` at `provider` in `window` on validator `i`.
fn route_record(
    net: &Localnet,
    i: usize,
    user: &str,
    provider: &str,
    window: u64,
) -> Result<Value> {
    query(
        &net.rpc(i),
        &format!("/sla/route/{user}/{provider}/org%2Fpaths/%2Fv1%2Fpaths/{window}"),
    )
}

/// The record fields a test expects, against `rec`.
fn check_record(rec: &Value, want: &[(&str, u64)]) -> Result<()> {
    for (field, v) in want {
        ensure!(
            rec[*field].as_u64() == Some(*v),
            "{field} is {}, want {v}: {rec}",
            rec[*field]
        );
    }
    Ok(())
}

fn allowance_grant_and_revoke_through_cometbft(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let provider = "prov-allow";
    // Dave has a key and a genesis allowance, but no credits yet.
    for i in 0..4 {
        ensure!(net.balance(i, DAVE)? == 0, "dave has credits on node{i}");
    }
    net.hub_deposit(DAVE, DEPOSIT)?;
    wait(net, 90, "the deposit credited on every node", || {
        Ok((0..4)
            .map(|i| net.balance(i, DAVE))
            .collect::<Result<Vec<_>>>()?
            == [DEPOSIT; 4])
    })?;
    // All charges in one window (a grant's limit is per window).
    let window = fresh_window(25);
    let (seq0, _) = dave_allowance(net, 0)?;
    let printed = allowance(
        net,
        "grant",
        &[
            "--max-per-window",
            &MAX_PER_WINDOW.to_string(),
            "--expires-in",
            "3600",
        ],
    )?;
    ensure!(
        printed.contains(&format!("up to {MAX_PER_WINDOW} credits")),
        "grant printed {printed:?}"
    );
    for i in 0..4 {
        let h = net.height(0);
        net.wait_height(i, h, Duration::from_secs(20))?;
        let (seq, a) = dave_allowance(net, i)?;
        let a = a.context("no allowance after the grant")?;
        ensure!(
            seq == seq0 + 1,
            "node{i}: sequence {seq}, want {}",
            seq0 + 1
        );
        ensure!(
            a["max_per_window"] == MAX_PER_WINDOW && a["used"] == 0 && a["expired"] == false,
            "node{i}: {a}"
        );
    }

    const OK: (u64, &str) = (0, "ok");
    const EXCEEDED: (u64, &str) = (25, "allowance_exceeded");
    const NONE: (u64, &str) = (24, "no_allowance");
    expect_report(net, DAVE, provider, "ok", 60, OK)?;
    expect_report(net, DAVE, provider, "ok", 41, EXCEEDED)?;
    expect_report(net, DAVE, provider, "ok", 40, OK)?;
    expect_report(net, DAVE, provider, "ok", 1, EXCEEDED)?;
    expect_report(net, DAVE, provider, "transient", 0, OK)?;
    let h = net.height(1);
    for i in 0..4 {
        net.wait_height(i, h, Duration::from_secs(20))?;
        let (_, a) = dave_allowance(net, i)?;
        let a = a.context("allowance gone")?;
        ensure!(a["used"] == MAX_PER_WINDOW, "node{i}: used {a}");
    }

    allowance(net, "revoke", &[])?;
    // From the next block on, on every node (each checks a report against
    // its own committed state).
    wait(net, 20, "the revoke on every node", || {
        for i in 0..4 {
            let (seq, a) = dave_allowance(net, i)?;
            if seq != seq0 + 2 || a.is_some_and(|a| a["max_per_window"] != 0) {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    expect_report(net, DAVE, provider, "ok", 1, NONE)?;
    expect_report(net, DAVE, provider, "transient", 0, NONE)?;

    // The audit: what landed is 60 + 40 and one failed call.
    let want = [
        ("requests", 3),
        ("ok", 2),
        ("fail_count", 1),
        ("transient", 1),
        ("units", 6),
        ("amount", 100),
    ];
    let h = net.height(1);
    for i in 0..4 {
        net.wait_height(i, h, Duration::from_secs(20))?;
        ensure!(
            net.balance(i, DAVE)? == DEPOSIT - MAX_PER_WINDOW,
            "node{i}: dave's balance {}",
            net.balance(i, DAVE)?
        );
        check_record(&route_record(net, i, DAVE, provider, window)?, &want)
            .with_context(|| format!("node{i}"))?;
        let (seq, a) = dave_allowance(net, i)?;
        ensure!(seq == seq0 + 2, "node{i}: sequence {seq} after the revoke");
        if let Some(a) = a {
            ensure!(a["max_per_window"] == 0, "node{i}: still allowed: {a}");
        }
    }
    Ok(())
}

/// CometBFT's validator set size at `height` on node `i`.
fn set_size(net: &Localnet, i: usize, height: u64) -> Result<usize> {
    let v = net.rpc(i).call(
        "validators",
        serde_json::json!({"height": height.to_string(), "per_page": "100"}),
    )?;
    Ok(v["validators"].as_array().context("validators")?.len())
}

/// The hash of the header at `height` on node `i`.
fn header_hash(net: &Localnet, i: usize, height: u64) -> Result<String> {
    let v = net
        .rpc(i)
        .call("block", serde_json::json!({"height": height.to_string()}))?;
    v["block_id"]["hash"]
        .as_str()
        .map(str::to_string)
        .context("no block_id")
}

/// Runs a command line `node.sh add` printed (`tallyd tx validator ...`),
/// again for up to 5 s while the node answers "no proposal".
fn run_printed(line: &str) -> Result<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    ensure!(
        words.len() > 2 && words[0].ends_with("tallyd"),
        "not a tallyd command: {line}"
    );
    let t = Instant::now();
    loop {
        match tallyd_ok(&words[1..]) {
            Err(e)
                if e.to_string().contains("no proposal")
                    && t.elapsed() < Duration::from_secs(5) =>
            {
                std::thread::sleep(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// A verified `query sla route` must fail with `error` in its stderr and
/// print nothing.
fn refused(args: &[&str], error: &str) -> Result<()> {
    let out = run_tallyd(args)?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(!out.status.success(), "accepted: {stdout}");
    ensure!(
        stdout.trim().is_empty(),
        "printed {stdout:?} while refusing"
    );
    ensure!(
        stderr.contains(error),
        "refused without {error:?}: {stderr}"
    );
    Ok(())
}

fn light_client_verifies_across_a_validator_set_change(f: &mut Net) -> Result<()> {
    let net = &f.net;
    net.wait_for_key(Duration::from_secs(120))?;
    let window = fresh_window(12);
    // The record, as the test sends it: two calls of 3 and 4 credits.
    for amount in [3, 4] {
        let got = report(net, 0, CAROL, LIGHT_PROVIDER, "ok", amount)?;
        ensure!(got.0 == 0, "report refused: {got:?}");
    }
    let want = [
        ("requests", 2),
        ("ok", 2),
        ("fail_count", 0),
        ("units", 4),
        ("amount", 7),
    ];

    // The trust root: a header four validators signed.
    let root = net.height(0).saturating_sub(1).max(1);
    let root_hash = header_hash(net, 0, root)?;
    ensure!(
        set_size(net, 0, root)? == 4,
        "not four validators at the root"
    );

    // A fifth validator by the governance path.
    let out = net.add_node()?;
    let pk = out
        .lines()
        .find_map(|l| l.strip_prefix("consensus pubkey: "))
        .context("node.sh add printed no consensus pubkey")?
        .trim()
        .to_string();
    let propose = out
        .lines()
        .find(|l| l.contains(" tx validator propose "))
        .context("no propose command printed")?;
    run_printed(propose)?;
    let props = query(&net.rpc(0), "/proposals")?;
    let id = props["proposals"]
        .as_array()
        .context("proposals")?
        .iter()
        .filter(|p| p["pubkey"] == pk.as_str() && p["action"] == "add")
        .filter_map(|p| p["id"].as_u64())
        .max()
        .with_context(|| format!("no add proposal for {pk}: {props}"))?;
    let approvals: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(" tx validator approve "))
        .collect();
    ensure!(approvals.len() >= 2, "approve commands: {approvals:?}");
    for line in &approvals[..2] {
        run_printed(&line.replace("<proposal id>", &id.to_string()))?;
    }
    wait(net, 180, "five validators and key epoch 2", || {
        let h = net.height(0);
        Ok(set_size(net, 0, h)? == 5 && query(&net.rpc(0), "/dkg")?["epoch"] == 2)
    })?;
    let changed = net.height(0);
    net.wait_height(4, changed, Duration::from_secs(30))?;

    // Verified from the old root, asked of the new validator.
    let home = tempfile::tempdir()?;
    let home_s = home.path().display().to_string();
    let (w, root_s) = (window.to_string(), root.to_string());
    let route = |node: &str| -> Vec<String> {
        [
            "query",
            "sla",
            "route",
            "--user",
            CAROL,
            "--provider",
            LIGHT_PROVIDER,
            "--model",
            "org/paths",
            "--route",
            "/v1/paths",
            "--window",
            &w,
            "--verify",
            "--node",
            node,
            "--home",
            &home_s,
            "--output",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let trust = [
        "--trust-height",
        root_s.as_str(),
        "--trust-hash",
        root_hash.as_str(),
    ];
    let node4 = net.rpc_url(4);
    let mut args: Vec<String> = route(&node4);
    args.extend(trust.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let v: Value = serde_json::from_str(tallyd_ok(&refs)?.trim())?;
    ensure!(v["verified"] == true, "not verified: {v}");
    check_record(&v, &want)?;
    ensure!(v["window"] == window, "window {v}");
    let h = v["height"].as_u64().context("no height")?;
    ensure!(
        h >= changed,
        "verified at {h}, before the change at {changed}"
    );
    ensure!(
        set_size(net, 0, h + 1)? == 5,
        "header {} is not signed by five validators",
        h + 1
    );

    // With the root stored in the home, it advances past the change.
    let root_args = [
        "light", "init", "--height", &root_s, "--hash", &root_hash, "--node", &node4, "--home",
        &home_s,
    ];
    tallyd_ok(&root_args)?;
    let args = route(&node4);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let v: Value = serde_json::from_str(tallyd_ok(&refs)?.trim())?;
    ensure!(v["verified"] == true, "not verified from the file: {v}");
    check_record(&v, &want)?;
    let shown: Value = serde_json::from_str(
        tallyd_ok(&["light", "show", "--home", &home_s, "--output", "json"])?.trim(),
    )?;
    let advanced = shown["height"].as_u64().context("light show")?;
    ensure!(advanced > changed, "the root stayed at {advanced}: {shown}");

    // A lying node: a changed value, or every header's app hash above the
    // old root, is refused and nothing is printed.
    let upstream = net.rpc_url(4).trim_start_matches("http://").to_string();
    for (tamper, error) in [
        (Tamper::AbciValue, "proof verification failed"),
        (
            Tamper::CommitAppHashAbove(root),
            "verification failed for header",
        ),
    ] {
        let proxy = TamperProxy::start(&upstream, tamper)?;
        let mut args = route(&proxy.url());
        args.extend(trust.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&refs, error).with_context(|| format!("{tamper:?}"))?;
        ensure!(proxy.edited() > 0, "{tamper:?}: the proxy changed nothing");
    }
    // Every validator still holds the record the test sent.
    for i in 0..5 {
        check_record(&route_record(net, i, CAROL, LIGHT_PROVIDER, window)?, &want)
            .with_context(|| format!("node{i}"))?;
    }
    Ok(())
}

/// The app hash in the header at `height` on node `i`.
fn header_app_hash(net: &Localnet, i: usize, height: u64) -> Result<String> {
    let v = net
        .rpc(i)
        .call("block", serde_json::json!({"height": height.to_string()}))?;
    v["block"]["header"]["app_hash"]
        .as_str()
        .map(str::to_string)
        .context("no app_hash in the header")
}

/// The nonce and status of the batch on node `i` holding a call for
/// `provider`, if one was formed.
fn batch_of(net: &Localnet, i: usize, provider: &str) -> Result<Option<(u64, String)>> {
    let s = query(&net.rpc(i), "/sync/hub")?;
    let last = s["nonce"]
        .as_u64()
        .unwrap_or(0)
        .max(s["settled_batches"].as_u64().unwrap_or(0));
    for n in 1..=last {
        let a = net.rpc(i).abci_query(&format!("/batch/hub/{n}"))?;
        if a.code != 0 {
            continue;
        }
        let b: Value = serde_json::from_slice(&a.value)?;
        let mine = b["calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["provider"] == provider));
        if mine {
            return Ok(Some((n, b["status"].as_str().unwrap_or("").to_string())));
        }
    }
    Ok(None)
}

fn state_sync_join_while_a_batch_is_in_flight(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let hub = Rpc::new(&net.hub_rpc_url());
    // Start from a quiet pipeline: every earlier window closed and settled.
    fresh_window(WINDOW_SECS + 1);
    wait(net, 240, "every earlier batch settled", || {
        let calls = query(&net.rpc(0), "/hubcalls/hub")?;
        let s = query(&net.rpc(0), "/sync/hub")?;
        Ok(calls["calls"].as_array().is_some_and(|c| c.is_empty())
            && (s["nonce"].is_null() || s["nonce"] == s["settled_batches"]))
    })?;
    // The hub down: the batch is signed but cannot settle.
    let down = net.take_down("stop", None)?;
    fresh_window(8);
    let got = report(net, 0, CAROL, SS_PROVIDER, "ok", SS_AMOUNT)?;
    ensure!(got.0 == 0, "report refused: {got:?}");
    let mut nonce = 0;
    wait(net, 120, "the batch signed", || {
        Ok(match batch_of(net, 0, SS_PROVIDER)? {
            Some((n, st)) if st == "signed" => {
                nonce = n;
                true
            }
            Some((n, st)) => bail!("batch {n} is {st} with the hub down"),
            None => false,
        })
    })?;
    let signed_at = net.height(0);
    let snap = (signed_at / SNAPSHOT_INTERVAL + 1) * SNAPSHOT_INTERVAL;
    net.wait_height(0, snap + 3, Duration::from_secs(60))?;
    let joiner = (4..10)
        .find(|i| !net.dir().join(format!("node{i}")).exists())
        .context("no free node index")?;
    net.node("join", joiner).context("localnet/node.sh join")?;
    let st = net.rpc(joiner).call("status", serde_json::json!({}))?["sync_info"].clone();
    let earliest: u64 = st["earliest_block_height"]
        .as_str()
        .and_then(|h| h.parse().ok())
        .context("earliest_block_height")?;
    ensure!(
        earliest > signed_at,
        "node{joiner} holds blocks from {earliest}: not restored from a snapshot after {signed_at}"
    );
    // It restored the batch in flight: signed, not settled.
    ensure!(
        batch_of(net, joiner, SS_PROVIDER)? == Some((nonce, "signed".into())),
        "node{joiner}: batch {:?}",
        batch_of(net, joiner, SS_PROVIDER)?
    );
    down.now()?;
    wait(net, 240, "the batch settled on the joiner", || {
        Ok(batch_of(net, joiner, SS_PROVIDER)? == Some((nonce, "settled".into())))
    })?;
    // Settled once: the hub paid exactly the batch's calls, and the
    // provider exactly what was reported.
    let b = query(&net.rpc(joiner), &format!("/batch/hub/{nonce}"))?;
    let calls = b["calls"].as_array().context("calls")?;
    let sum: u64 = calls.iter().filter_map(|c| c["amount"].as_u64()).sum();
    let h = query(&hub, &format!("/batch/hub/{nonce}"))?;
    ensure!(
        h["paid"].as_u64() == Some(sum)
            && h["shortfall"].as_u64().unwrap_or(0) == 0
            && h["calls"].as_u64() == Some(calls.len() as u64),
        "batch {nonce}: chain {b}\nhub {h}"
    );
    let paid = query(&hub, &format!("/payout/{SS_PROVIDER}"))?["paid"].as_u64();
    ensure!(paid == Some(SS_AMOUNT), "hub paid {SS_PROVIDER} {paid:?}");
    // The same state: app hashes and the settled count on every node.
    let top = net.height(joiner);
    net.wait_height(joiner, top + 2, Duration::from_secs(30))?;
    let want = header_app_hash(net, 0, top + 1)?;
    let validators = if net.dir().join("node4").exists() && joiner != 4 {
        5
    } else {
        4
    };
    for i in (0..validators).chain([joiner]) {
        net.wait_height(i, top + 1, Duration::from_secs(30))?;
        let got = header_app_hash(net, i, top + 1)?;
        ensure!(
            got == want,
            "node{i}: app hash {got} at {}, node0 {want}",
            top + 1
        );
        let s = query(&net.rpc(i), "/sync/hub")?;
        ensure!(s["settled_batches"].as_u64() >= Some(nonce), "node{i}: {s}");
        ensure!(
            batch_of(net, i, SS_PROVIDER)? == Some((nonce, "settled".into())),
            "node{i}: batch"
        );
    }
    Ok(())
}

//! Verified queries end to end on real CometBFT: four validators on
//! loopback (one localnet shared by the named tests below, run in order by
//! `tally_tests::harness`), a usage report landed through RPC, then
//! `tallyd light init` and `tallyd query ... --verify`:
//!
//! 1. `verified_queries_show_what_was_reported`: `sla route --window W`,
//!    `balance` and `sla totals` with `--verify` print exactly what the
//!    report implies (the test's own arithmetic, not the node's), with
//!    `"verified": true` and the height; absent keys are proven absent; the
//!    trust root advances; a root given by flags works as well;
//! 2. `tampered_values_are_refused`: behind a proxy that changes the value
//!    of `/abci_query` answers, the unverified `sla totals` prints the lie
//!    and every `--verify` query fails, printing nothing;
//! 3. `tampered_headers_are_refused`: behind a proxy that changes the app
//!    hash of `/commit` headers above the trust root, `--verify` fails at
//!    header verification; changing every header fails at the trust root;
//! 4. `a_wrong_trust_root_is_refused`: a trust hash that is not the
//!    chain's header fails.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED,
//! failed with `TALLY_E2E_REQUIRED`) and built `tallyd` and `tally-hub`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tally_node::records::build_report;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, run_tallyd, tallyd_ok, Localnet};
use tally_tests::tamper::{Tamper, TamperProxy};

/// Ports from here, or the next free block; below the ephemeral range.
const PORT_BASE: u16 = 27656;
/// Long windows: the report's records stay in one open window.
const WINDOW_SECS: u64 = 3600;

const USER: &str = "carol";
const PROVIDER: &str = "proof-prov";
const MODEL: &str = "org/proof-model";
const ROUTE: &str = "/v1/proof";
/// What up.sh deposits for carol.
const FUNDED: u64 = 1_000_000;

const TESTS: [Test<Net>; 4] = [
    Test {
        name: "verified_queries_show_what_was_reported",
        needs: &[],
        run: verified_queries_show_what_was_reported,
    },
    Test {
        name: "tampered_values_are_refused",
        needs: &["verified_queries_show_what_was_reported"],
        run: tampered_values_are_refused,
    },
    Test {
        name: "tampered_headers_are_refused",
        needs: &["verified_queries_show_what_was_reported"],
        run: tampered_headers_are_refused,
    },
    Test {
        name: "a_wrong_trust_root_is_refused",
        needs: &["verified_queries_show_what_was_reported"],
        run: a_wrong_trust_root_is_refused,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture.
struct Net {
    net: Localnet,
    key: SigningKey,
    chain_id: String,
    /// `tallyd --home` for the light client's trust file.
    home: tempfile::TempDir,
    /// The report's window, once landed.
    window: Option<u64>,
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
            home: tempfile::tempdir()?,
            window: None,
        })
    }

    fn home(&self) -> &Path {
        self.home.path()
    }

    fn window(&self) -> Result<u64> {
        self.window.context("no report landed")
    }
}

/// What the report sends: (outcome, amount), 10 units each.
const PLAN: [(Outcome, u64); 4] = [
    (Outcome::Ok, 5),
    (Outcome::Ok, 7),
    (Outcome::Transient, 0),
    (Outcome::Client, 2),
];

/// The counters the plan must give, computed here:
/// requests, ok, fail_count, transient, client, units, amount.
const WANT: [(&str, u64); 7] = [
    ("requests", 4),
    ("ok", 2),
    ("fail_count", 1),
    ("transient", 1),
    ("client", 1),
    ("units", 40),
    ("amount", 14),
];

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs tallyd with `--output json`; the JSON it prints.
fn ok_json(args: &[&str]) -> Result<Value> {
    let mut a = args.to_vec();
    a.extend(["--output", "json"]);
    let s = tallyd_ok(&a)?;
    serde_json::from_str(s.trim()).with_context(|| format!("tallyd {args:?} printed {s:?}"))
}

/// Runs tallyd, which must fail with `needle` in its error and print
/// nothing on stdout; the error.
fn refused(args: &[&str], needle: &str) -> Result<String> {
    let out = run_tallyd(args)?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(!out.status.success(), "tallyd {args:?} succeeded: {stdout}");
    ensure!(
        stdout.trim().is_empty(),
        "tallyd {args:?} failed but printed {stdout:?}"
    );
    ensure!(
        stderr.contains(needle),
        "tallyd {args:?}: expected {needle:?} in {stderr:?}"
    );
    Ok(stderr.into_owned())
}

/// `v` has the plan's counters.
fn check_counters(what: &str, v: &Value) -> Result<()> {
    for (field, want) in WANT {
        ensure!(
            v[field].as_u64() == Some(want),
            "{what}: {field} is {}, want {want}: {v}",
            v[field]
        );
    }
    for field in ["rate_limit", "auth", "unknown", "cancel"] {
        ensure!(v[field].as_u64() == Some(0), "{what}: {field}: {v}");
    }
    Ok(())
}

fn route_args<'a>(window: &'a str, node: &'a str, home: &'a str) -> Vec<&'a str> {
    vec![
        "query",
        "sla",
        "route",
        "--user",
        USER,
        "--provider",
        PROVIDER,
        "--model",
        MODEL,
        "--route",
        ROUTE,
        "--window",
        window,
        "--node",
        node,
        "--home",
        home,
    ]
}

/// A header's hash as another validator reports it (the operator's
/// "source they trust" in these tests): `block_id.hash` of its `/commit`,
/// once it has that block.
fn header_hash(net: &Localnet, i: usize, height: u64) -> Result<String> {
    net.wait_height(i, height, Duration::from_secs(30))?;
    let r = net.rpc(i).call(
        "commit",
        serde_json::json!({ "height": height.to_string() }),
    )?;
    r["signed_header"]["commit"]["block_id"]["hash"]
        .as_str()
        .map(str::to_string)
        .context("no block_id hash in /commit")
}

fn verified_queries_show_what_was_reported(f: &mut Net) -> Result<()> {
    let recs: Vec<UsageRecord> = PLAN
        .iter()
        .map(|(o, amount)| UsageRecord {
            user: USER.into(),
            provider: PROVIDER.into(),
            model: MODEL.into(),
            route: ROUTE.into(),
            outcome: *o as i32,
            units: 10,
            amount: *amount,
            ..Default::default()
        })
        .collect();
    let built = build_report(&f.key, &f.chain_id, recs, now() + 300);
    let r = f.net.rpc(0).broadcast_tx_commit(&built.tx)?;
    ensure!(r.final_code() == 0, "report refused: {}", r.final_log());
    let landed = r.height;
    // Its window, from another node's (unverified) listing, once that node
    // applied the block (its block store is ahead of its state by up to one
    // block: wait for the next one).
    f.net.wait_height(1, landed + 1, Duration::from_secs(30))?;
    let a = f.net.rpc(1).abci_query(&format!("/sla/user/{USER}"))?;
    let listing: Value = serde_json::from_slice(&a.value)?;
    let window = listing["records"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["provider"] == PROVIDER))
        .and_then(|r| r["window"].as_u64())
        .with_context(|| format!("no record of {PROVIDER} in {listing}"))?;
    f.window = Some(window);

    let node = f.net.rpc_url(0);
    let home = f.home().display().to_string();
    // The trust root: node 0's latest header, checked against node 2's.
    let init = tallyd_ok(&["light", "init", "--node", &node, "--home", &home])?;
    let field = |name: &str| {
        init.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map(str::to_string)
            .with_context(|| format!("no {name} in {init:?}"))
    };
    let root_height: u64 = field("height")?.parse()?;
    let root_hash = field("hash")?;
    ensure!(field("chain_id")? == f.chain_id, "{init}");
    ensure!(
        init.contains("compare"),
        "init must ask for a comparison: {init}"
    );
    ensure!(
        header_hash(&f.net, 2, root_height)? == root_hash,
        "node 2 disagrees on header {root_height}"
    );
    ensure!(
        refused(
            &["light", "init", "--node", &node, "--home", &home],
            "--force"
        )
        .is_ok(),
        "a second init replaced the root"
    );

    let w = window.to_string();
    let v = ok_json(&[&route_args(&w, &node, &home)[..], &["--verify"]].concat())?;
    check_counters("route --verify", &v)?;
    ensure!(v["verified"] == true && v["window"] == window, "{v}");
    let h = v["height"].as_u64().context("no height")?;
    ensure!(
        h >= landed,
        "verified at {h}, the report landed at {landed}"
    );
    ensure!(
        v["user"] == USER && v["model"] == MODEL && v["route"] == ROUTE,
        "{v}"
    );
    ensure!(v["window_start"].as_str().is_some(), "{v}");

    let bal = |extra: &[&str]| -> Result<Value> {
        ok_json(
            &[
                &[
                    "query", "balance", "--user", USER, "--node", &node, "--home", &home,
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    let v = bal(&["--verify"])?;
    ensure!(
        v["balance"].as_u64() == Some(FUNDED - 14) && v["verified"] == true,
        "balance --verify: {v}"
    );
    ensure!(
        v["user"] == USER && v["height"].as_u64() >= Some(landed),
        "{v}"
    );
    // The unverified query agrees and has no verification fields.
    let plain = bal(&[])?;
    ensure!(
        plain["balance"] == v["balance"] && plain.get("verified").is_none(),
        "{plain}"
    );

    for (flag, name) in [("--provider", PROVIDER), ("--user", USER)] {
        let args = [
            "query", "sla", "totals", flag, name, "--window", &w, "--node", &node, "--home", &home,
        ];
        let v = ok_json(&[&args[..], &["--verify"]].concat())?;
        check_counters(&format!("totals {flag}"), &v)?;
        ensure!(v["routes"] == 1 && v["verified"] == true, "{v}");
        let plain = ok_json(&args)?;
        check_counters(&format!("totals {flag} unverified"), &plain)?;
        ensure!(plain["verified"] == false, "{plain}");
    }

    // Absent keys are proven absent.
    let other = (window + 1000).to_string();
    let e = refused(
        &[&route_args(&other, &node, &home)[..], &["--verify"]].concat(),
        "not_found",
    )?;
    ensure!(e.contains(", verified)"), "{e}");
    let v = ok_json(&[
        "query",
        "balance",
        "--user",
        "nobody-here",
        "--verify",
        "--node",
        &node,
        "--home",
        &home,
    ])?;
    ensure!(v["balance"] == 0 && v["verified"] == true, "{v}");
    let v = ok_json(&[
        "query",
        "sla",
        "totals",
        "--provider",
        "nobody-here",
        "--window",
        &w,
        "--verify",
        "--node",
        &node,
        "--home",
        &home,
    ])?;
    ensure!(
        v["routes"] == 0 && v["amount"] == 0 && v["verified"] == true,
        "{v}"
    );

    // A table says what was verified.
    let table = tallyd_ok(&[
        "query", "balance", "--user", USER, "--verify", "--node", &node, "--home", &home,
    ])?;
    ensure!(
        table.contains(&format!("balance: {}", FUNDED - 14))
            && table.contains("verified: state at height"),
        "{table}"
    );

    // The trust root moved up to a verified header.
    let shown = ok_json(&["light", "show", "--home", &home])?;
    let moved = shown["height"].as_u64().context("no height")?;
    ensure!(
        moved > root_height,
        "trust root still at {root_height}: {shown}"
    );
    ensure!(
        shown["hash"].as_str() == Some(header_hash(&f.net, 3, moved)?.as_str()),
        "the advanced root is not node 3's header {moved}: {shown}"
    );

    // A root given by flags, with no trust file (another home), on node 1.
    let empty = tempfile::tempdir()?;
    let node1 = f.net.rpc_url(1);
    let args = [
        "query",
        "balance",
        "--user",
        USER,
        "--verify",
        "--trust-height",
        &root_height.to_string(),
        "--trust-hash",
        &root_hash,
        "--node",
        &node1,
        "--home",
        &empty.path().display().to_string(),
    ]
    .map(str::to_string);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = ok_json(&args)?;
    ensure!(v["balance"].as_u64() == Some(FUNDED - 14), "{v}");
    ensure!(
        std::fs::read_dir(empty.path())?.next().is_none(),
        "a root from flags must not be stored"
    );
    // Without either, --verify says what to do.
    refused(
        &[
            "query",
            "balance",
            "--user",
            USER,
            "--verify",
            "--node",
            &node1,
            "--home",
            &empty.path().display().to_string(),
        ],
        "tallyd light init",
    )?;
    Ok(())
}

fn upstream(net: &Localnet, i: usize) -> String {
    net.rpc_url(i).trim_start_matches("http://").to_string()
}

fn tampered_values_are_refused(f: &mut Net) -> Result<()> {
    let proxy = TamperProxy::start(&upstream(&f.net, 0), Tamper::AbciValue)?;
    let (node, home, w) = (
        proxy.url(),
        f.home().display().to_string(),
        f.window()?.to_string(),
    );
    // Without --verify the lie is printed: the proxy works.
    let v = ok_json(&[
        "query",
        "sla",
        "totals",
        "--provider",
        PROVIDER,
        "--window",
        &w,
        "--node",
        &node,
        "--home",
        &home,
    ])?;
    ensure!(
        v["routes"] != 1 && v["verified"] == false,
        "the proxy changed nothing: {v}"
    );
    // With --verify it is refused and nothing is printed.
    let before = proxy.edited();
    refused(
        &[&route_args(&w, &node, &home)[..], &["--verify"]].concat(),
        "proof verification failed",
    )?;
    refused(
        &[
            "query", "balance", "--user", USER, "--verify", "--node", &node, "--home", &home,
        ],
        "proof verification failed",
    )?;
    refused(
        &[
            "query", "sla", "totals", "--user", USER, "--window", &w, "--verify", "--node", &node,
            "--home", &home,
        ],
        "proof verification failed",
    )?;
    ensure!(
        proxy.edited() >= before + 3,
        "the proxy edited {} answers",
        proxy.edited()
    );
    Ok(())
}

fn tampered_headers_are_refused(f: &mut Net) -> Result<()> {
    // A root from flags: node 0's current header, read directly.
    let root = f.net.rpc(0).status()?.height;
    let root_hash = header_hash(&f.net, 0, root)?;
    let (home, w) = (f.home().display().to_string(), f.window()?.to_string());
    let root_s = root.to_string();
    let trust = [
        "--verify",
        "--trust-height",
        &root_s,
        "--trust-hash",
        &root_hash,
    ];
    // Headers above the root lie about the app hash.
    let proxy = TamperProxy::start(&upstream(&f.net, 0), Tamper::CommitAppHashAbove(root))?;
    let node = proxy.url();
    refused(
        &[&route_args(&w, &node, &home)[..], &trust].concat(),
        "verification failed for header",
    )?;
    refused(
        &[
            &[
                "query", "balance", "--user", USER, "--node", &node, "--home", &home,
            ][..],
            &trust,
        ]
        .concat(),
        "verification failed for header",
    )?;
    ensure!(proxy.edited() > 0, "the proxy changed no header");
    // Every header lies: the trust root itself no longer matches.
    let all = TamperProxy::start(&upstream(&f.net, 0), Tamper::CommitAppHashAbove(0))?;
    let node = all.url();
    refused(
        &[
            &[
                "query", "balance", "--user", USER, "--node", &node, "--home", &home,
            ][..],
            &trust,
        ]
        .concat(),
        "trust root mismatch",
    )?;
    // The same queries straight to the node pass (the root is good).
    let v = ok_json(
        &[
            &[
                "query",
                "balance",
                "--user",
                USER,
                "--node",
                &f.net.rpc_url(0),
                "--home",
                &home,
            ][..],
            &trust,
        ]
        .concat(),
    )?;
    ensure!(v["verified"] == true, "{v}");
    Ok(())
}

fn a_wrong_trust_root_is_refused(f: &mut Net) -> Result<()> {
    let root = f.net.rpc(2).status()?.height.saturating_sub(2).max(1);
    let good = header_hash(&f.net, 2, root)?;
    // Another 32-byte hash: the first hex digit changed.
    let bad = format!(
        "{}{}",
        if good.starts_with('0') { "1" } else { "0" },
        &good[1..]
    );
    let (node, home) = (f.net.rpc_url(2), f.home().display().to_string());
    let root_s = root.to_string();
    refused(
        &[
            "query",
            "balance",
            "--user",
            USER,
            "--verify",
            "--trust-height",
            &root_s,
            "--trust-hash",
            &bad,
            "--node",
            &node,
            "--home",
            &home,
        ],
        "trust root mismatch",
    )?;
    // The same via the trust file: `light init --height --hash` refuses it.
    let other = tempfile::tempdir()?;
    let other_home = other.path().display().to_string();
    refused(
        &[
            "light",
            "init",
            "--height",
            &root_s,
            "--hash",
            &bad,
            "--node",
            &node,
            "--home",
            &other_home,
        ],
        "trust root mismatch",
    )?;
    tallyd_ok(&[
        "light",
        "init",
        "--height",
        &root_s,
        "--hash",
        &good,
        "--node",
        &node,
        "--home",
        &other_home,
    ])?;
    let v = ok_json(&[
        "query",
        "balance",
        "--user",
        USER,
        "--verify",
        "--node",
        &node,
        "--home",
        &other_home,
    ])?;
    ensure!(v["balance"].as_u64() == Some(FUNDED - 14), "{v}");
    Ok(())
}

//! End to end with a full disk (real CometBFT on loopback, four validators
//! and the reference hub). Validator 3's tallyd keeps everything it writes
//! (the RocksDB store `data/tally.db`, the snapshot directory
//! `data/snapshots`, the DKG's round keys and epoch share files in
//! `data/`) on a tmpfs of 48 MiB mounted over its `data/`; CometBFT's own
//! files (block store, state, WAL, signing state) are moved beside it onto
//! the ordinary disk (`cometbft-data/`, named in its `config.toml`), so the
//! fault lands on tallyd's writes and not on CometBFT's. Validator 3's app
//! runs under a small wrapper that appends each exit status of `tallyd` to
//! `tallyd.exits` in its home (a process started by `localnet/node.sh` is
//! not the test's child, so its status would be lost otherwise). The
//! tests, in order:
//!
//! 1. `full_disk_stops_tallyd_with_the_store_code_and_it_recovers`: a
//!    ballast file fills the tmpfs until `write` answers ENOSPC; the chain
//!    goes on committing on validators 0-2 (reports land, heights move)
//!    while validator 3's tallyd exits with 3 (`HaltReason::StoreFailure`)
//!    after a FATAL line naming the failed write; once the ballast is
//!    removed and the node started again it opens its store (no second
//!    exit), catches up, and its app hash at its last height equals the
//!    header validator 0 holds for that height. `TALLY_DISK_CYCLES` (default
//!    1; `scripts/faults.sh` runs 3) repeats the fill and the recovery.
//! 2. `the_exit_codes_are_what_the_shipped_unit_expects`: systemd is not
//!    PID 1 here, so the unit cannot really run; instead the statuses the
//!    wrapper recorded are read against `deploy/systemd/tallyd.service`
//!    parsed here: the full-disk exit is listed in
//!    `RestartPreventExitStatus` (not restarted: the operator must free
//!    space first), the ordinary stop is a SIGTERM death, which
//!    `Restart=on-failure` does not restart either, and no other status
//!    was seen.
//! 3. `books_are_exact_on_every_node_and_the_hub`: once every window the
//!    test billed is paid, every validator shows the route record, the
//!    provider's owed total and the user's balance the test's own sums
//!    give, and the hub paid each nonce once, the provider exactly what
//!    was billed, and holds the deposit less the charges in escrow.
//!
//! Needs root (to mount a tmpfs: without it the tests are SKIPPED, as there
//! is no other way to get a real ENOSPC from the kernel), `cometbft` on
//! PATH and built `tallyd` and `tally-hub`. Seen failing: the first run's
//! audit read the chain's settled count before the chain had counted the
//! hub's last payment (the wait is in test 3 now). Seen failing, each with
//! its protection removed (then reverted): with validator 3's `tallyd`
//! behind a wrapper (`TALLYD=`) that turns its exit 3 into 1, as a
//! binary that dies on the failed write without its halt code would,
//! test 1 failed with `tallyd exited with 1 on a full disk, not 3`; with
//! the unit's text read without the 3 in `RestartPreventExitStatus` (a
//! throwaway edit of this file), test 2 failed with `tallyd exits 3 on a
//! full disk, which RestartPreventExitStatus={2, 4} would restart in a
//! loop`; with one report of 3 records sent at the start of test 3 and
//! left out of the books, test 3 failed with `node0: records [..]
//! against sent requests 21 units 42 amount 147` (the records held 24).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use serde_json::Value;
use tally_node::records::build_report;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_settlement::RouteRecordView;
use tally_store::halt::HaltReason;
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, repo_root, tallyd_path, Localnet, Options};
use tally_tests::smallfs::{self, fill, SmallFs};

const PORT_BASE: u16 = 14656;
const WINDOW_SECS: u64 = 10;
/// The validator whose tallyd writes to the small filesystem.
const VICTIM: usize = 3;
const USER: &str = "dave";
const PROVIDER: &str = "disk-prov";
const DEPOSIT: u64 = 100_000;
/// Size of the tmpfs: room for the store and snapshots of a young chain.
const FS_SIZE: &str = "48m";

const TESTS: [Test<Net>; 3] = [
    Test {
        name: "full_disk_stops_tallyd_with_the_store_code_and_it_recovers",
        needs: &[],
        run: full_disk_stops_tallyd_with_the_store_code_and_it_recovers,
    },
    Test {
        name: "the_exit_codes_are_what_the_shipped_unit_expects",
        needs: &["full_disk_stops_tallyd_with_the_store_code_and_it_recovers"],
        run: the_exit_codes_are_what_the_shipped_unit_expects,
    },
    Test {
        name: "books_are_exact_on_every_node_and_the_hub",
        needs: &["full_disk_stops_tallyd_with_the_store_code_and_it_recovers"],
        run: books_are_exact_on_every_node_and_the_hub,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// What the test sent: one route (USER, PROVIDER, "m", "r").
#[derive(Default)]
struct Books {
    requests: u64,
    units: u64,
    amount: u64,
}

/// The fixture. Field order is drop order: the mount is detached (lazily,
/// so it never fails for a busy file) before the network stops and its
/// directory is removed.
struct Net {
    mount: Option<SmallFs>,
    net: Localnet,
    /// The wrapper's directory, kept until validator 3 has stopped.
    _wrapper: tempfile::TempDir,
    books: Books,
    /// Full-disk exits seen by test 1.
    halts: u32,
}

/// Runs the real tallyd, forwards SIGTERM/SIGINT to it, and appends its
/// exit status to `<home>/tallyd.exits`.
const WRAPPER: &str = r#"#!/usr/bin/env bash
home=""; prev=""
for a in "$@"; do [ "$prev" = --home ] && home="$a"; prev="$a"; done
"$TALLY_REAL_TALLYD" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
while :; do
  wait "$child"; rc=$?
  kill -0 "$child" 2>/dev/null || break
done
echo "$rc" >>"$home/tallyd.exits"
exit "$rc"
"#;

impl Net {
    fn start() -> Result<Self> {
        if !smallfs::is_root() {
            return Err(harness::skip(
                "needs root to mount a small tmpfs (the only way to a real ENOSPC)",
            ));
        }
        let base = free_port_base(PORT_BASE, 4)?;
        let wrapper_dir = tempfile::Builder::new().prefix("tally-disk-").tempdir()?;
        let wrapper = wrapper_dir.path().join("tallyd-exits");
        std::fs::write(&wrapper, WRAPPER)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        let opts = Options {
            up_env: Vec::new(),
            env: vec![
                ("TALLY_SNAPSHOT_INTERVAL".into(), "10".into()),
                (
                    "TALLY_REAL_TALLYD".into(),
                    tallyd_path()?.display().to_string(),
                ),
            ],
            node_bins: vec![(VICTIM, wrapper.clone())],
            ..Options::default()
        };
        let net = Localnet::launch(4, base, "500ms", WINDOW_SECS, &opts)?;
        net.wait_for_key(Duration::from_secs(180))?;
        Ok(Self {
            mount: None,
            net,
            _wrapper: wrapper_dir,
            books: Books::default(),
            halts: 0,
        })
    }

    fn home(&self) -> PathBuf {
        self.net.dir().join(format!("node{VICTIM}"))
    }

    fn exits(&self) -> Vec<i32> {
        std::fs::read_to_string(self.home().join("tallyd.exits"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Sends one report of 3 `ok` records (2 units, 7 credits each) through
    /// validator 0 and adds it to the books once committed.
    fn report(&mut self) -> Result<()> {
        let net = &self.net;
        let key = net.gateway_key()?;
        let chain_id = net.rpc(0).status()?.chain_id;
        let rec = UsageRecord {
            user: USER.into(),
            provider: PROVIDER.into(),
            model: "m".into(),
            route: "r".into(),
            outcome: Outcome::Ok as i32,
            units: 2,
            amount: 7,
            ..Default::default()
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let tx = build_report(&key, &chain_id, vec![rec; 3], now + 300).tx;
        let r = net.rpc(0).broadcast_tx_commit(&tx)?;
        ensure!(r.final_code() == 0, "report refused: {}", r.final_log());
        self.books.requests += 3;
        self.books.units += 6;
        self.books.amount += 21;
        Ok(())
    }
}

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let r = rpc.abci_query(path)?;
    ensure!(r.code == 0, "{path}: code {} {}", r.code, r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

fn wait_for(what: &str, budget: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    loop {
        if done().unwrap_or(false) {
            return Ok(());
        }
        ensure!(start.elapsed() < budget, "{what}: not within {budget:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Puts validator 3's tallyd data on the small filesystem.
fn move_onto_small_fs(f: &mut Net) -> Result<()> {
    f.mount = Some(smallfs::move_tallyd_data(&f.net, VICTIM, FS_SIZE)?);
    Ok(())
}

fn full_disk_stops_tallyd_with_the_store_code_and_it_recovers(f: &mut Net) -> Result<()> {
    f.net.hub_deposit(USER, DEPOSIT)?;
    wait_for(
        "the deposit credited on every node",
        Duration::from_secs(120),
        || Ok((0..4).all(|i| f.net.balance(i, USER).ok() == Some(DEPOSIT))),
    )?;
    for _ in 0..3 {
        f.report()?;
    }
    move_onto_small_fs(f)?;
    let cycles: u32 = std::env::var("TALLY_DISK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for cycle in 1..=cycles {
        full_disk_cycle(f, cycle)?;
    }
    Ok(())
}

fn full_disk_cycle(f: &mut Net, cycle: u32) -> Result<()> {
    let data = f.home().join("data");
    let exits_before = f.exits().len();
    let filled = fill(&data)?;
    eprintln!("cycle {cycle}: tmpfs full after {filled} bytes of ballast");
    let full_at = f.net.height(0);
    // Reports keep landing through validator 0; validator 3's tallyd must
    // exit on its own.
    let start = Instant::now();
    while f.exits().len() == exits_before {
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "validator {VICTIM}'s tallyd did not exit on a full disk\n{}",
            f.net.logs_tail()
        );
        f.report()?;
        std::thread::sleep(Duration::from_millis(500));
    }
    let code = *f.exits().last().context("no exit recorded")?;
    ensure!(
        code == HaltReason::StoreFailure.exit_code(),
        "tallyd exited with {code} on a full disk, not {}\n{}",
        HaltReason::StoreFailure.exit_code(),
        f.net.logs_tail()
    );
    let log = std::fs::read_to_string(f.home().join("tallyd.log"))?;
    ensure!(
        log.lines()
            .any(|l| l.contains("FATAL") && l.contains("No space left on device")),
        "no FATAL line naming ENOSPC in validator {VICTIM}'s log"
    );
    f.halts += 1;
    // The other three go on: heights move and reports land.
    let h = f.net.height(0);
    for _ in 0..3 {
        f.report()?;
    }
    f.net.wait_height(1, h + 5, Duration::from_secs(60))?;
    ensure!(f.net.height(2) > full_at, "validator 2 stopped too");
    // The operator frees space and starts the node again.
    std::fs::remove_file(data.join("ballast"))?;
    f.net.node("stop", VICTIM)?;
    let exits = f.exits().len();
    f.net.node("start", VICTIM)?;
    let h = f.net.height(0);
    f.net.wait_height(VICTIM, h + 2, Duration::from_secs(120))?;
    ensure!(
        f.exits().len() == exits,
        "tallyd exited again after the restart: {:?}\n{}",
        f.exits(),
        f.net.logs_tail()
    );
    f.net.app_hash_agrees(VICTIM, 0)?;
    eprintln!(
        "cycle {cycle}: exit {code}, restarted and caught up at height {}",
        f.net.height(VICTIM)
    );
    Ok(())
}

/// `(Restart=, RestartPreventExitStatus=)` of a unit file's text.
fn restart_policy(unit: &str) -> Result<(String, BTreeSet<i32>)> {
    let mut restart = None;
    let mut prevent = BTreeSet::new();
    let mut in_service = false;
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        let Some((k, v)) = line.split_once('=').filter(|_| in_service) else {
            continue;
        };
        match k.trim() {
            "Restart" => restart = Some(v.trim().to_string()),
            "RestartPreventExitStatus" => {
                for w in v.split_whitespace() {
                    prevent.insert(w.parse().with_context(|| format!("status {w:?}"))?);
                }
            }
            _ => {}
        }
    }
    Ok((restart.context("no Restart= in [Service]")?, prevent))
}

fn the_exit_codes_are_what_the_shipped_unit_expects(f: &mut Net) -> Result<()> {
    let unit = std::fs::read_to_string(repo_root().join("deploy/systemd/tallyd.service"))?;
    let (restart, prevent) = restart_policy(&unit)?;
    ensure!(
        restart == "on-failure",
        "Restart={restart}: the statuses below assume on-failure"
    );
    let exits = f.exits();
    ensure!(f.halts > 0, "no full-disk exit was seen");
    let sigterm = 128 + 15;
    let full: Vec<i32> = exits.iter().copied().filter(|c| *c != sigterm).collect();
    ensure!(
        full.len() == f.halts as usize,
        "statuses seen: {exits:?} ({} full-disk halts)",
        f.halts
    );
    for code in &full {
        ensure!(
            prevent.contains(code),
            "tallyd exits {code} on a full disk, which RestartPreventExitStatus={prevent:?} would restart in a loop"
        );
    }
    // A stop is a death by SIGTERM, a clean end for Restart=on-failure;
    // a crash (any other signal, or status 1) is restarted: neither is in
    // the list.
    ensure!(
        exits.contains(&sigterm) && !prevent.contains(&1),
        "statuses seen: {exits:?}; RestartPreventExitStatus={prevent:?}"
    );
    eprintln!("statuses seen: {exits:?}; RestartPreventExitStatus={prevent:?}");
    Ok(())
}

fn records(rpc: &Rpc) -> Result<Vec<RouteRecordView>> {
    let v = query(rpc, &format!("/sla/provider/{PROVIDER}?limit=1000"))?;
    ensure!(
        v["next_cursor"].as_str().unwrap_or_default().is_empty(),
        "more than one page"
    );
    Ok(serde_json::from_value(v["records"].clone())?)
}

fn books_are_exact_on_every_node_and_the_hub(f: &mut Net) -> Result<()> {
    let (net, b) = (&f.net, &f.books);
    let hub = Rpc::new(&net.hub_rpc_url());
    let paid = |p: &str| -> Result<u64> {
        Ok(query(&hub, &format!("/payout/{p}"))?["paid"]
            .as_u64()
            .unwrap_or(0))
    };
    wait_for(
        "every billed credit paid on the hub",
        Duration::from_secs(180),
        || Ok(paid(PROVIDER)? >= b.amount),
    )?;
    let top = (0..4).map(|i| net.height(i)).max().unwrap_or(0);
    for i in 0..4 {
        net.wait_height(i, top + 1, Duration::from_secs(60))?;
        let recs = records(&net.rpc(i))?;
        let sum = |g: fn(&RouteRecordView) -> u64| recs.iter().map(g).sum::<u64>();
        ensure!(
            recs.iter()
                .all(|r| r.user == USER && r.model == "m" && r.route == "r"),
            "node{i}: records of other routes: {recs:?}"
        );
        ensure!(
            (
                sum(|r| r.requests),
                sum(|r| r.ok),
                sum(|r| r.units),
                sum(|r| r.amount)
            ) == (b.requests, b.requests, b.units, b.amount),
            "node{i}: records {:?} against sent requests {} units {} amount {}",
            recs,
            b.requests,
            b.units,
            b.amount
        );
        ensure!(
            net.balance(i, USER)? == DEPOSIT - b.amount,
            "node{i}: balance {} against {}",
            net.balance(i, USER)?,
            DEPOSIT - b.amount
        );
    }
    ensure!(paid(PROVIDER)? == b.amount, "hub paid {}", paid(PROVIDER)?);
    let escrow = query(&hub, &format!("/escrow/{USER}"))?["escrow"]
        .as_u64()
        .unwrap_or(0);
    ensure!(escrow == DEPOSIT - b.amount, "hub escrow {escrow}");
    // Every nonce the chain settled is paid once on the hub, the batches
    // summing to the provider's payout.
    let last = query(&hub, "/last_nonce/hub")?["last_nonce"]
        .as_u64()
        .unwrap_or(0);
    let mut by_batches = 0;
    for n in 1..=last {
        by_batches += query(&hub, &format!("/batch/hub/{n}"))?["paid"]
            .as_u64()
            .unwrap_or(0);
    }
    ensure!(
        by_batches == b.amount,
        "batches 1..={last} paid {by_batches}"
    );
    // The chain counts a batch settled a few blocks after the hub paid it.
    wait_for(
        "every validator counting the hub's batches settled",
        Duration::from_secs(90),
        || {
            Ok((0..4).all(|i| {
                query(&net.rpc(i), "/sync/hub")
                    .is_ok_and(|s| s["settled_batches"].as_u64() == Some(last))
            }))
        },
    )?;
    eprintln!(
        "books: {} requests, {} credits billed and paid in {last} batches",
        b.requests, b.amount
    );
    Ok(())
}

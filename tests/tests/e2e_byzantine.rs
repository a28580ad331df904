//! End to end with a byzantine validator on real CometBFT: four validators
//! and the hub chain on loopback, validator 3 running the test-only
//! `tallyd-byzantine` (cargo feature `byzantine` of tally-node, never in a
//! default build), whose vote extensions misbehave. One localnet is shared
//! by the named tests below, which run in this order (the runner is
//! `tally_tests::harness`):
//!
//! 1. `default_tallyd_has_no_byzantine_code`: the `tallyd` the other
//!    validators run does not contain the byzantine wrapper;
//! 2. `foreign_index_extensions_rejected_chain_commits`: validator 3 sends
//!    well-formed partials signed with a junk key under the other
//!    validators' share indices (`foreign-index`); every honest node
//!    rejects them in VerifyVoteExtension: its
//!    `tally_vote_extensions_rejected_total{reason="foreign_index"}` on
//!    `/metrics` rises by at least 3 while no other reason's counter moves
//!    and validator 3's own counters stay 0 (honest extensions are never
//!    refused); the chain keeps committing. Seen failing with a `tallyd`
//!    whose VerifyVoteExtension did not count its refusals: "honest
//!    validators rejected [0, 0, 0] extensions for foreign_index";
//! 3. `deposits_credited_with_a_byzantine_signer`: hub deposits are
//!    credited on every validator (hub blocks signed by the 3 honest ones);
//! 4. `batch_settles_with_a_byzantine_signer`: usage with real amounts sent
//!    through the gateway SDK's reporter forms batches the 3 honest
//!    validators sign; they settle on the hub, which pays each provider
//!    exactly what was sent, with no shortfall;
//! 5. `oversized_extensions_rejected_batch_settles`: validator 3 restarted
//!    in `oversized` mode (extensions over `max_vote_extension_bytes`): they
//!    are rejected (`reason="too_large"` rises by at least 3 on every honest
//!    node, nothing else), the chain keeps committing and the next batch
//!    settles, paid exactly.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED),
//! built `tallyd` and `tally-hub` binaries (like `e2e_localnet`), and
//! `tallyd-byzantine`: `$TALLY_BYZANTINE_BIN`, else this test builds it
//! into its own target dir with
//! `cargo build --release -p tally-node --features byzantine --bin tallyd-byzantine`
//! (`--bin`, so that `tallyd` is not rebuilt with the feature).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, repo_root, tallyd_path, Localnet, Options};

/// Ports from here, or the next free block (`free_port_base`); below
/// Linux's ephemeral range (32768+), apart from e2e_localnet's (29656) and
/// e2e_faults' (30656).
const PORT_BASE: u16 = 31656;
const WINDOW_SECS: u64 = 10;
/// The byzantine validator.
const BYZ: usize = 3;
/// What the binary that carries the byzantine wrapper contains.
const MARKER: &[u8] = b"TALLY_BYZANTINE_MODE";

const TESTS: [Test<Net>; 5] = [
    Test {
        name: "default_tallyd_has_no_byzantine_code",
        needs: &[],
        run: default_tallyd_has_no_byzantine_code,
    },
    Test {
        name: "foreign_index_extensions_rejected_chain_commits",
        needs: &[],
        run: foreign_index_extensions_rejected_chain_commits,
    },
    Test {
        name: "deposits_credited_with_a_byzantine_signer",
        needs: &[],
        run: deposits_credited_with_a_byzantine_signer,
    },
    Test {
        name: "batch_settles_with_a_byzantine_signer",
        needs: &["deposits_credited_with_a_byzantine_signer"],
        run: batch_settles_with_a_byzantine_signer,
    },
    Test {
        name: "oversized_extensions_rejected_batch_settles",
        needs: &["deposits_credited_with_a_byzantine_signer"],
        run: oversized_extensions_rejected_batch_settles,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture.
struct Net {
    net: Localnet,
    byzantine_bin: PathBuf,
    key: SigningKey,
    chain_id: String,
    hub: Rpc,
    /// What every provider must have been paid on the hub so far.
    paid: std::collections::BTreeMap<String, u64>,
}

impl Net {
    fn start() -> Result<Self> {
        let byzantine_bin = byzantine_bin()?;
        let base = free_port_base(PORT_BASE, 4)?;
        let opts = Options {
            env: vec![("TALLY_BYZANTINE_MODE".into(), "foreign-index".into())],
            node_bins: vec![(BYZ, byzantine_bin.clone())],
            ..Options::default()
        };
        let net = Localnet::launch(4, base, "500ms", WINDOW_SECS, &opts)?;
        let key = net.gateway_key()?;
        let chain_id = net.rpc(0).status()?.chain_id;
        let hub = Rpc::new(&net.hub_rpc_url());
        let byz_address = tally_node::dealer::validator_address(&net.dir().join("node3"))?;
        let dkg = query(&net.rpc(0), "/dkg")?;
        let byz_index = dkg["signers"]
            .as_array()
            .and_then(|s| {
                s.iter().position(|a| {
                    a.as_str()
                        .is_some_and(|a| a.eq_ignore_ascii_case(&byz_address))
                })
            })
            .map(|i| i as u32 + 1)
            .with_context(|| format!("validator {BYZ} holds no share: {dkg}"))?;
        // It signs with a share (the on-chain DKG orders players by
        // consensus address), so its foreign-index partials are refused as
        // such, not as a non-signer's.
        eprintln!("[e2e] validator {BYZ} ({byz_address}) holds share {byz_index}");
        Ok(Self {
            net,
            byzantine_bin,
            key,
            chain_id,
            hub,
            paid: Default::default(),
        })
    }
}

/// `$TALLY_BYZANTINE_BIN`, or `tallyd-byzantine` built into the target dir
/// this test runs from.
fn byzantine_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TALLY_BYZANTINE_BIN") {
        let p = PathBuf::from(p);
        ensure!(
            p.exists(),
            "TALLY_BYZANTINE_BIN={} does not exist",
            p.display()
        );
        return Ok(p);
    }
    // target/<profile>/deps/<test> -> target/<profile>, target
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("cannot locate the target directory")?;
    let target_dir = profile_dir
        .parent()
        .context("cannot locate the target directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("[e2e] building tallyd-byzantine (test-only feature byzantine)");
    let status = std::process::Command::new(cargo)
        .args(["build", "--release", "-p", "tally-node"])
        .args(["--features", "byzantine", "--bin", "tallyd-byzantine"])
        .arg("--manifest-path")
        .arg(repo_root().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir)
        .status()
        .context("running cargo build for tallyd-byzantine")?;
    ensure!(
        status.success(),
        "building tallyd-byzantine failed: {status}"
    );
    let p = profile_dir.join("tallyd-byzantine");
    ensure!(p.exists(), "{} was not built", p.display());
    Ok(p)
}

/// Whether the file at `path` contains `needle` (streamed: the binaries
/// are large).
fn file_contains(path: &Path, needle: &[u8]) -> Result<bool> {
    let mut f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut buf = vec![0u8; 8 << 20];
    let mut carry = 0usize;
    loop {
        let n = f.read(&mut buf[carry..])?;
        if n == 0 {
            return Ok(false);
        }
        let end = carry + n;
        if buf[..end].windows(needle.len()).any(|w| w == needle) {
            return Ok(true);
        }
        // Keep the last bytes: the needle may straddle two reads.
        let keep = (needle.len() - 1).min(end);
        buf.copy_within(end - keep..end, 0);
        carry = keep;
    }
}

fn default_tallyd_has_no_byzantine_code(f: &mut Net) -> Result<()> {
    let tallyd = tallyd_path()?;
    ensure!(
        !file_contains(&tallyd, MARKER)?,
        "{} contains the byzantine wrapper ({}): a default build must not",
        tallyd.display(),
        String::from_utf8_lossy(MARKER)
    );
    ensure!(
        file_contains(&f.byzantine_bin, MARKER)?,
        "{} does not contain the byzantine wrapper",
        f.byzantine_bin.display()
    );
    Ok(())
}

/// `text` without ANSI colour sequences (tracing colours field names).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... final byte in '@'..='~'
            for d in chars.by_ref() {
                if ('@'..='~').contains(&d) && d != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The `reason` labels of `tally_vote_extensions_rejected_total`.
const REASONS: [&str; 7] = [
    "too_large",
    "undecodable",
    "too_many_partials",
    "not_a_signer",
    "foreign_index",
    "malformed",
    "state",
];

/// Validator `i`'s `tally_vote_extensions_rejected_total` for each of
/// [`REASONS`], read from its `/metrics` page (a reason missing from the
/// page is an error).
fn rejected(net: &Localnet, i: usize) -> Result<[u64; REASONS.len()]> {
    let port = net.port_base() + 10 * i as u16 + 5;
    let url = format!("http://127.0.0.1:{port}/metrics");
    let page = ureq::get(&url)
        .timeout(Duration::from_secs(5))
        .call()
        .with_context(|| format!("GET {url}"))?
        .into_string()?;
    let mut out = [0; REASONS.len()];
    for (n, reason) in out.iter_mut().zip(REASONS) {
        let series = format!("tally_vote_extensions_rejected_total{{reason=\"{reason}\"}} ");
        *n = page
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .with_context(|| format!("node{i}: no {series} on {url}"))?
            .trim()
            .parse()?;
    }
    Ok(out)
}

/// Every honest validator's rejection counters.
fn honest_rejected(net: &Localnet) -> Result<[[u64; REASONS.len()]; 3]> {
    Ok([rejected(net, 0)?, rejected(net, 1)?, rejected(net, 2)?])
}

/// Waits until every honest validator's counter of extensions rejected
/// for `reason` is at least `at_least` above `before`, while no other
/// reason's counter moved and validator 3 rejected none (its
/// VerifyVoteExtension is the honest code, and honest extensions are never
/// refused); returns the counters.
fn wait_rejections(
    f: &Net,
    reason: &str,
    before: [[u64; REASONS.len()]; 3],
    at_least: u64,
) -> Result<[[u64; REASONS.len()]; 3]> {
    let r = REASONS
        .iter()
        .position(|x| *x == reason)
        .context("unknown reason")?;
    let start = Instant::now();
    loop {
        let now = honest_rejected(&f.net)?;
        for (i, (n, b)) in now.iter().zip(&before).enumerate() {
            for (k, reason_k) in REASONS.iter().enumerate() {
                ensure!(
                    k == r || n[k] == b[k],
                    "node{i} rejected extensions for {reason_k}: {} (before {}), only {reason} expected",
                    n[k],
                    b[k]
                );
            }
        }
        let byz = rejected(&f.net, BYZ)?;
        ensure!(
            byz == [0; REASONS.len()],
            "validator {BYZ} rejected extensions of honest validators: {byz:?} ({REASONS:?})"
        );
        let counts: [u64; 3] = std::array::from_fn(|i| now[i][r]);
        if now
            .iter()
            .zip(&before)
            .all(|(n, b)| n[r] >= b[r] + at_least)
        {
            eprintln!(
                "[e2e] validators 0..2 rejected {counts:?} extensions for {reason} after {:.1}s",
                start.elapsed().as_secs_f64()
            );
            return Ok(now);
        }
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "honest validators rejected {counts:?} extensions for {reason} (before {:?}), want {at_least} more each\n{}",
            before.map(|b| b[r]),
            f.net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Every validator advances by `blocks` within 60 s.
fn keeps_committing(net: &Localnet, blocks: u64) -> Result<()> {
    let from: Vec<u64> = (0..4).map(|i| net.height(i)).collect();
    for (i, h) in from.iter().enumerate() {
        net.wait_height(i, h + blocks, Duration::from_secs(60))
            .with_context(|| format!("node{i} stopped committing (from height {h})"))?;
    }
    Ok(())
}

/// Validator 3's log shows it sent `mode` extensions.
fn byzantine_sent(net: &Localnet, mode: &str) -> bool {
    let log = std::fs::read_to_string(net.dir().join(format!("node{BYZ}/tallyd.log")))
        .unwrap_or_default();
    strip_ansi(&log)
        .lines()
        .any(|l| l.contains("byzantine vote extension") && l.contains(mode))
}

fn foreign_index_extensions_rejected_chain_commits(f: &mut Net) -> Result<()> {
    // Partials under another index than the sender's own, counted from 0
    // on a new network.
    wait_rejections(f, "foreign_index", [[0; REASONS.len()]; 3], 3)?;
    ensure!(
        byzantine_sent(&f.net, "foreign-index"),
        "validator {BYZ} logged no foreign-index extension"
    );
    keeps_committing(&f.net, 10)?;
    Ok(())
}

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let r = rpc.abci_query(path)?;
    ensure!(r.code == 0, "{path}: code {} {}", r.code, r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

/// Hub deposits for the users the tests charge: escrow on the hub, and
/// (synced as signed hub blocks) balance on the chain.
const DEPOSITS: [(&str, u64); 2] = [("byz-alice", 500), ("byz-bob", 300)];

fn deposits_credited_with_a_byzantine_signer(f: &mut Net) -> Result<()> {
    let net = &f.net;
    for (user, amount) in DEPOSITS {
        net.hub_deposit(user, amount)?;
    }
    let start = Instant::now();
    for i in 0..4 {
        for (user, amount) in DEPOSITS {
            while net.balance(i, user)? != amount {
                ensure!(
                    start.elapsed() < Duration::from_secs(60),
                    "node{i}: {user} has {}, want {amount}\n{}",
                    net.balance(i, user)?,
                    net.logs_tail()
                );
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
    Ok(())
}

fn rec(user: &str, provider: &str, amount: u64) -> UsageRecord {
    UsageRecord {
        user: user.into(),
        provider: provider.into(),
        model: "org/byz-model".into(),
        route: "/v1/chat".into(),
        outcome: Outcome::Ok as i32,
        units: 10,
        amount,
        ..Default::default()
    }
}

/// Sends `records` through the gateway SDK's reporter (every validator's
/// RPC, the byzantine one first); all must land.
fn send(f: &Net, records: Vec<UsageRecord>) -> Result<()> {
    let endpoints = [BYZ, 0, 1, 2].map(|i| f.net.rpc_url(i)).to_vec();
    let within = Duration::from_secs(300);
    tally_tests::sdk::send_all(endpoints, &f.chain_id, f.key.clone(), records, None, within)
}

/// Waits until every batch the chain formed is settled and the hub paid
/// every provider in `f.paid` exactly that, then checks that the hub's
/// batches paid the sum of it with no shortfall.
fn wait_paid(f: &Net) -> Result<()> {
    let want_total: u64 = f.paid.values().sum();
    let start = Instant::now();
    let budget = Duration::from_secs(WINDOW_SECS * 3 + 60);
    loop {
        let s = query(&f.net.rpc(0), "/sync/hub")?;
        let formed = s["next_nonce"].as_u64().unwrap_or(1).saturating_sub(1);
        let settled = s["settled_batches"].as_u64().unwrap_or(0);
        let mut payouts = Vec::new();
        for p in f.paid.keys() {
            payouts.push(
                query(&f.hub, &format!("/payout/{p}"))?["paid"]
                    .as_u64()
                    .unwrap_or(0),
            );
        }
        let want: Vec<u64> = f.paid.values().copied().collect();
        if formed > 0 && settled == formed && payouts == want {
            let (mut paid, mut shortfall) = (0, 0);
            for nonce in 1..=formed {
                let b = query(&f.hub, &format!("/batch/hub/{nonce}"))?;
                paid += b["paid"].as_u64().unwrap_or(0);
                shortfall += b["shortfall"].as_u64().unwrap_or(0);
            }
            ensure!(
                paid == want_total && shortfall == 0,
                "hub batches 1..={formed} paid {paid} (shortfall {shortfall}), sent {want_total}"
            );
            eprintln!(
                "[e2e] {formed} batches settled, hub paid {want_total} ({:.1}s)",
                start.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        ensure!(
            payouts.iter().zip(&want).all(|(got, w)| got <= w),
            "hub paid {payouts:?}, more than sent {want:?} ({:?})",
            f.paid
        );
        ensure!(
            start.elapsed() < budget,
            "not settled after {budget:?}: formed {formed}, settled {settled}, hub paid {payouts:?} of {want:?}\n{s}\n{}",
            f.net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `user`'s balance equals `want` on every validator.
fn balances_agree(net: &Localnet, user: &str, want: u64) -> Result<()> {
    for i in 0..4 {
        let start = Instant::now();
        while net.balance(i, user)? != want {
            ensure!(
                start.elapsed() < Duration::from_secs(20),
                "node{i}: {user} has {}, want {want}",
                net.balance(i, user)?
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

fn batch_settles_with_a_byzantine_signer(f: &mut Net) -> Result<()> {
    // byz-alice: 7 + 13 + 21 to prov-x, 4 to prov-y (45 in all);
    // byz-bob: 5 + 9 to prov-y (14). prov-x is owed 41, prov-y 18.
    send(
        f,
        vec![
            rec("byz-alice", "prov-x", 7),
            rec("byz-bob", "prov-y", 5),
            rec("byz-alice", "prov-x", 13),
            rec("byz-alice", "prov-y", 4),
            rec("byz-bob", "prov-y", 9),
            rec("byz-alice", "prov-x", 21),
        ],
    )?;
    f.paid.insert("prov-x".into(), 41);
    f.paid.insert("prov-y".into(), 18);
    wait_paid(f)?;
    for (user, escrow) in [("byz-alice", 500 - 45), ("byz-bob", 300 - 14)] {
        let e = query(&f.hub, &format!("/escrow/{user}"))?["escrow"]
            .as_u64()
            .unwrap_or(0);
        ensure!(e == escrow, "hub escrow of {user}: {e}, want {escrow}");
        balances_agree(&f.net, user, escrow)?;
    }
    ensure!(
        byzantine_sent(&f.net, "foreign-index"),
        "validator {BYZ} sent no foreign-index extension"
    );
    Ok(())
}

fn oversized_extensions_rejected_batch_settles(f: &mut Net) -> Result<()> {
    // Validator 3 again, now sending extensions over the 4096-byte cap.
    let before = honest_rejected(&f.net)?;
    f.net.node("stop", BYZ)?;
    f.net
        .node_with_env("start", BYZ, &[("TALLY_BYZANTINE_MODE", "oversized")])?;
    wait_rejections(f, "too_large", before, 3)?;
    ensure!(
        byzantine_sent(&f.net, "oversized"),
        "validator {BYZ} logged no oversized extension"
    );
    keeps_committing(&f.net, 5)?;
    let settled_before = query(&f.net.rpc(0), "/sync/hub")?["settled_batches"]
        .as_u64()
        .unwrap_or(0);
    send(f, vec![rec("byz-bob", "prov-z", 17)])?;
    f.paid.insert("prov-z".into(), 17);
    wait_paid(f)?;
    let settled = query(&f.net.rpc(0), "/sync/hub")?["settled_batches"]
        .as_u64()
        .unwrap_or(0);
    ensure!(
        settled > settled_before,
        "no new batch settled ({settled_before} -> {settled})"
    );
    balances_agree(&f.net, "byz-bob", 300 - 14 - 17)?;
    Ok(())
}

//! End to end with real CometBFT processes: four validators and the hub
//! chain on loopback, one localnet shared by the named tests below, which
//! run in this order (the runner is `tally_tests::harness`):
//!
//! 1. `records_reach_every_validator`: reports of every outcome class sent
//!    over RPC are reflected exactly in every validator's SLA queries;
//! 2. `duplicate_report_changes_nothing`: resubmitting those exact bytes is
//!    refused (mempool cache or `duplicate_report`, 7), totals unchanged;
//! 3. `batch_signed_and_settled_on_hub`: the closed windows' payments form
//!    batches that t validators sign through real vote extensions (checked
//!    against the group key), the relays submit them and the hub pays each
//!    credit once (every batch's shortfall exactly 0, the provider's payout
//!    exactly what was reported);
//! 4. `deposit_credited_on_every_validator`: a hub deposit is credited once
//!    on every validator, judged once its deposit cursor is several hub
//!    blocks past the deposit;
//! 5. `a_deposit_burst_is_credited_in_flight`: 3,000 deposits put on the hub
//!    at once are credited on every validator (sampled users' balances
//!    exact) within 12 Tally blocks of the first credit: at least 12
//!    messages of 256, which one at a time (before app version 5) take two
//!    blocks each, while the localnet's version 5 has 16 in flight
//!    (ADR 0024);
//! 6. `validator_killed_under_load_catches_up`: a validator SIGKILLed under
//!    load; the chain keeps going, the validator catches up with the same
//!    app hashes; every validator shows exactly what committed (a model in
//!    the test: every route and counter, balance, owed; no load report
//!    refused in a block, as the model refuses none) and the hub pays it;
//! 7. `relay_metrics_served`: every relay's metrics beside its node, with
//!    values: a batch the test makes settle moves the relays' `ok`
//!    submissions by exactly one per batch and `refused`/`failed` by none;
//!    validator 0's circuits closed, its attempts and failures the chain's;
//! 8. `hub_outage_settles_after_return`: the hub down for 3 minutes, an
//!    attempt about every 60 s, settlement at most 75 s after it returns
//!    (the bound the docs give), each batch paid in full (shortfall 0);
//! 9. `reporter_exactly_once_with_a_killed_validator`: 100,000 records
//!    through the gateway SDK's reporter with a validator SIGKILLed and
//!    restarted and one endpoint unreachable land exactly once;
//! 10. `a_full_mempool_refuses_and_loses_nothing`: validator 3 restarted
//!     with a 30-transaction mempool and flooded over `broadcast_tx_sync`
//!     from 32 connections; every report it answered code 0 is in a block
//!     (CometBFT drops an accepted transaction that finds its mempool full
//!     without telling the sender; the app refuses with code 39 first), and
//!     code 39 was answered.
//!
//! Needs `cometbft` on PATH (localnet/install-cometbft.sh; without it every
//! test is reported SKIPPED) and built `tallyd` and `tally-hub` binaries
//! (`$TALLYD`, `$TALLY_HUB_BIN`, or beside the test binary);
//! `scripts/test.sh` provides all three.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use sha2::Digest as _;
use tally_node::records::build_report;
use tally_node::rpc::Rpc;
use tally_settlement::bls::{self, Kind, PublicShares};
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_settlement::RouteRecordView;
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, tallyd_path, Localnet};
use tally_tests::traffic::Traffic;

/// Ports from here, or the next free block (`free_port_base`); below
/// Linux's ephemeral range (32768+), so that no outgoing connection can be
/// holding a port a restarted node must bind.
const PORT_BASE: u16 = 29656;
const WINDOW_SECS: u64 = 10;

const TESTS: [Test<Net>; 10] = [
    Test {
        name: "records_reach_every_validator",
        needs: &[],
        run: records_reach_every_validator,
    },
    Test {
        name: "duplicate_report_changes_nothing",
        needs: &["records_reach_every_validator"],
        run: duplicate_report_changes_nothing,
    },
    Test {
        name: "batch_signed_and_settled_on_hub",
        needs: &["records_reach_every_validator"],
        run: batch_signed_and_settled_on_hub,
    },
    Test {
        name: "deposit_credited_on_every_validator",
        needs: &[],
        run: deposit_credited_on_every_validator,
    },
    Test {
        name: "a_deposit_burst_is_credited_in_flight",
        needs: &[],
        run: a_deposit_burst_is_credited_in_flight,
    },
    Test {
        name: "validator_killed_under_load_catches_up",
        needs: &[],
        run: validator_killed_under_load_catches_up,
    },
    Test {
        name: "relay_metrics_served",
        needs: &[],
        run: relay_metrics_served,
    },
    Test {
        name: "hub_outage_settles_after_return",
        needs: &[],
        run: hub_outage_settles_after_return,
    },
    Test {
        name: "reporter_exactly_once_with_a_killed_validator",
        needs: &[],
        run: reporter_exactly_once_with_a_killed_validator,
    },
    Test {
        name: "a_full_mempool_refuses_and_loses_nothing",
        needs: &[],
        run: a_full_mempool_refuses_and_loses_nothing,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture: the localnet and what the tests did to it.
struct Net {
    net: Localnet,
    key: SigningKey,
    chain_id: String,
    /// Credits of every report the chain accepted so far: what the hub must
    /// end up settling.
    credits: u64,
    /// `records_reach_every_validator`'s reports: the node each went to and
    /// its transaction bytes.
    reports: Vec<(usize, Vec<u8>)>,
    /// What `records_reach_every_validator`'s routes must total.
    expected: BTreeMap<(String, String), [u64; 9]>,
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
            credits: 0,
            reports: Vec::new(),
            expected: BTreeMap::new(),
        })
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A record; failed calls carry amount 0 whatever `amount` says (the
/// chain refuses anything else).
fn rec(user: &str, route: &str, outcome: Outcome, amount: u64) -> UsageRecord {
    UsageRecord {
        user: user.into(),
        provider: "e2e-prov".into(),
        model: "org/e2e-model".into(),
        route: route.into(),
        outcome: outcome as i32,
        units: 10,
        amount: if outcome.may_carry_amount() {
            amount
        } else {
            0
        },
        ..Default::default()
    }
}

/// Sum of a route's records over all windows, from one node.
fn route_totals(rpc: &Rpc, user: &str, route: &str) -> Result<[u64; 9]> {
    let path = format!(
        "/sla/route/{user}/e2e-prov/org%2Fe2e-model/{}?limit=1000",
        route.replace('/', "%2F")
    );
    let a = rpc.abci_query(&path)?;
    ensure!(a.code == 0, "{path}: code {} {}", a.code, a.log);
    let v: serde_json::Value = serde_json::from_slice(&a.value)?;
    let recs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
    let mut t = [0u64; 9];
    for r in recs {
        for (slot, x) in t.iter_mut().zip([
            r.requests,
            r.ok,
            r.fail_count,
            r.rate_limit,
            r.auth,
            r.transient,
            r.unknown,
            r.client,
            r.cancel,
        ]) {
            *slot += x;
        }
    }
    Ok(t)
}

/// Every validator's totals of `records_reach_every_validator`'s routes
/// equal what was reported, once every validator is past `height`.
fn check_expected(f: &Net, height: u64) -> Result<()> {
    for i in 0..4 {
        f.net.wait_height(i, height, Duration::from_secs(30))?;
        for ((user, route), want) in &f.expected {
            let got = route_totals(&f.net.rpc(i), user, route)?;
            ensure!(
                &got == want,
                "node{i} {user} {route}: got {got:?}, want {want:?}"
            );
        }
    }
    Ok(())
}

fn records_reach_every_validator(f: &mut Net) -> Result<()> {
    let plan = [
        (
            "alice",
            "/v1/chat",
            vec![
                Outcome::Ok,
                Outcome::Ok,
                Outcome::Cancel,
                Outcome::RateLimit,
                Outcome::Client,
            ],
        ),
        (
            "alice",
            "/v1/embed",
            vec![
                Outcome::Auth,
                Outcome::Transient,
                Outcome::Transient,
                Outcome::Unknown,
            ],
        ),
        (
            "bob",
            "/v1/chat",
            vec![
                Outcome::Cancel,
                Outcome::Cancel,
                Outcome::Client,
                Outcome::Ok,
            ],
        ),
    ];
    let mut last_height = 0;
    for (round, (user, route, outcomes)) in plan.iter().enumerate() {
        let recs: Vec<_> = outcomes.iter().map(|o| rec(user, route, *o, 3)).collect();
        let e = f
            .expected
            .entry((user.to_string(), route.to_string()))
            .or_default();
        for o in outcomes {
            e[0] += 1;
            let i = match o {
                Outcome::Ok => 1,
                Outcome::RateLimit => 3,
                Outcome::Auth => 4,
                Outcome::Transient => 5,
                Outcome::Unknown => 6,
                Outcome::Client => 7,
                _ => 8,
            };
            e[i] += 1;
            if (3..=6).contains(&i) {
                e[2] += 1;
            }
        }
        let built = build_report(&f.key, &f.chain_id, recs, now() + 300);
        let node = round % 4;
        let r = f.net.rpc(node).broadcast_tx_commit(&built.tx)?;
        ensure!(
            r.final_code() == 0,
            "report {} refused: {}",
            built.report_id,
            r.final_log()
        );
        f.credits += 3 * outcomes.iter().filter(|o| o.may_carry_amount()).count() as u64;
        f.reports.push((node, built.tx));
        last_height = last_height.max(r.height);
    }
    check_expected(f, last_height + 1)
}

fn duplicate_report_changes_nothing(f: &mut Net) -> Result<()> {
    ensure!(!f.reports.is_empty(), "no accepted reports to resubmit");
    // Resubmitting the same bytes (to another node) changes nothing:
    // CometBFT's mempool cache refuses it, or the app does with
    // duplicate_report (7).
    for (node, tx) in &f.reports {
        match f.net.rpc(3 - node).broadcast_tx_commit(tx) {
            Ok(again) => ensure!(
                again.final_code() == 7,
                "duplicate gave code {}",
                again.final_code()
            ),
            Err(e) => ensure!(
                e.to_string().contains("already exists in cache"),
                "resubmit: {e}"
            ),
        }
    }
    // Nothing was counted twice.
    let h = (0..4).map(|i| f.net.height(i)).max().unwrap_or(0) + 1;
    check_expected(f, h)
}

fn batch_signed_and_settled_on_hub(f: &mut Net) -> Result<()> {
    // The closed windows' payments (24 credits: the 8 records of classes
    // that may carry an amount, x 3) become
    // batches that t validators sign through real vote extensions (visible
    // with `tallyd query batch`); the relays submit them to the hub chain,
    // which pays each once, and the chain ends each sync when t validators
    // sign the hub's answer.
    let want = f.credits;
    ensure!(want > 0, "no credits were reported: nothing to settle");
    let net = &f.net;
    let chain_id = &f.chain_id;
    let dkg: serde_json::Value = serde_json::from_slice(&net.rpc(0).abci_query("/dkg")?.value)?;
    let group = bls::parse_public_key(&hex::decode(dkg["group_key"].as_str().unwrap_or(""))?)?;
    let pubs = PublicShares {
        threshold: 3,
        group,
        shares: Vec::new(),
    };
    let start = Instant::now();
    let mut checked = std::collections::BTreeSet::new();
    loop {
        let s: serde_json::Value =
            serde_json::from_slice(&net.rpc(1).abci_query("/sync/hub")?.value)?;
        let formed = s["next_nonce"].as_u64().unwrap_or(1) - 1;
        let mut signed_total = 0;
        for nonce in 1..=formed {
            let out = std::process::Command::new(tallyd_path()?)
                .args([
                    "query",
                    "batch",
                    "--chain",
                    "hub",
                    "--nonce",
                    &nonce.to_string(),
                    "--output",
                    "json",
                    "--node",
                ])
                // The node the sync state was read from: another may be a
                // block behind and not have formed this batch yet.
                .arg(net.rpc_url(1))
                .output()?;
            ensure!(
                out.status.success(),
                "tallyd query batch: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let b: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            if b["status"] == "pending" {
                continue;
            }
            signed_total += b["total"].as_u64().unwrap_or(0);
            if checked.insert(nonce) {
                let digest: [u8; 32] = hex::decode(b["digest"].as_str().unwrap_or(""))?
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("digest is not 32 bytes"))?;
                let sig =
                    bls::parse_signature(&hex::decode(b["signature"].as_str().unwrap_or(""))?)?;
                ensure!(
                    pubs.verify_group(&bls::message(chain_id, Kind::Batch, &digest), &sig),
                    "batch {nonce} signature does not verify against the group key: {b}"
                );
            }
        }
        let settled = s["settled_batches"].as_u64().unwrap_or(0);
        if signed_total == want && settled == formed {
            // Every credit was paid once on the hub, in full: each batch
            // settled with a shortfall of exactly 0, the batches paid
            // exactly what was reported, and so did the provider's payout.
            let mut hub_paid = 0;
            for nonce in 1..=formed {
                let h = hub_result(net, nonce)?;
                ensure!(
                    h["settled"] == true && h["shortfall"] == 0,
                    "hub batch {nonce} not settled in full: {h}"
                );
                hub_paid += h["paid"]
                    .as_u64()
                    .with_context(|| format!("hub batch {nonce} has no paid: {h}"))?;
            }
            ensure!(hub_paid == want, "hub paid {hub_paid} credits, want {want}");
            let payout = hub_payout(net, "e2e-prov")?;
            ensure!(
                payout == want,
                "hub paid e2e-prov {payout} credits, want {want}"
            );
            return Ok(());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(WINDOW_SECS * 3 + 60),
            "batches not signed and settled after {:?} (signed {signed_total} of {want} credits): {s}\n{}",
            start.elapsed(),
            net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Hub blocks the chain's deposit cursor must read past a credited deposit
/// before the test judges "once": ranges after the deposit's, each of which
/// would have credited it again had the chain lost its place.
const CURSOR_PAST: u64 = 6;

/// The hub height of the deposit of `amount` to `user`, from the hub's
/// `/deposits` of its last 20 blocks.
fn deposit_height(net: &Localnet, user: &str, amount: u64) -> Result<u64> {
    let hub = Rpc::new(&net.hub_rpc_url());
    let tip = hub.status()?.height;
    let a = hub.abci_query(&format!("/deposits/{}/{tip}", tip.saturating_sub(20)))?;
    ensure!(a.code == 0, "hub /deposits: {}", a.log);
    let v: serde_json::Value = serde_json::from_slice(&a.value)?;
    v["deposits"]
        .as_array()
        .and_then(|d| {
            d.iter()
                .find(|d| d["user"] == user && d["amount"] == amount)
                .and_then(|d| d["height"].as_u64())
        })
        .with_context(|| format!("the deposit is not on the hub: {v}"))
}

/// Validator `i`'s deposit cursor on the hub chain (the next hub height it
/// reads).
fn hub_cursor(net: &Localnet, i: usize) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_slice(&net.rpc(i).abci_query("/sync/hub")?.value)?;
    v["hub_cursor"].as_u64().context("no hub_cursor")
}

fn deposit_credited_on_every_validator(f: &mut Net) -> Result<()> {
    // A deposit on the hub is credited once on the chain, after its range is
    // `confirmations` hub blocks deep and t validators signed it; "once" is
    // judged on each validator after its cursor read CURSOR_PAST hub blocks
    // beyond the deposit's height.
    let net = &f.net;
    net.hub_deposit("dave", 77)?;
    let height = deposit_height(net, "dave", 77)?;
    let start = Instant::now();
    for i in 0..4 {
        loop {
            let cursor = hub_cursor(net, i)?;
            if cursor > height + CURSOR_PAST {
                break;
            }
            ensure!(
                start.elapsed() < Duration::from_secs(90),
                "node{i}: the hub cursor is at {cursor}, the deposit at hub height {height}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        let got = net.balance(i, "dave")?;
        ensure!(
            got == 77,
            "node{i}: dave has {got} with the cursor {CURSOR_PAST}+ hub blocks past the deposit of 77"
        );
    }
    Ok(())
}

/// Deposits in [`a_deposit_burst_is_credited_in_flight`]: at 256 a
/// message at least 12 messages.
const BURST: u64 = 3_000;

/// Most Tally blocks from the first credit of the burst to its last: one
/// message at a time takes two blocks per message (22 or more from the
/// first credit to the last for 12 messages; measured 22 at app version
/// 4); with 16 in flight and 8 credited a block, 2 blocks plus one per hub
/// range boundary the relay had not read ahead yet (measured 6).
const BURST_BLOCKS: u64 = 12;

fn a_deposit_burst_is_credited_in_flight(f: &mut Net) -> Result<()> {
    use tally_tests::depositbench::{credited, deposited_for, put_deposits, user, USERS};
    let net = &f.net;
    let rpc = net.rpc(0);
    let before = credited(&rpc)?;
    for t in put_deposits(&net.hub_rpc_url(), BURST, 4) {
        t.join()
            .map_err(|_| anyhow::anyhow!("a deposit sender panicked"))??;
    }
    // The height is read after the count, so `first` is at or after the
    // block of the first credit and `last` at or after that of the last.
    let start = Instant::now();
    let mut first: Option<u64> = None;
    let last = loop {
        let c = credited(&rpc)?.saturating_sub(before);
        let h = net.height(0);
        if c > 0 && first.is_none() {
            first = Some(h);
        }
        if c >= BURST {
            ensure!(c == BURST, "{c} deposits credited, {BURST} made");
            break h;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(180),
            "{c} of {BURST} deposits credited after 180 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let first = first.unwrap_or(last);
    ensure!(
        last - first <= BURST_BLOCKS,
        "the burst took {} Tally blocks ({first}..{last}), at most {BURST_BLOCKS} with messages in flight",
        last - first
    );
    // Every validator's own state counts the whole burst before its
    // balances are read: CometBFT's height can be ahead of the state the
    // app answers queries from, so a height alone does not say the last
    // credit is in.
    for i in 0..4 {
        net.wait_height(i, last, Duration::from_secs(30))?;
        let until = Instant::now() + Duration::from_secs(30);
        while credited(&net.rpc(i))?.saturating_sub(before) < BURST {
            ensure!(
                Instant::now() < until,
                "node{i} has not credited the burst 30 s after node0"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for u in [0, 7, USERS - 1] {
        let want = deposited_for(u, BURST);
        for i in 0..4 {
            let got = net.balance(i, &user(u))?;
            ensure!(
                got == want,
                "node{i}: {} has {got}, deposited {want}",
                user(u)
            );
        }
    }
    eprintln!(
        "a_deposit_burst_is_credited_in_flight: {BURST} deposits in {} blocks ({first}..{last})",
        last - first
    );
    Ok(())
}

/// What a test expects the chain to show, computed here from what it sent
/// (never with the implementation's counting code).
#[derive(Default)]
struct Model {
    /// Per route (user, provider, model, route): requests, ok, fail_count,
    /// rate_limit, auth, transient, unknown, client, cancel, units, amount
    /// (the order of [`route_view`]).
    routes: BTreeMap<(String, String, String, String), [u64; 11]>,
    /// Credits charged per user.
    charged: BTreeMap<String, u64>,
    /// Credits owed per provider.
    owed: BTreeMap<String, u64>,
}

impl Model {
    /// Counts one committed report's records.
    fn add(&mut self, recs: &[UsageRecord]) {
        for r in recs {
            let e = self
                .routes
                .entry((
                    r.user.clone(),
                    r.provider.clone(),
                    r.model.clone(),
                    r.route.clone(),
                ))
                .or_default();
            e[0] += 1;
            let slot = match Outcome::try_from(r.outcome) {
                Ok(Outcome::Ok) => 1,
                Ok(Outcome::RateLimit) => 3,
                Ok(Outcome::Auth) => 4,
                Ok(Outcome::Transient) => 5,
                Ok(Outcome::Client) => 7,
                Ok(Outcome::Cancel) => 8,
                _ => 6,
            };
            e[slot] += 1;
            if (3..=6).contains(&slot) {
                e[2] += 1;
            }
            e[9] += r.units;
            e[10] += r.amount;
            *self.charged.entry(r.user.clone()).or_default() += r.amount;
            *self.owed.entry(r.provider.clone()).or_default() += r.amount;
        }
    }
}

/// Every counter of one route summed over all windows, from one node, in
/// [`Model::routes`]' order.
fn route_view(rpc: &Rpc, id: &(String, String, String, String)) -> Result<[u64; 11]> {
    let path = tally_tests::traffic::route_path(&tally_settlement::RouteId {
        user: id.0.clone(),
        provider: id.1.clone(),
        model: id.2.clone(),
        route: id.3.clone(),
    });
    let a = rpc.abci_query(&path)?;
    ensure!(a.code == 0, "{path}: code {} {}", a.code, a.log);
    let v: serde_json::Value = serde_json::from_slice(&a.value)?;
    ensure!(v["next_cursor"].is_null(), "{path}: more than one page");
    let recs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
    let mut t = [0u64; 11];
    for r in recs {
        for (slot, x) in t.iter_mut().zip([
            r.requests,
            r.ok,
            r.fail_count,
            r.rate_limit,
            r.auth,
            r.transient,
            r.unknown,
            r.client,
            r.cancel,
            r.units,
            r.amount,
        ]) {
            *slot += x;
        }
    }
    Ok(t)
}

/// Credits owed to `provider` over all windows, from one node's
/// `/sla/provider` records.
fn provider_owed(rpc: &Rpc, provider: &str) -> Result<u64> {
    let mut total = 0;
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/sla/provider/{provider}?limit=1000&cursor={c}"),
            None => format!("/sla/provider/{provider}?limit=1000"),
        };
        let a = rpc.abci_query(&path)?;
        ensure!(a.code == 0, "{path}: code {} {}", a.code, a.log);
        let v: serde_json::Value = serde_json::from_slice(&a.value)?;
        let recs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
        total += recs.iter().map(|r| r.amount).sum::<u64>();
        match v["next_cursor"].as_str() {
            Some(c) if !c.is_empty() => cursor = Some(c.to_string()),
            _ => return Ok(total),
        }
    }
}

/// What the hub paid `provider` so far.
fn hub_payout(net: &Localnet, provider: &str) -> Result<u64> {
    let a = Rpc::new(&net.hub_rpc_url()).abci_query(&format!("/payout/{provider}"))?;
    ensure!(a.code == 0, "hub /payout/{provider}: {}", a.log);
    let v: serde_json::Value = serde_json::from_slice(&a.value)?;
    Ok(v["paid"].as_u64().unwrap_or(0))
}

/// Checks every route, every counter, every user's balance and every
/// provider's owed credits of `model` on every validator (once each is past
/// the highest height any of them reached); `funded` is each user's balance
/// before the model's reports.
fn check_model(net: &Localnet, model: &Model, funded: &BTreeMap<String, u64>) -> Result<()> {
    let h = (0..net.validators)
        .map(|i| net.height(i))
        .max()
        .unwrap_or(0)
        + 1;
    for i in 0..net.validators {
        net.wait_height(i, h, Duration::from_secs(60))?;
        let rpc = net.rpc(i);
        for (id, want) in &model.routes {
            let got = route_view(&rpc, id)?;
            ensure!(&got == want, "node{i} route {id:?}: got {got:?}, want {want:?} (requests, ok, fail_count, rate_limit, auth, transient, unknown, client, cancel, units, amount)");
        }
        for (user, charged) in &model.charged {
            let want = funded.get(user).copied().unwrap_or(0) - charged;
            let got = net.balance(i, user)?;
            ensure!(
                got == want,
                "node{i} balance of {user}: got {got}, want {want}"
            );
        }
        for (provider, want) in &model.owed {
            let got = provider_owed(&rpc, provider)?;
            ensure!(
                got == *want,
                "node{i} owed to {provider}: got {got}, want {want}"
            );
        }
    }
    Ok(())
}

/// Reports from background threads until stopped (at the latest after
/// 60 s), each with non-zero amounts for [`LOAD_USER`]; dropping it stops
/// and joins the threads. A report counts as sent only once its
/// transaction is in a block (`/tx` by hash), with code 0 or refused there:
/// each thread waits for that before sending the next, so the load follows
/// the chain's pace.
struct Load {
    stop: Arc<AtomicBool>,
    /// Reports in a block with code 0: the height and the records.
    committed: Shared<Landed>,
    /// Reports in a block with another code: the height, code and log.
    refused: Shared<Refused>,
    /// Reports CheckTx accepted but no block held yet: hash and records.
    unresolved: Shared<([u8; 32], Vec<UsageRecord>)>,
    threads: Vec<JoinHandle<()>>,
}

/// A list the load threads append to.
type Shared<T> = Arc<std::sync::Mutex<Vec<T>>>;
/// A load report a block accepted: its height and records.
type Landed = (u64, Vec<UsageRecord>);
/// A load report a block refused: its height, code and log.
type Refused = (u64, u32, String);

/// The load's user, funded by a hub deposit at the start of the test.
const LOAD_USER: &str = "erin";
/// The load's providers: used by no other test, so their hub payouts are
/// the load's alone.
const LOAD_PROVIDERS: [&str; 2] = ["load-prov-a", "load-prov-b"];
/// Load threads (each has one report in flight).
const LOAD_THREADS: u64 = 3;

/// An RPC client that can read `/tx`.
fn tx_client(url: &str) -> tally_client::RpcClient {
    tally_client::RpcClient::new(url, Duration::from_secs(3), Duration::from_secs(10))
}

impl Load {
    fn start(f: &Net) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let refused = Arc::new(std::sync::Mutex::new(Vec::new()));
        let unresolved = Arc::new(std::sync::Mutex::new(Vec::new()));
        let urls = [f.net.rpc_url(0), f.net.rpc_url(1)];
        let threads = (0..LOAD_THREADS)
            .map(|t| {
                let (stop, committed, refused, unresolved, key, chain_id, urls) = (
                    stop.clone(),
                    committed.clone(),
                    refused.clone(),
                    unresolved.clone(),
                    f.key.clone(),
                    f.chain_id.clone(),
                    urls.clone(),
                );
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let mut n = t;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let recs: Vec<_> = (0..100u64)
                            .map(|i| UsageRecord {
                                user: LOAD_USER.into(),
                                provider: LOAD_PROVIDERS[(i % 2) as usize].into(),
                                model: "org/load-model".into(),
                                route: format!("/load/{}", i % 10),
                                outcome: Outcome::ALL[((i + n) % 7) as usize] as i32,
                                units: 1 + (i * 3 + n) % 17,
                                amount: if Outcome::ALL[((i + n) % 7) as usize].may_carry_amount() {
                                    1 + (i + 2 * n) % 5
                                } else {
                                    0
                                },
                                ..Default::default()
                            })
                            .collect();
                        let built = build_report(&key, &chain_id, recs.clone(), now() + 300);
                        let url = &urls[(n % 2) as usize];
                        n += LOAD_THREADS;
                        let Ok((0, _, hash)) = Rpc::new(url).broadcast_tx_sync(&built.tx) else {
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        };
                        let Some(hash) = hex::decode(&hash)
                            .ok()
                            .and_then(|h| <[u8; 32]>::try_from(h).ok())
                        else {
                            continue;
                        };
                        let rpc = tx_client(url);
                        let until = Instant::now() + Duration::from_secs(15);
                        loop {
                            match rpc.tx(&hash) {
                                Ok(Some(r)) => {
                                    if r.code == 0 {
                                        if let Ok(mut c) = committed.lock() {
                                            c.push((r.height, recs));
                                        }
                                    } else if let Ok(mut x) = refused.lock() {
                                        x.push((r.height, r.code, r.log));
                                    }
                                    break;
                                }
                                _ if Instant::now() > until => {
                                    if let Ok(mut u) = unresolved.lock() {
                                        u.push((hash, recs));
                                    }
                                    break;
                                }
                                _ => std::thread::sleep(Duration::from_millis(100)),
                            }
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            committed,
            refused,
            unresolved,
            threads,
        }
    }

    /// Distinct heights above `above` holding a committed load report.
    fn heights_above(&self, above: u64) -> std::collections::BTreeSet<u64> {
        self.committed
            .lock()
            .map(|c| c.iter().map(|(h, _)| *h).filter(|h| *h > above).collect())
            .unwrap_or_default()
    }

    /// Stops the threads; returns the reports that committed with code 0
    /// (their height and records) and those a block refused (height, code,
    /// log). Reports still unresolved are looked up once more on `rpc` for
    /// 15 s; one that no block holds by then never counts (if it lands
    /// later, the model check fails).
    fn finish(mut self, rpc: &tally_client::RpcClient) -> Result<(Vec<Landed>, Vec<Refused>)> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join()
                .map_err(|_| anyhow::anyhow!("load thread panicked"))?;
        }
        let poisoned = || anyhow::anyhow!("load results poisoned");
        let mut committed = std::mem::take(&mut *self.committed.lock().map_err(|_| poisoned())?);
        let mut refused = std::mem::take(&mut *self.refused.lock().map_err(|_| poisoned())?);
        let unresolved = std::mem::take(&mut *self.unresolved.lock().map_err(|_| poisoned())?);
        let until = Instant::now() + Duration::from_secs(15);
        for (hash, recs) in unresolved {
            loop {
                match rpc.tx(&hash)? {
                    Some(r) => {
                        if r.code == 0 {
                            committed.push((r.height, recs));
                        } else {
                            refused.push((r.height, r.code, r.log));
                        }
                        break;
                    }
                    None if Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(200))
                    }
                    None => break,
                }
            }
        }
        Ok((committed, refused))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Deposits `amount` for `user` on the hub and waits until validator 0
/// credits it.
fn fund_from_hub(net: &Localnet, user: &str, amount: u64) -> Result<u64> {
    let before = net.balance(0, user)?;
    net.hub_deposit(user, amount)?;
    let start = Instant::now();
    while net.balance(0, user)? != before + amount {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "deposit for {user} not credited: {}",
            net.balance(0, user)?
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(before + amount)
}

fn validator_killed_under_load_catches_up(f: &mut Net) -> Result<()> {
    // Load from background threads (non-zero amounts, a user funded by a
    // hub deposit so the hub can pay every credit); validator 3 SIGKILLed
    // while reports commit, and restarted only after reports committed in
    // KILLED_BLOCKS blocks it missed. Afterwards every validator shows, for
    // every route and every counter, what committed; the user's balance and
    // the providers' owed credits match; the hub paid each provider exactly
    // what it is owed.
    const KILLED_BLOCKS: usize = 5;
    let net = &f.net;
    let funded: BTreeMap<String, u64> = [(
        LOAD_USER.to_string(),
        fund_from_hub(net, LOAD_USER, 2_000_000)?,
    )]
    .into();
    let paid_before: Vec<u64> = LOAD_PROVIDERS
        .iter()
        .map(|p| hub_payout(net, p))
        .collect::<Result<_>>()?;
    let load = Load::start(f);
    std::thread::sleep(Duration::from_secs(3));
    let down = net.take_down("kill", Some(3))?;
    let killed_at = net.height(0);
    // The chain keeps committing with one validator down; wait until
    // reports committed in KILLED_BLOCKS blocks after the kill (what the
    // victim misses), judged by the load reports' committed heights.
    let probe = tx_client(&net.rpc_url(0));
    let start = Instant::now();
    while load.heights_above(killed_at).len() < KILLED_BLOCKS {
        ensure!(
            start.elapsed() < Duration::from_secs(40),
            "load reports committed in only {} blocks after the kill (chain stalled?)\n{}",
            load.heights_above(killed_at).len(),
            net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let restarted_at = net.height(0);
    down.now()?;
    std::thread::sleep(Duration::from_secs(3));
    let (committed, refused) = load.finish(&probe)?;
    let missed: std::collections::BTreeSet<u64> = committed
        .iter()
        .map(|(h, _)| *h)
        .filter(|h| (killed_at + 1..=restarted_at).contains(h))
        .collect();
    ensure!(
        missed.len() >= KILLED_BLOCKS,
        "validator 3 was down for only {} blocks with reports ({killed_at}..{restarted_at})",
        missed.len()
    );
    let mut model = Model::default();
    for (_, recs) in &committed {
        model.add(recs);
    }
    // The model refuses no load report in a block: each has a new report
    // id, a 300 s expiry, amounts only on classes that may carry one, and
    // the user's funds cover every charge (checked here). So a report a
    // block refused is a fault, not noise to leave out of the model.
    let charged = model.charged.get(LOAD_USER).copied().unwrap_or(0);
    ensure!(
        charged <= funded[LOAD_USER],
        "the load charged {charged}, more than the {} funded: the model's premise fails",
        funded[LOAD_USER]
    );
    ensure!(
        refused.is_empty(),
        "{} load reports refused in a block, the model refuses none: {refused:?}",
        refused.len()
    );
    ensure!(
        model.routes.len() == 10 && committed.len() > 20,
        "load committed too little: {} reports over {} routes",
        committed.len(),
        model.routes.len()
    );

    // The restarted validator catches up with the same app hashes.
    let target = net.height(0) + 3;
    net.wait_height(3, target, Duration::from_secs(60))?;
    let mut seen: Vec<BTreeMap<u64, String>> = vec![BTreeMap::new(); 4];
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        for (i, m) in seen.iter_mut().enumerate() {
            if let Ok(s) = net.rpc(i).status() {
                m.insert(s.height, s.app_hash);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut compared = 0;
    for (h, hash) in &seen[3] {
        for (i, m) in seen.iter().enumerate().take(3) {
            if let Some(other) = m.get(h) {
                ensure!(
                    other == hash,
                    "app hash at height {h}: node3 {hash} vs node{i} {other}"
                );
                compared += 1;
            }
        }
    }
    ensure!(
        compared >= 3,
        "too few common heights to compare ({compared})"
    );

    // Every validator, the restarted one included, shows exactly what
    // committed: every route, every counter, the balance, what is owed.
    check_model(net, &model, &funded)?;

    // The hub pays each provider exactly what it is owed, once (the escrow
    // covers it: no shortfall), after the windows close and batches settle.
    let start = Instant::now();
    loop {
        let mut all = true;
        for (p, before) in LOAD_PROVIDERS.iter().zip(&paid_before) {
            let paid = hub_payout(net, p)? - before;
            let want = model.owed.get(*p).copied().unwrap_or(0);
            ensure!(paid <= want, "hub paid {p} {paid}, more than owed {want}");
            all &= paid == want;
        }
        if all {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(WINDOW_SECS * 3 + 60),
            "hub has not paid the load's providers {:?} after {:?}: {}",
            model.owed,
            start.elapsed(),
            sync_state(net)?
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    f.credits += model.charged.values().sum::<u64>();
    Ok(())
}

fn sync_state(net: &Localnet) -> Result<serde_json::Value> {
    Ok(serde_json::from_slice(
        &net.rpc(0).abci_query("/sync/hub")?.value,
    )?)
}

/// The value of the series `series` (name and labels exactly as served)
/// on a metrics page; 0 when the page does not have it (a labelled series
/// appears only once counted).
fn series(page: &str, series: &str) -> Result<f64> {
    for line in page.lines() {
        if let Some(v) = line.strip_prefix(series).and_then(|r| r.strip_prefix(' ')) {
            return v
                .trim()
                .parse()
                .with_context(|| format!("{series}: not a number: {line}"));
        }
    }
    Ok(0.0)
}

/// The relay's (and app's) metrics page beside validator `i`.
fn metrics_page(net: &Localnet, i: usize) -> Result<String> {
    let port = net.port_base() as usize + 10 * i + 5;
    Ok(ureq::get(&format!("http://127.0.0.1:{port}/metrics"))
        .call()?
        .into_string()?)
}

/// Σ over the four relays of `tally_relay_submissions_total{outcome}`.
fn submissions(net: &Localnet, outcome: &str) -> Result<f64> {
    let name = format!("tally_relay_submissions_total{{outcome=\"{outcome}\"}}");
    (0..4).map(|i| series(&metrics_page(net, i)?, &name)).sum()
}

fn relay_metrics_served(f: &mut Net) -> Result<()> {
    // Every relay serves its metrics beside its node, and they count what
    // happened: the batches this test makes settle move the four relays'
    // `relay_submissions_total{outcome="ok"}` by exactly their number (one
    // relay's submission settles a batch; the others find it settled or in
    // the hub's cache) and `refused` and `failed` by 0; validator 0's relay
    // shows its hub endpoints' circuits closed and the chain's settlement
    // attempts and failures.
    const PROVIDER: &str = "metrics-prov";
    const USER: &str = "frank";
    let net = &f.net;
    fund_from_hub(net, USER, 100)?;
    let last_nonce = || -> Result<u64> {
        let v: serde_json::Value = serde_json::from_slice(
            &Rpc::new(&net.hub_rpc_url())
                .abci_query("/last_nonce/hub")?
                .value,
        )?;
        Ok(v["last_nonce"].as_u64().unwrap_or(0))
    };
    let nonce_before = last_nonce()?;
    let before = [
        submissions(net, "ok")?,
        submissions(net, "refused")?,
        submissions(net, "failed")?,
    ];
    let amounts = [4u64, 6];
    let recs: Vec<UsageRecord> = amounts
        .iter()
        .map(|a| UsageRecord {
            provider: PROVIDER.into(),
            ..rec(USER, "/v1/metrics", Outcome::Ok, *a)
        })
        .collect();
    let built = build_report(&f.key, &f.chain_id, recs, now() + 300);
    let r = net.rpc(0).broadcast_tx_commit(&built.tx)?;
    ensure!(r.final_code() == 0, "{}", r.final_log());
    f.credits += amounts.iter().sum::<u64>();
    let start = Instant::now();
    while hub_payout(net, PROVIDER)? != amounts.iter().sum::<u64>() {
        ensure!(
            start.elapsed() < Duration::from_secs(WINDOW_SECS * 3 + 60),
            "{PROVIDER} not paid: {}",
            sync_state(net)?
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let settled = (last_nonce()? - nonce_before) as f64;
    ensure!(settled >= 1.0, "no batch settled on the hub");
    let want = [before[0] + settled, before[1], before[2]];
    let mut got;
    loop {
        got = [
            submissions(net, "ok")?,
            submissions(net, "refused")?,
            submissions(net, "failed")?,
        ];
        if got == want || start.elapsed() > Duration::from_secs(WINDOW_SECS * 3 + 90) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(
        got == want,
        "relay submissions (ok, refused, failed) over the four relays: {before:?} -> {got:?}, want {want:?} ({settled} batches settled)"
    );

    let page = metrics_page(net, 0)?;
    let circuits: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("tally_hub_circuit_state{"))
        .collect();
    ensure!(
        !circuits.is_empty() && circuits.iter().all(|l| l.ends_with(" 0")),
        "validator 0's hub circuits are not all closed: {circuits:?}"
    );
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let s = sync_state(net)?;
        let page = metrics_page(net, 0)?;
        let shown = (
            series(&page, "tally_sync_attempts_total")?,
            series(&page, "tally_sync_failures_total")?,
        );
        let chain = (
            s["attempts"].as_f64().unwrap_or(-1.0),
            s["failures"].as_f64().unwrap_or(-1.0),
        );
        if shown == chain {
            break;
        }
        ensure!(
            Instant::now() < until,
            "validator 0's relay shows (attempts, failures) {shown:?}, the chain {chain:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

/// The chain's batches `1..=formed` of the hub chain "hub", from validator
/// 0: per nonce, the calls (id and, while unsettled, user, provider and
/// amount as JSON).
fn chain_batches(net: &Localnet, formed: u64) -> Result<BTreeMap<u64, Vec<serde_json::Value>>> {
    let mut out = BTreeMap::new();
    for nonce in 1..=formed {
        let a = net.rpc(0).abci_query(&format!("/batch/hub/{nonce}"))?;
        ensure!(a.code == 0, "/batch/hub/{nonce}: {}", a.log);
        let v: serde_json::Value = serde_json::from_slice(&a.value)?;
        out.insert(nonce, v["calls"].as_array().cloned().unwrap_or_default());
    }
    Ok(out)
}

/// What the hub chain recorded for batch `nonce` (its `/batch/hub/{nonce}`).
fn hub_result(net: &Localnet, nonce: u64) -> Result<serde_json::Value> {
    let h = Rpc::new(&net.hub_rpc_url()).abci_query(&format!("/batch/hub/{nonce}"))?;
    ensure!(
        h.code == 0,
        "hub has no result for batch {nonce}: {}",
        h.log
    );
    Ok(serde_json::from_slice(&h.value)?)
}

fn hub_outage_settles_after_return(f: &mut Net) -> Result<()> {
    // The hub down for 3 minutes: each attempt fails and the next comes
    // about 60 s later; the batch settles after the hub returns, within a
    // bound derived below, and the hub pays each call exactly once.
    const PROVIDER: &str = "outage-prov";
    const USER: &str = "frank";
    let net = &f.net;
    // The user's credits come from a hub deposit, so the hub's escrow can
    // pay every call (no shortfall): the payout is then exactly the model.
    fund_from_hub(net, USER, 1_000)?;
    let paid_before = hub_payout(net, PROVIDER)?;
    let before = sync_state(net)?;
    let settled_before = before["settled_batches"].as_u64().unwrap_or(0);
    let failures_before = before["failures"].as_u64().unwrap_or(0);

    let down = net.take_down("stop", None).context("stopping the hub")?;
    let down_at = Instant::now();
    let amounts = [5u64, 7, 9];
    let recs: Vec<UsageRecord> = amounts
        .iter()
        .map(|a| UsageRecord {
            provider: PROVIDER.into(),
            ..rec(USER, "/v1/outage", Outcome::Ok, *a)
        })
        .collect();
    let owed: u64 = amounts.iter().sum();
    let built = build_report(&f.key, &f.chain_id, recs, now() + 300);
    let r = net.rpc(0).broadcast_tx_commit(&built.tx)?;
    ensure!(r.final_code() == 0, "{}", r.final_log());
    f.credits += owed;
    let mut attempts_seen = Vec::new();
    while down_at.elapsed() < Duration::from_secs(180) {
        let s = sync_state(net)?;
        let a = s["attempts"].as_u64().unwrap_or(0);
        if attempts_seen.last().map(|(n, _)| *n) != Some(a) {
            attempts_seen.push((a, down_at.elapsed()));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let s = sync_state(net)?;
    let failures = s["failures"].as_u64().unwrap_or(0) - failures_before;
    ensure!(
        failures >= 2,
        "expected failed attempts while the hub was down: {s}"
    );
    // Attempts came about every 60 s, not every 360 s.
    let gaps: Vec<u64> = attempts_seen
        .windows(2)
        .map(|w| (w[1].1 - w[0].1).as_secs())
        .collect();
    ensure!(
        gaps.iter().skip(1).all(|g| (50..=100).contains(g)),
        "attempt spacing {gaps:?} ({attempts_seen:?})"
    );
    // The batches formed while the hub was down, with their calls (user,
    // provider, amount are shown only until they settle).
    let formed = s["next_nonce"].as_u64().unwrap_or(1) - 1;
    let pending = chain_batches(net, formed)?;
    let outage_calls: Vec<(u64, u64, &serde_json::Value)> = pending
        .iter()
        .flat_map(|(n, calls)| {
            calls
                .iter()
                .map(move |c| (*n, c["id"].as_u64().unwrap_or(0), c))
        })
        .filter(|(_, _, c)| c["provider"] == PROVIDER)
        .collect();
    let listed: u64 = outage_calls
        .iter()
        .map(|(_, _, c)| c["amount"].as_u64().unwrap_or(0))
        .sum();
    ensure!(
        listed == owed && outage_calls.iter().all(|(_, _, c)| c["user"] == USER),
        "calls to {PROVIDER} in the pending batches total {listed}, want {owed}: {outage_calls:?}"
    );

    down.now().context("starting the hub")?;
    let back = Instant::now();
    // The bound on the time to settle after the hub is back:
    // - worst case, an attempt is in flight as the hub returns and fails
    //   (it reached the hub while it was still starting): its failure is
    //   on the chain within ~10 s (connect 2 s + read 5 s timeouts, the
    //   rank stagger, two 0.5 s blocks);
    // - the next attempt starts one cooldown later: sync_window_secs (360)
    //   - failure_backdate_secs (300) = 60 s;
    // - that attempt settles within ~5 s (two blocks to sign, the hub's
    //   commit, hub_confirmations = 1 hub block, the result signed back);
    // 60 + 10 + 5 = 75 s. Without a failing attempt at the return it is
    // at most 60 + 5 s.
    const SETTLE_BOUND: Duration = Duration::from_secs(60 + 10 + 5);
    let settled_after = loop {
        let s = sync_state(net)?;
        if s["settled_batches"].as_u64().unwrap_or(0) >= formed
            && s["settled_batches"].as_u64().unwrap_or(0) > settled_before
        {
            break back.elapsed();
        }
        ensure!(
            back.elapsed() <= SETTLE_BOUND + Duration::from_secs(30),
            "not settled {:?} after the hub came back: {s}",
            back.elapsed()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    ensure!(
        settled_after <= SETTLE_BOUND,
        "settled {settled_after:?} after the hub came back, bound {SETTLE_BOUND:?} (attempts {attempts_seen:?})"
    );
    eprintln!(
        "hub outage: settled {settled_after:?} after the hub came back (bound {SETTLE_BOUND:?})"
    );

    // Paid exactly once: the hub settled each nonce once (its last nonce
    // is the chain's last batch, so no nonce beyond), every call id is in
    // one batch only, each batch's calls count and credits on the hub are
    // the chain's, and the provider was paid exactly what it is owed.
    let last: serde_json::Value = serde_json::from_slice(
        &Rpc::new(&net.hub_rpc_url())
            .abci_query("/last_nonce/hub")?
            .value,
    )?;
    ensure!(
        last["last_nonce"].as_u64() == Some(formed),
        "hub's last nonce {last}, the chain formed {formed} batches"
    );
    let settled = chain_batches(net, formed)?;
    let mut ids = std::collections::BTreeSet::new();
    for (nonce, calls) in &settled {
        for c in calls {
            let id = c["id"].as_u64().unwrap_or(0);
            ensure!(
                ids.insert(id),
                "call {id} is in two batches (again in {nonce})"
            );
        }
        let h = hub_result(net, *nonce)?;
        ensure!(
            h["calls"].as_u64() == Some(calls.len() as u64),
            "batch {nonce}: hub paid {} calls, the chain's batch has {}",
            h["calls"],
            calls.len()
        );
    }
    for (nonce, calls) in &pending {
        let want: u64 = calls.iter().filter_map(|c| c["amount"].as_u64()).sum();
        if calls.iter().all(|c| c["amount"].is_u64()) {
            let h = hub_result(net, *nonce)?;
            ensure!(
                h["shortfall"] == 0 && h["paid"].as_u64() == Some(want),
                "batch {nonce}: hub paid {} (shortfall {}), its calls total {want}",
                h["paid"],
                h["shortfall"]
            );
        }
    }
    for (nonce, _, _) in &outage_calls {
        let h = hub_result(net, *nonce)?;
        ensure!(h["shortfall"] == 0, "batch {nonce} has a shortfall: {h}");
    }
    let paid = hub_payout(net, PROVIDER)? - paid_before;
    ensure!(paid == owed, "hub paid {PROVIDER} {paid}, owed {owed}");
    Ok(())
}

fn reporter_exactly_once_with_a_killed_validator(f: &mut Net) -> Result<()> {
    // 100,000 records of mixed classes with non-zero amounts through the
    // gateway SDK's reporter while validator 2 is SIGKILLed and one RPC
    // endpoint is unreachable; validator 2 stays down until a quarter of
    // the records landed in blocks it missed. Afterwards every validator
    // shows exactly what was recorded (every route, every counter, the
    // users' balances, what providers are owed), from the test's model.
    use std::sync::atomic::Ordering::Relaxed;
    use tally_client::{HttpTransport, ReportOutcome, Reporter, ReporterConfig};
    const N: usize = 100_000;
    const DEPOSIT: u64 = 1_000_000;
    let (net, key, chain_id) = (&f.net, &f.key, f.chain_id.as_str());
    let mut traffic = Traffic::new(99, key.clone(), chain_id, [5, 3, 2, 4]);
    let records: Vec<UsageRecord> = (0..N / 1000)
        .flat_map(|_| traffic.records(1000, 4))
        .map(|mut r| {
            // Non-zero amounts where the class may carry one (failed calls
            // carry 0).
            if Outcome::try_from(r.outcome).is_ok_and(Outcome::may_carry_amount) {
                r.amount += 1;
            }
            r
        })
        .collect();
    let mut model = Model::default();
    model.add(&records);
    // The users' credits come from hub deposits (synced down, confirmed).
    let mut funded = BTreeMap::new();
    for u in &traffic.users {
        funded.insert(u.clone(), net.balance(0, u)? + DEPOSIT);
        net.hub_deposit(u, DEPOSIT)?;
    }
    let start = Instant::now();
    for (u, want) in &funded {
        while net.balance(0, u)? != *want {
            ensure!(
                start.elapsed() < Duration::from_secs(60),
                "deposit for {u} not credited: {}",
                net.balance(0, u)?
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    let endpoints = vec![
        "http://127.0.0.1:1".to_string(),
        net.rpc_url(2),
        net.rpc_url(0),
        net.rpc_url(1),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let (outcomes, killed_at, restarted_at) = runtime.block_on(async {
        let mut cfg = ReporterConfig::new(endpoints, chain_id);
        cfg.ttl = Duration::from_secs(300);
        let reporter = Reporter::start(
            cfg,
            key.clone(),
            HttpTransport::new(Duration::from_secs(10)),
        )?;
        let mut down = None;
        let (mut killed_at, mut restarted_at) = (0, 0);
        let mut landed_at_kill = 0;
        for (i, r) in records.clone().into_iter().enumerate() {
            reporter.record(r).await?;
            if i + 1 == N / 4 {
                down = Some(net.take_down("kill", Some(2))?);
                killed_at = net.height(0);
                landed_at_kill = reporter.metrics().landed_records.load(Relaxed);
            }
            if i + 1 == 3 * N / 4 {
                // Real work while it is down: a quarter of the records land.
                let wait = Instant::now();
                while reporter.metrics().landed_records.load(Relaxed)
                    < landed_at_kill + N as u64 / 4
                {
                    ensure!(
                        wait.elapsed() < Duration::from_secs(60),
                        "only {} records landed while validator 2 was down",
                        reporter.metrics().landed_records.load(Relaxed) - landed_at_kill
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                restarted_at = net.height(0);
                if let Some(d) = down.take() {
                    d.now()?;
                }
            }
        }
        Ok::<_, anyhow::Error>((reporter.shutdown().await, killed_at, restarted_at))
    })?;
    let landed = tally_tests::sdk::landed(&outcomes);
    ensure!(
        landed == N,
        "landed {landed} of {N}: {:?}",
        outcomes
            .iter()
            .find(|o| !matches!(o, ReportOutcome::Landed { .. }))
    );
    // Most of the quarter that landed while it was down (a report confirmed
    // just after the kill may be in the block before) landed in blocks
    // validator 2
    // missed.
    let missed: usize = outcomes
        .iter()
        .filter_map(|o| match o {
            ReportOutcome::Landed {
                height, records, ..
            } if (killed_at + 1..=restarted_at).contains(height) => Some(*records),
            _ => None,
        })
        .sum();
    ensure!(
        missed >= N / 5,
        "only {missed} records landed in blocks validator 2 missed ({killed_at}..{restarted_at})"
    );
    eprintln!(
        "reporter: {N} records landed in {:.1} s; {missed} in blocks validator 2 missed",
        started.elapsed().as_secs_f64()
    );
    check_model(net, &model, &funded)
}

fn a_full_mempool_refuses_and_loses_nothing(f: &mut Net) -> Result<()> {
    // Validator 3 gets a 30-transaction mempool; 32 threads send it 2,400
    // one-call reports with broadcast_tx_sync, each thread one per 100 ms
    // (~320/s, ten times what the small mempool passes on, for ~8 s: the
    // mempool is full and refilled at every block). Each answer is sorted: code
    // 0 (accepted: it must land), code 39 (the app's full-mempool refusal),
    // any other code or an RPC error (CometBFT's own "mempool is full"
    // before CheckTx, also visible). Seen failing: without the app's limit
    // (`set_mempool_limit(None)`), hundreds of code-0 reports never land.
    const SIZE: usize = 30;
    const THREADS: usize = 32;
    const REPORTS: usize = 2_400;
    let net = &f.net;
    let cfg = net.dir().join("node3").join("config").join("config.toml");
    net.node("stop", 3)?;
    let text = std::fs::read_to_string(&cfg)?;
    let text = tally_tests::netbench::net::set_toml(&text, "mempool", "size", &SIZE.to_string())?;
    std::fs::write(&cfg, text)?;
    net.node("start", 3)?;
    net.wait_height(3, net.height(0) + 2, Duration::from_secs(60))?;

    let url = net.rpc_url(3);
    let (key, chain_id) = (f.key.clone(), f.chain_id.clone());
    let txs: Vec<Vec<u8>> = (0..REPORTS)
        .map(|i| {
            let r = rec(LOAD_USER, &format!("/mempool/{}", i % 8), Outcome::Ok, 0);
            build_report(&key, &chain_id, vec![r], now() + 300).tx
        })
        .collect();
    let txs = Arc::new(txs);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Per thread: (report index, CheckTx code or RPC error).
    type Answers = Vec<(usize, std::result::Result<u32, String>)>;
    let senders: Vec<JoinHandle<Answers>> = (0..THREADS)
        .map(|_| {
            let (txs, next, url) = (txs.clone(), next.clone(), url.clone());
            std::thread::spawn(move || {
                let rpc = Rpc::new(&url);
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(tx) = txs.get(i) else { break };
                    let answer = rpc
                        .broadcast_tx_sync(tx)
                        .map(|(code, _, _)| code)
                        .map_err(|e| e.to_string());
                    out.push((i, answer));
                    std::thread::sleep(Duration::from_millis(100));
                }
                out
            })
        })
        .collect();
    let mut accepted = Vec::new();
    let (mut full, mut other, mut rpc_errors) = (0usize, BTreeMap::new(), 0usize);
    for t in senders {
        let answers = t.join().map_err(|_| anyhow::anyhow!("sender panicked"))?;
        for (i, a) in answers {
            match a {
                Ok(0) => accepted.push(i),
                Ok(39) => full += 1,
                Ok(c) => *other.entry(c).or_insert(0usize) += 1,
                Err(e) => {
                    ensure!(e.contains("full"), "report {i}: {e}");
                    rpc_errors += 1
                }
            }
        }
    }
    eprintln!(
        "    {} accepted, {full} refused with code 39, {rpc_errors} RPC errors, other codes {other:?}",
        accepted.len()
    );
    ensure!(other.is_empty(), "unexpected CheckTx codes: {other:?}");
    ensure!(!accepted.is_empty(), "nothing was accepted");
    // Every accepted report must be in a block; the mempools drain first.
    let client = tx_client(&url);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lost = Vec::new();
    for &i in &accepted {
        let hash: [u8; 32] = sha2::Sha256::digest(&txs[i]).into();
        loop {
            match client.tx(&hash) {
                Ok(Some(r)) => {
                    ensure!(
                        r.code == 0,
                        "report {i} refused in a block: {} {}",
                        r.code,
                        r.log
                    );
                    break;
                }
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                _ => {
                    lost.push(i);
                    break;
                }
            }
        }
    }
    ensure!(
        lost.is_empty(),
        "{} of {} reports answered code 0 never landed (first: {:?})",
        lost.len(),
        accepted.len(),
        &lost[..lost.len().min(5)]
    );
    ensure!(
        full > 0,
        "the flood never met the app's full-mempool refusal (nothing proven)"
    );
    Ok(())
}

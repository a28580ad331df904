//! End to end with real CometBFT processes: a network that grows after
//! genesis (ADR 0020) on a four-validator localnet with the hub, at app
//! version 3, with a registration fee of 100 on the hub. The tests, in
//! order:
//!
//! 1. `a_newcomer_registers_on_the_hub_and_is_billed_through_the_sdk`: a
//!    user unknown at genesis deposits 10,100 on the hub with its key; every
//!    validator binds the key and credits 10,000; the user grants the demo
//!    gateway an allowance (`tallyd tx allowance grant`) and the gateway
//!    SDK bills it 50 calls of 7 credits;
//! 2. `the_newcomer_withdraws_the_rest_exactly_once`: `tallyd tx withdraw`
//!    of the whole balance; the hub pays it to the user once, the chain's
//!    balance is 0 on every node, and the books agree to the credit: hub
//!    escrow 0, withdrawn 9,650, the provider paid 350;
//! 3. `a_gateway_added_after_genesis_bills_once_approved`: `tallyd tx
//!    gateway propose add` on validator 0, approved by 1 and 2; a genesis
//!    user grants it an allowance and its reports land;
//! 4. `a_parameter_change_takes_effect_at_its_window`: `tallyd tx params
//!    propose` of `max_report_records` from a window 3 windows ahead; the
//!    first height that answers the new value is the first block of that
//!    window, on every node.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED),
//! built `tallyd` and `tally-hub`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, hub_path, tallyd_ok, Localnet};
use tally_tests::sdk::send_all;

/// Ports from here (validator i: +10 i; hub +100), or the next free block.
const PORT_BASE: u16 = 20656;
const WINDOW_SECS: u64 = 10;
const NEWBIE: &str = "newbie";
/// Only the newbie's calls go to this provider.
const PROVIDER: &str = "prov-growth";

const TESTS: [Test<Net>; 4] = [
    Test {
        name: "a_newcomer_registers_on_the_hub_and_is_billed_through_the_sdk",
        needs: &[],
        run: a_newcomer_registers_on_the_hub_and_is_billed_through_the_sdk,
    },
    Test {
        name: "the_newcomer_withdraws_the_rest_exactly_once",
        needs: &["a_newcomer_registers_on_the_hub_and_is_billed_through_the_sdk"],
        run: the_newcomer_withdraws_the_rest_exactly_once,
    },
    Test {
        name: "a_gateway_added_after_genesis_bills_once_approved",
        needs: &[],
        run: a_gateway_added_after_genesis_bills_once_approved,
    },
    Test {
        name: "a_parameter_change_takes_effect_at_its_window",
        needs: &[],
        run: a_parameter_change_takes_effect_at_its_window,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture.
struct Net {
    net: Localnet,
    chain_id: String,
    /// The newbie's key file.
    newbie_key: std::path::PathBuf,
}

impl Net {
    fn start() -> Result<Self> {
        let base = free_port_base(PORT_BASE, 4)?;
        let net = Localnet::launch(4, base, "500ms", WINDOW_SECS, &Default::default())?;
        let chain_id = net.rpc(0).status()?.chain_id;
        net.wait_for_key(Duration::from_secs(120))?;
        let newbie_key = net.dir().join("newbie.key");
        tally_node::keyfile::write(&newbie_key, NEWBIE, &SigningKey::from_bytes(&[0x4e; 32]))?;
        Ok(Self {
            net,
            chain_id,
            newbie_key,
        })
    }

    fn url(&self, i: usize) -> String {
        self.net.rpc_url(i)
    }
}

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let r = rpc.abci_query(path)?;
    ensure!(r.code == 0, "{path}: code {} {}", r.code, r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

fn hub_query(f: &Net, path: &str) -> Result<Value> {
    query(&Rpc::new(&f.net.hub_rpc_url()), path)
}

/// Polls `done` every 300 ms until it holds, at most `secs`.
fn wait(
    f: &Net,
    secs: u64,
    what: &str,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let t = Instant::now();
    loop {
        if done()? {
            return Ok(t.elapsed());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(secs),
            "{what}: not after {secs} s\n{}",
            f.net.logs_tail()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Sends `n` records of `amount` for `user` through the SDK's reporter
/// signed by `key`; every one must land.
fn bill(f: &Net, key: SigningKey, user: &str, n: usize, amount: u64) -> Result<()> {
    let r = UsageRecord {
        user: user.into(),
        provider: PROVIDER.into(),
        model: "org/growth".into(),
        route: "/v1/chat".into(),
        outcome: Outcome::Ok as i32,
        units: 1,
        amount,
        ..Default::default()
    };
    let endpoints = vec![f.url(0), f.url(1)];
    let (flush, within) = (Some(Duration::from_millis(300)), Duration::from_secs(120));
    send_all(endpoints, &f.chain_id, key, vec![r; n], flush, within)
}

/// `tallyd tx allowance grant`: `user` (key file `from`) lets `gateway`
/// charge it 100,000 credits per window for an hour.
fn grant(f: &Net, from: &str, user: &str, gateway: &str) -> Result<()> {
    let url = f.url(0);
    tallyd_ok(&[
        "tx",
        "allowance",
        "grant",
        "--from",
        from,
        "--user",
        user,
        "--gateway",
        gateway,
        "--max-per-window",
        "100000",
        "--expires-in",
        "3600",
        "--node",
        &url,
    ])
    .map(|_| ())
}

fn balances(f: &Net, user: &str) -> Result<Vec<u64>> {
    (0..4).map(|i| f.net.balance(i, user)).collect()
}

fn a_newcomer_registers_on_the_hub_and_is_billed_through_the_sdk(f: &mut Net) -> Result<()> {
    let (_, key) = tally_node::keyfile::load(&f.newbie_key)?;
    let pubkey = hex::encode(key.verifying_key().to_bytes());
    let out = std::process::Command::new(hub_path()?)
        .args([
            "deposit", "--user", NEWBIE, "--amount", "10100", "--pubkey", &pubkey,
        ])
        .args(["--node", &f.net.hub_rpc_url()])
        .output()?;
    ensure!(
        out.status.success(),
        "hub deposit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(hub_query(f, &format!("/user/{NEWBIE}"))?["escrow"] == 10_000);
    ensure!(hub_query(f, "/fees")?["fees"] == 100);
    wait(
        f,
        60,
        "the key bound and 10000 credited on every node",
        || {
            let keyed = (0..4).all(|i| {
                query(&f.net.rpc(i), &format!("/allowances/{NEWBIE}"))
                    .is_ok_and(|a| a["key"] == pubkey.as_str())
            });
            Ok(keyed && balances(f, NEWBIE)? == [10_000; 4])
        },
    )?;
    grant(
        f,
        &f.newbie_key.display().to_string(),
        NEWBIE,
        "demo-gateway",
    )?;
    bill(f, f.net.gateway_key()?, NEWBIE, 50, 7)?;
    wait(f, 30, "350 charged on every node", || {
        Ok(balances(f, NEWBIE)? == [9_650; 4])
    })?;
    Ok(())
}

fn the_newcomer_withdraws_the_rest_exactly_once(f: &mut Net) -> Result<()> {
    let from = f.newbie_key.display().to_string();
    let t = Instant::now();
    tallyd_ok(&[
        "tx",
        "withdraw",
        "--from",
        &from,
        "--user",
        NEWBIE,
        "--amount",
        "9650",
        "--node",
        &f.url(1),
    ])?;
    ensure!(balances(f, NEWBIE)?.iter().all(|b| *b == 0 || *b == 9_650));
    wait(f, 120, "the hub paid the withdrawal", || {
        Ok(hub_query(f, &format!("/withdrawn/{NEWBIE}"))?["withdrawn"] == 9_650)
    })?;
    eprintln!(
        "[e2e] withdrawal latency (request to hub credit): {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // The charges settle too; then the books agree to the credit.
    wait(f, 120, "escrow emptied and the provider paid", || {
        Ok(hub_query(f, &format!("/escrow/{NEWBIE}"))?["escrow"] == 0
            && hub_query(f, &format!("/payout/{PROVIDER}"))?["paid"] == 350)
    })?;
    wait(f, 30, "the withdrawal settled on every node", || {
        Ok((0..4).all(|i| {
            query(&f.net.rpc(i), &format!("/withdrawals/{NEWBIE}")).is_ok_and(|w| {
                w["withdrawals"].as_array().is_some_and(|a| {
                    a.len() == 1 && a[0]["status"] == "settled" && a[0]["amount"] == 9_650
                })
            })
        }))
    })?;
    ensure!(balances(f, NEWBIE)? == [0; 4]);
    // Once: a second withdrawal finds nothing to take.
    let again = tally_tests::localnet::run_tallyd(&[
        "tx",
        "withdraw",
        "--from",
        &from,
        "--user",
        NEWBIE,
        "--amount",
        "1",
        "--node",
        &f.url(0),
    ])?;
    ensure!(
        !again.status.success(),
        "a withdrawal from an empty balance was accepted"
    );
    ensure!(
        String::from_utf8_lossy(&again.stderr).contains("insufficient_balance"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    ensure!(hub_query(f, &format!("/withdrawn/{NEWBIE}"))?["withdrawn"] == 9_650);
    Ok(())
}

/// Proposes with `args` from validator 0 and approves it from 1 and 2
/// (3 of 4 equal powers); returns the proposal's final state.
fn pass(f: &Net, args: &[&str]) -> Result<Value> {
    f.net.pass_proposal(args)
}

fn a_gateway_added_after_genesis_bills_once_approved(f: &mut Net) -> Result<()> {
    let key = SigningKey::from_bytes(&[0x6c; 32]);
    let pubkey = hex::encode(key.verifying_key().to_bytes());
    let p = pass(
        f,
        &[
            "tx", "gateway", "propose", "add", "--name", "gw-late", "--pubkey", &pubkey,
        ],
    )?;
    ensure!(p["status"] == "applied", "{p}");
    wait(f, 20, "gw-late active on every node", || {
        Ok((0..4).all(|i| {
            query(&f.net.rpc(i), "/gateways").is_ok_and(|g| {
                g["gateways"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|x| x["name"] == "gw-late" && x["status"] == "active")
                })
            })
        }))
    })?;
    let alice_key = f
        .net
        .dir()
        .join("users")
        .join("alice.key")
        .display()
        .to_string();
    grant(f, &alice_key, "alice", "gw-late")?;
    let before = balances(f, "alice")?;
    bill(f, key, "alice", 10, 3)?;
    wait(f, 30, "30 charged to alice on every node", || {
        Ok(balances(f, "alice")?
            .iter()
            .zip(&before)
            .all(|(a, b)| a + 30 == *b))
    })?;
    Ok(())
}

/// The first 19 characters of an RFC 3339 time (to the second), which
/// order like the times.
fn to_second(t: &str) -> String {
    t.chars().take(19).collect()
}

/// The settlement window of RFC 3339 time `t`: the largest `w` whose
/// start is not after it.
fn window_of(t: &str) -> u64 {
    let t = to_second(t);
    let (mut lo, mut hi) = (0u64, u64::from(u32::MAX) / WINDOW_SECS);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if to_second(&tally_settlement::time::rfc3339(mid * WINDOW_SECS)) <= t {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The parameters in force after block `h`: the raw `meta/params` key
/// through `/key` (JSON queries answer the latest height only).
fn params_at(rpc: &Rpc, h: u64) -> Result<Value> {
    use base64::Engine as _;
    let r = rpc.call(
        "abci_query",
        serde_json::json!({"path": "/key", "data": hex::encode(b"meta/params"),
            "height": h.to_string(), "prove": false}),
    )?;
    let resp = &r["response"];
    ensure!(
        resp["code"].as_u64().unwrap_or(0) == 0,
        "meta/params at {h}: {resp}"
    );
    let raw = base64::engine::general_purpose::STANDARD
        .decode(resp["value"].as_str().context("no value")?)?;
    Ok(serde_json::from_slice(&raw)?)
}

fn block_time(rpc: &Rpc, h: u64) -> Result<String> {
    let v = rpc.call("block", serde_json::json!({"height": h.to_string()}))?;
    Ok(v["block"]["header"]["time"]
        .as_str()
        .context("block time")?
        .to_string())
}

fn a_parameter_change_takes_effect_at_its_window(f: &mut Net) -> Result<()> {
    let rpc = f.net.rpc(0);
    let now = query(&rpc, "/params")?;
    ensure!(now["max_report_records"] == 1000, "{now}");
    let latest = rpc.status()?;
    let t = block_time(&rpc, latest.height)?;
    let w = window_of(&t);
    let from = w + 3;
    let p = pass(
        f,
        &[
            "tx",
            "params",
            "propose",
            "--from-window",
            &from.to_string(),
            "--set",
            "max_report_records=500",
        ],
    )?;
    ensure!(p["status"] == "applied", "{p}");
    let scheduled = query(&rpc, "/params")?;
    ensure!(
        scheduled["scheduled"][0]["from_window"] == from,
        "{scheduled}"
    );
    wait(
        f,
        WINDOW_SECS * 6,
        "the change in force on every node",
        || {
            Ok((0..4).all(|i| {
                query(&f.net.rpc(i), "/params")
                    .is_ok_and(|p| p["max_report_records"] == 500 && p["since_window"] == from)
            }))
        },
    )?;
    // The first height that answers 500 is the first block of `from`.
    let top = rpc.status()?.height;
    let mut first = top;
    while first > 1 {
        let v = params_at(&rpc, first - 1)?;
        if v["max_report_records"] != 500 {
            break;
        }
        first -= 1;
    }
    let start = to_second(&tally_settlement::time::rfc3339(from * WINDOW_SECS));
    let at = to_second(&block_time(&rpc, first)?);
    let before = to_second(&block_time(&rpc, first - 1)?);
    ensure!(
        at >= start && before < start,
        "the change took effect at height {first} ({at}); window {from} starts at {start}; the block before is at {before}"
    );
    Ok(())
}

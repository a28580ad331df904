//! `tally-bench deposits [--deposits N] [--app-version V] [--senders S]`:
//! how fast a burst of hub deposits is credited on a real 4-validator
//! localnet with its reference hub (issue 31, goal 4; ADR 0024).
//!
//! Starts `localnet/up.sh` at app version `V` (default: the newest this
//! build carries), waits for the threshold key, then puts `N` deposits
//! (default 30,000) on the hub over `S` `broadcast_tx_sync` connections
//! (default 8; a full hub mempool is retried). Every 250 ms it reads
//! validator 0's `/sync/hub` (the next deposit sequence number: deposits
//! credited so far) and height. It prints when the hub took the last
//! deposit, when Tally credited the first and the last, the crediting rate
//! over that span and the best 10-second rate, and deposits per Tally
//! block. At the end every validator's balance of a sampled user must
//! equal what was deposited for it. The network is stopped on exit, also
//! on failure.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine;
use prost::Message;
use tally_hub_types::{hub_tx, Deposit, HubTx};
use tally_node::rpc::Rpc;

use crate::localnet::{free_port_base, Localnet};

/// Users the deposits go to, round robin.
pub const USERS: u64 = 200;

/// The user deposit `i` goes to.
pub fn user(i: u64) -> String {
    format!("dep-{:04}", i % USERS)
}

/// Deposit `i`'s amount: distinct per deposit, so no two hub transactions
/// are the same bytes (CometBFT's cache would drop a repeat).
fn amount(i: u64) -> u64 {
    1 + i
}

/// Parses the arguments after `deposits` and runs the benchmark.
pub fn main(args: &[String]) -> Result<()> {
    let mut n = 30_000u64;
    let mut version = tally_settlement::upgrade::LATEST_APP_VERSION;
    let mut senders = 8usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = |what: &str| -> Result<u64> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|v| *v > 0)
                .with_context(|| format!("{what} needs a positive number"))
        };
        match a.as_str() {
            "--deposits" => n = num("--deposits")?,
            "--app-version" => {
                version = num("--app-version")?;
                ensure!(
                    version <= tally_settlement::upgrade::LATEST_APP_VERSION,
                    "--app-version {version}: this build carries 1 to {}",
                    tally_settlement::upgrade::LATEST_APP_VERSION
                );
            }
            "--senders" => senders = num("--senders")?.min(64) as usize,
            other => bail!(
                "unknown argument {other:?}; usage: deposits [--deposits N] [--app-version V] [--senders S]"
            ),
        }
    }
    run(n, version, senders)
}

/// One sample of validator 0: seconds since the deposits started, Tally
/// height, deposits credited.
#[derive(Clone, Copy, Debug)]
struct Sample {
    secs: f64,
    height: u64,
    credited: u64,
}

fn run(n: u64, version: u64, senders: usize) -> Result<()> {
    let base = free_port_base(27400, 4)?;
    let v = version.to_string();
    let net = Localnet::start_with(4, base, "1s", 60, &[("TALLY_APP_VERSION", &v)])?;
    net.wait_for_key(Duration::from_secs(180))?;
    let tally = net.rpc(0);
    let before = credited(&tally)?;
    println!(
        "deposits: {n} on the reference hub, 4 validators, app version {version}, {senders} senders (credited before: {before})"
    );
    let start = Instant::now();
    let threads = put_deposits(&net.hub_rpc_url(), n, senders);
    let mut samples: Vec<Sample> = Vec::new();
    let mut hub_done: Option<f64> = None;
    let deadline = Duration::from_secs(600 + n / 10);
    loop {
        std::thread::sleep(Duration::from_millis(250));
        if hub_done.is_none() && threads.iter().all(|t| t.is_finished()) {
            hub_done = Some(start.elapsed().as_secs_f64());
        }
        let Ok(c) = credited(&tally) else { continue };
        samples.push(Sample {
            secs: start.elapsed().as_secs_f64(),
            height: net.height(0),
            credited: c - before,
        });
        if c - before >= n {
            break;
        }
        if start.elapsed() > deadline {
            bail!("{} of {n} deposits credited after {deadline:?}", c - before);
        }
    }
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a sender panicked"))??;
    }
    report(n, &samples, hub_done.unwrap_or(f64::NAN));
    // Every validator credited every deposit: a sampled user's balance is
    // the sum of its deposits (users start at zero on a hub localnet).
    for u in [0, 1, USERS - 1] {
        let want = deposited_for(u, n);
        for i in 0..4 {
            let got = net.balance(i, &user(u))?;
            ensure!(
                got == want,
                "validator {i}: {} has {got}, deposited {want}",
                user(u)
            );
        }
    }
    println!("balances: every validator holds exactly the sampled users' deposits");
    Ok(())
}

/// Starts `senders` threads that put deposits `0..n` on the hub at
/// `hub_url` (deposit `i` of [`amount`]`(i)` to [`user`]`(i)`); join them
/// to learn whether every one was taken.
pub fn put_deposits(
    hub_url: &str,
    n: u64,
    senders: usize,
) -> Vec<std::thread::JoinHandle<Result<()>>> {
    (0..senders as u64)
        .map(|s| {
            let url = hub_url.to_string();
            std::thread::spawn(move || send(&url, s, senders as u64, n))
        })
        .collect()
}

/// What [`put_deposits`] deposited for user number `u` (of [`USERS`]) when
/// it put `n` deposits.
pub fn deposited_for(u: u64, n: u64) -> u64 {
    (0..n).filter(|i| i % USERS == u).map(amount).sum()
}

/// Deposits credited on `rpc`'s node: the next deposit sequence number
/// minus one.
pub fn credited(rpc: &Rpc) -> Result<u64> {
    let a = rpc.abci_query("/sync/hub")?;
    ensure!(a.code == 0, "/sync/hub: {}", a.log);
    let v: serde_json::Value = serde_json::from_slice(&a.value)?;
    let next = v["next_deposit_seq"]
        .as_u64()
        .context("/sync/hub has no next_deposit_seq")?;
    Ok(next.saturating_sub(1))
}

/// Sender `s` of `of`: deposits `s, s + of, ...` below `n`, each until the
/// hub's CheckTx takes it (a full mempool is retried after 20 ms).
fn send(url: &str, s: u64, of: u64, n: u64) -> Result<()> {
    let rpc = Rpc::new(url);
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut i = s;
    while i < n {
        let tx = HubTx {
            sum: Some(hub_tx::Sum::Deposit(Deposit {
                user: user(i),
                amount: amount(i),
                pubkey: Vec::new(),
            })),
        }
        .encode_to_vec();
        let r = rpc.call(
            "broadcast_tx_sync",
            serde_json::json!({ "tx": b64.encode(&tx) }),
        );
        match r {
            Ok(v) if v["code"].as_u64() == Some(0) => {
                i += of;
            }
            Ok(v) => bail!("hub refused deposit {i}: {v}"),
            Err(e) if e.to_string().contains("mempool is full") => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => bail!("broadcasting deposit {i}: {e}"),
        }
    }
    Ok(())
}

/// Prints the figures of a finished run.
fn report(n: u64, samples: &[Sample], hub_done: f64) {
    let first = samples.iter().find(|s| s.credited > 0);
    let last = samples.last();
    let (Some(first), Some(last)) = (first, last) else {
        println!("no samples");
        return;
    };
    // The sample before the first credit bounds when crediting began.
    let span = (last.secs - first.secs).max(0.25);
    let mut best = 0.0f64;
    for (i, a) in samples.iter().enumerate() {
        if let Some(b) = samples[i..].iter().find(|b| b.secs - a.secs >= 10.0) {
            best = best.max((b.credited - a.credited) as f64 / (b.secs - a.secs));
        }
    }
    let blocks = last.height.saturating_sub(first.height).max(1);
    println!("hub took the last deposit at   {hub_done:8.1} s");
    println!("first deposit credited at      {:8.1} s", first.secs);
    println!("last deposit credited at       {:8.1} s", last.secs);
    println!(
        "credited {n} in {span:.1} s from the first credit: {:.0} deposits/s; best 10 s: {best:.0}/s",
        (n - first.credited) as f64 / span
    );
    println!(
        "Tally blocks {}..{}: {:.0} deposits per block, {:.2} s per block",
        first.height,
        last.height,
        (n - first.credited) as f64 / blocks as f64,
        span / blocks as f64
    );
}

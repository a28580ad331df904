//! What the chaos run does to the network besides faults (ADR 0020): users
//! unknown at genesis register by a keyed hub deposit and grant the
//! gateways allowances, users withdraw, a parameter changes mid-run and a
//! gateway's key is rotated. Each action goes through the same commands an
//! operator or a user would run (`tally-hub deposit`, `tallyd tx ...`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ed25519_dalek::SigningKey;

use crate::localnet::{hub_path, run_tallyd, Localnet};

/// Users that join mid-run.
pub const NEWCOMERS: [&str; 2] = ["cn-0", "cn-1"];
/// What each newcomer deposits, before the hub's registration fee (the
/// localnet's: 100).
pub const NEWCOMER_DEPOSIT: u64 = 20_000_100;
/// The registration fee the localnet's hub keeps.
pub const FEE: u64 = 100;
/// What each withdrawal takes.
pub const WITHDRAWAL: u64 = 1_000;

/// The key file of a newcomer.
pub fn newcomer_key(net: &Localnet, user: &str) -> PathBuf {
    net.dir().join(format!("{user}.key"))
}

/// Registers `user` by a deposit carrying a fresh key, waits until every
/// validator bound it, then grants each of `gateways` an allowance.
pub fn register(net: &Localnet, user: &str, seed: u8, gateways: &[&str]) -> Result<()> {
    let key = SigningKey::from_bytes(&[seed; 32]);
    let path = newcomer_key(net, user);
    tally_node::keyfile::write(&path, user, &key)?;
    let pubkey = hex::encode(key.verifying_key().to_bytes());
    let out = std::process::Command::new(hub_path()?)
        .args([
            "deposit",
            "--user",
            user,
            "--amount",
            &NEWCOMER_DEPOSIT.to_string(),
        ])
        .args(["--pubkey", &pubkey, "--node", &net.hub_rpc_url()])
        .output()?;
    ensure!(
        out.status.success(),
        "hub deposit for {user}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Instant::now();
    loop {
        let bound = (0..4).all(|i| {
            net.rpc(i)
                .abci_query(&format!("/allowances/{user}"))
                .ok()
                .and_then(|a| serde_json::from_slice::<serde_json::Value>(&a.value).ok())
                .is_some_and(|v| v["key"] == pubkey.as_str())
        });
        if bound {
            break;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(300),
            "{user}'s key not bound in 300 s"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    for g in gateways {
        allowance(net, &path, user, g)?;
    }
    Ok(())
}

/// `tallyd tx allowance grant`, retried while a validator restarts.
fn allowance(net: &Localnet, key: &std::path::Path, user: &str, gateway: &str) -> Result<()> {
    let key = key.display().to_string();
    retry(net, |url| {
        run_tallyd(&[
            "tx",
            "allowance",
            "grant",
            "--from",
            &key,
            "--user",
            user,
            "--gateway",
            gateway,
            "--max-per-window",
            "1000000000",
            "--expires-in",
            "86400",
            "--node",
            url,
        ])
    })
    .map(|_| ())
}

/// Runs `f` against validators 0..4 in turn until one succeeds (a node may
/// be down for a fault); the first success's stdout.
fn retry(net: &Localnet, f: impl Fn(&str) -> Result<std::process::Output>) -> Result<String> {
    let mut last = String::new();
    for attempt in 0..12 {
        let url = net.rpc_url(attempt % 4);
        let out = f(&url)?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        // A refusal by the chain is final; only a node that did not answer
        // is retried.
        if last.contains("refused: code") {
            bail!("{last}");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    bail!("no validator took it: {last}")
}

/// `user` withdraws [`WITHDRAWAL`] credits signed with `key`; whether the
/// chain took it (a refusal for the balance is fine under load: the
/// audit counts what the hub paid).
pub fn withdraw(net: &Localnet, key: &std::path::Path, user: &str) -> Result<bool> {
    let key = key.display().to_string();
    let amount = WITHDRAWAL.to_string();
    match retry(net, |url| {
        run_tallyd(&[
            "tx", "withdraw", "--from", &key, "--user", user, "--amount", &amount, "--node", url,
        ])
    }) {
        Ok(_) => Ok(true),
        Err(e) if e.to_string().contains("insufficient_balance") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Proposes `args` from validator 0 and approves it from 1 and 2; the
/// proposal's status.
pub fn pass(net: &Localnet, args: &[&str]) -> Result<String> {
    let p = net.pass_proposal(args)?;
    Ok(p["status"].as_str().context("proposal status")?.to_string())
}

/// The newest settlement window with records on validator 0 (under the
/// chaos load, the current one).
pub fn current_window(net: &Localnet) -> Result<u64> {
    let r = net.rpc(0).abci_query("/windows?limit=1000")?;
    let v: serde_json::Value = serde_json::from_slice(&r.value)?;
    v["windows"]
        .as_array()
        .and_then(|w| w.iter().filter_map(|w| w["window"].as_u64()).max())
        .context("no window yet")
}

//! The audit at the end of a chaos run: the money on both chains, printed
//! line by line and checked (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use tally_node::rpc::Rpc;

use super::{query, Grown, GATEWAYS, NEWCOMERS, PROVIDERS, USERS};
use crate::localnet::Localnet;

#[allow(clippy::too_many_arguments)]
pub(super) fn audit(
    net: &Localnet,
    (made, credited_before): (u64, u64),
    grown: &Grown,
    sent: u64,
    landed: u64,
    other: &BTreeMap<String, u64>,
    stale_answers: u64,
    start: Instant,
) -> Result<()> {
    let hub = Rpc::new(&net.hub_rpc_url());
    let mut failures = Vec::new();
    let mut check = |ok: bool, what: String| {
        println!("audit: {what} {}", if ok { "ok" } else { "MISMATCH" });
        if !ok {
            failures.push(what);
        }
    };
    let sync = query(&net.rpc(0), "/sync/hub")?;
    let credited_count = sync["next_deposit_seq"]
        .as_u64()
        .unwrap_or(1)
        .saturating_sub(credited_before);
    let mut balances = 0u64;
    let mut debits = 0u64;
    let mut counted = [0u64; 4];
    let everyone: Vec<&str> = USERS.iter().chain(NEWCOMERS.iter()).copied().collect();
    let mut withdrawn = 0u64;
    for u in &everyone {
        withdrawn += query(&hub, &format!("/withdrawn/{u}"))?["withdrawn"]
            .as_u64()
            .unwrap_or(0);
    }
    for u in &everyone {
        balances += net.balance(0, u)?;
        for (i, c) in counted.iter_mut().enumerate() {
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    Some(c) => format!("/sla/user/{u}?limit=1000&cursor={c}"),
                    None => format!("/sla/user/{u}?limit=1000"),
                };
                let v = query(&net.rpc(i), &path)?;
                for r in v["records"].as_array().context("records")? {
                    *c += r["requests"].as_u64().unwrap_or(0);
                    if i == 0 {
                        debits += r["amount"].as_u64().unwrap_or(0);
                    }
                }
                match v["next_cursor"].as_str() {
                    Some(n) => cursor = Some(n.to_string()),
                    None => break,
                }
            }
        }
    }
    let mut paid = 0u64;
    for p in PROVIDERS {
        paid += query(&hub, &format!("/payout/{p}"))?["paid"]
            .as_u64()
            .unwrap_or(0);
    }
    let mut escrow = 0u64;
    for u in &everyone {
        escrow += query(&hub, &format!("/escrow/{u}"))?["escrow"]
            .as_u64()
            .unwrap_or(0);
    }
    let pending: u64 = query(&net.rpc(0), "/hubcalls/hub?limit=1000")?["calls"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["amount"].as_u64()).sum())
        .unwrap_or(0);
    // Nonces: each settled once on the hub, with the chain's calls.
    let formed = sync["next_nonce"].as_u64().unwrap_or(1) - 1;
    let last = query(&hub, "/last_nonce/hub")?["last_nonce"]
        .as_u64()
        .unwrap_or(0);
    let mut twice = 0u64;
    let mut ids = BTreeSet::new();
    for n in 1..=formed {
        let b = query(&net.rpc(0), &format!("/batch/hub/{n}"))?;
        let calls = b["calls"].as_array().context("calls")?;
        let mut dup = false;
        for c in calls {
            dup |= !ids.insert(c["id"].as_u64().unwrap_or(0));
        }
        let h = query(&hub, &format!("/batch/hub/{n}"))?;
        if dup || h["calls"].as_u64() != Some(calls.len() as u64) || b["status"] != "settled" {
            twice += 1;
            eprintln!("batch {n}: chain {b}\nhub {h}");
        }
    }
    println!(
        "audit: ran {:.0} min; proxy served {stale_answers} stale tips; batches {formed}, hub last nonce {last}",
        start.elapsed().as_secs_f64() / 60.0
    );
    println!("audit: records offered {sent}, landed (SDK) {landed}, not landed {other:?}");
    check(
        credited_count == everyone.len() as u64,
        format!(
            "deposits made {} ({made} net of fees), credited {credited_count}",
            everyone.len()
        ),
    );
    check(
        balances + debits + withdrawn == made,
        format!("Σ balances {balances} + Σ user debits {debits} + Σ withdrawn {withdrawn} = Σ deposits {made}"),
    );
    check(
        withdrawn == grown.withdrawals,
        format!(
            "Σ withdrawn on the hub {withdrawn} = withdrawals the chain took {}",
            grown.withdrawals
        ),
    );
    check(
        debits == paid + pending,
        format!("Σ user debits {debits} = Σ paid by the hub {paid} + Σ pending {pending}"),
    );
    check(
        pending == 0,
        format!("Σ pending after settling {pending} = 0"),
    );
    check(
        escrow + paid + withdrawn == made,
        format!("hub escrow {escrow} + paid {paid} + withdrawn {withdrawn} = deposits {made}"),
    );
    let p = query(&net.rpc(0), "/params")?;
    check(
        p["max_batch_calls"] == 50 && p["since_window"].as_u64() >= Some(grown.param_window),
        format!(
            "max_batch_calls {} since window {} (changed from window {})",
            p["max_batch_calls"], p["since_window"], grown.param_window
        ),
    );
    let gws = query(&net.rpc(0), "/gateways")?;
    let status_of = |name: &str, current: bool| {
        gws["gateways"].as_array().and_then(|a| {
            a.iter()
                .find(|g| {
                    g["name"] == name
                        && (g["pubkey"].as_str() == grown.rotated.as_deref()) == current
                })
                .map(|g| g["status"].as_str().unwrap_or("?").to_string())
        })
    };
    check(
        grown.rotated.is_none()
            || (status_of(GATEWAYS[0], true).as_deref() == Some("active")
                && status_of(GATEWAYS[0], false).as_deref() == Some("retired")),
        format!(
            "{} rotated: new key {:?}, old key {:?}",
            GATEWAYS[0],
            status_of(GATEWAYS[0], true),
            status_of(GATEWAYS[0], false)
        ),
    );
    check(
        last == formed,
        format!("hub last nonce {last} = batches formed {formed}"),
    );
    check(
        twice == 0,
        format!("nonces paid twice or not as formed: {twice}"),
    );
    for (i, c) in counted.iter().enumerate() {
        check(
            *c == landed,
            format!("records counted on validator {i} {c} = landed {landed}"),
        );
    }
    ensure!(failures.is_empty(), "audit failed: {failures:?}");
    println!("audit: every invariant holds");
    Ok(())
}

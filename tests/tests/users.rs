//! Users after genesis and withdrawals (ADR 0020) through the in-process
//! driver, with the modelled hub and relays, on a keyed net of 4 at app
//! version 3. A user unknown at genesis funds itself on the hub with a
//! deposit that carries its key, grants a gateway an allowance, is billed,
//! changes its key and takes the rest back. Oracles: hand-computed
//! balances, the hub model's payouts, and the driver's app-hash agreement
//! on every node at every height.

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use tally_settlement::proto::{
    user_msg, AllowanceChange, Outcome as CallOutcome, UsageRecord, UserKeyChange, UserMsg,
    Withdrawal,
};
use tally_settlement::user::sign_user_msg;
use tally_settlement::{sign_allowance, Code};
use tally_tests::dkgnet::{user_key, DkgNet, CHAIN};

const NEWBIE: &str = "newbie";

fn query(net: &DkgNet, i: usize, path: &str) -> Result<serde_json::Value> {
    let r = tally_settlement::query::query(net.net.nodes[i].app.committed_state(), path);
    ensure!(r.code == Code::Ok, "{path}: {}", r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

fn balance(net: &DkgNet, i: usize, user: &str) -> Result<u64> {
    Ok(tally_settlement::balance(
        net.net.nodes[i].app.committed_state(),
        user,
    )?)
}

/// Runs one block carrying `txs` (no other usage); their result codes.
fn run(net: &mut DkgNet, txs: &[Vec<u8>]) -> Result<Vec<Code>> {
    let o = net.block(false, txs.to_vec())?;
    txs.iter()
        .map(|tx| {
            let pos = o
                .block
                .txs
                .iter()
                .position(|t| t.as_ref() == tx.as_slice())
                .context("tx not included")?;
            Code::from_value(o.tx_results[pos].code).context("unknown code")
        })
        .collect()
}

fn msg(key: &SigningKey, sequence: u64, sum: user_msg::Sum) -> Vec<u8> {
    sign_user_msg(
        key,
        &UserMsg {
            chain_id: CHAIN.into(),
            user: NEWBIE.into(),
            sequence,
            sum: Some(sum),
        },
    )
}

fn withdraw(key: &SigningKey, sequence: u64, amount: u64) -> Vec<u8> {
    msg(
        key,
        sequence,
        user_msg::Sum::Withdraw(Withdrawal { amount }),
    )
}

/// A report by the genesis gateway charging the newbie `amount` credits.
fn charge(net: &mut DkgNet, amount: u64) -> Vec<u8> {
    let rec = UsageRecord {
        user: NEWBIE.into(),
        provider: "prov-0".into(),
        model: "m".into(),
        route: "r".into(),
        outcome: CallOutcome::Ok.into(),
        units: 1,
        amount,
        ..Default::default()
    };
    let now = net.net.now as u64;
    net.traffic.report(vec![rec], now, 120)
}

#[test]
fn a_user_unknown_at_genesis_registers_is_billed_and_withdraws_the_rest() -> Result<()> {
    let mut net = DkgNet::new_at(4, 3, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    net.pin_hub()?;
    let key = SigningKey::from_bytes(&[77; 32]);
    let other = SigningKey::from_bytes(&[78; 32]);
    {
        let hub = net.net.hub.as_mut().context("hub")?;
        hub.deposit_keyed(8, NEWBIE, 10_000, key.verifying_key().to_bytes().to_vec());
        // A key for a user the chain knows is ignored, and so is one for a
        // user a plain deposit funded first.
        hub.deposit_keyed(9, "user-0", 50, other.verifying_key().to_bytes().to_vec());
        hub.deposit(7, "keyless", 500);
        hub.deposit_keyed(9, "keyless", 50, other.verifying_key().to_bytes().to_vec());
        hub.tip = 10;
    }
    net.until(20, |s| Ok(balance(s, 0, NEWBIE)? == 10_000))?;
    for i in 0..4 {
        let a = query(&net, i, &format!("/allowances/{NEWBIE}"))?;
        ensure!(
            a["key"] == hex::encode(key.verifying_key().to_bytes()),
            "node{i}: {a}"
        );
        let a = query(&net, i, "/allowances/user-0")?;
        ensure!(
            a["key"] == hex::encode(user_key("user-0").verifying_key().to_bytes()),
            "node{i}: {a}"
        );
        let a = query(&net, i, "/allowances/keyless")?;
        ensure!(
            a["key"].is_null() && balance(&net, i, "keyless")? == 550,
            "node{i}: {a}"
        );
    }

    // An allowance, then a charge of 300.
    let grant = sign_allowance(
        &key,
        &AllowanceChange {
            chain_id: CHAIN.into(),
            user: NEWBIE.into(),
            gateway: "gw-test".into(),
            max_per_window: 100_000,
            expires_at: net.net.now as u64 + 86_400,
            sequence: 1,
        },
    );
    ensure!(run(&mut net, &[grant])? == [Code::Ok]);
    let c = charge(&mut net, 300);
    ensure!(run(&mut net, &[c])? == [Code::Ok]);
    ensure!(balance(&net, 0, NEWBIE)? == 9_700);

    // More than the balance: refused, nothing changes.
    ensure!(run(&mut net, &[withdraw(&key, 2, 9_701)])? == [Code::InsufficientBalance]);
    // A charge and a withdrawal in one block: the charge runs first and
    // leaves too little for the withdrawal.
    let c = charge(&mut net, 200);
    ensure!(
        run(&mut net, &[c, withdraw(&key, 2, 9_600)])? == [Code::Ok, Code::InsufficientBalance]
    );
    ensure!(balance(&net, 0, NEWBIE)? == 9_500);
    // A replayed or stale sequence.
    ensure!(run(&mut net, &[withdraw(&key, 1, 10)])? == [Code::BadUserMsg]);

    ensure!(run(&mut net, &[withdraw(&key, 2, 9_000)])? == [Code::Ok]);
    ensure!(balance(&net, 0, NEWBIE)? == 500);
    // A new key; the old one no longer signs.
    let key2 = SigningKey::from_bytes(&[79; 32]);
    let change = msg(
        &key,
        3,
        user_msg::Sum::Key(UserKeyChange {
            pubkey: key2.verifying_key().to_bytes().to_vec(),
        }),
    );
    ensure!(run(&mut net, &[change])? == [Code::Ok]);
    ensure!(run(&mut net, &[withdraw(&key, 4, 100)])? == [Code::BadSignature]);
    ensure!(run(&mut net, &[withdraw(&key2, 4, 100)])? == [Code::Ok]);

    // Both withdrawals settle on the hub, once.
    net.until(80, |s| {
        Ok(s.net.hub.as_ref().map_or(0, |h| h.withdrawn(NEWBIE)) == 9_100)
    })?;
    net.until(20, |s| {
        let w = query(s, 0, &format!("/withdrawals/{NEWBIE}"))?;
        Ok(w["withdrawals"]
            .as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(|x| x["status"] == "settled")))
    })?;
    for i in 0..4 {
        ensure!(balance(&net, i, NEWBIE)? == 400, "node{i}");
        let w = query(&net, i, &format!("/withdrawals/{NEWBIE}"))?;
        let amounts: Vec<u64> = w["withdrawals"]
            .as_array()
            .context("list")?
            .iter()
            .map(|x| x["amount"].as_u64().unwrap_or(0))
            .collect();
        ensure!(amounts == [9_000, 100], "node{i}: {w}");
    }
    // The books: deposited = balance + paid to providers + withdrawn.
    let hub = net.net.hub.as_ref().context("hub")?;
    let paid_providers: u64 = hub
        .paid
        .iter()
        .filter(|((u, p), _)| u == NEWBIE && !p.is_empty())
        .map(|(_, v)| v)
        .sum();
    let pending: u64 = {
        let kv = net.net.nodes[0].app.committed_state();
        tally_settlement::sync::pending_calls(kv, "hub", None, 10_000)?
            .iter()
            .filter(|c| c.user == NEWBIE)
            .map(|c| c.amount)
            .sum()
    };
    ensure!(
        10_000 == balance(&net, 0, NEWBIE)? + paid_providers + pending + hub.withdrawn(NEWBIE),
        "deposited 10000 = balance {} + paid {paid_providers} + pending {pending} + withdrawn {}",
        balance(&net, 0, NEWBIE)?,
        hub.withdrawn(NEWBIE)
    );
    Ok(())
}

#[test]
fn before_version_3_keys_in_deposits_bind_nothing_and_users_cannot_withdraw() -> Result<()> {
    let mut net = DkgNet::new(4, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    let key = SigningKey::from_bytes(&[77; 32]);
    {
        let hub = net.net.hub.as_mut().context("hub")?;
        hub.deposit_keyed(8, NEWBIE, 10_000, key.verifying_key().to_bytes().to_vec());
        hub.tip = 10;
    }
    net.until(20, |s| Ok(balance(s, 0, NEWBIE)? == 10_000))?;
    let a = query(&net, 0, &format!("/allowances/{NEWBIE}"))?;
    ensure!(a["key"].is_null(), "{a}");
    // user-0 has a genesis key; its withdrawal is refused by version.
    let m = UserMsg {
        chain_id: CHAIN.into(),
        user: "user-0".into(),
        sequence: 1,
        sum: Some(user_msg::Sum::Withdraw(Withdrawal { amount: 10 })),
    };
    let w = sign_user_msg(&user_key("user-0"), &m);
    ensure!(run(&mut net, &[w])? == [Code::BadUserMsg]);
    Ok(())
}

//! ADR 0020 on the hub: a deposit that first funds a user binds its key
//! (after the registration fee), later keyed deposits cannot take the name,
//! and a withdrawal call moves escrow to the user, never to a provider.
//! Oracles: hand-computed balances and codes.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use prost::Message;
use tally_hub::machine::{self, hub_tx, Deposit, HubCode, HubTx, SubmitBatch};
use tally_settlement::bls::{self, deal, Kind, PublicShares, SecretShare};
use tally_settlement::proto::HubCall;
use tally_settlement::sync::batch_digest;
use tally_store::{MemBackend, Pending};

const SETTLEMENT: &str = "tally-localnet";

fn setup(fee: u64) -> (Pending, PublicShares, Vec<SecretShare>) {
    let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 70; 64]).collect();
    let (pubs, shares) = deal(4, 3, &coeffs).unwrap();
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = serde_json::json!({
        "settlement_chain_id": SETTLEMENT,
        "group_key": hex::encode(pubs.group.compress()),
        "escrow": [{"user": "bob", "amount": 500}],
        "registration_fee": fee,
    });
    machine::init(&mut kv, g.to_string().as_bytes()).unwrap();
    (kv, pubs, shares)
}

fn deposit(user: &str, amount: u64, pubkey: &[u8]) -> Vec<u8> {
    HubTx {
        sum: Some(hub_tx::Sum::Deposit(Deposit {
            user: user.into(),
            amount,
            pubkey: pubkey.to_vec(),
        })),
    }
    .encode_to_vec()
}

fn q(kv: &Pending, path: &str) -> serde_json::Value {
    let r = machine::query(kv, path);
    assert_eq!(r.code, HubCode::Ok, "{path}: {}", r.log);
    serde_json::from_slice(&r.value).unwrap()
}

fn run(kv: &mut Pending, tx: &[u8]) -> (HubCode, String) {
    let r = machine::deliver(kv, 7, tx).unwrap();
    (r.code, r.log)
}

#[test]
fn the_deposit_that_first_funds_a_user_binds_its_key_after_the_fee() {
    let (mut kv, _, _) = setup(100);
    let k1 = SigningKey::from_bytes(&[1; 32]).verifying_key().to_bytes();
    let k2 = SigningKey::from_bytes(&[2; 32]).verifying_key().to_bytes();
    // Not above the fee: refused, nothing recorded.
    let (code, log) = run(&mut kv, &deposit("newbie", 100, &k1));
    assert_eq!(code, HubCode::BadDeposit, "{log}");
    assert!(log.contains("registration fee 100"), "{log}");
    assert_eq!(q(&kv, "/deposits/1/10")["deposit_count"], 0);
    // Not a key.
    // y = 2 does not decompress: not an ed25519 point.
    let mut not_a_point = [0u8; 32];
    not_a_point[0] = 2;
    for bad in [&k1[..31], &not_a_point[..]] {
        let (code, _) = run(&mut kv, &deposit("newbie", 1000, bad));
        assert_eq!(code, HubCode::BadDeposit);
    }
    // Binds: 1000 - 100 in escrow, 100 kept.
    assert_eq!(run(&mut kv, &deposit("newbie", 1000, &k1)).0, HubCode::Ok);
    let u = q(&kv, "/user/newbie");
    assert_eq!(
        (u["escrow"].as_u64(), u["key"].as_str()),
        (Some(900), Some(hex::encode(k1).as_str()))
    );
    assert_eq!(q(&kv, "/fees")["fees"], 100);
    let d = &q(&kv, "/deposits/7/7")["deposits"][0];
    assert_eq!(
        (d["amount"].as_u64(), d["fee"].as_u64()),
        (Some(900), Some(100))
    );
    assert_eq!(d["pubkey"], hex::encode(k1));
    // The name is taken: another key is refused; the same key tops up
    // without a fee and without a key in the record; no key tops up too.
    let (code, log) = run(&mut kv, &deposit("newbie", 1000, &k2));
    assert_eq!(code, HubCode::BadDeposit);
    assert!(log.contains("bound to another key"), "{log}");
    assert_eq!(run(&mut kv, &deposit("newbie", 10, &k1)).0, HubCode::Ok);
    assert_eq!(run(&mut kv, &deposit("newbie", 5, &[])).0, HubCode::Ok);
    assert_eq!(q(&kv, "/escrow/newbie")["escrow"], 915);
    let later = &q(&kv, "/deposits/7/7")["deposits"][1];
    assert!(later.get("pubkey").is_none(), "{later}");
    assert_eq!(q(&kv, "/fees")["fees"], 100);
    // A funded user without a key cannot be bound by anybody's deposit.
    let (code, log) = run(&mut kv, &deposit("bob", 1000, &k2));
    assert_eq!(code, HubCode::BadDeposit);
    assert!(log.contains("already holds 500"), "{log}");
}

fn batch(pubs: &PublicShares, shares: &[SecretShare], nonce: u64, calls: Vec<HubCall>) -> Vec<u8> {
    let d = batch_digest("hub", nonce, &calls);
    let msg = bls::message(SETTLEMENT, Kind::Batch, &d);
    let parts: Vec<_> = shares[..3].iter().map(|s| s.sign(&msg)).collect();
    let sig = pubs.combine(&msg, &parts).unwrap();
    HubTx {
        sum: Some(hub_tx::Sum::SubmitBatch(SubmitBatch {
            chain: "hub".into(),
            nonce,
            calls,
            signature: sig.compress().to_vec(),
        })),
    }
    .encode_to_vec()
}

fn call(id: u64, provider: &str, amount: u64, kind: u32) -> HubCall {
    HubCall {
        id,
        user: "bob".into(),
        provider: provider.into(),
        amount,
        window: 1,
        kind,
    }
}

#[test]
fn a_withdrawal_pays_the_user_out_of_escrow_once() {
    let (mut kv, pubs, shares) = setup(0);
    // Kinds the hub does not know, or a withdrawal naming a provider.
    for bad in [
        call(1, "acme", 10, 1),
        call(1, "acme", 10, 2),
        call(1, "", 10, 7),
    ] {
        let (code, log) = run(&mut kv, &batch(&pubs, &shares, 1, vec![bad]));
        assert_eq!(code, HubCode::BadBatch, "{log}");
    }
    let calls = vec![call(1, "acme", 30, 0), call(2, "", 200, 1)];
    let (code, log) = run(&mut kv, &batch(&pubs, &shares, 1, calls.clone()));
    assert_eq!(code, HubCode::Ok, "{log}");
    assert_eq!(q(&kv, "/escrow/bob")["escrow"], 270);
    assert_eq!(q(&kv, "/payout/acme")["paid"], 30);
    assert_eq!(q(&kv, "/withdrawn/bob")["withdrawn"], 200);
    let r = q(&kv, "/batch/hub/1");
    assert_eq!(
        (r["paid"].as_u64(), r["withdrawn"].as_u64()),
        (Some(230), Some(200))
    );
    // Once per nonce.
    assert_eq!(
        run(&mut kv, &batch(&pubs, &shares, 1, calls)).0,
        HubCode::AlreadySettled
    );
    assert_eq!(q(&kv, "/withdrawn/bob")["withdrawn"], 200);
    // More than escrow: refused whole.
    let (code, _) = run(
        &mut kv,
        &batch(&pubs, &shares, 2, vec![call(3, "", 271, 1)]),
    );
    assert_eq!(code, HubCode::InsufficientEscrow);
    assert_eq!(q(&kv, "/withdrawn/bob")["withdrawn"], 200);
}

//! The hub's state machine: deposits, threshold-signed batches paid once
//! per nonce, bad signatures and nonces refused without any change.

use std::sync::Arc;

use prost::Message;
use tally_hub::machine::{self, hub_tx, Deposit, HubCode, HubTx, SubmitBatch};
use tally_settlement::bls::{self, deal, Kind, PublicShares, SecretShare};
use tally_settlement::proto::HubCall;
use tally_settlement::sync::batch_digest;
use tally_store::{Kv, MemBackend, Pending};

const SETTLEMENT: &str = "tally-localnet";

fn setup() -> (Pending, PublicShares, Vec<SecretShare>) {
    let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 70; 64]).collect();
    let (pubs, shares) = deal(4, 3, &coeffs).unwrap();
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = serde_json::json!({
        "settlement_chain_id": SETTLEMENT,
        "group_key": hex::encode(pubs.group.compress()),
        "escrow": [{"user": "bob", "amount": 5}],
    });
    machine::init(&mut kv, g.to_string().as_bytes()).unwrap();
    (kv, pubs, shares)
}

fn deposit(user: &str, amount: u64) -> Vec<u8> {
    HubTx {
        sum: Some(hub_tx::Sum::Deposit(Deposit {
            user: user.into(),
            amount,
            pubkey: Vec::new(),
        })),
    }
    .encode_to_vec()
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

fn call(id: u64, user: &str, amount: u64) -> HubCall {
    HubCall {
        id,
        user: user.into(),
        provider: "acme".into(),
        amount,
        window: 1,
        kind: 0,
    }
}

fn q(kv: &Pending, path: &str) -> serde_json::Value {
    let r = machine::query(kv, path);
    assert_eq!(r.code, HubCode::Ok, "{path}: {}", r.log);
    serde_json::from_slice(&r.value).unwrap()
}

#[test]
fn deposits_then_a_batch_is_paid_once() {
    let (mut kv, pubs, shares) = setup();
    assert_eq!(
        machine::deliver(&mut kv, 1, &deposit("alice", 100))
            .expect("store")
            .code,
        HubCode::Ok
    );
    assert_eq!(
        machine::deliver(&mut kv, 2, &deposit("alice", 20))
            .expect("store")
            .code,
        HubCode::Ok
    );
    let d = q(&kv, "/deposits/1/2");
    let seqs: Vec<u64> = d["deposits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![1, 2]);
    // bob's whole genesis escrow (5), alice's 30 of 120.
    let b = batch(
        &pubs,
        &shares,
        1,
        vec![call(1, "alice", 30), call(2, "bob", 5)],
    );
    let r = machine::deliver(&mut kv, 3, &b).expect("store");
    assert_eq!(r.code, HubCode::Ok, "{}", r.log);
    assert_eq!(q(&kv, "/escrow/alice")["escrow"], 90);
    assert_eq!(q(&kv, "/escrow/bob")["escrow"], 0);
    assert_eq!(q(&kv, "/payout/acme")["paid"], 35);
    assert_eq!(q(&kv, "/batch/hub/1")["paid"], 35);
    assert_eq!(q(&kv, "/batch/hub/1")["shortfall"], 0);
    // Resubmitting the settled nonce pays nothing twice.
    let before = kv.changes().clone();
    assert_eq!(
        machine::deliver(&mut kv, 4, &b).expect("store").code,
        HubCode::AlreadySettled
    );
    assert_eq!(kv.changes(), &before);
    assert_eq!(q(&kv, "/last_nonce/hub")["last_nonce"], 1);
}

#[test]
fn bad_signatures_nonces_and_batches_change_nothing() {
    let (mut kv, pubs, shares) = setup();
    let before = kv.changes().clone();
    // Signed for nonce 1 but submitted as nonce 2: wrong nonce first.
    let b2 = batch(&pubs, &shares, 2, vec![call(1, "bob", 1)]);
    assert_eq!(
        machine::deliver(&mut kv, 1, &b2).expect("store").code,
        HubCode::BadNonce
    );
    // A signature by another key set.
    let (other, other_shares) = deal(4, 3, &[[1u8; 64], [2; 64], [3; 64]]).unwrap();
    let forged = batch(&other, &other_shares, 1, vec![call(1, "bob", 1)]);
    assert_eq!(
        machine::deliver(&mut kv, 1, &forged).expect("store").code,
        HubCode::BadSignature
    );
    // A valid signature over different calls.
    let good = batch(&pubs, &shares, 1, vec![call(1, "bob", 1)]);
    let mut tampered = HubTx::decode(good.as_slice()).unwrap();
    if let Some(hub_tx::Sum::SubmitBatch(b)) = &mut tampered.sum {
        b.calls[0].amount = 2;
    }
    assert_eq!(
        machine::deliver(&mut kv, 1, &tampered.encode_to_vec())
            .expect("store")
            .code,
        HubCode::BadSignature
    );
    let unordered = batch(
        &pubs,
        &shares,
        1,
        vec![call(2, "bob", 1), call(1, "bob", 1)],
    );
    assert_eq!(
        machine::deliver(&mut kv, 1, &unordered)
            .expect("store")
            .code,
        HubCode::BadBatch
    );
    assert_eq!(
        machine::deliver(&mut kv, 1, &[0xff, 0x00])
            .expect("store")
            .code,
        HubCode::Malformed
    );
    assert_eq!(
        machine::deliver(&mut kv, 1, &deposit("alice", 0))
            .expect("store")
            .code,
        HubCode::BadDeposit
    );
    assert_eq!(kv.changes(), &before, "nothing changed");
    assert_eq!(machine::query(&kv, "/batch/hub/1").code, HubCode::NotFound);
    assert_eq!(machine::query(&kv, "/nope").code, HubCode::UnknownPath);
}

/// A corrupt stored integer is the node's fault, not the sender's: deliver
/// returns the store error (the adapter halts) instead of a result code,
/// and a query answers `internal`.
#[test]
fn a_corrupt_integer_is_a_store_error_not_a_result() {
    let (mut kv, pubs, shares) = setup();
    kv.put(b"last_nonce/hub".to_vec(), vec![1, 2, 3]);
    let b = batch(&pubs, &shares, 1, vec![call(1, "alice", 30)]);
    match machine::deliver(&mut kv, 3, &b) {
        Err(tally_store::StoreError::Corrupt(m)) => assert!(m.contains("last_nonce/hub"), "{m}"),
        other => panic!("want a corrupt-store error, got {other:?}"),
    }
    assert_eq!(
        machine::query(&kv, "/last_nonce/hub").code,
        HubCode::Internal
    );
}

/// A batch that some user's escrow cannot cover in full is refused whole:
/// nothing is paid, nothing is stored, and the nonce stays open. Short by
/// 1 (one call, or one user's two calls together) is refused; exactly
/// enough is paid.
#[test]
fn a_batch_escrow_cannot_cover_in_full_is_refused_whole() {
    let (mut kv, pubs, shares) = setup();
    assert_eq!(
        machine::deliver(&mut kv, 1, &deposit("alice", 40))
            .expect("store")
            .code,
        HubCode::Ok
    );
    let before = kv.changes().clone();
    // alice has 40, bob 5 (genesis).
    for calls in [
        vec![call(1, "alice", 10), call(2, "bob", 6)],
        vec![
            call(1, "alice", 20),
            call(2, "bob", 1),
            call(3, "alice", 21),
        ],
        vec![call(1, "alice", u64::MAX), call(2, "alice", 2)],
    ] {
        let b = batch(&pubs, &shares, 1, calls.clone());
        let r = machine::deliver(&mut kv, 2, &b).expect("store");
        assert_eq!(r.code, HubCode::InsufficientEscrow, "{calls:?}: {}", r.log);
        assert_eq!(r.code.value(), 8);
        assert_eq!(kv.changes(), &before, "{calls:?}: nothing changed");
    }
    assert_eq!(q(&kv, "/last_nonce/hub")["last_nonce"], 0);
    assert_eq!(machine::query(&kv, "/batch/hub/1").code, HubCode::NotFound);
    // Exactly enough for both users: nonce 1 is paid in full.
    let b = batch(
        &pubs,
        &shares,
        1,
        vec![
            call(1, "alice", 20),
            call(2, "bob", 5),
            call(3, "alice", 20),
        ],
    );
    let r = machine::deliver(&mut kv, 3, &b).expect("store");
    assert_eq!(r.code, HubCode::Ok, "{}", r.log);
    assert_eq!(q(&kv, "/escrow/alice")["escrow"], 0);
    assert_eq!(q(&kv, "/escrow/bob")["escrow"], 0);
    assert_eq!(q(&kv, "/payout/acme")["paid"], 45);
    let res = q(&kv, "/batch/hub/1");
    assert_eq!(
        (res["paid"].clone(), res["shortfall"].clone()),
        (45.into(), 0.into())
    );
    assert_eq!(q(&kv, "/last_nonce/hub")["last_nonce"], 1);
}

/// `/deposits/{from}/{to}` carries the hub's cumulative deposit count
/// through `to`, whatever the range holds, and refuses a range ending
/// above the committed height.
#[test]
fn deposit_answers_carry_the_count_through_their_end() {
    let (mut kv, _, _) = setup();
    // Deposits 1 at height 1, 2 and 3 at height 2, 4 at height 5.
    for (h, user) in [(1, "a"), (2, "b"), (2, "c"), (5, "d")] {
        let r = machine::deliver(&mut kv, h, &deposit(user, 7)).expect("store");
        assert_eq!(r.code, HubCode::Ok, "{}", r.log);
    }
    // (from, to) -> (seqs listed, count through to), by hand.
    type Case = ((u64, u64), (&'static [u64], u64));
    let cases: [Case; 6] = [
        ((1, 1), (&[1], 1)),
        ((2, 2), (&[2, 3], 3)),
        ((3, 4), (&[], 3)),
        ((1, 4), (&[1, 2, 3], 3)),
        ((5, 10), (&[4], 4)),
        ((11, 20), (&[], 4)),
    ];
    for ((from, to), (seqs, count)) in cases {
        let v = q(&kv, &format!("/deposits/{from}/{to}"));
        let got: Vec<u64> = v["deposits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(got, seqs, "{from}..={to}");
        assert_eq!(v["deposit_count"], count, "{from}..={to}");
    }
    // Committed through height 4 only: a range ending at 5 could still grow.
    let r = machine::query_at(&kv, "/deposits/1/5", 4);
    assert_eq!(r.code, HubCode::BadArgument, "{}", r.log);
    let r = machine::query_at(&kv, "/deposits/1/4", 4);
    assert_eq!(r.code, HubCode::Ok, "{}", r.log);
}

//! Money and trust at the edges (issue 11): allowances bound what a gateway
//! may charge, failed calls carry no amount, only canonical bytes are
//! accepted, and report ids belong to the gateway that used them. Expected
//! values are computed by hand from the rules in DESIGN.md.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use prost::Message;
use sha2::{Digest, Sha256};
use tally_settlement::proto::{tx, AllowanceChange, Outcome, ReportUsage, Tx, UsageRecord};
use tally_settlement::{
    begin_block, init_chain, query::query, sign_allowance, sign_report, AllowanceEntry,
    BalanceEntry, Block, Code, GatewayEntry, Genesis, TxResult, UserEntry,
};
use tally_store::{KvRead, MemBackend, Pending};

const CHAIN: &str = "tally-edges";
/// A window boundary for 60 s windows.
const T0: u64 = 1_800_000_000;

fn gw(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn alice_key() -> SigningKey {
    SigningKey::from_bytes(&[41; 32])
}

/// Two gateways (gw-a, gw-b); alice (key registered) and bob, 1000 each;
/// alice lets gw-a charge 10 per window until T0 + 600; bob gave nobody
/// anything.
fn setup() -> Pending {
    let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = Genesis {
        gateways: vec![
            GatewayEntry {
                name: "gw-a".into(),
                pubkey: hex::encode(gw(1).verifying_key().to_bytes()),
            },
            GatewayEntry {
                name: "gw-b".into(),
                pubkey: hex::encode(gw(2).verifying_key().to_bytes()),
            },
        ],
        balances: ["alice", "bob"]
            .iter()
            .map(|u| BalanceEntry {
                user: (*u).into(),
                amount: 1000,
            })
            .collect(),
        users: vec![UserEntry {
            name: "alice".into(),
            pubkey: hex::encode(alice_key().verifying_key().to_bytes()),
        }],
        allowances: vec![AllowanceEntry {
            user: "alice".into(),
            gateway: "gw-a".into(),
            max_per_window: 10,
            expires_at: T0 + 600,
        }],
        ..Genesis::default()
    };
    init_chain(&mut p, CHAIN, &g).unwrap();
    p
}

fn block(p: &mut Pending, height: u64, time: u64) -> Block {
    let b = Block { height, time };
    begin_block(p, &b).unwrap();
    b
}

fn deliver(p: &mut Pending, b: &Block, tx: &[u8]) -> TxResult {
    tally_settlement::deliver_tx(p, b, tx).expect("no local fault")
}

fn rec(user: &str, outcome: Outcome, amount: u64) -> UsageRecord {
    UsageRecord {
        user: user.into(),
        provider: "prov".into(),
        model: "m".into(),
        route: "/r".into(),
        outcome: outcome as i32,
        units: 1,
        amount,
        ..Default::default()
    }
}

fn report(id: u8, expires_at: u64, records: Vec<UsageRecord>) -> ReportUsage {
    ReportUsage {
        chain_id: CHAIN.into(),
        report_id: vec![id; 16],
        expires_at,
        records,
        route_calls: Vec::new(),
    }
}

fn balance(p: &Pending, user: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_slice(&query(p, &format!("/balance/{user}")).value).unwrap();
    v["balance"].as_u64().unwrap()
}

/// Every key and value of the state, to show a refusal changed nothing.
fn snapshot(p: &Pending) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut all = Vec::new();
    p.for_each(&[], &[0xff; 8], &mut |k, v| {
        all.push((k.to_vec(), v.to_vec()));
        true
    })
    .unwrap();
    all
}

/// Delivers `tx`, expects `code`, and (for a refusal) an unchanged state.
fn expect(p: &mut Pending, b: &Block, tx: &[u8], code: Code) -> TxResult {
    let before = snapshot(p);
    let r = deliver(p, b, tx);
    assert_eq!(r.code, code, "{}", r.log);
    if code != Code::Ok {
        assert_eq!(snapshot(p), before, "a refused transaction changed state");
    }
    r
}

fn change(gateway: &str, max: u64, expires_at: u64, sequence: u64) -> AllowanceChange {
    AllowanceChange {
        chain_id: CHAIN.into(),
        user: "alice".into(),
        gateway: gateway.into(),
        max_per_window: max,
        expires_at,
        sequence,
    }
}

#[test]
fn a_gateway_charges_only_users_who_allowed_it_and_only_up_to_the_allowance() {
    let mut p = setup();
    let b = block(&mut p, 1, T0 + 1);
    // bob gave no allowance: even a failure record for him is refused (a
    // leaked key cannot fake SLA failures for users who never chose it).
    let t = sign_report(
        &gw(1),
        &report(1, T0 + 60, vec![rec("bob", Outcome::Transient, 0)]),
    );
    expect(&mut p, &b, &t, Code::NoAllowance);
    // alice allowed gw-a, not gw-b.
    let t = sign_report(
        &gw(2),
        &report(1, T0 + 60, vec![rec("alice", Outcome::Ok, 1)]),
    );
    expect(&mut p, &b, &t, Code::NoAllowance);
    // 6 + 4 = 10 fits the allowance of 10; one more credit does not.
    let t = sign_report(
        &gw(1),
        &report(2, T0 + 60, vec![rec("alice", Outcome::Ok, 6)]),
    );
    expect(&mut p, &b, &t, Code::Ok);
    let t = sign_report(
        &gw(1),
        &report(
            3,
            T0 + 60,
            vec![
                rec("alice", Outcome::Ok, 3),
                rec("alice", Outcome::Cancel, 1),
            ],
        ),
    );
    expect(&mut p, &b, &t, Code::Ok);
    let t = sign_report(
        &gw(1),
        &report(4, T0 + 60, vec![rec("alice", Outcome::Ok, 1)]),
    );
    expect(&mut p, &b, &t, Code::AllowanceExceeded);
    // Failures (amount 0) still count in the SLA record within the limit.
    let t = sign_report(
        &gw(1),
        &report(5, T0 + 60, vec![rec("alice", Outcome::Auth, 0)]),
    );
    expect(&mut p, &b, &t, Code::Ok);
    assert_eq!(balance(&p, "alice"), 990);
    let v: serde_json::Value =
        serde_json::from_slice(&query(&p, "/allowances/alice").value).unwrap();
    assert_eq!(v["allowances"][0]["used"], 10, "{v}");
    // The next window starts from 0 again.
    let b = block(&mut p, 2, T0 + 61);
    let t = sign_report(
        &gw(1),
        &report(6, T0 + 120, vec![rec("alice", Outcome::Ok, 10)]),
    );
    expect(&mut p, &b, &t, Code::Ok);
    // At the expiry the allowance no longer holds.
    let b = block(&mut p, 3, T0 + 600);
    let t = sign_report(
        &gw(1),
        &report(7, T0 + 660, vec![rec("alice", Outcome::Ok, 1)]),
    );
    expect(&mut p, &b, &t, Code::NoAllowance);
    assert_eq!(balance(&p, "alice"), 980);
}

#[test]
fn users_grant_and_revoke_with_their_own_key_and_replays_are_refused() {
    let mut p = setup();
    let b = block(&mut p, 1, T0 + 1);
    let grant = sign_allowance(&alice_key(), &change("gw-b", 50, T0 + 300, 1));
    let r = expect(&mut p, &b, &grant, Code::Ok);
    assert_eq!(r.events[0].kind, "allowance_granted");
    let t = sign_report(
        &gw(2),
        &report(1, T0 + 60, vec![rec("alice", Outcome::Ok, 50)]),
    );
    expect(&mut p, &b, &t, Code::Ok);
    // The same signed grant again: its sequence is not above the last.
    expect(&mut p, &b, &grant, Code::BadAllowance);
    // Signed by someone else (gw-b's operator, say): a bad signature, as
    // for every signed transaction (ADR 0016).
    let forged = sign_allowance(&gw(2), &change("gw-b", 1000, T0 + 300, 9));
    expect(&mut p, &b, &forged, Code::BadSignature);
    // bob has no registered key: he cannot sign anything.
    let bobs = sign_allowance(
        &gw(3),
        &AllowanceChange {
            user: "bob".into(),
            ..change("gw-a", 5, T0 + 300, 1)
        },
    );
    expect(&mut p, &b, &bobs, Code::BadAllowance);
    // No such gateway; an expiry already past; another chain.
    expect(
        &mut p,
        &b,
        &sign_allowance(&alice_key(), &change("gw-z", 5, T0 + 300, 2)),
        Code::UnknownGateway,
    );
    expect(
        &mut p,
        &b,
        &sign_allowance(&alice_key(), &change("gw-b", 5, T0 + 1, 2)),
        Code::BadAllowance,
    );
    expect(
        &mut p,
        &b,
        &sign_allowance(
            &alice_key(),
            &AllowanceChange {
                chain_id: "other".into(),
                ..change("gw-b", 5, T0 + 300, 2)
            },
        ),
        Code::WrongChain,
    );
    // Revoke: gw-b's reports for alice are refused from now on.
    let r = expect(
        &mut p,
        &b,
        &sign_allowance(&alice_key(), &change("gw-b", 0, 0, 5)),
        Code::Ok,
    );
    assert_eq!(r.events[0].kind, "allowance_revoked");
    let b = block(&mut p, 2, T0 + 61);
    let t = sign_report(
        &gw(2),
        &report(2, T0 + 120, vec![rec("alice", Outcome::Ok, 1)]),
    );
    expect(&mut p, &b, &t, Code::NoAllowance);
    let v: serde_json::Value =
        serde_json::from_slice(&query(&p, "/allowances/alice").value).unwrap();
    assert_eq!(v["sequence"], 5);
    assert_eq!(v["allowances"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["allowances"][0]["gateway"], "gw-a");
}

#[test]
fn failed_calls_carry_no_amount() {
    let mut p = setup();
    let b = block(&mut p, 1, T0 + 1);
    for o in [
        Outcome::RateLimit,
        Outcome::Auth,
        Outcome::Transient,
        Outcome::Unknown,
    ] {
        let t = sign_report(&gw(1), &report(1, T0 + 60, vec![rec("alice", o, 1)]));
        expect(&mut p, &b, &t, Code::FailedCallBilled);
    }
    for (i, o) in [Outcome::Ok, Outcome::Cancel, Outcome::Client]
        .iter()
        .enumerate()
    {
        let t = sign_report(
            &gw(1),
            &report(i as u8 + 2, T0 + 60, vec![rec("alice", *o, 1)]),
        );
        expect(&mut p, &b, &t, Code::Ok);
    }
    assert_eq!(balance(&p, "alice"), 997);
}

#[test]
fn only_the_canonical_bytes_of_a_report_are_accepted() {
    let mut p = setup();
    let b = block(&mut p, 1, T0 + 1);
    let good = sign_report(
        &gw(1),
        &report(1, T0 + 60, vec![rec("alice", Outcome::Ok, 1)]),
    );
    // Re-wrapped by a third party: an unknown field appended; the payload
    // field written twice (protobuf keeps the last); both decode to the
    // same report.
    let mut unknown = good.clone();
    unknown.extend_from_slice(&[0x78, 0x01]); // field 15, varint 1
    let payload = match Tx::decode(good.as_slice()).unwrap().sum {
        Some(tx::Sum::Report(r)) => r,
        _ => unreachable!(),
    };
    let mut twice = good.clone();
    twice.extend_from_slice(&good);
    for variant in [&unknown, &twice] {
        assert_eq!(
            Tx::decode(variant.as_slice()).unwrap().sum,
            Some(tx::Sum::Report(payload.clone()))
        );
        expect(&mut p, &b, variant, Code::NonCanonical);
    }
    // A body with padding (a field the schema does not have), signed by the
    // gateway itself, is refused too: one report, one byte string.
    let mut body = report(2, T0 + 60, vec![rec("alice", Outcome::Ok, 1)]).encode_to_vec();
    body.extend_from_slice(&[0x78, 0x01]);
    let signed = {
        use ed25519_dalek::Signer;
        let mut msg = tally_settlement::REPORT_SIGN_DOMAIN.to_vec();
        msg.extend_from_slice(&body);
        tally_settlement::proto::SignedReport {
            signature: gw(1).sign(&msg).to_bytes().to_vec(),
            gateway_key: gw(1).verifying_key().to_bytes().to_vec(),
            body,
        }
    };
    let t = Tx {
        sum: Some(tx::Sum::Report(signed)),
    }
    .encode_to_vec();
    expect(&mut p, &b, &t, Code::NonCanonical);
    expect(&mut p, &b, &good, Code::Ok);
}

#[test]
fn report_ids_belong_to_their_gateway_and_code_7_names_the_body() {
    let mut p = setup();
    let b = block(&mut p, 1, T0 + 1);
    // gw-b may charge alice too (granted by alice herself).
    expect(
        &mut p,
        &b,
        &sign_allowance(&alice_key(), &change("gw-b", 100, T0 + 300, 1)),
        Code::Ok,
    );
    let first = report(7, T0 + 60, vec![rec("alice", Outcome::Ok, 2)]);
    expect(&mut p, &b, &sign_report(&gw(1), &first), Code::Ok);
    // Another gateway's report with the same id is its own report.
    let other = report(7, T0 + 60, vec![rec("alice", Outcome::Ok, 3)]);
    expect(&mut p, &b, &sign_report(&gw(2), &other), Code::Ok);
    // The same gateway again, other records: code 7, and the data is the
    // SHA-256 of the body the chain holds (not of this one).
    let clash = report(7, T0 + 60, vec![rec("alice", Outcome::Ok, 4)]);
    let r = expect(
        &mut p,
        &b,
        &sign_report(&gw(1), &clash),
        Code::DuplicateReport,
    );
    let held: [u8; 32] = Sha256::digest(first.encode_to_vec()).into();
    assert_eq!(r.data, held.to_vec());
    assert_ne!(r.data, Sha256::digest(clash.encode_to_vec()).to_vec());
    assert_eq!(balance(&p, "alice"), 995);
}

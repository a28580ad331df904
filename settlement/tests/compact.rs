//! The compact report encoding (`ReportUsage.route_calls`): the same calls
//! written per route must leave exactly the state that the same calls
//! written as one `UsageRecord` each leave (the per-call form is the
//! oracle: `machine.rs` checks it against a model), and the compact form's
//! own malformations are refused with nothing changed.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use prost::Message;
use tally_settlement::calls::{call_count, compact, expand, group_records};
use tally_settlement::proto::{Outcome, ReportUsage, RouteCalls, UsageRecord};
use tally_settlement::{
    begin_block, init_chain, sign_report, AllowanceEntry, BalanceEntry, Block, Code, GatewayEntry,
    Genesis,
};
use tally_store::{KvRead, MemBackend, Pending};

const CHAIN: &str = "tally-test";
const T0: u64 = 1_800_000_000;

fn gw_key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

fn setup(balance: u64) -> Pending {
    let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let users = ["alice", "bob"];
    let g = Genesis {
        gateways: vec![GatewayEntry {
            name: "gw0".into(),
            pubkey: hex::encode(gw_key().verifying_key().to_bytes()),
        }],
        balances: users
            .iter()
            .map(|u| BalanceEntry {
                user: (*u).into(),
                amount: balance,
            })
            .collect(),
        allowances: users
            .iter()
            .map(|u| AllowanceEntry {
                user: (*u).into(),
                gateway: "gw0".into(),
                max_per_window: u64::MAX,
                expires_at: u64::MAX,
            })
            .collect(),
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

fn run(p: &mut Pending, b: &Block, report: &ReportUsage) -> tally_settlement::TxResult {
    tally_settlement::deliver_tx(p, b, &sign_report(&gw_key(), report)).expect("no local fault")
}

fn rec(user: &str, route: &str, outcome: Outcome, units: u64, amount: u64) -> UsageRecord {
    UsageRecord {
        user: user.into(),
        provider: "prov".into(),
        model: "llama/3-8b".into(),
        route: route.into(),
        outcome: outcome as i32,
        units,
        amount,
        ..Default::default()
    }
}

fn report(id: u8, records: Vec<UsageRecord>, route_calls: Vec<RouteCalls>) -> ReportUsage {
    ReportUsage {
        chain_id: CHAIN.into(),
        report_id: vec![id; 16],
        expires_at: T0 + 300,
        records,
        route_calls,
    }
}

/// Every pair of the state but the replay entries' values (`rid/`: they
/// hold the body's hash, which differs between encodings by design).
fn state(p: &Pending) -> Vec<(Vec<u8>, Vec<u8>)> {
    p.scan(&[], &[0xff; 8], usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(k, v)| {
            if k.starts_with(tally_settlement::keys::REPORT_ID) {
                (k, Vec::new())
            } else {
                (k, v)
            }
        })
        .collect()
}

fn outcome() -> impl Strategy<Value = Outcome> {
    proptest::sample::select(Outcome::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Reports sent once as per-call records and once with a random tail
    /// of their calls in the compact form: the same result code for each
    /// report (accepted, insufficient balance, failed call billed, ...)
    /// and the same state afterwards, pair for pair.
    #[test]
    fn compact_form_leaves_the_state_per_call_records_leave(
        reports in proptest::collection::vec(
            (proptest::collection::vec((0..2usize, 0..3usize, outcome(), 0u64..50, 0u64..40), 1..25), 0..30usize),
            1..10),
    ) {
        let mut plain = setup(400);
        let mut mixed = setup(400);
        for (i, (calls, split)) in reports.iter().enumerate() {
            let records: Vec<UsageRecord> = calls
                .iter()
                .map(|&(u, r, o, units, amount)| {
                    // Most failed calls carry 0, as gateways must.
                    let failed = !o.may_carry_amount();
                    let amount = if failed && i % 3 != 0 { 0 } else { amount };
                    rec(["alice", "bob"][u], ["/v1/chat", "/v1/embed", "/v1/img"][r], o, units, amount)
                })
                .collect();
            let split = (*split).min(records.len());
            let time = T0 + i as u64 * 20;
            let (bp, bm) = (block(&mut plain, i as u64 + 1, time), block(&mut mixed, i as u64 + 1, time));
            let a = run(&mut plain, &bp, &report(i as u8, records.clone(), vec![]));
            let (head, tail) = records.split_at(split);
            let b = run(&mut mixed, &bm, &report(i as u8, head.to_vec(), group_records(tail.to_vec())));
            prop_assert_eq!(a.code, b.code, "plain: {} / mixed: {}", a.log, b.log);
        }
        prop_assert_eq!(state(&plain), state(&mixed));
    }
}

#[test]
fn a_compact_report_counts_fail_count_units_and_amounts_by_hand() {
    let mut p = setup(100);
    let b = block(&mut p, 1, T0);
    let group = RouteCalls {
        user: "alice".into(),
        provider: "prov".into(),
        model: "llama/3-8b".into(),
        route: "/v1/chat".into(),
        outcomes: [
            Outcome::Ok,
            Outcome::Cancel,
            Outcome::Transient,
            Outcome::Client,
            Outcome::Ok,
        ]
        .iter()
        .map(|o| *o as i32)
        .collect(),
        units: vec![10, 1, 0, 2, 30],
        amounts: vec![4, 1, 0, 0, 6],
        ..Default::default()
    };
    let r = run(&mut p, &b, &report(1, vec![], vec![group]));
    assert_eq!(r.code, Code::Ok, "{}", r.log);
    assert!(r.log.contains("5 records on 1 routes"), "{}", r.log);
    let q = tally_settlement::query::query(
        &p,
        &format!(
            "/sla/route/alice/prov/llama%2F3-8b/%2Fv1%2Fchat/{}",
            T0 / 60
        ),
    );
    let v: serde_json::Value = serde_json::from_slice(&q.value).unwrap();
    // By hand: 5 requests; fail_count counts only the transient one
    // (cancel and client never fail); units 43; amount 11.
    assert_eq!(v["requests"], 5);
    assert_eq!(v["fail_count"], 1);
    assert_eq!(v["cancel"], 1);
    assert_eq!(v["client"], 1);
    assert_eq!(v["units"], 43);
    assert_eq!(v["amount"], 11);
    let bal = tally_settlement::query::query(&p, "/balance/alice");
    let bal: serde_json::Value = serde_json::from_slice(&bal.value).unwrap();
    assert_eq!(bal["balance"], 89);
}

fn group(outcomes: Vec<Outcome>, units: Vec<u64>, amounts: Vec<u64>) -> RouteCalls {
    RouteCalls {
        user: "alice".into(),
        provider: "prov".into(),
        model: "m".into(),
        route: "/r".into(),
        outcomes: outcomes.into_iter().map(|o| o as i32).collect(),
        units,
        amounts,
        ..Default::default()
    }
}

#[test]
fn malformed_compact_reports_have_their_codes_and_change_nothing() {
    let p0 = setup(5);
    let ok = || group(vec![Outcome::Ok], vec![1], vec![1]);
    let many = |n: usize| group(vec![Outcome::Ok; n], vec![1; n], vec![0; n]);
    let cases: Vec<(&str, ReportUsage, Code)> = vec![
        (
            "empty group",
            report(1, vec![], vec![ok(), group(vec![], vec![], vec![])]),
            Code::EmptyReport,
        ),
        (
            "units short",
            report(
                1,
                vec![],
                vec![group(vec![Outcome::Ok; 2], vec![1], vec![0, 0])],
            ),
            Code::MalformedTx,
        ),
        (
            "amounts short",
            report(
                1,
                vec![],
                vec![group(vec![Outcome::Ok; 2], vec![1, 1], vec![])],
            ),
            Code::MalformedTx,
        ),
        (
            "unspecified",
            report(
                1,
                vec![],
                vec![group(
                    vec![Outcome::Ok, Outcome::Unspecified],
                    vec![1, 1],
                    vec![0, 0],
                )],
            ),
            Code::BadOutcome,
        ),
        (
            "billed failure",
            report(
                1,
                vec![],
                vec![group(
                    vec![Outcome::Ok, Outcome::Auth],
                    vec![1, 1],
                    vec![0, 1],
                )],
            ),
            Code::FailedCallBilled,
        ),
        (
            "bad route name",
            report(
                1,
                vec![],
                vec![RouteCalls {
                    route: "has space".into(),
                    ..ok()
                }],
            ),
            Code::BadIdentifier,
        ),
        (
            "too poor",
            report(
                1,
                vec![],
                vec![group(vec![Outcome::Ok; 2], vec![1, 1], vec![3, 3])],
            ),
            Code::InsufficientBalance,
        ),
        // 999 records + 2 calls: the cap counts both forms together.
        (
            "1001 calls",
            report(
                1,
                vec![rec("alice", "/r", Outcome::Ok, 1, 0); 999],
                vec![many(2)],
            ),
            Code::TooManyRecords,
        ),
    ];
    for (what, r, want) in cases {
        let mut p = setup(5);
        let b = block(&mut p, 1, T0);
        let before = state(&p);
        let got = run(&mut p, &b, &r);
        assert_eq!(got.code, want, "{what}: {}", got.log);
        assert_eq!(state(&p), before, "{what} changed state");
    }
    // The cap itself passes: 998 records + 2 calls.
    let mut p = setup(5);
    let b = block(&mut p, 1, T0);
    let r = report(
        2,
        vec![rec("alice", "/r", Outcome::Ok, 1, 0); 998],
        vec![many(2)],
    );
    assert_eq!(run(&mut p, &b, &r).code, Code::Ok);
    drop(p0);
}

#[test]
fn unpacked_lists_are_not_canonical() {
    // Hand-written bytes of RouteCalls{user "a", provider "p", model "m",
    // route "r", outcomes [1, 1], units [2, 2], amounts [0, 0]} with the
    // three lists written one element per field (valid protobuf, but not
    // the packed form that re-encoding gives).
    let mut group = vec![0x0a, 1, b'a', 0x12, 1, b'p', 0x1a, 1, b'm', 0x22, 1, b'r'];
    group.extend_from_slice(&[0x28, 1, 0x28, 1, 0x30, 2, 0x30, 2, 0x38, 0, 0x38, 0]);
    let parsed = RouteCalls::decode(group.as_slice()).unwrap();
    assert_eq!(parsed.outcomes, vec![1, 1]);
    assert_ne!(parsed.encode_to_vec(), group, "prost re-encodes packed");
    // Packed, by hand: field 5 length-delimited (0x2a), 2 bytes, 1, 1.
    let packed = parsed.encode_to_vec();
    assert_eq!(
        &packed[12..],
        &[0x2a, 2, 1, 1, 0x32, 2, 2, 2, 0x3a, 2, 0, 0]
    );

    let mut body = report(3, vec![], vec![]).encode_to_vec();
    body.push(0x2a); // ReportUsage field 5, length-delimited
    body.push(group.len() as u8);
    body.extend_from_slice(&group);
    let key = gw_key();
    let mut msg = tally_settlement::REPORT_SIGN_DOMAIN.to_vec();
    msg.extend_from_slice(&body);
    use ed25519_dalek::Signer;
    let tx = tally_settlement::proto::Tx {
        sum: Some(tally_settlement::proto::tx::Sum::Report(
            tally_settlement::proto::SignedReport {
                body,
                gateway_key: key.verifying_key().to_bytes().to_vec(),
                signature: key.sign(&msg).to_bytes().to_vec(),
            },
        )),
    }
    .encode_to_vec();
    let mut p = setup(5);
    let b = block(&mut p, 1, T0);
    let r = tally_settlement::deliver_tx(&mut p, &b, &tx).unwrap();
    assert_eq!(r.code, Code::NonCanonical, "{}", r.log);
}

#[test]
fn compact_is_several_times_smaller_for_typical_reports() {
    // 1,000 calls over 10 routes with realistic names and values.
    let records: Vec<UsageRecord> = (0..1000u64)
        .map(|i| UsageRecord {
            user: format!("user-{:04}", i % 5),
            provider: "provider-east-1".into(),
            model: "meta-llama/llama-3.1-70b-instruct".into(),
            route: format!("/v1/chat/completions/{}", i % 2),
            outcome: if i % 10 == 0 {
                Outcome::Transient
            } else {
                Outcome::Ok
            } as i32,
            units: 200 + i % 1800,
            amount: if i % 10 == 0 { 0 } else { 1 + i % 300 },
            ..Default::default()
        })
        .collect();
    let plain = report(1, records.clone(), vec![]);
    let small = compact(plain.clone());
    assert_eq!(expand(&small).len(), 1000);
    assert_eq!(call_count(&small), 1000);
    let (a, b) = (plain.encoded_len(), small.encoded_len());
    // Per call: outcome 1 byte, units 2, amount 1-2 (plus 10 groups of
    // names): under 6 bytes a call; the per-call form is over 80.
    assert!(b < 6 * 1000, "compact {b} bytes");
    assert!(a > 80 * 1000, "plain {a} bytes");
}

//! State-machine tests: every rejection code, FailCount rules, balances,
//! replay protection. Runs on the in-memory store.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use prost::Message;
use tally_settlement::proto::{tx, Outcome, ReportUsage, SignedReport, Tx, UsageRecord};
use tally_settlement::{
    begin_block, init_chain, query::query, sign_report, AllowanceEntry, BalanceEntry, Block, Code,
    GatewayEntry, Genesis, RouteRecordView,
};
use tally_store::{Kv, KvRead, MemBackend, Pending};

const CHAIN: &str = "tally-test";
const T0: u64 = 1_800_000_000; // a window boundary for 60 s windows

/// Runs a transaction; a local fault (impossible on the in-memory store)
/// fails the test.
fn deliver(kv: &mut impl tally_store::Kv, b: &Block, tx: &[u8]) -> tally_settlement::TxResult {
    tally_settlement::deliver_tx(kv, b, tx).expect("no local fault")
}

fn gw_key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

fn setup(balance: u64) -> Pending {
    let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = Genesis {
        gateways: vec![GatewayEntry {
            name: "gw0".into(),
            pubkey: hex::encode(gw_key().verifying_key().to_bytes()),
        }],
        balances: vec![
            BalanceEntry {
                user: "alice".into(),
                amount: balance,
            },
            BalanceEntry {
                user: "bob".into(),
                amount: balance,
            },
        ],
        allowances: ["alice", "bob"]
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

fn rec(user: &str, outcome: Outcome, units: u64, amount: u64) -> UsageRecord {
    UsageRecord {
        user: user.into(),
        provider: "prov".into(),
        model: "llama/3-8b".into(),
        route: "/v1/chat".into(),
        outcome: outcome as i32,
        units,
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

fn block(p: &mut Pending, height: u64, time: u64) -> Block {
    let b = Block { height, time };
    begin_block(p, &b).unwrap();
    b
}

fn route_record(p: &Pending, window: u64) -> Option<RouteRecordView> {
    let r = query(
        p,
        &format!("/sla/route/alice/prov/llama%2F3-8b/%2Fv1%2Fchat/{window}"),
    );
    (r.code == Code::Ok).then(|| serde_json::from_slice(&r.value).unwrap())
}

#[test]
fn counts_every_class_and_fail_count_skips_cancel_and_client() {
    let mut p = setup(1000);
    let b = block(&mut p, 1, T0);
    // ok, cancel and client carry 1 credit each; failures carry 0.
    let recs = Outcome::ALL
        .iter()
        .map(|o| rec("alice", *o, 10, u64::from(o.may_carry_amount())))
        .collect();
    let r = deliver(
        &mut p,
        &b,
        &sign_report(&gw_key(), &report(1, T0 + 60, recs)),
    );
    assert_eq!(r.code, Code::Ok, "{}", r.log);
    let v = route_record(&p, T0 / 60).unwrap();
    assert_eq!((v.requests, v.ok, v.cancel, v.client), (7, 1, 1, 1));
    assert_eq!((v.rate_limit, v.auth, v.transient, v.unknown), (1, 1, 1, 1));
    assert_eq!(v.fail_count, 4);
    assert_eq!((v.units, v.amount), (70, 3));
    assert_eq!(v.window_start, "2027-01-15T08:00:00Z");
    let bal: serde_json::Value =
        serde_json::from_slice(&query(&p, "/balance/alice").value).unwrap();
    assert_eq!(bal["balance"], 997);
}

/// Every rejection path: its code, and no state change at all.
#[test]
fn every_malformed_input_has_its_code_and_changes_nothing() {
    let p0 = setup(5);
    let key = gw_key();
    let now = T0;
    let ok = |recs| report(9, now + 60, recs);
    let good = vec![rec("alice", Outcome::Ok, 1, 1)];
    let stranger = SigningKey::from_bytes(&[9u8; 32]);
    let mut bad_sig = match Tx::decode(sign_report(&key, &ok(good.clone())).as_slice())
        .unwrap()
        .sum
    {
        Some(tx::Sum::Report(r)) => r,
        _ => unreachable!(),
    };
    bad_sig.signature[0] ^= 1;
    let bad_sig = Tx {
        sum: Some(tx::Sum::Report(bad_sig)),
    }
    .encode_to_vec();
    // A body for this chain: the chain id is checked before the key.
    let short_key = Tx {
        sum: Some(tx::Sum::Report(SignedReport {
            body: ok(good.clone()).encode_to_vec(),
            gateway_key: vec![1, 2],
            signature: vec![],
        })),
    }
    .encode_to_vec();
    let mut wrong_chain = ok(good.clone());
    wrong_chain.chain_id = "other".into();
    let mut bad_id = ok(good.clone());
    bad_id.report_id = vec![1; 15];
    let bad_field = |f: &dyn Fn(&mut UsageRecord)| {
        let mut r = rec("alice", Outcome::Ok, 1, 1);
        f(&mut r);
        sign_report(&key, &ok(vec![r]))
    };
    let cases: Vec<(&str, Vec<u8>, Code)> = vec![
        ("garbage", vec![0xff, 0x01, 0x02], Code::MalformedTx),
        ("empty tx", vec![], Code::MalformedTx),
        ("short key", short_key, Code::UnknownGateway),
        (
            "stranger",
            sign_report(&stranger, &ok(good.clone())),
            Code::UnknownGateway,
        ),
        ("bad signature", bad_sig, Code::BadSignature),
        (
            "wrong chain",
            sign_report(&key, &wrong_chain),
            Code::WrongChain,
        ),
        ("bad id", sign_report(&key, &bad_id), Code::BadReportId),
        (
            "expired",
            sign_report(&key, &report(9, now, good.clone())),
            Code::ReportExpired,
        ),
        (
            "too far",
            sign_report(&key, &report(9, now + 601, good.clone())),
            Code::ExpiryTooFar,
        ),
        ("empty", sign_report(&key, &ok(vec![])), Code::EmptyReport),
        (
            "too many",
            sign_report(&key, &ok(vec![rec("alice", Outcome::Ok, 0, 0); 1001])),
            Code::TooManyRecords,
        ),
        (
            "bad user",
            bad_field(&|r| r.user = "al ice".into()),
            Code::BadIdentifier,
        ),
        (
            "empty provider",
            bad_field(&|r| r.provider = String::new()),
            Code::BadIdentifier,
        ),
        (
            "long model",
            bad_field(&|r| r.model = "m".repeat(129)),
            Code::BadIdentifier,
        ),
        (
            "bad route",
            bad_field(&|r| r.route = "/v1?x".into()),
            Code::BadIdentifier,
        ),
        (
            "unspecified",
            bad_field(&|r| r.outcome = 0),
            Code::BadOutcome,
        ),
        (
            "unknown enum",
            bad_field(&|r| r.outcome = 99),
            Code::BadOutcome,
        ),
        (
            "broke",
            bad_field(&|r| r.amount = 6),
            Code::InsufficientBalance,
        ),
        ("oversized", vec![0u8; (1 << 20) + 1], Code::TxTooLarge),
        (
            "overflow",
            sign_report(
                &key,
                &ok(vec![
                    rec("alice", Outcome::Ok, u64::MAX, 0),
                    rec("alice", Outcome::Ok, 1, 0),
                ]),
            ),
            Code::Overflow,
        ),
    ];
    for (name, bytes, want) in cases {
        let mut p = Pending::open(p0.backend().clone()).unwrap();
        for (k, v) in &p0.changes().writes {
            match v {
                Some(v) => p.put(k.clone(), v.clone()),
                None => p.delete(k.clone()),
            }
        }
        let b = block(&mut p, 1, now);
        let before = p.changes().clone();
        let r = deliver(&mut p, &b, &bytes);
        assert_eq!(r.code, want, "{name}: {}", r.log);
        assert!(!r.log.is_empty(), "{name}: a rejection explains itself");
        assert_eq!(p.changes(), &before, "{name}: a rejection changes nothing");
    }
}

#[test]
fn duplicate_is_refused_until_expiry_then_forgotten() {
    let mut p = setup(100);
    let tx = sign_report(
        &gw_key(),
        &report(3, T0 + 30, vec![rec("alice", Outcome::Ok, 1, 1)]),
    );
    let b = block(&mut p, 1, T0);
    assert_eq!(deliver(&mut p, &b, &tx).code, Code::Ok);
    let b = block(&mut p, 2, T0 + 1);
    let before = p.changes().clone();
    let r = deliver(&mut p, &b, &tx);
    assert_eq!(r.code, Code::DuplicateReport, "{}", r.log);
    assert_eq!(p.changes(), &before);
    // After expiry the id is forgotten, and the report is refused as expired.
    let b = block(&mut p, 3, T0 + 30);
    assert!(p
        .get(&tally_settlement::keys::report_id(&[3; 16]))
        .unwrap()
        .is_none());
    assert_eq!(deliver(&mut p, &b, &tx).code, Code::ReportExpired);
}

/// `/windows` and `/hubcalls/hub` after a block: each window's (closed,
/// converting) and the pending call ids.
fn windows_and_calls(p: &Pending) -> (Vec<(bool, bool)>, Vec<u64>) {
    let w: serde_json::Value = serde_json::from_slice(&query(p, "/windows").value).unwrap();
    let ws = w["windows"].as_array().unwrap();
    let flags = ws
        .iter()
        .map(|w| {
            (
                w["closed"].as_bool().unwrap(),
                w["converting"].as_bool().unwrap(),
            )
        })
        .collect();
    let c: serde_json::Value = serde_json::from_slice(&query(p, "/hubcalls/hub").value).unwrap();
    let ids = c["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    (flags, ids)
}

#[test]
fn a_closed_window_is_converting_until_its_last_hub_call() {
    let mut p = setup(100);
    let mut params = tally_settlement::params(&p).unwrap();
    params.max_close_per_block = 1;
    tally_settlement::state::chain::put_params(&mut p, &params).unwrap();
    let b = block(&mut p, 1, T0 + 5);
    let tx = sign_report(
        &gw_key(),
        &report(
            4,
            T0 + 100,
            vec![
                rec("alice", Outcome::Ok, 1, 2),
                rec("bob", Outcome::Ok, 1, 3),
            ],
        ),
    );
    assert_eq!(deliver(&mut p, &b, &tx).code, Code::Ok);
    assert_eq!(windows_and_calls(&p), (vec![(false, false)], vec![]));
    block(&mut p, 2, T0 + 60);
    assert_eq!(windows_and_calls(&p), (vec![(true, true)], vec![1]));
    block(&mut p, 3, T0 + 61);
    assert_eq!(windows_and_calls(&p), (vec![(true, false)], vec![1, 2]));
}

#[test]
fn windows_close_and_freeze() {
    let mut p = setup(100);
    let b = block(&mut p, 1, T0 + 5);
    let tx = sign_report(
        &gw_key(),
        &report(4, T0 + 100, vec![rec("alice", Outcome::Transient, 1, 0)]),
    );
    assert_eq!(deliver(&mut p, &b, &tx).code, Code::Ok);
    let b = block(&mut p, 2, T0 + 61);
    let tx = sign_report(
        &gw_key(),
        &report(5, T0 + 100, vec![rec("alice", Outcome::Ok, 1, 1)]),
    );
    assert_eq!(deliver(&mut p, &b, &tx).code, Code::Ok);
    let w: serde_json::Value = serde_json::from_slice(&query(&p, "/windows").value).unwrap();
    let ws = w["windows"].as_array().unwrap();
    assert_eq!(ws.len(), 2);
    assert_eq!(ws[0]["closed"], true);
    assert_eq!(ws[0]["fail_count"], 1);
    assert_eq!(ws[1]["closed"], false);
    assert_eq!(route_record(&p, T0 / 60).unwrap().requests, 1);
    assert_eq!(route_record(&p, T0 / 60 + 1).unwrap().ok, 1);
}

#[test]
fn queries_refuse_bad_paths_and_arguments() {
    let p = setup(1);
    for (path, want) in [
        ("/nope", Code::UnknownPath),
        ("/sla/route/a/b/c", Code::UnknownPath),
        ("/sla/provider/a b", Code::BadArgument),
        ("/sla/provider/p/notanumber", Code::BadArgument),
        ("/sla/provider/p?limit=0", Code::BadArgument),
        ("/sla/provider/p?cursor=zz", Code::BadArgument),
        ("/sla/provider/p?bogus=1", Code::BadArgument),
        ("/sla/route/alice/prov/m/r/5", Code::NotFound),
        ("/balance/%zz", Code::BadArgument),
    ] {
        let r = query(&p, path);
        assert_eq!(r.code, want, "{path}: {}", r.log);
        assert!(!r.log.is_empty());
    }
    assert_eq!(query(&p, "/params").code, Code::Ok);
    assert_eq!(query(&p, "/sla/provider/prov").code, Code::Ok);
}

#[test]
fn paging_walks_every_record_once() {
    let mut p = setup(1_000_000);
    let b = block(&mut p, 1, T0);
    let recs: Vec<_> = (0..25)
        .map(|i| UsageRecord {
            route: format!("r{i:02}"),
            ..rec("alice", Outcome::Ok, 1, 1)
        })
        .collect();
    assert_eq!(
        deliver(
            &mut p,
            &b,
            &sign_report(&gw_key(), &report(1, T0 + 60, recs))
        )
        .code,
        Code::Ok
    );
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!("/sla/provider/prov?limit=10{cursor}");
        let v: serde_json::Value = serde_json::from_slice(&query(&p, &path).value).unwrap();
        for r in v["records"].as_array().unwrap() {
            seen.push(r["route"].as_str().unwrap().to_string());
        }
        match v["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    let want: Vec<_> = (0..25).map(|i| format!("r{i:02}")).collect();
    assert_eq!(seen, want);
}

fn outcome() -> impl Strategy<Value = Outcome> {
    proptest::sample::select(Outcome::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Cancel and client never reach fail_count; the class counters add up
    /// to requests; each report is accepted exactly when a model of the
    /// balances says every user in it can pay (else insufficient_balance,
    /// and nothing of it applies); balances equal the model's, credits are
    /// conserved, and once the windows close the hub calls owe each
    /// provider exactly what the model charged, per window and user.
    #[test]
    fn counters_balances_and_conservation(
        reports in proptest::collection::vec(
            proptest::collection::vec((0..2usize, 0..3usize, outcome(), 0u64..50, 0u64..40), 1..20), 1..15),
    ) {
        let start = 300u64;
        let mut p = setup(start);
        let users = ["alice", "bob"];
        let mut model_bal = [start, start];
        // (window, user, provider) -> credits owed, from the model.
        let mut owed: std::collections::BTreeMap<(u64, String, String), u64> = Default::default();
        let mut accepted = Vec::new();
        for (i, recs) in reports.iter().enumerate() {
            let b = block(&mut p, i as u64 + 1, T0 + i as u64 * 7);
            // Three reports in four bill failed calls nothing, as gateways
            // must; the fourth keeps what was drawn.
            let recs: Vec<_> = recs
                .iter()
                .map(|&(u, pv, o, units, amt)| {
                    let failed = !matches!(o, Outcome::Ok | Outcome::Cancel | Outcome::Client);
                    (u, pv, o, units, if failed && i % 4 != 0 { 0 } else { amt })
                })
                .collect();
            let rs: Vec<_> = recs
                .iter()
                .map(|(u, pv, o, units, amt)| UsageRecord {
                    provider: format!("prov{pv}"),
                    ..rec(users[*u], *o, *units, *amt)
                })
                .collect();
            let mut debit = [0u64; 2];
            for (u, _, _, _, amt) in &recs {
                debit[*u] += amt;
            }
            // The model's rule (DESIGN.md): records of the failure classes
            // carry amount 0, checked before any balance.
            let bills_failure = recs
                .iter()
                .any(|(_, _, o, _, amt)| *amt > 0 && !matches!(o, Outcome::Ok | Outcome::Cancel | Outcome::Client));
            let pays = (0..2).all(|u| debit[u] <= model_bal[u]);
            let r = deliver(&mut p, &b, &sign_report(&gw_key(), &report(i as u8, b.time + 60, rs)));
            if bills_failure {
                prop_assert_eq!(r.code, Code::FailedCallBilled, "{}", r.log);
            } else if pays {
                prop_assert_eq!(r.code, Code::Ok, "{}", r.log);
                for u in 0..2 {
                    model_bal[u] -= debit[u];
                }
                for (u, pv, _, _, amt) in &recs {
                    *owed.entry((b.time / 60, users[*u].to_string(), format!("prov{pv}"))).or_default() += amt;
                }
                accepted.extend(recs.iter().cloned());
            } else {
                prop_assert_eq!(r.code, Code::InsufficientBalance, "{}", r.log);
            }
        }
        let mut charged = 0u64;
        let mut balances = 0u64;
        for (ui, u) in users.iter().enumerate() {
            let v: serde_json::Value = serde_json::from_slice(&query(&p, &format!("/sla/user/{u}?limit=1000")).value).unwrap();
            let mut total = (0u64, 0u64, 0u64, 0u64);
            for r in v["records"].as_array().unwrap() {
                let r: RouteRecordView = serde_json::from_value(r.clone()).unwrap();
                prop_assert_eq!(r.fail_count, r.rate_limit + r.auth + r.transient + r.unknown);
                prop_assert_eq!(r.requests, r.ok + r.cancel + r.client + r.fail_count);
                total.0 += r.requests;
                total.1 += r.fail_count;
                total.2 += r.amount;
                total.3 += r.cancel + r.client;
            }
            let mine: Vec<_> = accepted.iter().filter(|(x, ..)| *x == ui).collect();
            prop_assert_eq!(total.0, mine.len() as u64);
            let fails = mine.iter().filter(|(_, _, o, ..)| !matches!(o, Outcome::Ok | Outcome::Cancel | Outcome::Client)).count();
            prop_assert_eq!(total.1, fails as u64);
            let bal: serde_json::Value = serde_json::from_slice(&query(&p, &format!("/balance/{u}")).value).unwrap();
            let bal = bal["balance"].as_u64().unwrap();
            prop_assert_eq!(bal, model_bal[ui], "balance of {}", u);
            prop_assert_eq!(bal + total.2, start, "credits are conserved");
            charged += total.2;
            balances += bal;
        }
        prop_assert_eq!(charged + balances, 2 * start);
        // Close every window: what providers are owed becomes hub calls.
        block(&mut p, reports.len() as u64 + 1, T0 + 1000);
        let v: serde_json::Value = serde_json::from_slice(&query(&p, "/hubcalls/hub?limit=1000").value).unwrap();
        let mut calls: std::collections::BTreeMap<(u64, String, String), u64> = Default::default();
        for c in v["calls"].as_array().unwrap() {
            let k = (
                c["window"].as_u64().unwrap(),
                c["user"].as_str().unwrap().to_string(),
                c["provider"].as_str().unwrap().to_string(),
            );
            prop_assert!(calls.insert(k, c["amount"].as_u64().unwrap()).is_none(), "one call per window, user, provider");
        }
        owed.retain(|_, v| *v > 0);
        prop_assert_eq!(calls, owed, "hub calls vs the model's owed");
    }

    /// A cancelled or client-fault record never changes fail_count, whatever
    /// came before it.
    #[test]
    fn cancel_and_client_never_fail(before in proptest::collection::vec(outcome(), 0..30), last in prop_oneof![Just(Outcome::Cancel), Just(Outcome::Client)]) {
        let mut p = setup(0);
        let b = block(&mut p, 1, T0);
        let recs: Vec<_> = before.iter().map(|o| rec("alice", *o, 1, 0)).collect();
        if !recs.is_empty() {
            prop_assert_eq!(deliver(&mut p, &b, &sign_report(&gw_key(), &report(1, T0 + 60, recs))).code, Code::Ok);
        }
        let f0 = route_record(&p, T0 / 60).map(|r| r.fail_count).unwrap_or(0);
        prop_assert_eq!(deliver(&mut p, &b, &sign_report(&gw_key(), &report(2, T0 + 60, vec![rec("alice", last, 1, 0)]))).code, Code::Ok);
        let r = route_record(&p, T0 / 60).unwrap();
        prop_assert_eq!(r.fail_count, f0);
        prop_assert_eq!(r.requests, before.len() as u64 + 1);
    }
}

/// A corrupt stored value is this node's fault, not the sender's: running
/// or checking a transaction answers `Fatal`, never a result code in a
/// block, and changes nothing.
#[test]
fn corrupt_state_is_fatal_not_a_rejection() {
    let mut p = setup(100);
    let b = block(&mut p, 1, T0);
    p.put(tally_settlement::keys::balance("alice"), vec![1, 2, 3]);
    let before = p.changes().clone();
    let tx = sign_report(
        &gw_key(),
        &report(9, T0 + 30, vec![rec("alice", Outcome::Ok, 1, 1)]),
    );
    let r = tally_settlement::deliver_tx(&mut p, &b, &tx);
    assert!(
        matches!(r, Err(tally_settlement::Fatal::Corrupt("integer"))),
        "{r:?}"
    );
    assert_eq!(p.changes(), &before);
    assert!(tally_settlement::check_tx(&p, &tx).is_err());
    // An invalid transaction is still a result, even on this node.
    let r = deliver(&mut p, &b, b"garbage");
    assert_eq!(r.code, Code::MalformedTx);
}

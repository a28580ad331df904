//! Target 1: transaction decode and CheckTx, on arbitrary bytes and on
//! mutations of valid signed reports (bit flips, truncation, insertions,
//! a second payload appended, every field twice, bodies changed and signed again, reports with
//! hundreds of records). Properties: no panic and no halt; the code is one
//! CheckTx documents, the same from the state machine and the adapter, and
//! consistent with what the bytes decode to; anything over `max_tx_bytes`
//! is refused as `tx_too_large` (by its length, before decoding); an
//! unmutated valid report passes.

use ed25519_dalek::Signer;
use proptest::prelude::*;
use prost::Message;
use tally_settlement::proto::{
    tx, Outcome, ReportUsage, SignedReport, SubmitPartials, SyncTxStart, UsageRecord,
};
use tally_settlement::{check_tx, decode_tx, Code, REPORT_SIGN_DOMAIN};
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::RequestCheckTx;

use crate::env::{params, tx_bytes, Env, CHAIN, NOW};
use crate::mutate::{apply, mutation, Mutation};

/// How the bytes under test are made.
#[derive(Clone, Debug)]
enum Input {
    /// Any bytes, sometimes longer than `max_tx_bytes`.
    Raw(Vec<u8>),
    /// A valid report (id, amount), then byte-level mutations.
    Report([u8; 16], u64, Vec<Mutation>),
    /// A report whose body bytes were mutated, then signed again.
    Resigned([u8; 16], Vec<Mutation>),
    /// A valid report with `n` records.
    Huge(usize),
    /// A SubmitPartials with `n` partials (a system transaction, over the
    /// size cap from about 30 partials on).
    HugeSystem(usize),
}

fn input() -> impl Strategy<Value = Input> {
    let appended = || {
        prop_oneof![
            Just(tx_bytes(tx::Sum::Partials(SubmitPartials::default()))),
            Just(tx_bytes(tx::Sum::SyncStart(SyncTxStart::default()))),
        ]
    };
    let mutations = move || prop::collection::vec(mutation(appended()), 0..4);
    prop_oneof![
        3 => prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            prop::collection::vec(any::<u8>(), 4090..4200),
        ]
        .prop_map(Input::Raw),
        4 => (any::<[u8; 16]>(), 0u64..20, mutations())
            .prop_map(|(id, amount, m)| Input::Report(id, amount, m)),
        2 => (any::<[u8; 16]>(), prop::collection::vec(mutation(Just(Vec::new())), 1..4))
            .prop_map(|(id, m)| Input::Resigned(id, m)),
        1 => (100usize..1500).prop_map(Input::Huge),
        1 => (1usize..100).prop_map(Input::HugeSystem),
    ]
}

fn record(i: usize) -> UsageRecord {
    UsageRecord {
        user: "alice".into(),
        provider: format!("p{}", i % 7),
        model: "m".into(),
        route: "r".into(),
        outcome: Outcome::Ok as i32,
        units: 1,
        amount: 0,
        ..Default::default()
    }
}

/// The bytes of `input`, and whether the oracle knows them to be valid.
fn build(env: &Env, input: &Input) -> (Vec<u8>, bool) {
    match input {
        Input::Raw(b) => (b.clone(), false),
        Input::Report(id, amount, ms) => {
            let valid = env.report(id.to_vec(), NOW + 60, *amount);
            (apply(valid, ms), ms.is_empty())
        }
        Input::Resigned(id, ms) => {
            let body = ReportUsage {
                chain_id: CHAIN.into(),
                report_id: id.to_vec(),
                expires_at: NOW + 60,
                records: vec![record(0), record(1)],
                route_calls: Vec::new(),
            }
            .encode_to_vec();
            let body = apply(body, ms);
            let mut signed = REPORT_SIGN_DOMAIN.to_vec();
            signed.extend_from_slice(&body);
            let s = SignedReport {
                signature: env.gw.sign(&signed).to_bytes().to_vec(),
                gateway_key: env.gw.verifying_key().to_bytes().to_vec(),
                body,
            };
            (tx_bytes(tx::Sum::Report(s)), false)
        }
        Input::Huge(n) => {
            let report = ReportUsage {
                chain_id: CHAIN.into(),
                report_id: vec![9; 16],
                expires_at: NOW + 60,
                records: (0..*n).map(record).collect(),
                route_calls: Vec::new(),
            };
            (tally_settlement::sign_report(&env.gw, &report), false)
        }
        Input::HugeSystem(n) => {
            let p = SubmitPartials {
                partials: (0..*n).map(|i| env.good(i % 7, i % 4)).collect(),
                ..SubmitPartials::default()
            };
            (tx_bytes(tx::Sum::Partials(p)), false)
        }
    }
}

/// The gateway key and report id of a report transaction.
fn report_scope(bytes: &[u8]) -> Option<Vec<u8>> {
    let Ok(Some(tx::Sum::Report(signed))) = decode_tx(bytes).map(|t| t.sum) else {
        return None;
    };
    let body = ReportUsage::decode(signed.body.as_slice()).ok()?;
    Some([signed.gateway_key, body.report_id].concat())
}

/// The payload's field number by ADR 0016's rule, written from the
/// protobuf wire format: the top level must read as a sequence of fields
/// (a varint key, then a varint, 8 bytes, a varint length and that many
/// bytes, or 4 bytes, for wire types 0, 1, 2 and 5; a varint is at most 10
/// bytes, 7 bits each, least significant first); the payload is the last
/// field of wire type 2, as a protobuf `oneof` keeps the last one.
fn payload_field(bytes: &[u8]) -> Option<u64> {
    fn varint(rest: &mut &[u8]) -> Option<u64> {
        let end = rest.iter().position(|b| b & 0x80 == 0)?;
        if end >= 10 {
            return None;
        }
        let (v, tail) = rest.split_at(end + 1);
        *rest = tail;
        Some(
            v.iter()
                .rev()
                .fold(0u64, |acc, b| (acc << 7) | u64::from(b & 0x7f)),
        )
    }
    let mut rest = bytes;
    let mut payload = None;
    while !rest.is_empty() {
        let key = varint(&mut rest)?;
        let skip = match key % 8 {
            0 => {
                varint(&mut rest)?;
                0
            }
            1 => 8,
            2 => {
                payload = Some(key / 8);
                usize::try_from(varint(&mut rest)?).ok()?
            }
            5 => 4,
            _ => return None,
        };
        rest = rest.get(skip..)?;
    }
    payload
}

/// Codes CheckTx may answer (no query codes; `internal` only on a local
/// fault, which the in-memory store never has).
fn documented(c: Code) -> bool {
    !matches!(
        c,
        Code::Internal | Code::UnknownPath | Code::BadArgument | Code::NotFound
    )
}

#[test]
fn check_tx_on_arbitrary_and_mutated_transactions() {
    let env = Env::new();
    let backend = env.app.committed_state().clone();
    let max = params().max_tx_bytes as usize;
    let mut runner = crate::runner(file!(), 8);
    // The mempool's claims, modelled: the first transaction that passes
    // with a (gateway key, report id) holds it; another passing one with
    // other bytes is refused with report_pending (no block commits here).
    let claims = std::cell::RefCell::new(std::collections::BTreeMap::<Vec<u8>, Vec<u8>>::new());
    let r = runner.run(&input(), |input| {
        let (bytes, valid) = build(&env, &input);
        let mut r = check_tx(&backend, &bytes).map_err(|f| TestCaseError::fail(f.to_string()))?;
        if r.code == Code::Ok {
            if let Some(scope) = report_scope(&bytes) {
                let mut claims = claims.borrow_mut();
                match claims.get(&scope) {
                    Some(held) if *held != bytes => r.code = Code::ReportPending,
                    _ => {
                        claims.insert(scope, bytes.clone());
                    }
                }
            }
        }
        prop_assert!(
            documented(r.code),
            "undocumented code {:?}: {}",
            r.code,
            r.log
        );
        let abci = env.app.check_tx(RequestCheckTx {
            tx: bytes.clone().into(),
            r#type: 0,
        });
        prop_assert_eq!(
            abci.code,
            r.code.value(),
            "adapter and state machine disagree"
        );
        prop_assert!(
            env.halts.is_empty(),
            "CheckTx halted: {:?}",
            env.halts.events()
        );
        if bytes.len() > max {
            prop_assert_eq!(r.code, Code::TxTooLarge, "{} bytes: {}", bytes.len(), r.log);
            return Ok(());
        }
        // ADR 0016: a system transaction is told by its payload's field
        // number before anything is decoded; the rest is decoded once.
        if matches!(payload_field(&bytes), Some(2 | 3)) {
            prop_assert_eq!(r.code, Code::SystemTxFromMempool, "{}", r.log);
            return Ok(());
        }
        match decode_tx(&bytes).map(|t| t.sum) {
            Err(_) => prop_assert_eq!(r.code, Code::MalformedTx, "{}", r.log),
            // Validator messages are user transactions too (ADR 0015).
            Ok(Some(
                tx::Sum::Report(_)
                | tx::Sum::Allowance(_)
                | tx::Sum::Validator(_)
                | tx::Sum::User(_),
            )) => {
                prop_assert_ne!(r.code, Code::SystemTxFromMempool)
            }
            // It decodes as a system transaction, yet its last
            // length-delimited field is not the payload: another field
            // follows, which canonical encoding never writes.
            Ok(Some(_)) => prop_assert_eq!(r.code, Code::NonCanonical, "{}", r.log),
            Ok(None) => prop_assert!(false, "decode_tx accepted a transaction without payload"),
        }
        if valid && r.code != Code::ReportPending {
            // (report_pending comes only from the claims model above.)
            prop_assert_eq!(r.code, Code::Ok, "a valid report was refused: {}", r.log);
        }
        Ok(())
    });
    crate::report("check_tx", r);
}

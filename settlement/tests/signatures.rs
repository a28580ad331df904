//! The verified-signature memory (`VerifiedSignatures`): only signatures
//! that verified are remembered, a remembered one skips the ed25519 check,
//! and every result is the one a node without memory gives.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use prost::Message;
use tally_settlement::proto::{tx, Outcome, ReportUsage, Tx, UsageRecord};
use tally_settlement::{
    check_tx_claim, check_tx_claim_with, init_chain, sign_report, AllowanceEntry, BalanceEntry,
    Code, GatewayEntry, Genesis, VerifiedSignatures,
};
use tally_store::{MemBackend, Pending};

/// A memory that logs what it was asked.
#[derive(Default)]
struct Log {
    known: RefCell<BTreeSet<[u8; 32]>>,
    asked: RefCell<usize>,
    inserted: RefCell<usize>,
}

impl VerifiedSignatures for Log {
    fn contains(&self, id: &[u8; 32]) -> bool {
        *self.asked.borrow_mut() += 1;
        self.known.borrow().contains(id)
    }
    fn insert(&self, id: [u8; 32]) {
        *self.inserted.borrow_mut() += 1;
        self.known.borrow_mut().insert(id);
    }
}

fn key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

fn setup() -> Pending {
    let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = Genesis {
        gateways: vec![GatewayEntry {
            name: "gw0".into(),
            pubkey: hex::encode(key().verifying_key().to_bytes()),
        }],
        balances: vec![BalanceEntry {
            user: "alice".into(),
            amount: 10,
        }],
        allowances: vec![AllowanceEntry {
            user: "alice".into(),
            gateway: "gw0".into(),
            max_per_window: 10,
            expires_at: u64::MAX,
        }],
        ..Genesis::default()
    };
    init_chain(&mut p, "tally-test", &g).unwrap();
    p
}

fn report(id: u8) -> Vec<u8> {
    sign_report(
        &key(),
        &ReportUsage {
            chain_id: "tally-test".into(),
            report_id: vec![id; 16],
            expires_at: 100,
            records: vec![UsageRecord {
                user: "alice".into(),
                provider: "p".into(),
                model: "m".into(),
                route: "/r".into(),
                outcome: Outcome::Transient as i32,
                units: 1,
                amount: 0,
                ..Default::default()
            }],
            route_calls: vec![],
        },
    )
}

/// `tx` with one bit of its signature flipped.
fn forged(tx: &[u8]) -> Vec<u8> {
    let mut t = Tx::decode(tx).unwrap();
    if let Some(tx::Sum::Report(s)) = &mut t.sum {
        s.signature[10] ^= 1;
    }
    t.encode_to_vec()
}

#[test]
fn only_verified_signatures_are_remembered_and_results_do_not_change() {
    let p = setup();
    let log = Log::default();
    let good = report(1);
    let bad = forged(&good);
    for tx in [&good, &bad, &good, &bad] {
        let plain = check_tx_claim(&p, tx).unwrap().result;
        let cached = check_tx_claim_with(&p, tx, &log).unwrap().result;
        assert_eq!((plain.code, plain.log), (cached.code, cached.log));
    }
    assert_eq!(check_tx_claim(&p, &good).unwrap().result.code, Code::Ok);
    assert_eq!(
        check_tx_claim(&p, &bad).unwrap().result.code,
        Code::BadSignature
    );
    // The good signature was inserted once (first check), found the second
    // time; the forged one was never inserted.
    assert_eq!(*log.inserted.borrow(), 1);
    assert_eq!(log.known.borrow().len(), 1);
    assert_eq!(*log.asked.borrow(), 4);
}

#[test]
fn a_remembered_signature_skips_the_curve_check() {
    // A memory that claims to know every id: a forged signature then
    // passes. Not a real situation (ids only get in by verifying); it shows
    // the check is skipped, which is the saving.
    struct KnowsAll;
    impl VerifiedSignatures for KnowsAll {
        fn contains(&self, _: &[u8; 32]) -> bool {
            true
        }
        fn insert(&self, _: [u8; 32]) {}
    }
    let p = setup();
    let bad = forged(&report(2));
    assert_eq!(
        check_tx_claim_with(&p, &bad, &KnowsAll)
            .unwrap()
            .result
            .code,
        Code::Ok
    );
}

#[test]
fn allowances_and_validator_messages_are_remembered_too() {
    use tally_settlement::proto::{validator_msg, AllowanceChange, ProposalApproval, ValidatorMsg};
    use tally_settlement::UserEntry;
    let alice = SigningKey::from_bytes(&[8u8; 32]);
    let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
    // A user key for alice, as genesis `users` writes it.
    let mut g = Genesis {
        users: vec![UserEntry {
            name: "alice".into(),
            pubkey: hex::encode(alice.verifying_key().to_bytes()),
        }],
        ..Genesis::default()
    };
    g.gateways = vec![GatewayEntry {
        name: "gw0".into(),
        pubkey: hex::encode(key().verifying_key().to_bytes()),
    }];
    init_chain(&mut p, "tally-test", &g).unwrap();
    let allowance = tally_settlement::sign_allowance(
        &alice,
        &AllowanceChange {
            chain_id: "tally-test".into(),
            user: "alice".into(),
            gateway: "gw0".into(),
            max_per_window: 5,
            expires_at: u64::MAX,
            sequence: 1,
        },
    );
    let validator = tally_settlement::dkg::sign_validator_msg(
        &SigningKey::from_bytes(&[3u8; 32]),
        &ValidatorMsg {
            chain_id: "tally-test".into(),
            sum: Some(validator_msg::Sum::Approve(ProposalApproval {
                proposal: 1,
            })),
        },
    );
    for tx in [&allowance, &validator] {
        let log = Log::default();
        let first = check_tx_claim_with(&p, tx, &log).unwrap().result;
        let again = check_tx_claim_with(&p, tx, &log).unwrap().result;
        let plain = check_tx_claim(&p, tx).unwrap().result;
        assert_eq!((&first.code, &first.log), (&plain.code, &plain.log));
        assert_eq!((&again.code, &again.log), (&plain.code, &plain.log));
        // Verified once, found the second time.
        assert_eq!(*log.inserted.borrow(), 1, "{}", plain.log);
        assert_eq!(*log.asked.borrow(), 2);
    }
}

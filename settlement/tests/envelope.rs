//! One table of codes for the faults of every signed envelope (ADR 0016):
//! for a report, an allowance change and a validator message alike, a
//! signature that is not 64 bytes or does not verify is 3 `bad_signature`,
//! a body for another chain is 4 `wrong_chain` whatever its signature, and
//! a key the kind does not know is the kind's own code (2, 27, 29, 37). The
//! expected codes are the ADR's table, not the implementation's.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use prost::Message;
use tally_settlement::proto::{
    tx, user_msg, validator_msg, AllowanceChange, Outcome, ProposalApproval, ReportUsage, Tx,
    UsageRecord, UserMsg, ValidatorMsg, Withdrawal,
};
use tally_settlement::user::sign_user_msg;
use tally_settlement::{
    check_tx, deliver_tx, init_chain, sign_allowance, sign_report, AllowanceEntry, BalanceEntry,
    Block, Code, GatewayEntry, Genesis, UserEntry,
};
use tally_store::{MemBackend, Pending};

const CHAIN: &str = "tally-test";
const T0: u64 = 1_000;

fn gw() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}
fn alice() -> SigningKey {
    SigningKey::from_bytes(&[8; 32])
}
fn stranger() -> SigningKey {
    SigningKey::from_bytes(&[9; 32])
}
fn hexkey(k: &SigningKey) -> String {
    hex::encode(k.verifying_key().to_bytes())
}

fn setup() -> Pending {
    let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = Genesis {
        gateways: vec![GatewayEntry {
            name: "gw0".into(),
            pubkey: hexkey(&gw()),
        }],
        users: vec![UserEntry {
            name: "alice".into(),
            pubkey: hexkey(&alice()),
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
    init_chain(&mut p, CHAIN, &g).unwrap();
    p
}

fn report(chain: &str) -> ReportUsage {
    ReportUsage {
        chain_id: chain.into(),
        report_id: vec![1; 16],
        expires_at: T0 + 60,
        records: vec![UsageRecord {
            user: "alice".into(),
            provider: "p".into(),
            model: "m".into(),
            route: "r".into(),
            outcome: Outcome::Ok as i32,
            units: 1,
            amount: 1,
            ..Default::default()
        }],
        route_calls: vec![],
    }
}

fn allowance(chain: &str, gateway: &str) -> AllowanceChange {
    AllowanceChange {
        chain_id: chain.into(),
        user: "alice".into(),
        gateway: gateway.into(),
        max_per_window: 5,
        expires_at: T0 + 100,
        sequence: 1,
    }
}

fn approval(chain: &str) -> ValidatorMsg {
    ValidatorMsg {
        chain_id: chain.into(),
        sum: Some(validator_msg::Sum::Approve(ProposalApproval {
            proposal: 1,
        })),
    }
}

/// The signed transaction `tx` with its envelope changed by `f`: the
/// signature or the key, as raw bytes.
fn edit(tx: &[u8], f: impl Fn(&mut Vec<u8>, Option<&mut Vec<u8>>)) -> Vec<u8> {
    let mut t = Tx::decode(tx).unwrap();
    match &mut t.sum {
        Some(tx::Sum::Report(s)) => f(&mut s.signature, Some(&mut s.gateway_key)),
        Some(tx::Sum::Allowance(s)) => f(&mut s.signature, None),
        Some(tx::Sum::Validator(s)) => f(&mut s.signature, Some(&mut s.pubkey)),
        Some(tx::Sum::User(s)) => f(&mut s.signature, None),
        _ => unreachable!(),
    }
    t.encode_to_vec()
}

/// A user's withdrawal (ADR 0020; the chain here runs app version 1, so
/// one that opens is refused by version, after every envelope check).
fn withdrawal(chain: &str, user: &str) -> UserMsg {
    UserMsg {
        chain_id: chain.into(),
        user: user.into(),
        sequence: 1,
        sum: Some(user_msg::Sum::Withdraw(Withdrawal { amount: 1 })),
    }
}

fn short_sig(tx: &[u8]) -> Vec<u8> {
    edit(tx, |s, _| {
        s.pop();
    })
}
fn flipped_sig(tx: &[u8]) -> Vec<u8> {
    edit(tx, |s, _| s[5] ^= 1)
}
fn short_key(tx: &[u8]) -> Vec<u8> {
    edit(tx, |_, k| {
        k.unwrap().pop();
    })
}

/// The code FinalizeBlock gives `tx` in a block at `T0`, and CheckTx's.
fn codes(tx: &[u8]) -> (Code, Code) {
    let mut p = setup();
    let checked = check_tx(&p, tx).unwrap().code;
    let b = Block {
        height: 1,
        time: T0,
    };
    tally_settlement::begin_block(&mut p, &b).unwrap();
    (deliver_tx(&mut p, &b, tx).unwrap().code, checked)
}

fn expect(what: &str, tx: &[u8], want: Code) {
    let (delivered, checked) = codes(tx);
    assert_eq!(delivered, want, "{what}: FinalizeBlock");
    assert_eq!(checked, want, "{what}: CheckTx");
}

#[test]
fn a_short_or_wrong_signature_is_bad_signature_for_every_kind() {
    let kinds: [(&str, Vec<u8>); 4] = [
        ("report", sign_report(&gw(), &report(CHAIN))),
        (
            "allowance",
            sign_allowance(&alice(), &allowance(CHAIN, "gw0")),
        ),
        (
            "validator message",
            tally_settlement::dkg::sign_validator_msg(&stranger(), &approval(CHAIN)),
        ),
        (
            "user message",
            sign_user_msg(&alice(), &withdrawal(CHAIN, "alice")),
        ),
    ];
    for (what, tx) in &kinds {
        expect(
            &format!("{what}, 63-byte signature"),
            &short_sig(tx),
            Code::BadSignature,
        );
        expect(
            &format!("{what}, flipped signature"),
            &flipped_sig(tx),
            Code::BadSignature,
        );
    }
    // Signed by someone else's key.
    expect(
        "allowance signed by another key",
        &sign_allowance(&gw(), &allowance(CHAIN, "gw0")),
        Code::BadSignature,
    );
    // The gateway an allowance names is the allowance's own check, after
    // the signature.
    expect(
        "allowance, bad gateway name and signature",
        &short_sig(&sign_allowance(&alice(), &allowance(CHAIN, "g w"))),
        Code::BadSignature,
    );
}

#[test]
fn another_chain_comes_before_the_signer_and_the_signature() {
    expect(
        "report for another chain, bad signature",
        &flipped_sig(&sign_report(&gw(), &report("other"))),
        Code::WrongChain,
    );
    expect(
        "report for another chain, unknown gateway",
        &sign_report(&stranger(), &report("other")),
        Code::WrongChain,
    );
    expect(
        "allowance for another chain, bad signature",
        &short_sig(&sign_allowance(&alice(), &allowance("other", "gw0"))),
        Code::WrongChain,
    );
    expect(
        "user message for another chain, bad signature",
        &short_sig(&sign_user_msg(&alice(), &withdrawal("other", "alice"))),
        Code::WrongChain,
    );
    expect(
        "validator message for another chain, bad signature",
        &short_sig(&tally_settlement::dkg::sign_validator_msg(
            &stranger(),
            &approval("other"),
        )),
        Code::WrongChain,
    );
}

#[test]
fn a_key_the_kind_does_not_know_is_the_kinds_own_code() {
    expect(
        "report from an unregistered key",
        &sign_report(&stranger(), &report(CHAIN)),
        Code::UnknownGateway,
    );
    expect(
        "report with a 31-byte key",
        &short_key(&sign_report(&gw(), &report(CHAIN))),
        Code::UnknownGateway,
    );
    expect(
        "allowance of a user without a key",
        &sign_allowance(
            &alice(),
            &AllowanceChange {
                user: "bob".into(),
                ..allowance(CHAIN, "gw0")
            },
        ),
        Code::BadAllowance,
    );
    expect(
        "user message of a user without a key",
        &sign_user_msg(&alice(), &withdrawal(CHAIN, "bob")),
        Code::BadUserMsg,
    );
    // Every envelope check passed: the version refuses it (app version 1).
    expect(
        "user message on an app version 1 chain",
        &sign_user_msg(&alice(), &withdrawal(CHAIN, "alice")),
        Code::BadUserMsg,
    );
    let msg = tally_settlement::dkg::sign_validator_msg(&stranger(), &approval(CHAIN));
    expect(
        "validator message with a 31-byte key",
        &short_key(&msg),
        Code::NotValidator,
    );
    // Not an ed25519 point: y = 2 does not decompress.
    let mut not_a_point = [0u8; 32];
    not_a_point[0] = 2;
    expect(
        "validator message whose key is not a point",
        &edit(&msg, |_, k| *k.unwrap() = not_a_point.to_vec()),
        Code::NotValidator,
    );
    // A valid key that verifies but is no validator: after opening.
    expect(
        "validator message from a stranger",
        &msg,
        Code::NotValidator,
    );
    // A validator message without payload, badly signed: the envelope
    // comes first.
    expect(
        "validator message without payload, bad signature",
        &short_sig(&tally_settlement::dkg::sign_validator_msg(
            &stranger(),
            &ValidatorMsg {
                chain_id: CHAIN.into(),
                sum: None,
            },
        )),
        Code::BadSignature,
    );
}

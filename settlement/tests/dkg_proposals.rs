//! Validator-set proposals through `deliver_tx`, as a validator sends
//! them: the result codes of approvals (a missing proposal is a refused
//! transaction, `bad_proposal`, not a query's `not_found`) and the status
//! names `/proposals` shows as a proposal moves on.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use tally_settlement::dkg::{init_validators, sign_validator_msg};
use tally_settlement::proto::{
    validator_msg::Sum, ProposalApproval, ValidatorMsg, ValidatorProposal,
};
use tally_settlement::query::query;
use tally_settlement::{begin_block, deliver_tx, init_chain, Block, Code, Genesis};
use tally_store::{MemBackend, Pending};

const CHAIN: &str = "c";

fn send(kv: &mut Pending, key: &SigningKey, height: u64, sum: Sum) -> Code {
    let tx = sign_validator_msg(
        key,
        &ValidatorMsg {
            chain_id: CHAIN.into(),
            sum: Some(sum),
        },
    );
    let block = Block {
        height,
        time: 100 + height,
    };
    deliver_tx(kv, &block, &tx).unwrap().code
}

fn statuses(kv: &Pending) -> Vec<(String, String)> {
    let r = query(kv, "/proposals");
    assert_eq!(r.code, Code::Ok, "{}", r.log);
    let v: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
    v["proposals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["action"].as_str().unwrap().to_string(),
                p["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A chain with two validators of power 10 (keys a and b) and no
/// encryption keys: no ceremony ever starts.
fn two_validators() -> (Pending, SigningKey, SigningKey) {
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    init_chain(&mut kv, CHAIN, &Genesis::default()).unwrap();
    let a = SigningKey::from_bytes(&[7; 32]);
    let b = SigningKey::from_bytes(&[8; 32]);
    let set = [
        (a.verifying_key().to_bytes(), 10),
        (b.verifying_key().to_bytes(), 10),
    ];
    init_validators(&mut kv, &set).unwrap();
    (kv, a, b)
}

#[test]
fn approvals_of_missing_or_closed_proposals_are_bad_proposals() {
    let (mut kv, a, b) = two_validators();
    begin_block(
        &mut kv,
        &Block {
            height: 1,
            time: 101,
        },
    )
    .unwrap();

    let approve = |id| Sum::Approve(ProposalApproval { proposal: id });
    assert_eq!(send(&mut kv, &a, 1, approve(1)), Code::BadProposal);
    assert_eq!(send(&mut kv, &a, 1, approve(u64::MAX)), Code::BadProposal);

    // An addition at another power is refused: powers stay equal.
    let third = SigningKey::from_bytes(&[9; 32]);
    let unequal = Sum::Propose(ValidatorProposal {
        action: 1,
        pubkey: third.verifying_key().to_bytes().to_vec(),
        power: 5,
        valid_until_height: 5,
        ..Default::default()
    });
    assert_eq!(send(&mut kv, &a, 1, unequal), Code::BadProposal);
    // A re-key names no validator and carries no power.
    for (pubkey, power) in [(b.verifying_key().to_bytes().to_vec(), 0), (Vec::new(), 10)] {
        let bad = Sum::Propose(ValidatorProposal {
            action: 3,
            pubkey,
            power,
            valid_until_height: 5,
            ..Default::default()
        });
        assert_eq!(send(&mut kv, &a, 1, bad), Code::BadProposal);
    }
    // a proposes a re-key; its own approval is half the power.
    let rekey = Sum::Propose(ValidatorProposal {
        action: 3,
        valid_until_height: 5,
        ..ValidatorProposal::default()
    });
    assert_eq!(send(&mut kv, &a, 1, rekey), Code::Ok);
    assert_eq!(statuses(&kv), [("rekey".into(), "open".into())]);
    assert_eq!(send(&mut kv, &a, 1, approve(1)), Code::DkgDuplicate);
    assert_eq!(send(&mut kv, &b, 1, approve(1)), Code::Ok);
    assert_eq!(statuses(&kv), [("rekey".into(), "accepted".into())]);
    // Accepted: no longer open for approvals.
    assert_eq!(send(&mut kv, &b, 1, approve(1)), Code::BadProposal);
    // The first key's ceremony started at height 1 with no key registered
    // in advance (ADR 0018): the re-key waits for it.
    begin_block(
        &mut kv,
        &Block {
            height: 2,
            time: 102,
        },
    )
    .unwrap();
    assert_eq!(statuses(&kv), [("rekey".into(), "accepted".into())]);
    let c = tally_settlement::dkg::state::ceremony(&kv)
        .unwrap()
        .expect("first key");
    assert_eq!((c.round, c.start_height, c.players.len()), (1, 1, 2));
    assert_eq!(send(&mut kv, &a, 2, approve(1)), Code::BadProposal);
}

#[test]
fn a_proposal_opens_only_until_its_valid_until_height() {
    let (mut kv, a, b) = two_validators();
    let _ = b;
    let update = |until| {
        Sum::Propose(ValidatorProposal {
            action: 3,
            valid_until_height: until,
            ..ValidatorProposal::default()
        })
    };
    let at = |kv: &mut Pending, h: u64| {
        begin_block(
            kv,
            &Block {
                height: h,
                time: 100 + h,
            },
        )
        .unwrap();
    };
    at(&mut kv, 50);
    // Hand-computed edges: at height 50, 49 is past, 1050 is 1000 ahead
    // (the limit), 1051 one too many; 0 (unset) is always past.
    assert_eq!(send(&mut kv, &a, 50, update(0)), Code::BadProposal);
    assert_eq!(send(&mut kv, &a, 50, update(49)), Code::BadProposal);
    assert_eq!(send(&mut kv, &a, 50, update(1051)), Code::BadProposal);
    assert_eq!(send(&mut kv, &a, 50, update(50)), Code::Ok);
    assert_eq!(statuses(&kv).len(), 1);
    // The same signed bytes, replayed after the proposal closed, open
    // nothing: a later height is past its validity.
    let (mut kv2, _, _) = two_validators();
    at(&mut kv2, 1050);
    assert_eq!(send(&mut kv2, &a, 1050, update(1050)), Code::Ok);
    at(&mut kv2, 1051);
    assert_eq!(send(&mut kv2, &a, 1051, update(1050)), Code::BadProposal);
}

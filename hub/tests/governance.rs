//! Governed keys on the hub (ADR 0018): when the settlement chain made its
//! key by a recovery, nobody can sign the rotation, and the hub takes the
//! new key only from a majority of its governors. The governors' message
//! is rebuilt here by hand from the ADR's layout (an oracle apart from
//! `govern_message`); keys come from the BLS module's trusted dealer.

use std::sync::Arc;

use ed25519_dalek::{Signer, SigningKey};
use prost::Message;
use tally_hub::machine::{self, hub_tx, GovernKey, GovernorApproval, HubCode, HubTx};
use tally_settlement::sync::rotation_digest;
use tally_store::{MemBackend, Pending};

mod keys_common;
use keys_common::*;

fn governor(i: u8) -> SigningKey {
    SigningKey::from_bytes(&[i + 50; 32])
}

fn genesis(k: &Key, governors: &[u8], threshold: u32) -> serde_json::Value {
    serde_json::json!({
        "settlement_chain_id": SETTLEMENT,
        "group_key": hex::encode(k.0.group.compress()),
        "escrow": [{"user": "bob", "amount": 1000}],
        "governors": governors.iter().map(|&i| hex::encode(governor(i).verifying_key().to_bytes())).collect::<Vec<_>>(),
        "governor_threshold": threshold,
    })
}

fn setup(k: &Key, governors: &[u8], threshold: u32) -> Pending {
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = genesis(k, governors, threshold);
    machine::init(&mut kv, g.to_string().as_bytes()).unwrap();
    kv
}

/// What a governor signs, by hand: tag, NUL, one length byte, the
/// settlement chain id, the rotation digest.
fn govern_bytes(settlement: &str, nonce: u64, epoch: u64, group_key: &[u8]) -> Vec<u8> {
    let mut m = b"tally-hub/govern-key/v1".to_vec();
    m.push(0);
    m.push(settlement.len() as u8);
    m.extend_from_slice(settlement.as_bytes());
    m.extend_from_slice(&rotation_digest("hub", nonce, epoch, group_key));
    m
}

fn approval(i: u8, msg: &[u8]) -> GovernorApproval {
    let g = governor(i);
    GovernorApproval {
        pubkey: g.verifying_key().to_bytes().to_vec(),
        signature: g.sign(msg).to_bytes().to_vec(),
    }
}

fn governed(nonce: u64, epoch: u64, next: &[u8], approvals: Vec<GovernorApproval>) -> Vec<u8> {
    HubTx {
        sum: Some(hub_tx::Sum::GovernKey(GovernKey {
            chain: "hub".into(),
            nonce,
            epoch,
            group_key: next.to_vec(),
            approvals,
        })),
    }
    .encode_to_vec()
}

#[test]
fn a_majority_of_governors_installs_a_recovered_key_and_then_only_it_settles() {
    let (k1, k2, k3) = (key(10), key(40), key(70));
    let g2 = k2.0.group.compress();
    let mut kv = setup(&k1, &[1, 2, 3], 2);
    let msg = govern_bytes(SETTLEMENT, 1, 2, &g2);
    // One governor is not a majority of three; neither are approvals that
    // do not count: an outsider, the same governor twice, a signature over
    // another settlement chain's message, a signature by the wrong key.
    let other_chain = govern_bytes("another-chain", 1, 2, &g2);
    let mut forged = approval(3, &msg);
    forged.signature = governor(9).sign(&msg).to_bytes().to_vec();
    let weak = vec![
        approval(1, &msg),
        approval(1, &msg),
        approval(9, &msg),
        approval(2, &other_chain),
        forged,
    ];
    assert_eq!(
        run(&mut kv, 2, &governed(1, 2, &g2, weak)),
        HubCode::Malformed,
        "more approvals than governors"
    );
    let weak = vec![
        approval(1, &msg),
        approval(1, &msg),
        approval(2, &other_chain),
    ];
    assert_eq!(
        run(&mut kv, 2, &governed(1, 2, &g2, weak)),
        HubCode::NotGoverned
    );
    assert_eq!(keys(&kv)["last_rotation"], 0, "nothing changed");
    // Checked like a rotation before the approvals.
    let two = || vec![approval(1, &msg), approval(3, &msg)];
    assert_eq!(
        run(&mut kv, 2, &governed(2, 2, &g2, two())),
        HubCode::BadNonce
    );
    assert_eq!(
        run(&mut kv, 2, &governed(1, 2, &[7; 48], two())),
        HubCode::BadKey
    );
    // Two of three: installed, recorded as the governors' key.
    assert_eq!(run(&mut kv, 3, &governed(1, 2, &g2, two())), HubCode::Ok);
    assert_eq!(
        run(&mut kv, 4, &governed(1, 2, &g2, two())),
        HubCode::AlreadySettled
    );
    let k = keys(&kv);
    assert_eq!(k["last_rotation"], 1);
    assert_eq!(k["keys"][0]["by"], "genesis");
    assert_eq!(k["keys"][1]["by"], "governors");
    assert_eq!(k["keys"][1]["group_key"], hex::encode(g2));
    // The lost committee's key is done; the recovered key settles and can
    // hand over to its successor by an ordinary rotation.
    assert_eq!(run(&mut kv, 5, &batch(&k1, 1)), HubCode::BadSignature);
    assert_eq!(run(&mut kv, 5, &batch(&k2, 1)), HubCode::Ok);
    let g3 = k3.0.group.compress();
    assert_eq!(run(&mut kv, 6, &rotation(&k2, 2, 3, &g3)), HubCode::Ok);
    assert_eq!(keys(&kv)["keys"][2]["by"], "key");
}

#[test]
fn a_hub_without_governors_refuses_every_governed_key() {
    let (k1, k2) = (key(10), key(40));
    let g2 = k2.0.group.compress();
    let mut kv = setup(&k1, &[], 0);
    let msg = govern_bytes(SETTLEMENT, 1, 2, &g2);
    assert_eq!(
        run(&mut kv, 2, &governed(1, 2, &g2, vec![approval(1, &msg)])),
        HubCode::NotGoverned
    );
    assert_eq!(keys(&kv)["last_rotation"], 0);
}

#[test]
fn genesis_governors_must_be_distinct_keys_with_a_majority_threshold() {
    let k1 = key(10);
    let init = |g: serde_json::Value| {
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        machine::init(&mut kv, g.to_string().as_bytes())
    };
    // Hand-computed majorities: of 3, 2 is the least; of 4, 3.
    assert!(init(genesis(&k1, &[1, 2, 3], 2)).is_ok());
    assert!(init(genesis(&k1, &[1, 2, 3], 3)).is_ok());
    assert!(init(genesis(&k1, &[1, 2, 3], 1)).is_err());
    assert!(init(genesis(&k1, &[1, 2, 3, 4], 2)).is_err());
    assert!(init(genesis(&k1, &[1, 2, 3, 4], 3)).is_ok());
    assert!(init(genesis(&k1, &[1, 2, 3], 4)).is_err());
    assert!(init(genesis(&k1, &[], 1)).is_err());
    assert!(
        init(genesis(&k1, &[1, 1], 2)).is_err(),
        "a repeated governor"
    );
    let mut bad = genesis(&k1, &[1], 1);
    bad["governors"] = serde_json::json!(["zz"]);
    assert!(init(bad).is_err());
}

#[test]
fn the_shared_message_is_the_documented_one() {
    let g = key(40).0.group.compress();
    assert_eq!(
        tally_hub_types::govern_message(SETTLEMENT, "hub", 5, 6, &g),
        govern_bytes(SETTLEMENT, 5, 6, &g)
    );
}

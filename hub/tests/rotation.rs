//! Key rotations on the hub (ADR 0017): the key the hub holds signs its
//! successor; from then on batches verify only against the new key. Keys
//! are dealt here by the BLS module's trusted dealer (an oracle apart from
//! the hub's code); refusals change nothing.

use std::sync::Arc;

use prost::Message;
use tally_hub::machine::{self, hub_tx, HubCode, HubTx, RotateKey};
use tally_settlement::bls::{self, Kind};
use tally_settlement::sync::rotation_digest;
use tally_store::{MemBackend, Pending};

mod keys_common;
use keys_common::*;

fn setup(k: &Key) -> Pending {
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = serde_json::json!({
        "settlement_chain_id": SETTLEMENT,
        "group_key": hex::encode(k.0.group.compress()),
        "escrow": [{"user": "bob", "amount": 1000}],
    });
    machine::init(&mut kv, g.to_string().as_bytes()).unwrap();
    kv
}

#[test]
fn the_held_key_hands_over_and_then_only_the_new_key_settles() {
    let (k1, k2, k3) = (key(10), key(40), key(70));
    let g2 = k2.0.group.compress();
    let g3 = k3.0.group.compress();
    let mut kv = setup(&k1);
    assert_eq!(run(&mut kv, 1, &batch(&k1, 1)), HubCode::Ok);
    // Only the held key can hand over: k2 cannot name itself.
    assert_eq!(
        run(&mut kv, 2, &rotation(&k2, 1, 2, &g2)),
        HubCode::BadSignature
    );
    assert_eq!(
        run(&mut kv, 2, &rotation(&k1, 2, 2, &g2)),
        HubCode::BadNonce
    );
    assert_eq!(
        run(&mut kv, 2, &rotation(&k1, 1, 2, &[7; 48])),
        HubCode::BadKey
    );
    assert_eq!(keys(&kv)["last_rotation"], 0);
    assert_eq!(run(&mut kv, 3, &rotation(&k1, 1, 2, &g2)), HubCode::Ok);
    assert_eq!(
        run(&mut kv, 4, &rotation(&k1, 1, 2, &g2)),
        HubCode::AlreadySettled
    );
    // The past committee's batch is refused; the new key's settles.
    assert_eq!(run(&mut kv, 5, &batch(&k1, 2)), HubCode::BadSignature);
    assert_eq!(run(&mut kv, 5, &batch(&k2, 2)), HubCode::Ok);
    // k1 can no longer rotate; k2 can.
    assert_eq!(
        run(&mut kv, 6, &rotation(&k1, 2, 3, &g3)),
        HubCode::BadSignature
    );
    assert_eq!(run(&mut kv, 6, &rotation(&k2, 2, 3, &g3)), HubCode::Ok);
    assert_eq!(run(&mut kv, 7, &batch(&k2, 3)), HubCode::BadSignature);
    assert_eq!(run(&mut kv, 7, &batch(&k3, 3)), HubCode::Ok);
    let k = keys(&kv);
    assert_eq!(k["last_rotation"], 2);
    let listed: Vec<(u64, String, u64)> = k["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["nonce"].as_u64().unwrap(),
                e["group_key"].as_str().unwrap().to_string(),
                e["height"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            (0, hex::encode(k1.0.group.compress()), 0),
            (1, hex::encode(g2), 3),
            (2, hex::encode(g3), 6),
        ]
    );
}

#[test]
fn a_rotation_for_another_hub_or_chain_changes_nothing() {
    let (k1, k2) = (key(10), key(40));
    let g2 = k2.0.group.compress();
    let mut kv = setup(&k1);
    let mut other = RotateKey::decode(
        match HubTx::decode(rotation(&k1, 1, 2, &g2).as_slice())
            .unwrap()
            .sum
        {
            Some(hub_tx::Sum::RotateKey(r)) => r.encode_to_vec(),
            _ => unreachable!(),
        }
        .as_slice(),
    )
    .unwrap();
    other.chain = "elsewhere".into();
    let tx = HubTx {
        sum: Some(hub_tx::Sum::RotateKey(other)),
    }
    .encode_to_vec();
    assert_eq!(run(&mut kv, 1, &tx), HubCode::WrongChain);
    // Signed for another settlement chain id: the message differs.
    let d = rotation_digest("hub", 1, 2, &g2);
    let msg = bls::message("another-chain", Kind::KeyRotation, &d);
    let parts: Vec<_> = k1.1[..3].iter().map(|s| s.sign(&msg)).collect();
    let sig = k1.0.combine(&msg, &parts).unwrap().compress().to_vec();
    let tx = HubTx {
        sum: Some(hub_tx::Sum::RotateKey(RotateKey {
            chain: "hub".into(),
            nonce: 1,
            epoch: 2,
            group_key: g2.to_vec(),
            signature: sig,
        })),
    }
    .encode_to_vec();
    assert_eq!(run(&mut kv, 1, &tx), HubCode::BadSignature);
    assert_eq!(keys(&kv)["last_rotation"], 0);
    assert_eq!(run(&mut kv, 2, &batch(&k1, 1)), HubCode::Ok);
}

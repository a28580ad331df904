//! Tests of the `/validators`, `/proposals` and `/dkg` answers, through
//! [`crate::query::query`] as a client asks them.

use std::sync::Arc;

use serde_json::json;
use tally_store::{MemBackend, Pending};

use crate::dkg::key::KeyEpoch;
use crate::dkg::state as st;
use crate::proto::{
    Ceremony, CeremonyDealer, CeremonyPlayer, Dealing, NextKey, Proposal, ValidatorRecord,
};
use crate::query::query;
use crate::Code;

fn ask(kv: &Pending, path: &str) -> serde_json::Value {
    let r = query(kv, path);
    assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
    serde_json::from_slice(&r.value).unwrap()
}

fn empty() -> Pending {
    Pending::open(Arc::new(MemBackend::new())).unwrap()
}

/// Two validators ([1; 20] power 10, [2; 20] power 20) and a 1-of-1 key
/// held by [2; 20].
fn with_validators() -> (Pending, KeyEpoch) {
    let mut kv = empty();
    st::put_validator(
        &mut kv,
        &[1; 20],
        &ValidatorRecord {
            pubkey: vec![0x11; 32],
            power: 10,
        },
    );
    st::put_validator(
        &mut kv,
        &[2; 20],
        &ValidatorRecord {
            pubkey: vec![0x22; 32],
            power: 20,
        },
    );
    let (pubs, _) = crate::bls::deal(1, 1, &[[7u8; 64]]).unwrap();
    let key = KeyEpoch {
        threshold: 1,
        group_key: hex::encode(pubs.group.compress()),
        public_shares: vec![hex::encode(pubs.shares[0].compress())],
        signers: vec!["02".repeat(20)],
        epoch: 3,
    };
    st::put_active_key(&mut kv, &key).unwrap();
    (kv, key)
}

#[test]
fn validators_show_keys_powers_and_share_indexes() {
    let (kv, _) = with_validators();
    assert_eq!(
        ask(&kv, "/validators"),
        json!({"validators": [
            {"address": "01".repeat(20), "pubkey": "11".repeat(32), "power": 10,
             "share_index": null},
            {"address": "02".repeat(20), "pubkey": "22".repeat(32), "power": 20,
             "share_index": 1},
        ], "total_power": 30})
    );
    assert_eq!(
        ask(&empty(), "/validators"),
        json!({"validators": [], "total_power": 0})
    );
    assert_eq!(query(&kv, "/validators?x=1").code, Code::BadArgument);
}

fn proposal(id: u64, status: u32, approvals: Vec<Vec<u8>>) -> Proposal {
    Proposal {
        id,
        action: 1,
        pubkey: vec![0x33; 32],
        power: 5,
        proposer: vec![1; 20],
        height: 40,
        status,
        approvals,
        reason: String::new(),
        applied_height: 0,
        ..Proposal::default()
    }
}

#[test]
fn proposals_are_paged_by_id_with_status_names_and_approving_power() {
    let (mut kv, _) = with_validators();
    st::put_proposal(&mut kv, &proposal(1, 1, vec![vec![1; 20]]));
    let mut refused = proposal(2, 4, vec![vec![1; 20], vec![2; 20]]);
    refused.action = 2;
    refused.reason = "expired without enough approvals".into();
    st::put_proposal(&mut kv, &refused);
    let v = ask(&kv, "/proposals");
    assert_eq!(v["next_from"], json!(null));
    let p = &v["proposals"];
    assert_eq!(p.as_array().unwrap().len(), 2);
    assert_eq!(p[0]["id"], 1);
    assert_eq!(p[0]["action"], "add");
    assert_eq!(p[0]["status"], "open");
    assert_eq!(p[0]["pubkey"], "33".repeat(32));
    assert_eq!(p[0]["approvals"], json!(["01".repeat(20)]));
    assert_eq!(p[0]["approving_power"], 10);
    assert_eq!(p[0]["total_power"], 30);
    assert_eq!(p[1]["action"], "remove");
    assert_eq!(p[1]["status"], "refused");
    assert_eq!(p[1]["reason"], "expired without enough approvals");
    assert_eq!(p[1]["approving_power"], 30);
    let v = ask(&kv, "/proposals?from=2");
    assert_eq!(v["proposals"].as_array().unwrap().len(), 1);
    assert_eq!(v["proposals"][0]["id"], 2);
    for id in 3..=103 {
        st::put_proposal(&mut kv, &proposal(id, 3, Vec::new()));
    }
    let v = ask(&kv, "/proposals");
    assert_eq!(v["proposals"].as_array().unwrap().len(), 100);
    assert_eq!(v["proposals"][99]["id"], 100);
    assert_eq!(v["proposals"][99]["status"], "applied");
    assert_eq!(v["next_from"], 101);
    let v = ask(&kv, "/proposals?from=101");
    assert_eq!(v["proposals"].as_array().unwrap().len(), 3);
    assert_eq!(v["next_from"], json!(null));
    let mut rekey = proposal(200, 1, vec![vec![2; 20]]);
    rekey.action = 3;
    rekey.pubkey.clear();
    rekey.power = 0;
    st::put_proposal(&mut kv, &rekey);
    let r = &ask(&kv, "/proposals?from=200")["proposals"][0];
    assert_eq!(
        (&r["action"], &r["pubkey"], &r["address"]),
        (&json!("rekey"), &json!(null), &json!(null)),
        "a re-key names no validator"
    );
    assert_eq!(query(&kv, "/proposals?from=x").code, Code::BadArgument);
    assert_eq!(query(&kv, "/proposals?limit=2").code, Code::BadArgument);
}

fn ceremony(round: u64) -> Ceremony {
    Ceremony {
        round,
        kind: 3,
        start_height: 95,
        keys_end: 100,
        deal_end: 110,
        ack_end: 120,
        end: 130,
        dealers: vec![CeremonyDealer {
            address: vec![2; 20],
        }],
        players: (1..=3u8)
            .map(|i| CeremonyPlayer {
                address: vec![i; 20],
                ..Default::default()
            })
            .collect(),
        threshold: 2,
        proposal: 9,
        epoch: 4,
        qualified: Vec::new(),
        attempt: 1,
    }
}

#[test]
fn dkg_shows_the_key_the_running_ceremony_and_what_comes_next() {
    assert_eq!(query(&empty(), "/dkg").code, Code::NotFound);
    let (mut kv, key) = with_validators();
    let v = ask(&kv, "/dkg");
    assert_eq!(v["epoch"], 3);
    assert_eq!(v["threshold"], 1);
    assert_eq!(v["group_key"], json!(key.group_key));
    assert_eq!(v["signers"], json!(["02".repeat(20)]));
    assert_eq!(v["ceremony"], json!(null));
    assert_eq!(v["next_key"], json!(null));
    assert_eq!(v["last_ceremony"], json!(null));

    st::put_last_height(&mut kv, 112);
    st::put_ceremony(&mut kv, Some(&ceremony(6)));
    let d = Dealing {
        round: 6,
        ..Default::default()
    };
    st::put_ceremony_key(&mut kv, 6, 1, &[1; 48]);
    st::put_ceremony_key(&mut kv, 6, 3, &[3; 48]);
    st::put_dealing(&mut kv, 1, &d);
    st::put_ack(&mut kv, 6, 1, 1);
    st::put_ack(&mut kv, 6, 1, 2);
    st::put_reveal(&mut kv, 6, 1, 3, &[5; 32]);
    // An older round's data is not counted.
    st::put_dealing(
        &mut kv,
        1,
        &Dealing {
            round: 5,
            ..Default::default()
        },
    );
    st::put_ack(&mut kv, 5, 1, 3);
    let mut last = ceremony(5);
    last.kind = 1;
    last.epoch = 3;
    last.qualified = vec![1];
    st::put_last_ceremony(&mut kv, &last);
    let next = KeyEpoch {
        epoch: 4,
        ..key.clone()
    };
    st::put_next_key(
        &mut kv,
        Some(&NextKey {
            key: serde_json::to_vec(&next).unwrap(),
            activate_height: 133,
            proposal: 9,
            rotation: 2,
        }),
    );
    let v = ask(&kv, "/dkg");
    assert_eq!(v["height"], 112);
    assert_eq!(
        v["ceremony"],
        json!({"round": 6, "kind": "rekey", "phase": "acks", "start_height": 95,
               "keys_end": 100, "deal_end": 110, "ack_end": 120, "end": 130,
               "threshold": 2, "epoch": 4, "proposal": 9, "attempt": 1,
               "dealers": 1, "players": 3, "keys": 2, "dealings": 1, "acks": 2,
               "reveals": 1})
    );
    assert_eq!(
        v["next_key"],
        json!({"epoch": 4, "activate_height": 133, "proposal": 9, "rotation": 2, "threshold": 1,
               "group_key": key.group_key, "signers": ["02".repeat(20)]})
    );
    assert_eq!(
        v["last_ceremony"],
        json!({"round": 5, "kind": "fresh", "epoch": 3, "qualified": [1],
               "dealers": 1, "players": 3})
    );
    for (h, phase) in [
        (99, "keys"),
        (100, "dealings"),
        (109, "dealings"),
        (120, "reveals"),
        (129, "reveals"),
        (130, "finalising"),
    ] {
        st::put_last_height(&mut kv, h);
        assert_eq!(ask(&kv, "/dkg")["ceremony"]["phase"], phase, "height {h}");
    }
    // No key yet, but a ceremony: the key fields are empty, not an error.
    let mut kv = empty();
    st::put_ceremony(&mut kv, Some(&ceremony(1)));
    let v = ask(&kv, "/dkg");
    assert_eq!(v["group_key"], json!(null));
    assert_eq!(v["signers"], json!([]));
    assert_eq!(v["ceremony"]["dealings"], 0);
}

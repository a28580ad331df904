//! A reshared key's activation at its height, on a hand-built state: the
//! key switches, the proposal's change reaches the stored validator set,
//! and partial signatures stored under the old key are dropped (they could
//! never combine with the new key's, and would block its signers' new
//! partials under the same index).

use std::sync::Arc;

use tally_settlement::bls::deal;
use tally_settlement::dkg::state::{active_key, put_active_key};
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::dkg::{self, state as st};
use tally_settlement::proto::{NextKey, Proposal, ValidatorRecord};
use tally_settlement::state::sync::{has_partial, put_partial};
use tally_settlement::{init_chain, Block, Genesis, KeyCache, KeyEpoch};
use tally_store::{MemBackend, Pending};

fn key(epoch: u64, seed: u8, n: u32) -> KeyEpoch {
    let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [seed + i; 64]).collect();
    let (pubs, _) = deal(n, 3, &coeffs).unwrap();
    let h = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
    KeyEpoch {
        threshold: 3,
        group_key: h(&pubs.group),
        public_shares: pubs.shares.iter().map(h).collect(),
        signers: (0..n).map(|i| hex::encode([i as u8 + 1; 20])).collect(),
        epoch,
    }
}

#[test]
fn a_reshared_key_activates_at_its_height_and_old_partials_go() {
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    init_chain(&mut kv, "c", &Genesis::default()).unwrap();
    put_active_key(&mut kv, &key(1, 10, 4)).unwrap();
    let newcomer = [9u8; 32];
    st::put_proposal(
        &mut kv,
        &Proposal {
            id: 1,
            action: ProposalAction::Add.into(),
            pubkey: newcomer.to_vec(),
            power: 7,
            status: ProposalStatus::Applied.into(),
            ..Proposal::default()
        },
    );
    let next = key(2, 10, 5);
    st::put_next_key(
        &mut kv,
        Some(&NextKey {
            key: serde_json::to_vec(&next).unwrap(),
            activate_height: 12,
            proposal: 1,
            rotation: 0,
        }),
    );
    put_partial(&mut kv, &[5; 32], 2, &[0; 96]);
    put_partial(&mut kv, &[6; 32], 4, &[0; 96]);

    // One block before: nothing changes.
    dkg::begin_block(
        &mut kv,
        &Block {
            height: 11,
            time: 100,
        },
    )
    .unwrap();
    assert_eq!(
        active_key(&kv, &KeyCache::new())
            .unwrap()
            .unwrap()
            .record
            .epoch,
        1
    );
    assert!(has_partial(&kv, &[5; 32], 2).unwrap());

    let ev = dkg::begin_block(
        &mut kv,
        &Block {
            height: 12,
            time: 105,
        },
    )
    .unwrap();
    assert!(ev.iter().any(|e| e.kind == "key_epoch"), "{ev:?}");
    let active = active_key(&kv, &KeyCache::new()).unwrap().unwrap();
    assert_eq!(active.record, next);
    assert!(!has_partial(&kv, &[5; 32], 2).unwrap(), "old partial kept");
    assert!(!has_partial(&kv, &[6; 32], 4).unwrap(), "old partial kept");
    assert!(st::next_key(&kv).unwrap().is_none());
    let addr = dkg::address_of(&newcomer);
    let v: ValidatorRecord = st::validator(&kv, &addr).unwrap().expect("added");
    assert_eq!((v.power, v.pubkey), (7, newcomer.to_vec()));
}

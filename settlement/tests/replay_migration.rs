//! App version 2's migration of report ids (ADR 0019), against the test's
//! own list of what was accepted: 25,000 version-1 ids, a third of them
//! already expired at the upgrade block, move to their expiry buckets at
//! most `MIGRATE_PER_BLOCK` per block; at every step every live id is still
//! seen (a duplicate) with its body hash and no expired one is; at the end
//! no version-1 key is left and the buckets hold exactly the live ids.

use std::sync::Arc;

use prost::Message;
use tally_settlement::proto::UpgradePlan;
use tally_settlement::state::chain::{app_version, put_app_version};
use tally_settlement::state::replay::{put_report, report_seen, MIGRATE_PER_BLOCK};
use tally_settlement::{keys, upgrade, Block};
use tally_store::{Kv, KvRead, MemBackend, Pending};

const NOW: u64 = 1_900_000_000;
const IDS: u64 = 25_000;

fn scope(i: u64) -> Vec<u8> {
    let mut s = vec![0x42; 32];
    s.extend_from_slice(&[0; 8]);
    s.extend_from_slice(&i.to_be_bytes());
    s
}

fn hash(i: u64) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(&i.to_be_bytes());
    h
}

/// Expiry of id `i`: every third one at or before `NOW`.
fn expiry(i: u64) -> u64 {
    if i.is_multiple_of(3) {
        NOW - (i % 500)
    } else {
        NOW + 1 + (i % 600)
    }
}

fn count(kv: &Pending, prefix: &[u8]) -> usize {
    kv.scan_prefix(prefix, usize::MAX).unwrap().len()
}

fn check_seen(kv: &Pending) {
    for i in (0..IDS).step_by(7) {
        let seen = report_seen(kv, &scope(i), NOW).unwrap();
        if expiry(i) > NOW {
            assert_eq!(seen, Some(hash(i)), "live id {i}");
        } else {
            assert_eq!(seen, None, "expired id {i}");
        }
    }
}

#[test]
fn version_1_ids_move_to_buckets_in_bounded_steps_and_stay_duplicates() {
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    for i in 0..IDS {
        put_report(&mut kv, 1, 0, &scope(i), expiry(i), &hash(i));
    }
    put_app_version(&mut kv, 1);
    let plan = UpgradePlan {
        name: "v2".into(),
        app_version: 2,
        height: 10,
        binary_sha256: vec![0; 32],
        info: String::new(),
    };
    kv.put(keys::UPGRADE_PLAN.to_vec(), plan.encode_to_vec());
    assert_eq!(count(&kv, keys::REPORT_ID), IDS as usize);

    let mut height = 10;
    let mut steps = 0;
    loop {
        let block = Block { height, time: NOW };
        upgrade::begin_block(&mut kv, &block, 2).unwrap();
        steps += 1;
        assert_eq!(app_version(&kv).unwrap(), 2);
        let left = count(&kv, keys::REPORT_ID);
        let want_left = (IDS as usize).saturating_sub(steps * MIGRATE_PER_BLOCK);
        assert_eq!(left, want_left, "after step {steps}");
        check_seen(&kv);
        if kv.get(keys::V1_IDS_LEFT).unwrap().is_none() {
            break;
        }
        height += 1;
    }
    assert_eq!(steps, IDS.div_ceil(MIGRATE_PER_BLOCK as u64) as usize);
    assert_eq!(count(&kv, keys::REPORT_ID), 0);
    assert_eq!(count(&kv, keys::REPORT_EXPIRY), 0);
    let live = (0..IDS).filter(|&i| expiry(i) > NOW).count();
    assert_eq!(count(&kv, keys::REPORT_BUCKET), live);
    // Once done, later blocks do nothing more.
    let before = count(&kv, keys::REPORT_BUCKET);
    upgrade::begin_block(
        &mut kv,
        &Block {
            height: height + 1,
            time: NOW,
        },
        2,
    )
    .unwrap();
    assert_eq!(count(&kv, keys::REPORT_BUCKET), before);
}

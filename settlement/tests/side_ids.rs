//! App version 6's report ids as side state (ADR 0025), against the test's
//! own list of what was accepted: ids filed by version 5 stay in the tree
//! and are still seen after the switch until their buckets end; ids filed
//! by version 6 are side state, cost no tree leaf (the app hash is the one
//! of a store without them plus their digests), are committed to by one
//! digest per bucket and block, and a store whose side ids differ from the
//! digests in any way is refused by the restore check.

use std::collections::BTreeSet;
use std::sync::Arc;

use prost::Message;
use tally_settlement::proto::UpgradePlan;
use tally_settlement::state::chain::{app_version, put_app_version, put_last_time};
use tally_settlement::state::replay::{
    check_side_ids, commit_block_ids, forget_reports_through, put_report, report_seen,
    SideIdsError, BUCKET_SECS,
};
use tally_settlement::{keys, upgrade, Block};
use tally_store::{Backend, Kv, KvRead, MemBackend, Pending};

const NOW: u64 = 1_900_000_020;
const IDS: u64 = 600;

fn scope(i: u64) -> Vec<u8> {
    let mut s = vec![0x42; 32];
    s.extend_from_slice(&[0; 8]);
    s.extend_from_slice(&i.to_be_bytes());
    s
}

fn hash(i: u64) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(&i.to_be_bytes());
    h[31] = 1;
    h
}

/// Expiry of id `i`: 1 to 600 s after `NOW`.
fn expiry(i: u64) -> u64 {
    NOW + 1 + (i * 7) % 600
}

fn count(kv: &impl KvRead, prefix: &[u8]) -> usize {
    kv.scan_prefix(prefix, usize::MAX).unwrap().len()
}

fn copy(b: &dyn Backend) -> Arc<MemBackend> {
    let out = Arc::new(MemBackend::new());
    let all: Vec<_> = b
        .scan(b"", b"", usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, Some(v)))
        .collect();
    out.write_raw(&all, false).unwrap();
    out
}

#[test]
fn version_6_keeps_ids_as_side_state_committed_by_digests() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let mut kv = Pending::open(backend.clone()).unwrap();
    put_app_version(&mut kv, 5);
    put_last_time(&mut kv, NOW - 1);
    // Version 5: ids 0..IDS in the tree.
    for i in 0..IDS {
        put_report(&mut kv, 5, 1, &scope(i), expiry(i), &hash(i));
    }
    kv.commit(1).unwrap();
    assert_eq!(count(&kv, keys::REPORT_BUCKET), IDS as usize);

    // The switch to version 6 at height 2.
    let plan = UpgradePlan {
        name: "v6".into(),
        app_version: 6,
        height: 2,
        binary_sha256: vec![0; 32],
        info: String::new(),
    };
    kv.put(keys::UPGRADE_PLAN.to_vec(), plan.encode_to_vec());
    upgrade::begin_block(
        &mut kv,
        &Block {
            height: 2,
            time: NOW,
        },
        6,
    )
    .unwrap();
    assert_eq!(app_version(&kv).unwrap(), 6);
    let until = kv.get(keys::TREE_IDS_UNTIL).unwrap().unwrap();
    assert_eq!(until, ((NOW + 600) / 120).to_be_bytes().to_vec());

    // Version 6: ids IDS..2*IDS as side state, at heights 2 and 3.
    let mut buckets_by_height = BTreeSet::new();
    for (height, ids) in [(2, IDS..IDS + IDS / 2), (3, IDS + IDS / 2..2 * IDS)] {
        if height == 3 {
            kv.commit(2).unwrap();
        }
        for i in ids {
            put_report(&mut kv, 6, height, &scope(i), expiry(i), &hash(i));
            buckets_by_height.insert((expiry(i) / BUCKET_SECS, height));
        }
        let filed = commit_block_ids(&mut kv, height).unwrap();
        assert_eq!(filed, IDS / 2);
    }
    kv.commit(3).unwrap();
    // No version-6 id is a tree key; each (bucket, height) has one digest.
    assert_eq!(count(&kv, keys::REPORT_BUCKET), IDS as usize);
    assert_eq!(count(&kv, keys::REPORT_SIDE), IDS as usize);
    assert_eq!(count(&kv, keys::REPORT_DIGEST), buckets_by_height.len());
    for i in 0..2 * IDS {
        assert_eq!(
            report_seen(&kv, &scope(i), NOW).unwrap(),
            Some(hash(i)),
            "id {i}"
        );
    }
    assert_eq!(report_seen(&kv, &scope(2 * IDS), NOW).unwrap(), None);
    assert_eq!(check_side_ids(backend.as_ref()), Ok(IDS));

    // Any difference from the digests is refused.
    let some = keys::report_side(expiry(IDS) / BUCKET_SECS, &scope(IDS));
    let v = Backend::get(backend.as_ref(), &some).unwrap().unwrap();
    let tampered = copy(backend.as_ref());
    let mut w = v.clone();
    w[20] ^= 1;
    tampered
        .write_raw(&[(some.clone(), Some(w))], false)
        .unwrap();
    assert!(matches!(
        check_side_ids(tampered.as_ref()),
        Err(SideIdsError::Mismatch { .. })
    ));
    let dropped = copy(backend.as_ref());
    dropped.write_raw(&[(some.clone(), None)], false).unwrap();
    assert!(matches!(
        check_side_ids(dropped.as_ref()),
        Err(SideIdsError::Mismatch { .. })
    ));
    let added = copy(backend.as_ref());
    let extra = keys::report_side(expiry(IDS) / BUCKET_SECS, &scope(9_999));
    added.write_raw(&[(extra, Some(v.clone()))], false).unwrap();
    assert!(matches!(
        check_side_ids(added.as_ref()),
        Err(SideIdsError::Mismatch { .. })
    ));
    let unknown = copy(backend.as_ref());
    unknown
        .write_raw(&[(b"\x01zz".to_vec(), Some(vec![1]))], false)
        .unwrap();
    assert!(matches!(
        check_side_ids(unknown.as_ref()),
        Err(SideIdsError::Unknown(_))
    ));
    let orphan = copy(backend.as_ref());
    let mut all_of_a_block = Vec::new();
    Backend::for_each(orphan.as_ref(), b"\x01", b"\x02", &mut |k, v| {
        if v[40..] == 3u64.to_be_bytes() {
            all_of_a_block.push((k.to_vec(), None));
        }
        true
    })
    .unwrap();
    orphan.write_raw(&all_of_a_block, false).unwrap();
    assert!(matches!(
        check_side_ids(orphan.as_ref()),
        Err(SideIdsError::Missing { height: 3, .. })
    ));

    // Buckets end: side ids, digests, tree ids and the marker all go.
    let mut time = NOW;
    let mut height = 4;
    while time <= NOW + 601 + BUCKET_SECS {
        time += 60;
        forget_reports_through(&mut kv, time).unwrap();
        put_last_time(&mut kv, time);
        kv.commit(height).unwrap();
        height += 1;
        let live = (0..2 * IDS).filter(|&i| expiry(i) > time).count();
        let seen = (0..2 * IDS)
            .filter(|&i| report_seen(&kv, &scope(i), time).unwrap().is_some())
            .count();
        assert_eq!(seen, live, "at {time}");
        assert_eq!(check_side_ids(backend.as_ref()).map(|_| ()), Ok(()));
    }
    assert_eq!(count(&kv, keys::REPORT_SIDE), 0);
    assert_eq!(count(&kv, keys::REPORT_DIGEST), 0);
    assert_eq!(count(&kv, keys::REPORT_BUCKET), 0);
    assert_eq!(kv.get(keys::TREE_IDS_UNTIL).unwrap(), None);
}

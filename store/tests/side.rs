//! Side state (keys whose first byte is `0x01`): stored, scanned, snapshot
//! and restored like any user key, but no leaf of the Merkle tree. Oracle:
//! a twin store that never saw the side keys has the same app hash at every
//! height, and the side pairs read back exactly as a `BTreeMap` model says.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tally_store::restore::{Applied, Restore};
use tally_store::snapshot;
use tally_store::{is_side, proof, Backend, Kv, KvRead, MemBackend, Pending};

fn side(i: u64) -> Vec<u8> {
    format!("\x01s/{i:04}").into_bytes()
}

fn tree(i: u64) -> Vec<u8> {
    format!("t/{i:04}").into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    /// Blocks of tree writes, side writes and range deletes over both: the
    /// store with side state hashes like its twin without, reads back its
    /// model, visits exactly the block's buffered side puts, and a restore
    /// of its snapshot holds the same pairs under the same app hash.
    #[test]
    fn side_state_never_moves_the_app_hash(seed in any::<u64>(), blocks in 1u64..25) {
        let with: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let without: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let (mut a, mut b) = (Pending::open(with.clone()).unwrap(), Pending::open(without.clone()).unwrap());
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for h in 1..=blocks {
            let mut puts = BTreeMap::new();
            for _ in 0..30 {
                let r = next();
                let (t, s) = (tree(r % 300), side((r >> 9) % 300));
                let v = (r >> 20).to_be_bytes()[..(r % 5 + 1) as usize].to_vec();
                a.put(t.clone(), v.clone());
                b.put(t, v.clone());
                a.put(s.clone(), v.clone());
                puts.insert(s.clone(), v.clone());
                model.insert(s, v);
            }
            if h % 3 == 0 {
                // A range over the end of side state and the start of the
                // tree's keys, as a range delete of both would be.
                let (lo, hi) = (next() % 300, next() % 300);
                let (s, e) = (side(lo.min(hi)), tree(lo.max(hi)));
                a.delete_range(s.clone(), e.clone());
                b.delete_range(s.clone(), e.clone());
                model.retain(|k, _| !(k >= &s && k < &e));
                puts.retain(|k, _| !(k >= &s && k < &e));
            }
            let mut seen = BTreeMap::new();
            a.for_each_buffered(b"\x01", b"\x02", &mut |k, v| {
                seen.insert(k.to_vec(), v.to_vec());
                true
            });
            prop_assert_eq!(seen, puts);
            prop_assert_eq!(a.commit(h).unwrap(), b.commit(h).unwrap());
        }
        let got: BTreeMap<_, _> = with.scan(b"\x01", b"\x02", usize::MAX).unwrap().into_iter().collect();
        prop_assert_eq!(&got, &model);

        let mut chunks = Vec::new();
        let meta = snapshot::export(with.as_ref(), &mut |_, c| {
            chunks.push(c.to_vec());
            Ok(())
        })
        .unwrap();
        let dst = Arc::new(MemBackend::new());
        let mut r = Restore::begin(dst.clone(), meta.clone()).unwrap();
        let mut last = None;
        for (i, c) in chunks.iter().enumerate() {
            last = Some(r.apply(i as u32, c).unwrap());
        }
        prop_assert_eq!(last, Some(Applied::Done(with.meta().unwrap().unwrap())));
        let dst: Arc<dyn Backend> = dst;
        prop_assert_eq!(
            dst.scan(b"", b"", usize::MAX).unwrap(),
            with.scan(b"", b"", usize::MAX).unwrap()
        );
    }
}

#[test]
fn a_side_key_has_no_proof_and_a_tree_key_does() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let mut p = Pending::open(backend.clone()).unwrap();
    p.put(side(1), b"v".to_vec());
    p.put(tree(1), b"v".to_vec());
    let meta = p.commit(1).unwrap();
    assert!(is_side(&side(1)) && !is_side(&tree(1)));
    let e = proof::prove(backend.as_ref(), &side(1), 1).unwrap_err();
    assert!(matches!(e, proof::ProofError::Side(_)), "{e}");
    let ok = proof::prove(backend.as_ref(), &tree(1), 1).unwrap();
    assert_eq!(ok.root, meta.app_hash);
    assert!(proof::verify(&meta.app_hash, &tree(1), Some(b"v"), &ok.proof).is_ok());
}

//! Property tests: pending state reads exactly like a model map, and
//! committing it gives the same contents.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use prost_ics23::Message;
use tally_store::{proof, Backend, Kv, KvRead, MemBackend, Pending};

/// What the store should hold.
type Model = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u8),
    Delete(u8),
    DeleteRange(u8, u8),
    Commit,
}

fn key(k: u8) -> Vec<u8> {
    vec![b'k', k % 32]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => any::<u8>().prop_map(Op::Delete),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::DeleteRange(a, b)),
        1 => Just(Op::Commit),
    ]
}

/// An empty value cannot be proven (ICS23 needs a value), nor the absence
/// of its neighbours: the store refuses it and writes nothing.
#[test]
fn an_empty_value_is_refused_and_nothing_is_written() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let mut p = Pending::open(backend.clone()).unwrap();
    p.put(b"a".to_vec(), vec![1]);
    p.put(b"b".to_vec(), Vec::new());
    match p.commit(1) {
        Err(tally_store::StoreError::EmptyValue(k)) => assert_eq!(k, b"b"),
        other => panic!("expected EmptyValue, got {other:?}"),
    }
    assert_eq!(backend.meta().unwrap(), None);
    assert!(Backend::get(backend.as_ref(), b"a").unwrap().is_none());
}

proptest! {
    #[test]
    fn pending_matches_model(ops in proptest::collection::vec(op(), 1..200)) {
        let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let mut p = Pending::open(backend.clone()).unwrap();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut height = 0;
        for op in ops {
            match op {
                Op::Put(k, v) => { p.put(key(k), vec![v]); model.insert(key(k), vec![v]); }
                Op::Delete(k) => { p.delete(key(k)); model.remove(&key(k)); }
                Op::DeleteRange(a, b) => {
                    let (s, e) = (key(a), key(b));
                    p.delete_range(s.clone(), e.clone());
                    model.retain(|k, _| !(k >= &s && k < &e));
                }
                Op::Commit => { height += 1; p.commit(height).unwrap(); }
            }
            let all = p.scan(b"", b"", usize::MAX).unwrap();
            let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            prop_assert_eq!(&all, &want);
            for k in 0..32u8 {
                prop_assert_eq!(p.get(&key(k)).unwrap(), model.get(&key(k)).cloned());
            }
            // A bounded scan is a prefix of the full one.
            let some = p.scan(&key(5), &key(20), 3).unwrap();
            let want_some: Vec<_> = model.range(key(5)..key(20)).take(3).map(|(k, v)| (k.clone(), v.clone())).collect();
            prop_assert_eq!(some, want_some);
        }
        height += 1;
        p.commit(height).unwrap();
        let committed = backend.scan(b"", b"", usize::MAX).unwrap();
        let want: Vec<_> = model.into_iter().collect();
        prop_assert_eq!(committed, want);
    }

    /// The app hash is the root of the committed state, whatever history
    /// led there: after every commit, each of the 32 keys proves its model
    /// value (or its absence) under that root with the `ics23` crate's own
    /// verifier, and a store that writes the model in one commit at the same
    /// height gets the same root. Every earlier version still proves what the
    /// model held then (nothing is pruned with retention 0).
    #[test]
    fn app_hash_is_the_root_of_the_state(ops in proptest::collection::vec(op(), 1..120)) {
        let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let mut p = Pending::open(backend.clone()).unwrap();
        p.set_retain_versions(0);
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut history: Vec<(u64, [u8; 32], Model)> = Vec::new();
        let mut height = 0;
        let spec = jmt::ics23_spec();
        let check = |h: u64, root: &[u8; 32], model: &BTreeMap<Vec<u8>, Vec<u8>>| -> Result<(), TestCaseError> {
            if model.is_empty() {
                let r = proof::prove(backend.as_ref(), &key(0), h);
                prop_assert!(matches!(r, Err(proof::ProofError::EmptyState(v)) if v == h));
                return Ok(());
            }
            for k in 0..32u8 {
                let key = key(k);
                let proven = proof::prove(backend.as_ref(), &key, h).unwrap();
                prop_assert_eq!(&proven.root, root);
                prop_assert_eq!(proven.value.as_ref(), model.get(&key));
                let cp = ics23::CommitmentProof::decode(proven.proof.as_slice()).unwrap();
                let ok = match model.get(&key) {
                    Some(v) => ics23::verify_membership::<ics23::HostFunctionsManager>(&cp, &spec, &root.to_vec(), &key, v),
                    None => ics23::verify_non_membership::<ics23::HostFunctionsManager>(&cp, &spec, &root.to_vec(), &key),
                };
                prop_assert!(ok, "key {:?} at height {}", key, h);
            }
            Ok(())
        };
        for op in ops {
            match op {
                Op::Put(k, v) => { p.put(key(k), vec![v]); model.insert(key(k), vec![v]); }
                Op::Delete(k) => { p.delete(key(k)); model.remove(&key(k)); }
                Op::DeleteRange(a, b) => {
                    let (s, e) = (key(a), key(b));
                    p.delete_range(s.clone(), e.clone());
                    model.retain(|k, _| !(k >= &s && k < &e));
                }
                Op::Commit => {
                    height += 1;
                    let root = p.commit(height).unwrap().app_hash;
                    check(height, &root, &model)?;
                    let mut fresh = Pending::open(Arc::new(MemBackend::new())).unwrap();
                    for (k, v) in &model {
                        fresh.put(k.clone(), v.clone());
                    }
                    prop_assert_eq!(fresh.app_hash_at(height).unwrap(), root, "same state, other history");
                    history.push((height, root, model.clone()));
                }
            }
        }
        for (h, root, m) in &history {
            check(*h, root, m)?;
        }
    }

    /// With `retain` versions kept, versions older than the last `retain`
    /// answer "pruned", the kept ones still prove, and the tree's stored
    /// entries stop growing when the same keys are rewritten.
    #[test]
    fn pruning_keeps_the_last_versions(retain in 1u64..6, blocks in 20u64..60) {
        let backend = Arc::new(MemBackend::new());
        let dynb: Arc<dyn Backend> = backend.clone();
        let mut p = Pending::open(dynb.clone()).unwrap();
        p.set_retain_versions(retain);
        let mut sizes = Vec::new();
        for h in 1..=blocks {
            for k in 0..8u8 {
                p.put(key(k), h.to_be_bytes().to_vec());
            }
            if h % 3 == 0 {
                p.delete(key(7));
            }
            p.commit(h).unwrap();
            sizes.push(backend.raw_len());
        }
        for h in 1..=blocks {
            let r = proof::prove(dynb.as_ref(), &key(1), h);
            if h + retain <= blocks {
                prop_assert!(matches!(r, Err(proof::ProofError::Pruned { .. })), "height {} of {}: {:?}", h, blocks, r.map(|x| x.version));
            } else {
                let r = r.unwrap();
                prop_assert_eq!(r.value, Some(h.to_be_bytes().to_vec()));
                proof::verify(&r.root, &key(1), Some(&h.to_be_bytes()), &r.proof).unwrap();
            }
        }
        let late = &sizes[sizes.len() - 10..];
        prop_assert!(late.iter().max().unwrap() - late.iter().min().unwrap() <= 40, "tree entries keep growing: {:?}", late);
    }
}

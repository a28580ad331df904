//! Property tests: pending state reads exactly like a model map, and
//! committing it gives the same contents.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tally_store::{Backend, Kv, KvRead, MemBackend, Pending};

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

    #[test]
    fn app_hash_depends_on_every_write(k in 0u8..32, v in any::<u8>()) {
        let mk = || Pending::open(Arc::new(MemBackend::new())).unwrap();
        let (mut a, mut b) = (mk(), mk());
        a.put(key(k), vec![v]);
        b.put(key(k), vec![v.wrapping_add(1)]);
        prop_assert_ne!(a.app_hash_at(1), b.app_hash_at(1));
        prop_assert_ne!(a.app_hash_at(1), a.app_hash_at(2));
    }
}

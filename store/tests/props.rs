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

    /// Every write of a block's change set feeds the app hash: changing
    /// any byte of any key or value (each position), a value's length, a
    /// put into a delete or back, dropping a write, or any byte of a range
    /// delete's bounds changes the hash; the write changes are pairwise
    /// distinct too. Also the height and the previous commit.
    #[test]
    fn app_hash_depends_on_every_write(
        writes in proptest::collection::btree_map(
            (2u8..0xf0, proptest::collection::vec(any::<u8>(), 0..6))
                .prop_map(|(h, mut t)| { t.insert(0, h); t }),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..6)),
            1..8,
        ),
        ranges in proptest::collection::vec((any::<u8>(), 1u8..=255, any::<u8>()), 0..3),
    ) {
        // Range deletes live under 0xff: they never cover a write.
        let ranges: Vec<(Vec<u8>, Vec<u8>)> = ranges
            .into_iter()
            .map(|(a, d, x)| (vec![0xff, a / 2], vec![0xff, a / 2 + d / 2 + 1, x]))
            .collect();
        let hash = |w: &BTreeMap<Vec<u8>, Option<Vec<u8>>>, r: &[(Vec<u8>, Vec<u8>)]| {
            let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
            for (s, e) in r {
                p.delete_range(s.clone(), e.clone());
            }
            for (k, v) in w {
                match v {
                    Some(v) => p.put(k.clone(), v.clone()),
                    None => p.delete(k.clone()),
                }
            }
            p.app_hash_at(1)
        };
        let base = hash(&writes, &ranges);
        let mut seen = std::collections::BTreeSet::from([base]);
        let mut variants = 0;
        let mut distinct = |w: BTreeMap<Vec<u8>, Option<Vec<u8>>>, what: String| {
            variants += 1;
            prop_assert!(seen.insert(hash(&w, &ranges)), "{}", what);
            Ok(())
        };
        for (k, v) in &writes {
            for j in 0..k.len() {
                let mut k2 = k.clone();
                k2[j] ^= 1;
                if writes.contains_key(&k2) {
                    continue;
                }
                let mut w = writes.clone();
                let v = w.remove(k).unwrap();
                w.insert(k2, v);
                distinct(w, format!("key {k:?} byte {j}"))?;
            }
            let mut w = writes.clone();
            w.remove(k);
            distinct(w, format!("drop {k:?}"))?;
            match v {
                Some(val) => {
                    for j in 0..val.len() {
                        let mut val2 = val.clone();
                        val2[j] ^= 0x80;
                        let mut w = writes.clone();
                        w.insert(k.clone(), Some(val2));
                        distinct(w, format!("value of {k:?} byte {j}"))?;
                    }
                    let mut longer = val.clone();
                    longer.push(0);
                    let mut w = writes.clone();
                    w.insert(k.clone(), Some(longer));
                    distinct(w, format!("value of {k:?} longer"))?;
                    let mut w = writes.clone();
                    w.insert(k.clone(), None);
                    distinct(w, format!("put {k:?} into delete"))?;
                }
                None => {
                    let mut w = writes.clone();
                    w.insert(k.clone(), Some(Vec::new()));
                    distinct(w, format!("delete {k:?} into put"))?;
                }
            }
        }
        prop_assert_eq!(seen.len(), variants + 1);
        for i in 0..ranges.len() {
            for (end, bound) in [(false, &ranges[i].0), (true, &ranges[i].1)] {
                for j in 0..bound.len() {
                    let mut r = ranges.clone();
                    let b = if end { &mut r[i].1 } else { &mut r[i].0 };
                    b[j] ^= 1;
                    prop_assert_ne!(hash(&writes, &r), base, "range {} end {} byte {}", i, end, j);
                }
            }
        }
        let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
        for (k, v) in &writes {
            if let Some(v) = v {
                p.put(k.clone(), v.clone());
            }
        }
        prop_assert_ne!(p.app_hash_at(1), p.app_hash_at(2));
        let before = p.app_hash_at(2);
        p.commit(1).unwrap();
        for (k, v) in &writes {
            if let Some(v) = v {
                p.put(k.clone(), v.clone());
            }
        }
        prop_assert_ne!(p.app_hash_at(2), before, "the previous commit feeds the hash");
    }
}

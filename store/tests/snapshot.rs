//! State-sync snapshots: a store restored from the chunks of another is the
//! same store. Oracles: the source's app hash (computed block by block, a
//! different code path from the restore's one-shot rebuild), its contents,
//! proofs checked with the `ics23` crate, and the next blocks' hashes on
//! both stores.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tally_store::restore::{Applied, Restore, RestoreError};
use tally_store::snapshot::{self, Metadata};
use tally_store::{proof, Backend, Kv, KvRead, MemBackend, Pending};

/// Commits `blocks` blocks of writes derived from `seed` into a fresh store.
fn source(seed: u64, blocks: u64, per_block: u64) -> (Arc<dyn Backend>, Pending) {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let mut p = Pending::open(backend.clone()).unwrap();
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    for h in 1..=blocks {
        for _ in 0..per_block {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = format!("r/{:05}", (x >> 33) % 5000).into_bytes();
            if (x >> 20).is_multiple_of(7) {
                p.delete(k);
            } else {
                p.put(k, (x >> 8).to_be_bytes()[..((x % 7) + 1) as usize].to_vec());
            }
        }
        if h.is_multiple_of(5) {
            p.delete_prefix(format!("r/{:03}", (x >> 40) % 50).as_bytes());
        }
        p.commit(h).unwrap();
    }
    (backend, p)
}

fn export(backend: &dyn Backend) -> (Metadata, Vec<Vec<u8>>) {
    let mut chunks = Vec::new();
    let meta = snapshot::export(backend, &mut |i, c| {
        assert_eq!(i as usize, chunks.len());
        chunks.push(c.to_vec());
        Ok(())
    })
    .unwrap();
    (meta, chunks)
}

fn restore(meta: &Metadata, chunks: &[Vec<u8>], batch: u64) -> (Arc<MemBackend>, Applied) {
    let target = Arc::new(MemBackend::new());
    let mut r = Restore::begin(target.clone(), meta.clone()).unwrap();
    r.set_tree_batch(batch);
    let mut last = None;
    for (i, c) in chunks.iter().enumerate() {
        last = Some(r.apply(i as u32, c).unwrap());
    }
    (target, last.unwrap())
}

fn all(b: &dyn Backend) -> BTreeMap<Vec<u8>, Vec<u8>> {
    b.scan(b"", b"", usize::MAX).unwrap().into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// Whatever the history, the restored store holds the same pairs, has the
    /// same app hash (rebuilt in one go or in many small tree versions),
    /// proves every key and absence against it, refuses proofs below the
    /// snapshot height, and keeps agreeing with the source block after block.
    #[test]
    fn a_restored_store_is_the_source_store(seed in any::<u64>(), blocks in 1u64..40, batch in 1u64..400) {
        let (src, mut sp) = source(seed, blocks, 60);
        let want = src.meta().unwrap().unwrap();
        let (meta, chunks) = export(src.as_ref());
        prop_assert_eq!(meta.height, want.height);
        prop_assert_eq!(meta.app_hash, want.app_hash);
        prop_assert_eq!(meta.pairs as usize, all(src.as_ref()).len());
        let (dst, done) = restore(&meta, &chunks, batch);
        prop_assert_eq!(done, Applied::Done(want.clone()));
        // Built in many versions or in one, the tree keeps the same entries:
        // nodes replaced while rebuilding are gone.
        let (one, _) = restore(&meta, &chunks, u64::MAX);
        prop_assert_eq!(dst.raw_len(), one.raw_len());
        let dst: Arc<dyn Backend> = dst;
        prop_assert_eq!(dst.meta().unwrap(), Some(want.clone()));
        prop_assert_eq!(all(dst.as_ref()), all(src.as_ref()));
        for i in (0..5000u64).step_by(97) {
            let k = format!("r/{i:05}").into_bytes();
            let p = proof::prove(dst.as_ref(), &k, want.height).unwrap();
            prop_assert_eq!(p.root, want.app_hash);
            prop_assert_eq!(p.value.clone(), Backend::get(src.as_ref(), &k).unwrap());
            prop_assert!(proof::verify(&want.app_hash, &k, p.value.as_deref(), &p.proof).is_ok());
        }
        // The restored tree starts at the snapshot height.
        prop_assert_eq!(proof::versions(dst.as_ref()).unwrap(), Some((want.height, want.height)));
        if want.height > 1 {
            let below = proof::prove(dst.as_ref(), b"r/00001", want.height - 1);
            let pruned = matches!(below, Err(proof::ProofError::Pruned { .. }));
            prop_assert!(pruned, "below the snapshot: {:?}", below);
        }
        // Both go on: same writes, same hashes.
        let mut dp = Pending::open(dst.clone()).unwrap();
        for h in want.height + 1..=want.height + 3 {
            for p in [&mut sp, &mut dp] {
                p.put(format!("r/{:05}", h * 13 % 5000).into_bytes(), vec![h as u8 | 1]);
                p.delete(format!("r/{:05}", h * 29 % 5000).into_bytes());
            }
            prop_assert_eq!(sp.commit(h).unwrap(), dp.commit(h).unwrap());
        }
    }
}

#[test]
fn many_chunks_and_tree_versions() {
    // Values big enough for several 4 MiB chunks.
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let mut p = Pending::open(backend.clone()).unwrap();
    for h in 1..=3u64 {
        for i in 0..4000u64 {
            p.put(
                format!("big/{h}/{i:05}").into_bytes(),
                vec![(i % 251) as u8 + 1; 1000],
            );
        }
        p.commit(h).unwrap();
    }
    let (meta, chunks) = export(backend.as_ref());
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    assert!(chunks.iter().all(|c| c.len() <= snapshot::MAX_CHUNK_BYTES));
    // 12,000 keys at height 3 with batches of 1,000: the batch grows to 4,000.
    let (dst, done) = restore(&meta, &chunks, 1000);
    assert_eq!(done, Applied::Done(backend.meta().unwrap().unwrap()));
    assert_eq!(all(dst.as_ref()), all(backend.as_ref()));
}

#[test]
fn bad_chunks_and_snapshots_are_refused() {
    let (src, _) = source(7, 10, 50);
    let (meta, chunks) = export(src.as_ref());
    assert_eq!(chunks.len(), 1);

    // A chunk that is not the listed one: refused, the restore goes on.
    let target: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let mut r = Restore::begin(target.clone(), meta.clone()).unwrap();
    let mut bad = chunks[0].clone();
    bad[10] ^= 1;
    assert!(matches!(
        r.apply(0, &bad),
        Err(RestoreError::ChunkHash { index: 0 })
    ));
    assert!(matches!(
        r.apply(1, &chunks[0]),
        Err(RestoreError::OutOfOrder {
            index: 1,
            expected: 0
        })
    ));
    assert!(matches!(r.apply(0, &chunks[0]), Ok(Applied::Done(_))));

    // Metadata claiming another app hash (its chunks listed truly): the
    // rebuilt root disagrees, the store is wiped.
    let mut lie = meta.clone();
    lie.app_hash[0] ^= 1;
    let target: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let mut r = Restore::begin(target.clone(), lie).unwrap();
    assert!(matches!(
        r.apply(0, &chunks[0]),
        Err(RestoreError::AppHash { .. })
    ));
    assert_eq!(target.meta().unwrap(), None);
    assert!(all(target.as_ref()).is_empty());

    // A pair dropped from the chunk, hashes recomputed: the pair count
    // (and the root) give it away.
    let mut fewer = meta.clone();
    fewer.pairs += 1;
    let target: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let mut r = Restore::begin(target.clone(), fewer).unwrap();
    assert!(matches!(
        r.apply(0, &chunks[0]),
        Err(RestoreError::PairCount { .. })
    ));
    assert!(all(target.as_ref()).is_empty());

    // A store with a commit is never overwritten.
    assert!(matches!(
        Restore::begin(src.clone(), meta.clone()),
        Err(RestoreError::NotEmpty(10))
    ));

    // An interrupted restore is found and wiped when the node opens.
    let target: Arc<dyn Backend> = Arc::new(MemBackend::new());
    let r = Restore::begin(target.clone(), meta.clone()).unwrap();
    drop(r);
    assert!(Restore::discard_interrupted(target.as_ref()).unwrap());
    assert!(!Restore::discard_interrupted(target.as_ref()).unwrap());
}

#[test]
fn an_empty_or_uncommitted_store_has_no_snapshot() {
    let b = MemBackend::new();
    assert!(matches!(
        snapshot::export(&b, &mut |_, _| Ok(())),
        Err(snapshot::ExportError::NoCommit)
    ));
}

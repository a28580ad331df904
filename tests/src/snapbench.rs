//! `tally-bench snapshot`: what a state-sync snapshot costs at a given
//! state size. Builds a RocksDB store of `keys` route-record-sized pairs
//! (committed through the Merkle tree, 20,000 per block), takes a snapshot
//! the way a node does (checkpoint, then chunk files), and restores it into
//! a fresh RocksDB store the way a joining node does, checking that the
//! restored height and app hash are the source's.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use tally_node::snapshots::DiskSnapshots;
use tally_store::restore::{Applied, Restore};
use tally_store::{Backend, Kv, Pending, RocksBackend};

/// Runs the benchmark over `keys` pairs and prints its figures.
pub fn run(keys: u64) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let src = Arc::new(RocksBackend::open(&dir.path().join("src"))?);
    let t = Instant::now();
    let mut p = Pending::open(src.clone())?;
    let mut height = 0;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..keys {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let key = format!(
            "sr/user-{:04}\0prov-{:03}\0org/model-{}\0/v1/route-{:06}\0{:012}",
            i % 1000,
            (i / 1000) % 300,
            i % 7,
            i,
            29_935_519 + i % 24
        );
        let mut value = x.to_be_bytes().repeat(11);
        value.truncate(88);
        p.put(key.into_bytes(), value);
        if (i + 1).is_multiple_of(20_000) || i + 1 == keys {
            height += 1;
            p.commit(height)?;
        }
    }
    let want = src.meta()?.context("no commit")?;
    println!(
        "state: {keys} pairs committed in {height} blocks ({:.1} s)",
        t.elapsed().as_secs_f64()
    );

    let snaps = DiskSnapshots::open(&dir.path().join("snapshots"), 0, 2, src.clone())?;
    let t = Instant::now();
    let meta = snaps.take(height).map_err(anyhow::Error::msg)?;
    let take_s = t.elapsed().as_secs_f64();
    let snap_dir = dir.path().join("snapshots").join(height.to_string());
    let bytes: u64 = (0..meta.chunks())
        .map(|i| std::fs::metadata(snap_dir.join(i.to_string())).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    println!(
        "snapshot: {} chunks, {:.1} MiB, taken (checkpoint + chunk files) in {:.2} s",
        meta.chunks(),
        bytes as f64 / (1 << 20) as f64,
        take_s
    );

    // The source's background compactions would compete with the restore
    // for the cores; a joining node's source is another machine.
    drop(snaps);
    drop(p);
    drop(src);
    let dst: Arc<dyn Backend> = Arc::new(RocksBackend::open(&dir.path().join("dst"))?);
    let t = Instant::now();
    let mut r = Restore::begin(dst.clone(), meta.clone())?;
    let mut done = None;
    let mut last_s = 0.0;
    for i in 0..meta.chunks() {
        let chunk = std::fs::read(snap_dir.join(i.to_string()))?;
        let c = Instant::now();
        if let Applied::Done(m) = r.apply(i, &chunk)? {
            done = Some(m);
        }
        last_s = c.elapsed().as_secs_f64();
    }
    let restore_s = t.elapsed().as_secs_f64();
    let done = done.context("the restore did not finish")?;
    ensure!(done == want, "restored {done:?}, source {want:?}");
    println!(
        "restore: {:.2} s ({:.0} pairs/s; the chunks before the last {:.2} s, the last with the tree {:.2} s), app hash {} equals the source's",
        restore_s,
        keys as f64 / restore_s,
        restore_s - last_s,
        last_s,
        hex::encode(done.app_hash)
    );
    Ok(())
}

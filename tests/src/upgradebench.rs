//! `tally-bench upgrade [--keys N]`: what app version 2's migration costs
//! (ADR 0019). Builds a RocksDB store holding `N` live report ids in the
//! version-1 layout (two keys each, committed through the Merkle tree,
//! 20,000 per block), then runs the switch the way block H and the blocks
//! after it do (`tally_settlement::upgrade::begin_block`: the migration in
//! bounded steps inside each block's change set), commits each, times each
//! part, and checks that every id is still a duplicate afterwards.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Result};
use prost::Message;
use tally_settlement::proto::UpgradePlan;
use tally_settlement::state::replay::{put_report, report_seen};
use tally_settlement::{keys, Block};
use tally_store::{Kv, KvRead, Pending, RocksBackend};

/// Block time of the upgrade block; every id expires after it.
const NOW: u64 = 1_900_000_000;

fn scope(i: u64) -> Vec<u8> {
    let mut s = vec![0x5a; 32];
    s.extend_from_slice(&[0; 8]);
    s.extend_from_slice(&i.to_be_bytes());
    s
}

/// Runs the benchmark over `ids` live report ids and prints its figures.
pub fn run(ids: u64) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let backend = Arc::new(RocksBackend::open(&dir.path().join("db"))?);
    let t = Instant::now();
    let mut p = Pending::open(backend.clone())?;
    let mut height = 0;
    for i in 0..ids {
        let expires_at = NOW + 1 + i % 600;
        put_report(&mut p, 1, 0, &scope(i), expires_at, &[0x11; 32]);
        if (i + 1).is_multiple_of(20_000) || i + 1 == ids {
            height += 1;
            p.commit(height)?;
        }
    }
    println!(
        "state: {ids} version-1 report ids ({} keys) committed in {height} blocks ({:.1} s)",
        2 * ids,
        t.elapsed().as_secs_f64()
    );
    let plan = UpgradePlan {
        name: "v2".into(),
        app_version: 2,
        height: height + 1,
        binary_sha256: vec![0; 32],
        info: String::new(),
    };
    p.put(keys::UPGRADE_PLAN.to_vec(), plan.encode_to_vec());
    height += 1;
    p.commit(height)?;

    // The upgrade block and the blocks after it, until the migration is
    // done: each takes a bounded step (begin-block work, then commit).
    let (mut migrate_s, mut commit_s, mut first_s, mut blocks) = (0.0, 0.0, 0.0, 0u64);
    let mut migrated = 0u64;
    loop {
        height += 1;
        let block = Block { height, time: NOW };
        let t = Instant::now();
        let events = tally_settlement::upgrade::begin_block(&mut p, &block, 2)?;
        let m = t.elapsed().as_secs_f64();
        let t = Instant::now();
        p.commit(height)?;
        let c = t.elapsed().as_secs_f64();
        if blocks == 0 {
            first_s = m + c;
            migrated = events
                .iter()
                .flat_map(|e| &e.attrs)
                .find(|(k, _)| k == "migrated")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
        }
        migrate_s += m;
        commit_s += c;
        blocks += 1;
        if p.get(keys::V1_IDS_LEFT)?.is_none() {
            break;
        }
    }
    let left = backend.scan_prefix(keys::REPORT_ID, 1)?.len();
    ensure!(left == 0, "version-1 ids left");
    for i in (0..ids).step_by((ids / 1000).max(1) as usize) {
        ensure!(
            report_seen(&p, &scope(i), NOW)?.is_some(),
            "id {i} forgotten"
        );
    }
    let total = migrate_s + commit_s;
    println!(
        "migration: {ids} ids over {blocks} blocks ({} per block, {migrated} in the upgrade block, which took {:.2} s); {:.2} s begin-block + {:.2} s commit (tree + RocksDB) = {:.2} s; {:.2} s per million ids",
        tally_settlement::state::replay::MIGRATE_PER_BLOCK,
        first_s,
        migrate_s,
        commit_s,
        total,
        total * 1e6 / ids.max(1) as f64
    );
    println!("keys: {} before, {} after (one per id)", 2 * ids, ids);
    Ok(())
}

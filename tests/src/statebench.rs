//! `tally-bench state`: what a 1-call report leaves in the store, while
//! its id is live and after it expired (issue 31, goal 3; ADR 0025).
//!
//! One `TallyApp` on RocksDB, in process, with the node's defaults
//! (`state_retain_versions` 10,000 unless `--retain`), 1-second blocks of
//! 1-call reports over 2,000 routes (20 users × 10 providers × 2 models × 5
//! routes, 60-second windows), each report expiring 500 s after its block.
//! The same blocks run twice, with `low` and `high` reports per block:
//! the route records, window totals and balances both runs write are the
//! same set of keys (at 200 and 400 calls a block every route is used in
//! nearly every window; the per-prefix lines show what differs),
//! so the difference between the two stores is what the extra reports
//! themselves cost. Reported per extra report: the flat pairs by prefix
//! (exact key and value bytes), and the RocksDB table files after a full
//! compaction (tree nodes, versioned values and every retained version
//! included). Then `--idle` empty blocks (default 720: every id expired
//! and its bucket dropped) and the same figures again. With
//! `--keep-windows K` (app version 7, ADR 0026) genesis sets
//! `sla_keep_windows`, and each run's SLA-record bytes (route records,
//! indexes, totals, histograms) are printed too: after the idle blocks
//! every loaded window is older than the horizon and pruned.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{bail, Result};
use bytes::Bytes;
use tally_abci::TallyApp;
use tally_store::{Backend, RocksBackend};
use tendermint_abci::Application;
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::RequestFinalizeBlock;

use crate::traffic::{bench_init_chain, gateway_key, Traffic};

const CHAIN: &str = "tally-statebench";
const T0: i64 = 1_800_000_000;

/// What one run left.
struct Sizes {
    /// Key + value bytes of live pairs by prefix.
    flat: BTreeMap<String, (u64, u64)>,
    /// Bytes of RocksDB table files after a full compaction.
    sst: u64,
}

fn prefix_of(k: &[u8]) -> String {
    let end = k.iter().position(|&b| b == b'/').map_or(k.len(), |i| i + 1);
    k[..end]
        .iter()
        .map(|&b| {
            if b < 0x20 {
                format!("\\x{b:02x}")
            } else {
                (b as char).to_string()
            }
        })
        .collect()
}

fn measure(backend: &RocksBackend, dir: &std::path::Path) -> Result<Sizes> {
    let mut flat: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    Backend::for_each(backend, b"", b"", &mut |k, v| {
        let e = flat.entry(prefix_of(k)).or_default();
        e.0 += 1;
        e.1 += (k.len() + v.len()) as u64;
        true
    })?;
    backend.compact()?;
    let sst = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sst"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    Ok(Sizes { flat, sst })
}

fn run(
    version: u64,
    per_block: usize,
    blocks: u64,
    idle: u64,
    retain: u64,
    keep: u64,
) -> Result<(Sizes, Sizes)> {
    let dir = tempfile::tempdir()?;
    let key = gateway_key(9);
    let mut traffic = Traffic::new(1, key.clone(), CHAIN, [20, 10, 2, 5]);
    let backend = Arc::new(RocksBackend::open(dir.path())?);
    let dynb: Arc<dyn Backend> = backend.clone();
    let app = TallyApp::new(dynb, tally_abci::Halt::new(|e| panic!("halt: {e:?}")))?;
    app.set_retain_versions(retain);
    let mut init = bench_init_chain(CHAIN, T0, &key, &traffic.users, version);
    if keep > 0 {
        let mut state: serde_json::Value = serde_json::from_slice(&init.app_state_bytes)?;
        state["params"]["sla_keep_windows"] = serde_json::json!(keep);
        init.app_state_bytes = state.to_string().into_bytes().into();
    }
    app.init_chain(init);
    let block = |h: u64, txs: Vec<Bytes>| -> Result<()> {
        let r = app.finalize_block(RequestFinalizeBlock {
            txs,
            height: h as i64,
            time: Some(Timestamp {
                seconds: T0 + h as i64,
                nanos: 0,
            }),
            ..Default::default()
        });
        if let Some(bad) = r.tx_results.iter().find(|x| x.code != 0) {
            bail!("block {h}: a report was refused: {}", bad.log);
        }
        app.commit();
        Ok(())
    };
    for h in 1..=blocks {
        let now = (T0 + h as i64) as u64;
        let txs = (0..per_block)
            .map(|_| {
                let recs = traffic.records(1, 10);
                Bytes::from(traffic.report(recs, now, 500))
            })
            .collect();
        block(h, txs)?;
    }
    let loaded = measure(&backend, dir.path())?;
    for h in blocks + 1..=blocks + idle {
        block(h, Vec::new())?;
    }
    let after = measure(&backend, dir.path())?;
    drop(app);
    Ok((loaded, after))
}

/// Pairs and key + value bytes of the SLA-record prefixes.
fn sla_bytes(s: &Sizes) -> (u64, u64) {
    ["rr/", "ip/", "iu/", "pw/", "uw/", "win/", "lat/", "plat/"]
        .iter()
        .filter_map(|p| s.flat.get(*p))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

fn report(label: &str, low: &Sizes, high: &Sizes, extra: f64) {
    println!("  {label}:");
    let (lo, hi) = (sla_bytes(low), sla_bytes(high));
    println!(
        "    SLA records (rr/ ip/ iu/ pw/ uw/ win/ lat/ plat/): {} pairs, {} B (low run); {} pairs, {} B (high run)",
        lo.0, lo.1, hi.0, hi.1
    );
    let mut prefixes: Vec<&String> = low.flat.keys().chain(high.flat.keys()).collect();
    prefixes.sort();
    prefixes.dedup();
    for p in prefixes {
        let (a, b) = (
            low.flat.get(p).copied().unwrap_or_default(),
            high.flat.get(p).copied().unwrap_or_default(),
        );
        if a == b {
            continue;
        }
        println!(
            "    {p:<10} pairs {:>9} -> {:>9}   bytes {:>11} -> {:>11}   {:>8.1} B per extra report",
            a.0,
            b.0,
            a.1,
            b.1,
            (b.1 as f64 - a.1 as f64) / extra
        );
    }
    let flat = |s: &Sizes| s.flat.values().map(|v| v.1).sum::<u64>();
    println!(
        "    flat state (every prefix)   {:>8.1} B per extra report",
        (flat(high) as f64 - flat(low) as f64) / extra
    );
    println!(
        "    RocksDB tables after compaction: {:.1} MiB -> {:.1} MiB, {:.1} B per extra report",
        low.sst as f64 / 1048576.0,
        high.sst as f64 / 1048576.0,
        (high.sst as f64 - low.sst as f64) / extra
    );
}

/// `tally-bench state [--app-version V] [--low N] [--high N] [--blocks N]
/// [--idle N] [--retain N] [--keep-windows K]`.
pub fn main(args: &[String]) -> Result<()> {
    let mut version = tally_settlement::upgrade::LATEST_APP_VERSION;
    let (mut low, mut high, mut blocks, mut idle, mut retain, mut keep) = (
        200usize,
        400usize,
        300u64,
        720u64,
        tally_store::DEFAULT_RETAIN_VERSIONS,
        0u64,
    );
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<u64> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow::anyhow!("{name} needs a number"))
        };
        match a.as_str() {
            "--app-version" => version = num("--app-version")?,
            "--low" => low = num("--low")? as usize,
            "--high" => high = num("--high")? as usize,
            "--blocks" => blocks = num("--blocks")?,
            "--idle" => idle = num("--idle")?,
            "--retain" => retain = num("--retain")?,
            "--keep-windows" => keep = num("--keep-windows")?,
            other => bail!("unknown argument {other:?}"),
        }
    }
    if !(1..=tally_settlement::upgrade::LATEST_APP_VERSION).contains(&version) || high <= low {
        bail!("--app-version must be one this build carries and --high above --low");
    }
    println!(
        "state per 1-call report: app version {version}, {blocks} 1-second blocks of {low} and of {high} reports over 2,000 routes, expiry 500 s, state_retain_versions {retain}, sla_keep_windows {keep}"
    );
    let (low_loaded, low_after) = run(version, low, blocks, idle, retain, keep)?;
    let (high_loaded, high_after) = run(version, high, blocks, idle, retain, keep)?;
    let extra = ((high - low) as u64 * blocks) as f64;
    report(
        &format!("after the {blocks} blocks (every id live)"),
        &low_loaded,
        &high_loaded,
        extra,
    );
    report(
        &format!("after {idle} more empty blocks (every id expired)"),
        &low_after,
        &high_after,
        extra,
    );
    Ok(())
}

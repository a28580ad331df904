//! Benchmarks that back the closing-note figures. Run:
//!
//!   scripts/bench.sh [finalize] [bls] [range] [proposal] [--blocks N]
//!
//! `finalize`: FinalizeBlock + Commit on RocksDB with the Merkle tree,
//! blocks of 10,000 records (100 reports of 100) over 1,000 routes; prints
//! records/s, latency percentiles, tree key updates/s, bytes written per
//! block, proofs generated per second, the RocksDB directory's size and
//! peak memory (VmHWM). `--blocks 100` is one million records.
//! `bls`: threshold combine + verify at n = 4, 16, 67, 100 (t = 2n/3 + 1),
//! and batch verification of 67 partials against one-by-one.
//! `range`: deleting 100 and 10,000 partials by RocksDB range delete
//! against scan-and-delete.
//! `proposal`: PrepareProposal and ProcessProposal latency with a full
//! batch (100 hub calls) and with 67 validators' partials to verify.
//! `chaos --minutes N`: a localnet with faults for N minutes, then an audit
//! of the money (`tally_tests::chaos`; `scripts/chaos.sh`).
//! `worst`: the worst ProcessProposal and FinalizeBlock a byzantine
//! proposer can cause within the caps (ADR 0010) at `--validators N`
//! (default 100): p50/p99/max over `--reps R` (default 30) runs.
//! `finalize --app-version 4 [--latency]`: the same at app version 4, each
//! call with a latency and a TTFT bucket with `--latency` (ADR 0021); also
//! prints the report bytes per call.
//! `slo-close [--policies N]`: the block that closes a window judging N
//! service-level objectives (default 10,000; `tally_tests::slobench`).
//! `upgrade [--keys N]`: app version 2's migration over N live report ids
//! (default 1,000,000): time in the change set and to commit, per million
//! (`tally_tests::upgradebench`).
//! `network [--apps tally,kvstore] [--sizes 1,100[,1000]] [--start-rate N]
//! [--step-secs N] [--max-steps N] [--out DIR]`: Tally and CometBFT's kvstore
//! each on a 4-validator loopback network with the same CometBFT settings,
//! open-loop load rising step by step to saturation; table, CSV and PNG in
//! `$CARGO_TARGET_DIR/bench/network` (`tally_tests::netbench`).
//! `state [--app-version V] [--low N] [--high N] [--blocks N] [--idle N]
//! [--retain N]`: bytes of state per 1-call report while its id is live and
//! after it expired (`tally_tests::statebench`, ADR 0025).
//! `deposits [--deposits N] [--app-version V] [--senders S]`: a burst of N
//! hub deposits (default 30,000) on a 4-validator localnet with its
//! reference hub, and how fast Tally credits them (ADR 0024;
//! `tally_tests::depositbench`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use bytes::Bytes;
use tally_abci::TallyApp;
use tally_settlement::Code;
use tally_store::RocksBackend;
use tally_tests::traffic::{app_state, bench_init_chain, gateway_key, Traffic};
use tendermint_abci::Application;
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::{RequestFinalizeBlock, RequestInitChain};

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn finalize(blocks: usize, version: u64, latency: bool) -> Result<()> {
    use rand::{Rng, SeedableRng};
    anyhow::ensure!(!latency || version >= 4, "--latency needs --app-version 4");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    const CHAIN: &str = "tally-bench";
    const T0: i64 = 1_800_000_000;
    let dir = tempfile::tempdir()?;
    let key = gateway_key(9);
    // 10 users x 10 providers x 2 models x 5 routes = 1,000 routes.
    let mut traffic = Traffic::new(1, key.clone(), CHAIN, [10, 10, 2, 5]);
    let backend: Arc<dyn tally_store::Backend> = Arc::new(RocksBackend::open(dir.path())?);
    let app = TallyApp::new(backend.clone(), halt_exits())?;
    app.init_chain(bench_init_chain(CHAIN, T0, &key, &traffic.users, version));
    let mut tx_bytes = 0usize;
    eprintln!("generating {blocks} blocks of 100 reports x 100 records ...");
    let mut prepared = Vec::with_capacity(blocks);
    for b in 0..blocks {
        let now = (T0 + b as i64) as u64;
        let txs: Vec<Bytes> = (0..100)
            .map(|_| {
                let mut recs = traffic.records(100, 10);
                if latency {
                    for r in &mut recs {
                        r.latency_bucket = rng.gen_range(8..=22);
                        r.ttft_bucket = rng.gen_range(4..=r.latency_bucket);
                    }
                }
                let tx = traffic.report(recs, now, 300);
                tx_bytes += tx.len();
                Bytes::from(tx)
            })
            .collect();
        prepared.push(txs);
    }
    let mut fin_ms = Vec::new();
    let mut commit_ms = Vec::new();
    let mut total_ms = Vec::new();
    let mut key_updates = 0usize;
    let mut written = Vec::new();
    let start = Instant::now();
    for (b, txs) in prepared.into_iter().enumerate() {
        let t0 = Instant::now();
        let r = app.finalize_block(RequestFinalizeBlock {
            txs,
            height: b as i64 + 1,
            time: Some(Timestamp {
                seconds: T0 + b as i64,
                nanos: 0,
            }),
            ..Default::default()
        });
        let t1 = Instant::now();
        app.commit();
        let t2 = Instant::now();
        if let Some(bad) = r.tx_results.iter().find(|x| x.code != Code::Ok.value()) {
            bail!("block {b}: a report was refused: {}", bad.log);
        }
        let stats = app.last_tree_stats();
        key_updates += stats.key_updates;
        written.push((stats.raw_bytes + stats.state_bytes) as f64);
        fin_ms.push((t1 - t0).as_secs_f64() * 1e3);
        commit_ms.push((t2 - t1).as_secs_f64() * 1e3);
        total_ms.push((t2 - t0).as_secs_f64() * 1e3);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let records = blocks as f64 * 10_000.0;
    for v in [&mut fin_ms, &mut commit_ms, &mut total_ms] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    println!(
        "finalize+commit on RocksDB: {blocks} blocks x 10,000 records over 1,000 routes (app version {version}{})",
        if latency { ", latency and TTFT on every call" } else { "" }
    );
    println!("  report bytes per call: {:.2}", tx_bytes as f64 / records);
    println!(
        "  throughput: {:.0} records/s ({records:.0} records in {elapsed:.2} s)",
        records / elapsed
    );
    println!(
        "  FinalizeBlock ms: p50 {:.1}  p99 {:.1}",
        pct(&fin_ms, 0.5),
        pct(&fin_ms, 0.99)
    );
    println!(
        "  Commit ms:        p50 {:.1}  p99 {:.1}",
        pct(&commit_ms, 0.5),
        pct(&commit_ms, 0.99)
    );
    println!(
        "  block total ms:   p50 {:.1}  p99 {:.1}",
        pct(&total_ms, 0.5),
        pct(&total_ms, 0.99)
    );
    println!(
        "  tree key updates: {:.0}/s ({:.0} per block)",
        key_updates as f64 / elapsed,
        key_updates as f64 / blocks as f64
    );
    written.sort_by(|a, b| a.total_cmp(b));
    println!(
        "  bytes written per block (state + tree): p50 {:.0} KiB  max {:.0} KiB",
        pct(&written, 0.5) / 1024.0,
        written.last().copied().unwrap_or(0.0) / 1024.0
    );
    // Proofs of route records at the latest height, as `/key` makes them.
    let height = blocks as u64;
    let window = (T0 as u64 + height - 1) / 60;
    let mut ids = Vec::new();
    for u in &traffic.users {
        for p in &traffic.providers {
            for m in &traffic.models {
                for r in &traffic.routes {
                    ids.push(tally_settlement::RouteId {
                        user: u.clone(),
                        provider: p.clone(),
                        model: m.clone(),
                        route: r.clone(),
                    });
                }
            }
        }
    }
    let t0 = Instant::now();
    let mut proof_bytes = 0usize;
    for id in &ids {
        let k = tally_settlement::keys::route(id, window);
        let p = tally_store::proof::prove(backend.as_ref(), &k, height)?;
        proof_bytes += p.proof.len();
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "  proofs: {:.0}/s ({} route records at height {height}, {:.0} bytes each on average)",
        ids.len() as f64 / secs,
        ids.len(),
        proof_bytes as f64 / ids.len() as f64
    );
    drop(app);
    drop(backend);
    println!(
        "  RocksDB directory after {records:.0} records: {:.1} MiB",
        dir_bytes(dir.path()) as f64 / (1024.0 * 1024.0)
    );
    println!("  peak RSS: {:.1} MiB", peak_rss_kib() as f64 / 1024.0);
    Ok(())
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn time_ms<T>(reps: u32, mut f: impl FnMut() -> T) -> f64 {
    let start = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    start.elapsed().as_secs_f64() * 1e3 / reps as f64
}

fn bls_bench() -> Result<()> {
    use rand::RngCore;
    use tally_settlement::bls::{deal, message, Kind};
    let mut rng = rand::thread_rng();
    println!("threshold BLS (blst, min_pk), mean over repetitions");
    for n in [4u32, 16, 67, 100] {
        let t = 2 * n / 3 + 1;
        let coeffs: Vec<[u8; 64]> = (0..t)
            .map(|_| {
                let mut b = [0u8; 64];
                rng.fill_bytes(&mut b);
                b
            })
            .collect();
        let (pubs, secrets) = deal(n, t, &coeffs)?;
        let msg = message("tally-bench", Kind::Batch, &[5; 32]);
        let parts: Vec<_> = secrets.iter().map(|s| s.sign(&msg)).collect();
        let reps = if n > 50 { 20 } else { 100 };
        let combine = time_ms(reps, || pubs.combine(&msg, &parts).map(|_| ()));
        let batch = time_ms(reps, || pubs.invalid_partials(&msg, &parts).len());
        let single = time_ms(reps.min(10), || {
            parts
                .iter()
                .filter(|p| pubs.verify_partial(&msg, p))
                .count()
        });
        println!(
            "  n={n:>3} t={t:>3}: combine+verify {combine:>7.2} ms | verify {n} partials: batch {batch:>7.2} ms, one by one {single:>7.2} ms ({:.1}x)",
            single / batch
        );
    }
    Ok(())
}

fn range_bench() -> Result<()> {
    use tally_store::{Backend, Kv, KvRead, Pending};
    println!("deleting partials from RocksDB (psig/<digest>/<index>), one commit each");
    for n in [100u32, 10_000] {
        let mut row = Vec::new();
        for by_range in [true, false] {
            let dir = tempfile::tempdir()?;
            let backend: Arc<dyn Backend> = Arc::new(RocksBackend::open(dir.path())?);
            let mut p = Pending::open(backend.clone())?;
            let prefix = b"psig/0123456789abcdef0123456789abcdef/".to_vec();
            for i in 0..n {
                let mut k = prefix.clone();
                k.extend_from_slice(&i.to_be_bytes());
                p.put(k, vec![7u8; 96]);
            }
            p.commit(1)?;
            let t0 = Instant::now();
            if by_range {
                p.delete_prefix(&prefix);
            } else {
                for (k, _) in p.scan_prefix(&prefix, usize::MAX)? {
                    p.delete(k);
                }
            }
            p.commit(2)?;
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let t1 = Instant::now();
            let left = backend.scan_prefix(&prefix, 10)?.len();
            let scan_after = t1.elapsed().as_secs_f64() * 1e3;
            anyhow::ensure!(left == 0, "partials left after delete");
            row.push((ms, scan_after));
        }
        println!(
            "  {n:>6} partials: range delete {:>8.3} ms (prefix scan after {:.3} ms) | scan-and-delete {:>8.3} ms (scan after {:.3} ms)",
            row[0].0, row[0].1, row[1].0, row[1].1
        );
    }
    Ok(())
}

fn proposal_bench() -> Result<()> {
    use rand::RngCore;
    use tally_settlement::bls::deal;
    use tally_settlement::proto::{tx, Outcome, SyncTxStart, UsageRecord};
    use tendermint_proto::v0_38::abci::{
        ExtendedCommitInfo, ExtendedVoteInfo, RequestPrepareProposal,
    };
    const CHAIN: &str = "tally-bench";
    const T0: i64 = 1_800_000_000;
    let (n, t) = (67u32, 45u32);
    let mut rng = rand::thread_rng();
    let coeffs: Vec<[u8; 64]> = (0..t)
        .map(|_| {
            let mut b = [0u8; 64];
            rng.fill_bytes(&mut b);
            b
        })
        .collect();
    let (pubs, shares) = deal(n, t, &coeffs)?;
    let key = gateway_key(4);
    let mut traffic = Traffic::new(2, key.clone(), CHAIN, [10, 10, 1, 1]);
    let mut state: serde_json::Value =
        serde_json::from_str(&app_state(&key, &traffic.users, 1 << 40, 60))?;
    let hexkey = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
    state["dkg"] = serde_json::json!({
        "threshold": t,
        "group_key": hexkey(&pubs.group),
        "public_shares": pubs.shares.iter().map(hexkey).collect::<Vec<_>>(),
        "signers": (0..n).map(|i| hex::encode([i as u8; 20])).collect::<Vec<_>>(),
    });
    let dir = tempfile::tempdir()?;
    let backend: Arc<dyn tally_store::Backend> = Arc::new(RocksBackend::open(dir.path())?);
    let app = TallyApp::new(backend.clone(), halt_exits())?;
    app.init_chain(RequestInitChain {
        time: Some(Timestamp {
            seconds: T0,
            nanos: 0,
        }),
        chain_id: CHAIN.into(),
        app_state_bytes: Bytes::from(state.to_string()),
        initial_height: 1,
        ..Default::default()
    });
    let ts = |s: i64| {
        Some(Timestamp {
            seconds: s,
            nanos: 0,
        })
    };
    // 100 (user, provider) pairs with payments -> 100 hub calls at window close.
    let mut recs = Vec::new();
    for u in &traffic.users {
        for p in &traffic.providers {
            recs.push(UsageRecord {
                user: u.clone(),
                provider: p.clone(),
                model: "m".into(),
                route: "r".into(),
                outcome: Outcome::Ok as i32,
                units: 1,
                amount: 5,
                ..Default::default()
            });
        }
    }
    let report = Bytes::from(traffic.report(recs, T0 as u64, 300));
    app.finalize_block(RequestFinalizeBlock {
        txs: vec![report],
        height: 1,
        time: ts(T0),
        ..Default::default()
    });
    app.commit();
    let (h, time) = (2i64, T0 + 61);
    let prep_req = |ext: Vec<ExtendedVoteInfo>, h: i64, time: i64| RequestPrepareProposal {
        max_tx_bytes: 4 << 20,
        local_last_commit: Some(ExtendedCommitInfo {
            round: 0,
            votes: ext,
        }),
        height: h,
        time: ts(time),
        ..Default::default()
    };
    let (prep_ms, proc_ms, prep) = propose_and_check(&app, prep_req(Vec::new(), h, time), h, time)?;
    let start: SyncTxStart = prep
        .txs
        .iter()
        .find_map(|t| match tally_settlement::decode_tx(t).ok()?.sum {
            Some(tx::Sum::SyncStart(s)) => Some(s),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("no SyncTxStart proposed"))?;
    anyhow::ensure!(
        start.call_ids.len() == 100,
        "batch has {} calls",
        start.call_ids.len()
    );
    println!("PrepareProposal / ProcessProposal, {n} validators (t = {t}), RocksDB state");
    println!("  with a full batch (SyncTxStart of 100 hub calls): prepare {prep_ms:.2} ms, process {proc_ms:.2} ms");
    app.finalize_block(RequestFinalizeBlock {
        txs: prep.txs.clone(),
        height: h,
        time: ts(time),
        ..Default::default()
    });
    app.commit();
    // Every validator's extension: a partial over the batch digest.
    let backend = app.committed_state();
    let cache = tally_settlement::KeyCache::new();
    let exts: Vec<ExtendedVoteInfo> = shares
        .iter()
        .map(|s| {
            let e = tally_settlement::sync::extension(backend, &cache, CHAIN, s, 0, None, &[], &[])
                .unwrap_or_default();
            ExtendedVoteInfo {
                validator: Some(tendermint_proto::v0_38::abci::Validator {
                    address: Bytes::from(vec![(s.index - 1) as u8; 20]),
                    power: 10,
                }),
                vote_extension: prost::Message::encode_to_vec(&e).into(),
                ..Default::default()
            }
        })
        .collect();
    let (prep_ms, proc_ms, _) =
        propose_and_check(&app, prep_req(exts, h + 1, time + 1), h + 1, time + 1)?;
    println!("  with {n} partials to verify and combine: prepare {prep_ms:.2} ms, process {proc_ms:.2} ms");
    Ok(())
}

/// Mean PrepareProposal and ProcessProposal latency over 20 runs of `req`;
/// the node must accept its own proposal. Returns the last proposal too.
fn propose_and_check(
    app: &TallyApp,
    req: tendermint_proto::v0_38::abci::RequestPrepareProposal,
    h: i64,
    time: i64,
) -> Result<(
    f64,
    f64,
    tendermint_proto::v0_38::abci::ResponsePrepareProposal,
)> {
    use tendermint_proto::v0_38::abci::{
        response_process_proposal::ProposalStatus, RequestProcessProposal,
    };
    let reps = 20;
    let t0 = Instant::now();
    let mut prep = Default::default();
    for _ in 0..reps {
        prep = app.prepare_proposal(req.clone());
    }
    let prep_ms = t0.elapsed().as_secs_f64() * 1e3 / reps as f64;
    let t0 = Instant::now();
    for _ in 0..reps {
        let r = app.process_proposal(RequestProcessProposal {
            txs: prep.txs.clone(),
            height: h,
            time: Some(Timestamp {
                seconds: time,
                nanos: 0,
            }),
            ..Default::default()
        });
        anyhow::ensure!(
            r.status == ProposalStatus::Accept as i32,
            "own proposal rejected"
        );
    }
    let proc_ms = t0.elapsed().as_secs_f64() * 1e3 / reps as f64;
    Ok((prep_ms, proc_ms, prep))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "network") {
        return tally_tests::netbench::main(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "dkg") {
        return tally_tests::dkgbench::main(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "state") {
        return tally_tests::statebench::main(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "deposits") {
        return tally_tests::depositbench::main(&args[1..]);
    }
    let mut blocks = 30;
    let mut validators = 100u32;
    let mut reps = 30usize;
    let mut minutes = 60u64;
    let mut keys = 1_000_000u64;
    let mut version = 1u64;
    let mut latency = false;
    let mut policies = 10_000u64;
    let mut which = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--blocks" => {
                blocks = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| anyhow::anyhow!("--blocks needs a number"))?
            }
            "--validators" => {
                validators = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| (1..=255).contains(v))
                    .ok_or_else(|| anyhow::anyhow!("--validators needs a number 1..=255"))?
            }
            "--reps" => {
                reps = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| *v > 0)
                    .ok_or_else(|| anyhow::anyhow!("--reps needs a positive number"))?
            }
            "--minutes" => {
                minutes = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| *v > 0)
                    .ok_or_else(|| anyhow::anyhow!("--minutes needs a positive number"))?
            }
            "--keys" => {
                keys = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| *v > 0)
                    .ok_or_else(|| anyhow::anyhow!("--keys needs a positive number"))?
            }
            "--app-version" => {
                version = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| (1..=tally_settlement::upgrade::LATEST_APP_VERSION).contains(v))
                    .ok_or_else(|| {
                        anyhow::anyhow!("--app-version needs a version this build carries")
                    })?
            }
            "--latency" => latency = true,
            "--policies" => {
                policies = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| (1..=10_000).contains(v))
                    .ok_or_else(|| anyhow::anyhow!("--policies needs a number 1..=10000"))?
            }
            "finalize" | "bls" | "range" | "proposal" | "worst" | "chaos" | "snapshot"
            | "upgrade" | "slo-close" => which.push(a.clone()),
            other => {
                bail!("unknown argument {other:?}; benches: finalize, bls, range, proposal, worst, chaos, snapshot, upgrade, slo-close")
            }
        }
    }
    if which.is_empty() {
        which = vec![
            "finalize".into(),
            "bls".into(),
            "range".into(),
            "proposal".into(),
        ];
    }
    for w in which {
        match w.as_str() {
            "finalize" => finalize(blocks, version, latency)?,
            "slo-close" => tally_tests::slobench::run(policies)?,
            "bls" => bls_bench()?,
            "range" => range_bench()?,
            "worst" => worst_bench(validators, reps)?,
            "chaos" => tally_tests::chaos::run(minutes)?,
            "snapshot" => tally_tests::snapbench::run(keys)?,
            "upgrade" => tally_tests::upgradebench::run(keys)?,
            _ => proposal_bench()?,
        }
    }
    Ok(())
}

fn worst_bench(validators: u32, reps: usize) -> Result<()> {
    println!(
        "worst case within the caps, {validators} validators, {reps} runs each (RocksDB state)"
    );
    for t in tally_tests::worst::run(validators, reps)? {
        println!(
            "  {}: {} bytes; p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            t.name, t.tx_bytes, t.p50, t.p99, t.max
        );
    }
    Ok(())
}

/// The binaries' halt hook: exit with the reason's status.
fn halt_exits() -> tally_abci::Halt {
    tally_abci::Halt::new(|e| std::process::exit(e.reason.exit_code()))
}

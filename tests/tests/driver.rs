//! In-process ABCI driver: several app instances through CometBFT's call
//! sequence with a controllable clock. Deterministic and fast.

use tally_settlement::proto::UsageRecord;
use tally_settlement::{Code, RouteRecordView};
use tally_tests::driver::Net;
use tally_tests::traffic::{app_state, gateway_key, totals, Traffic};

const CHAIN: &str = "tally-driver";
const T0: i64 = 1_800_000_000;

/// 1,000 blocks of random traffic (valid and invalid) on four RocksDB-backed
/// validators: all app hashes agree at every height; a restart from the
/// RocksDB files mid-run and a crash between FinalizeBlock and Commit both
/// continue with the same hashes; the final records equal a model's.
#[test]
fn thousand_blocks_agree_across_restarts() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let key = gateway_key(1);
    let mut traffic = Traffic::new(42, key.clone(), CHAIN, [6, 3, 2, 3]);
    let mut net = Net::on_rocksdb(4, dir.path(), CHAIN, T0)?;
    net.init(&app_state(&key, &traffic.users, 200_000, 60))?;

    let mut accepted: Vec<UsageRecord> = Vec::new();
    let mut rejected_codes = std::collections::BTreeSet::new();
    let mut replay: Option<Vec<u8>> = None;
    for h in 1..=1000 {
        let mut txs = Vec::new();
        for _ in 0..traffic.pick(0..4) {
            let n = traffic.pick(1..40);
            let recs = traffic.records(n, 20);
            txs.push(traffic.report(recs, net.now as u64, 120));
        }
        // Some invalid traffic: a replayed report, garbage, an expired one.
        match h % 50 {
            7 => {
                if let Some(r) = replay.take() {
                    txs.push(r);
                }
            }
            13 => {
                txs.push(vec![0xde, 0xad]);
            }
            29 => {
                let recs = traffic.records(3, 1);
                txs.push(traffic.report(recs, net.now as u64 - 200, 100));
            }
            _ => {}
        }
        if let Some(t) = txs.first() {
            replay = Some(t.clone());
        }
        let step = 1 + traffic.pick(0..3) as i64;
        if h == 400 {
            net.stop(2);
        }
        if h == 450 {
            net.restart(2)?;
        }
        if h == 700 {
            // Node 1 runs FinalizeBlock for the next block and crashes.
            net.crash_before_commit(1, txs.clone())?;
        }
        let out = net.block(txs, step)?;
        // PrepareProposal drops undecodable bytes; every kept tx has a result.
        assert_eq!(out.block.txs.len(), out.tx_results.len());
        for (tx, r) in out.block.txs.iter().zip(out.tx_results.iter()) {
            let code = Code::from_value(r.code).expect("known code");
            if code == Code::Ok {
                accepted.extend(decode_records(tx));
            } else {
                rejected_codes.insert(code);
            }
        }
    }
    let heads = net.heads();
    assert!(
        heads.iter().all(|h| h == &heads[0]),
        "final heads differ: {heads:?}"
    );
    assert_eq!(heads[0].0, 1000);
    assert!(
        rejected_codes.contains(&Code::DuplicateReport),
        "{rejected_codes:?}"
    );
    assert!(
        rejected_codes.contains(&Code::ReportExpired),
        "{rejected_codes:?}"
    );

    // Every node answers queries with exactly the model's totals.
    let want = totals(&accepted);
    assert!(want.len() > 50, "traffic touched {} routes", want.len());
    for node in &net.nodes {
        for (id, c) in &want {
            let path = tally_tests::traffic::route_path(id);
            let r = node.app.query_path(&path);
            assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
            let v: serde_json::Value = serde_json::from_slice(&r.value)?;
            let recs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
            let sum = |f: fn(&RouteRecordView) -> u64| recs.iter().map(f).sum::<u64>();
            assert_eq!(sum(|r| r.requests), c.requests, "{path}");
            assert_eq!(sum(|r| r.fail_count), c.fail_count(), "{path}");
            assert_eq!(sum(|r| r.cancel), c.cancel, "{path}");
            assert_eq!(sum(|r| r.client), c.client, "{path}");
            assert_eq!(sum(|r| r.units), c.units, "{path}");
            assert_eq!(sum(|r| r.amount), c.amount, "{path}");
        }
    }
    Ok(())
}

fn decode_records(tx: &[u8]) -> Vec<UsageRecord> {
    use prost::Message;
    use tally_settlement::proto::{tx, ReportUsage};
    match tally_settlement::decode_tx(tx).ok().and_then(|t| t.sum) {
        Some(tx::Sum::Report(s)) => ReportUsage::decode(s.body.as_slice())
            .map(|r| r.records)
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The in-memory twin gives the same app hashes as RocksDB for the same
/// blocks.
#[test]
fn memory_and_rocksdb_nodes_agree() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let key = gateway_key(2);
    let mut t1 = Traffic::new(7, key.clone(), CHAIN, [3, 2, 2, 2]);
    let mut t2 = Traffic::new(7, key.clone(), CHAIN, [3, 2, 2, 2]);
    let state = app_state(&key, &t1.users, 10_000, 30);
    let mut mem = Net::in_memory(2, CHAIN, T0)?;
    let mut rocks = Net::on_rocksdb(2, dir.path(), CHAIN, T0)?;
    mem.init(&state)?;
    rocks.init(&state)?;
    for _ in 0..100 {
        let r1 = t1.records(10, 5);
        let r2 = t2.records(10, 5);
        let a = mem.block(vec![t1.report(r1, mem.now as u64, 60)], 2)?;
        let b = rocks.block(vec![t2.report(r2, rocks.now as u64, 60)], 2)?;
        assert_eq!(a.app_hash, b.app_hash);
    }
    Ok(())
}

/// An invalid genesis never reaches InitChain in the driver: the parser
/// refuses it with a message (tallyd start does the same before listening).
#[test]
fn genesis_errors_are_explained() {
    let e =
        tally_settlement::Genesis::parse(br#"{"params":{"max_report_records":5000}}"#).unwrap_err();
    assert!(e.to_string().contains("max_report_records"));
}

/// A local store fault while executing a block calls the halt hook (the
/// binaries exit with status 3) instead of answering an app hash; the app
/// then refuses consensus work. A read-only path answers code 16 instead.
#[test]
fn a_corrupt_store_halts_the_node() -> anyhow::Result<()> {
    use std::sync::Arc;

    use tally_abci::{Halt, HaltReason, TallyApp};
    use tally_store::{Kv, MemBackend, Pending};
    use tendermint_abci::Application;
    use tendermint_proto::google::protobuf::Timestamp;
    use tendermint_proto::v0_38::abci::{
        response_process_proposal::ProposalStatus, RequestCheckTx, RequestFinalizeBlock,
        RequestProcessProposal,
    };

    // Height 1 committed with genesis state and one corrupt integer.
    let backend = Arc::new(MemBackend::new());
    let mut p = Pending::open(backend.clone())?;
    tally_settlement::init_chain(&mut p, CHAIN, &tally_settlement::Genesis::default())?;
    p.put(tally_settlement::keys::CUR_WINDOW.to_vec(), vec![1, 2, 3]);
    p.commit(1)?;

    let (halt, halts) = Halt::recording();
    let app = TallyApp::new(backend, halt)?;
    let r = app.check_tx(RequestCheckTx {
        tx: b"garbage".to_vec().into(),
        ..Default::default()
    });
    assert_eq!(r.code, Code::MalformedTx.value(), "{}", r.log);
    assert!(halts.is_empty(), "a read-only path never halts");

    let r = app.finalize_block(RequestFinalizeBlock {
        height: 2,
        time: Some(Timestamp {
            seconds: T0 + 1,
            nanos: 0,
        }),
        ..Default::default()
    });
    assert!(r.app_hash.is_empty(), "no app hash from a broken node");
    let events = halts.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, HaltReason::StoreFailure);
    assert_eq!(events[0].reason.exit_code(), 3);
    assert_eq!(events[0].height, 2);
    assert_eq!(events[0].error, "stored integer is corrupt");
    assert!(app.halted());
    app.commit();
    assert_eq!(
        app.last_commit().height,
        1,
        "nothing of the block is written"
    );
    let r = app.process_proposal(RequestProcessProposal {
        height: 2,
        ..Default::default()
    });
    assert_eq!(r.status, ProposalStatus::Reject as i32);
    Ok(())
}

/// A genesis the app cannot read halts it with the genesis reason (exit
/// status 2 in the binaries).
#[test]
fn a_bad_genesis_halts_the_node() -> anyhow::Result<()> {
    use std::sync::Arc;

    use tally_abci::{Halt, HaltReason, TallyApp};
    use tally_store::MemBackend;
    use tendermint_abci::Application;
    use tendermint_proto::v0_38::abci::RequestInitChain;

    let (halt, halts) = Halt::recording();
    let app = TallyApp::new(Arc::new(MemBackend::new()), halt)?;
    let r = app.init_chain(RequestInitChain {
        chain_id: CHAIN.into(),
        app_state_bytes: br#"{"bogus":1}"#.to_vec().into(),
        ..Default::default()
    });
    assert!(r.consensus_params.is_none());
    let events = halts.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, HaltReason::BadGenesis);
    assert_eq!(events[0].reason.exit_code(), 2);
    assert!(events[0].error.contains("bogus"), "{}", events[0].error);
    Ok(())
}

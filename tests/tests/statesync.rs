//! State sync in the in-process driver: a node restored from another's
//! snapshot executes the next blocks to the network's app hashes and
//! answers queries like a validator that executed every block; snapshots
//! that lie (about their hash, format, app hash or content) are refused
//! without leaving anything behind. The oracle is the network itself: the
//! app hashes its validators computed block by block, and a validator's
//! answers.

use anyhow::{ensure, Result};
use tally_store::snapshot::{self, Metadata};
use tally_store::KvRead;
use tally_tests::driver::statesync::{abci_snapshot, apply, offer, ApplyResult, OfferResult};
use tally_tests::driver::Net;
use tally_tests::traffic::{app_state, gateway_key, route_path, totals, Traffic};
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::RequestInfo;

const CHAIN: &str = "tally-statesync";
const T0: i64 = 1_800_000_000;

/// Four validators, reports in most blocks over several 60 s windows;
/// node 0 takes a snapshot every 10 heights.
fn busy_net(
    blocks: u64,
    version: u64,
) -> Result<(Net, Traffic, Vec<tally_settlement::proto::UsageRecord>)> {
    let key = gateway_key(3);
    let mut traffic = Traffic::new(7, key.clone(), CHAIN, [4, 3, 2, 2]);
    let mut net = Net::in_memory(4, CHAIN, T0)?;
    net.genesis_version = version;
    net.init(&app_state(&key, &traffic.users, 1_000_000, 60))?;
    net.serve_snapshots(0, 10)?;
    let mut sent = Vec::new();
    for _ in 0..blocks {
        run_block(&mut net, &mut traffic, &mut sent)?;
    }
    Ok((net, traffic, sent))
}

fn run_block(
    net: &mut Net,
    traffic: &mut Traffic,
    sent: &mut Vec<tally_settlement::proto::UsageRecord>,
) -> Result<()> {
    let now = net.now as u64;
    let mut txs = Vec::new();
    for _ in 0..traffic.pick(0..3) {
        let n = traffic.pick(1..30);
        let recs = traffic.records(n, 10);
        sent.extend(recs.clone());
        txs.push(traffic.report(recs, now, 120));
    }
    let out = net.block(txs, 5)?;
    ensure!(
        out.tx_results.iter().all(|r| r.code == 0),
        "a report was refused: {:?}",
        out.tx_results
    );
    Ok(())
}

#[test]
fn a_node_joins_from_a_snapshot_and_follows_the_chain() -> Result<()> {
    // Version 1 (report ids in the tree) and version 6 (side state).
    for version in [1, 6] {
        joins_and_follows(version)?;
    }
    Ok(())
}

fn joins_and_follows(version: u64) -> Result<()> {
    let (mut net, mut traffic, mut sent) = busy_net(35, version)?;
    let mut joined = net.join_by_state_sync(0)?;
    // The newest snapshot is height 30 (every 10, at least one block after).
    ensure!(joined.restored == 30, "restored {}", joined.restored);
    ensure!(joined.height == 35);
    for _ in 0..25 {
        run_block(&mut net, &mut traffic, &mut sent)?;
    }
    joined.follow(&net)?;
    // Every route's records read the same on the joined node as on a
    // validator that executed every block, and hold what was sent.
    let want = totals(&sent);
    ensure!(want.len() > 10, "too little traffic: {} routes", want.len());
    for id in want.keys() {
        let path = route_path(id);
        let a = joined.node.app.query_path(&path);
        let b = net.nodes[1].app.query_path(&path);
        ensure!(a.code.value() == 0, "{path}: code {:?}", a.code);
        ensure!(a.value == b.value, "{path} differs on the joined node");
    }
    // Balances too.
    for u in &traffic.users {
        let path = format!("/balance/{u}");
        ensure!(
            joined.node.app.query_path(&path).value == net.nodes[2].app.query_path(&path).value
        );
    }
    Ok(())
}

/// The chunk format written by hand from store/src/snapshot.rs's docs.
fn encode_chunk(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_be_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v);
    }
    out
}

/// Offers a snapshot of `meta` with chunk 0 replaced by `pairs` (chunks
/// and metadata re-hashed, the trusted app hash kept) and applies it from
/// a liar; the last answer (the first that was not `Accept`).
fn serve_forged(
    node: &tally_tests::driver::Node,
    meta: &Metadata,
    chunks: &[Vec<u8>],
    pairs: &[(Vec<u8>, Vec<u8>)],
    trusted: &[u8],
) -> Result<Option<ApplyResult>> {
    let mut forged_chunks = chunks.to_vec();
    forged_chunks[0] = encode_chunk(pairs);
    let chunk0 = snapshot::decode_chunk(0, &chunks[0], None)?.len() as u64;
    let forged = Metadata {
        pairs: meta.pairs + pairs.len() as u64 - chunk0,
        chunk_hashes: forged_chunks.iter().map(|c| sha256(c)).collect(),
        ..meta.clone()
    };
    ensure!(offer(&node.app, abci_snapshot(&forged), trusted) == OfferResult::Accept);
    let mut last = None;
    for (i, c) in forged_chunks.iter().enumerate() {
        last = Some(apply(&node.app, i as u32, c, "liar").0);
        if last != Some(ApplyResult::Accept) {
            break;
        }
    }
    Ok(last)
}

fn sha256(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(b).into()
}

#[test]
fn lying_snapshots_are_refused_and_leave_nothing_behind() -> Result<()> {
    let (net, _, _) = busy_net(22, 6)?;
    let list = net.nodes[0].app.list_snapshots().snapshots;
    let s = list.first().cloned().expect("a snapshot");
    ensure!(s.height == 20);
    let meta = Metadata::decode(&s.metadata)?;
    let server = net.serve_snapshots_of(0);
    let chunks: Vec<Vec<u8>> = (0..s.chunks)
        .map(|i| server.load_chunk(s.height, s.format, i).expect("chunk"))
        .collect();
    let trusted = net.hashes[19].clone();
    let empty = |node: &tally_tests::driver::Node| -> Result<()> {
        let info = node.app.info(RequestInfo::default());
        ensure!(
            info.last_block_height == 0 && node.app.committed_state().scan(b"", b"", 1)?.is_empty(),
            "a refused snapshot left state behind (height {})",
            info.last_block_height
        );
        Ok(())
    };

    let node = Net::fresh_node()?;
    // An app hash the light client did not verify for that height.
    ensure!(offer(&node.app, s.clone(), &net.hashes[18]) == OfferResult::Reject);
    // A format this node does not read.
    let mut f2 = s.clone();
    f2.format = 2;
    ensure!(offer(&node.app, f2, &trusted) == OfferResult::RejectFormat);
    // A hash that is not the metadata's.
    let mut h = s.clone();
    h.hash = vec![0u8; 32].into();
    ensure!(offer(&node.app, h, &trusted) == OfferResult::Reject);
    // A height the metadata does not say.
    let mut other = s.clone();
    other.height = 10;
    ensure!(offer(&node.app, other, &trusted) == OfferResult::Reject);
    empty(&node)?;

    // A server that changed one value and re-hashed its chunks and
    // metadata, keeping the trusted app hash: the offer is consistent, the
    // rebuilt state is not; the snapshot is rejected and the store wiped.
    let mut pairs = snapshot::decode_chunk(0, &chunks[0], None)?;
    let victim = pairs.len() / 2;
    pairs[victim].1[0] ^= 1;
    let last = serve_forged(&node, &meta, &chunks, &pairs, &trusted)?;
    ensure!(
        last == Some(ApplyResult::RejectSnapshot),
        "forged content answered {last:?}"
    );
    empty(&node)?;

    // Report ids are side state (app version 6, ADR 0025): no tree leaf, so
    // a server that drops or changes one keeps the app hash right. The
    // restore checks them against the digests the tree holds: refused.
    let pairs = snapshot::decode_chunk(0, &chunks[0], None)?;
    let side = pairs
        .iter()
        .filter(|(k, _)| tally_store::is_side(k))
        .count();
    ensure!(side > 10, "too few side report ids in the snapshot: {side}");
    for lie in ["drop", "change"] {
        let mut pairs = pairs.clone();
        if lie == "drop" {
            pairs.remove(side / 2);
        } else {
            pairs[side / 2].1[20] ^= 1;
        }
        let last = serve_forged(&node, &meta, &chunks, &pairs, &trusted)?;
        ensure!(
            last == Some(ApplyResult::RejectSnapshot),
            "a side report id ({lie}) answered {last:?}"
        );
        empty(&node)?;
    }
    // A chunk after the restore ended: nothing to apply it to.
    ensure!(apply(&node.app, 0, &chunks[0], "late").0 == ApplyResult::Abort);

    // The genuine snapshot, one chunk first served corrupted: that chunk is
    // fetched again and its sender dropped; then the restore completes.
    ensure!(offer(&node.app, s.clone(), &trusted) == OfferResult::Accept);
    let mut bad = chunks[0].clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    let (r, refetch, senders) = apply(&node.app, 0, &bad, "corrupt-peer");
    ensure!(
        r == ApplyResult::Retry
            && refetch == vec![0]
            && senders == vec!["corrupt-peer".to_string()],
        "a corrupted chunk answered {r:?} {refetch:?} {senders:?}"
    );
    for (i, c) in chunks.iter().enumerate() {
        let (r, _, _) = apply(&node.app, i as u32, c, "honest-peer");
        ensure!(r == ApplyResult::Accept, "chunk {i}: {r:?}");
    }
    let info = node.app.info(RequestInfo::default());
    ensure!(info.last_block_height == 20 && info.last_block_app_hash.as_ref() == trusted);
    // A node with state never takes another snapshot.
    ensure!(offer(&node.app, s, &trusted) == OfferResult::Abort);
    ensure!(node.app.info(RequestInfo::default()).last_block_height == 20);
    Ok(())
}

//! The reporter against a fake chain, on tokio's paused clock (no real
//! sleeping): batching limits, identical-bytes resubmission, duplicate =
//! success only with this report's own body hash, backpressure, permits
//! returned after a panicking transport, shutdown flush, many reports in
//! flight, confirmation from blocks (a lost answer, a dropped transaction,
//! no tx indexer), and exactly-once landing under random faults.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use prost::Message;
use sha2::{Digest, Sha256};
use tally_client::proto::{tx, Outcome, ReportUsage, UsageRecord};
use tally_client::{
    Admission, Block, BlockTx, Broadcast, Failure, Included, ReportError, ReportOutcome, Reporter,
    ReporterConfig, Transport,
};

/// How long the fake chain takes per block (tokio's paused clock).
const BLOCK: Duration = Duration::from_secs(1);

/// A fake chain of four nodes sharing one mempool: `broadcast_tx_sync`
/// puts a transaction in it (CheckTx: code 7 with the body hash for bytes
/// already accepted, "in cache" for bytes already waiting), and every
/// `BLOCK` of tokio time the next block takes everything waiting (cut
/// lazily, when anyone asks). A report's bytes landing a second time get
/// code 7 in their block and are not counted again.
struct Chain {
    /// Report transactions accepted (code 0) in a block: records, by tx hash.
    landed: BTreeMap<[u8; 32], usize>,
    /// Every broadcast: endpoint and tx hash.
    calls: Vec<(String, [u8; 32])>,
    /// Records of every distinct transaction broadcast, by tx hash.
    sent: BTreeMap<[u8; 32], usize>,
    /// Upcoming broadcast behaviours, consumed in order; empty: behave.
    script: Vec<Step>,
    /// Waiting for the next block, in order.
    mempool: Vec<Vec<u8>>,
    /// Waiting for the block after the next (a second node's copy).
    later: Vec<Vec<u8>>,
    /// Committed blocks (height = index + 1).
    blocks: Vec<Block>,
    /// When the last block was cut (or the chain started).
    last_block: tokio::time::Instant,
    /// Unix time of the chain's start (block times count from it).
    genesis_time: u64,
    /// Times each tx hash was in a block, whatever its code.
    inclusions: BTreeMap<[u8; 32], usize>,
    /// Most transactions broadcast and not yet in any block, at once.
    max_unconfirmed: usize,
    /// Whether `lookup` answers (CometBFT's tx indexer on).
    indexer: bool,
    /// Report ids accepted, with the accepted body's hash: a report id
    /// lands once, whatever bytes carry it (the chain's replay rule).
    ids: BTreeMap<Vec<u8>, Vec<u8>>,
    /// While set, no block is cut (the chain is stopped, e.g. for an
    /// upgrade); mempools still take transactions.
    stopped: bool,
}

impl Default for Chain {
    fn default() -> Self {
        Self {
            landed: BTreeMap::new(),
            calls: Vec::new(),
            sent: BTreeMap::new(),
            script: Vec::new(),
            mempool: Vec::new(),
            later: Vec::new(),
            blocks: Vec::new(),
            last_block: tokio::time::Instant::now(),
            genesis_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            inclusions: BTreeMap::new(),
            max_unconfirmed: 0,
            indexer: true,
            ids: BTreeMap::new(),
            stopped: false,
        }
    }
}

impl Chain {
    /// Cuts the blocks due by now.
    fn advance(&mut self) {
        if self.stopped {
            self.last_block = tokio::time::Instant::now();
            return;
        }
        while self.last_block.elapsed() >= BLOCK {
            self.last_block += BLOCK;
            let mut txs = std::mem::take(&mut self.mempool);
            self.mempool = std::mem::take(&mut self.later);
            txs.dedup();
            let mut block = Vec::new();
            // A block's time: the wall clock (tokio's clock is paused, so
            // many blocks share a second), never before the last block's.
            let prev = self.blocks.last().map_or(self.genesis_time, |b| b.time);
            let time = prev.max(wall_now());
            for tx in txs {
                let hash: [u8; 32] = Sha256::digest(&tx).into();
                *self.inclusions.entry(hash).or_default() += 1;
                let (id, expires_at) = id_and_expiry(&tx);
                let (code, data) = if expires_at <= time {
                    (5, Vec::new())
                } else if let Some(body) = self.ids.get(&id) {
                    (7, body.clone())
                } else {
                    self.ids.insert(id, body_hash(&tx));
                    self.landed.insert(hash, records_in(&tx));
                    (0, Vec::new())
                };
                block.push(BlockTx {
                    hash,
                    code,
                    log: String::new(),
                    data,
                });
            }
            let height = self.blocks.len() as u64 + 1;
            self.blocks.push(Block {
                height,
                time,
                txs: block,
            });
        }
    }

    fn waiting(&self, tx: &[u8]) -> bool {
        self.mempool.iter().chain(&self.later).any(|t| t == tx)
    }

    /// Notes a broadcast of `tx` and how many sent ones no block holds.
    fn note_sent(&mut self, endpoint: &str, tx: &[u8]) {
        let hash: [u8; 32] = Sha256::digest(tx).into();
        self.calls.push((endpoint.to_string(), hash));
        self.sent.insert(hash, records_in(tx));
        let unconfirmed = self
            .sent
            .keys()
            .filter(|h| !self.inclusions.contains_key(*h))
            .count();
        self.max_unconfirmed = self.max_unconfirmed.max(unconfirmed);
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Connection refused, nothing happens.
    Refuse,
    /// The tx reaches the mempool but the answer is lost.
    LoseAck,
    /// HTTP 503.
    Unavailable,
    /// CometBFT's "already in cache" while the tx is still in a mempool.
    InCacheNotYet,
    /// The transport panics (a bug in it).
    Panic,
    /// Code 7 for a different report's body under the same id.
    TakenByOther,
    /// Code 7 without any body hash.
    DuplicateNoData,
    /// CheckTx passes but the tx is dropped from the mempool: no block
    /// ever holds it unless it is sent again.
    Drop,
    /// The tx reaches two nodes' mempools: two blocks hold it.
    Twice,
    /// CheckTx code 26: the mempool's report claims are full, for now.
    ClaimsFull,
    /// CheckTx code 39: the node's mempool is full, for now.
    MempoolFull,
}

#[derive(Clone, Default)]
struct FakeRpc(Arc<Mutex<Chain>>);

/// SHA-256 of the report body inside `tx`, what the chain answers code 7 with.
fn body_hash(tx: &[u8]) -> Vec<u8> {
    match tally_client::proto::Tx::decode(tx).ok().and_then(|t| t.sum) {
        Some(tx::Sum::Report(s)) => Sha256::digest(&s.body).to_vec(),
        _ => Vec::new(),
    }
}

fn wall_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The report id and `expires_at` of the report in `tx`.
fn id_and_expiry(tx: &[u8]) -> (Vec<u8>, u64) {
    match tally_client::proto::Tx::decode(tx).ok().and_then(|t| t.sum) {
        Some(tx::Sum::Report(s)) => ReportUsage::decode(s.body.as_slice())
            .map(|r| (r.report_id, r.expires_at))
            .unwrap_or_default(),
        _ => (Vec::new(), 0),
    }
}

fn records_in(tx: &[u8]) -> usize {
    match tally_client::proto::Tx::decode(tx).ok().and_then(|t| t.sum) {
        Some(tx::Sum::Report(s)) => ReportUsage::decode(s.body.as_slice())
            // Calls in either form (the reporter sends the compact one).
            .map(|r| {
                r.records.len()
                    + r.route_calls
                        .iter()
                        .map(|g| g.outcomes.len())
                        .sum::<usize>()
            })
            .unwrap_or(0),
        _ => 0,
    }
}

fn refused() -> Failure {
    Failure::Transport("connection refused".into())
}

impl Transport for FakeRpc {
    async fn broadcast_commit(&self, _: String, _: Vec<u8>) -> Result<Broadcast, Failure> {
        Err(Failure::Rejected(
            "the reporter must not wait for blocks".into(),
        ))
    }

    async fn broadcast_sync(&self, endpoint: String, tx: Vec<u8>) -> Result<Admission, Failure> {
        let hash: [u8; 32] = Sha256::digest(&tx).into();
        let mut c = self.0.lock().unwrap();
        c.advance();
        if endpoint.contains("dead") {
            c.calls.push((endpoint, hash));
            return Err(refused());
        }
        c.note_sent(&endpoint, &tx);
        let step = if c.script.is_empty() {
            None
        } else {
            Some(c.script.remove(0))
        };
        match step {
            Some(Step::Refuse) => Err(refused()),
            Some(Step::Unavailable) => Err(Failure::Status {
                code: 503,
                retry_after: Some("1".into()),
                body: String::new(),
            }),
            Some(Step::LoseAck) => {
                if !c.waiting(&tx) && !c.landed.contains_key(&hash) {
                    c.mempool.push(tx);
                }
                Err(Failure::Transport("connection reset".into()))
            }
            Some(Step::InCacheNotYet) => {
                if !c.waiting(&tx) && !c.landed.contains_key(&hash) {
                    c.mempool.push(tx);
                }
                Ok(Admission::InCache)
            }
            Some(Step::Panic) => {
                drop(c);
                panic!("transport bug");
            }
            Some(Step::TakenByOther) => Ok(Admission::Refused {
                code: 7,
                log: "duplicate".into(),
                data: vec![0xAA; 32],
            }),
            Some(Step::DuplicateNoData) => Ok(Admission::Refused {
                code: 7,
                log: "duplicate".into(),
                data: Vec::new(),
            }),
            Some(Step::ClaimsFull) => Ok(Admission::Refused {
                code: 26,
                log: "100000 reports are waiting in the mempool; retry after the next block".into(),
                data: Vec::new(),
            }),
            Some(Step::MempoolFull) => Ok(Admission::Refused {
                code: 39,
                log: "this node's mempool holds 5000 transactions; send again after the next block"
                    .into(),
                data: Vec::new(),
            }),
            Some(Step::Drop) => Ok(Admission::Accepted),
            Some(Step::Twice) => {
                if !c.waiting(&tx) && !c.landed.contains_key(&hash) {
                    c.mempool.push(tx.clone());
                    c.later.push(tx);
                }
                Ok(Admission::Accepted)
            }
            None => {
                if let Some(body) = c.ids.get(&id_and_expiry(&tx).0) {
                    return Ok(Admission::Refused {
                        code: 7,
                        log: "duplicate".into(),
                        data: body.clone(),
                    });
                }
                if c.waiting(&tx) {
                    return Ok(Admission::InCache);
                }
                c.mempool.push(tx);
                Ok(Admission::Accepted)
            }
        }
    }

    async fn lookup(&self, endpoint: String, hash: [u8; 32]) -> Result<Option<Included>, Failure> {
        let mut c = self.0.lock().unwrap();
        c.advance();
        if endpoint.contains("dead") {
            return Err(refused());
        }
        if !c.indexer {
            return Err(Failure::Transport(
                "transaction indexing is disabled".into(),
            ));
        }
        Ok(c.blocks.iter().find_map(|b| {
            b.txs.iter().find(|t| t.hash == hash).map(|t| Included {
                height: b.height,
                code: t.code,
                data: t.data.clone(),
            })
        }))
    }

    async fn latest_height(&self, endpoint: String) -> Result<u64, Failure> {
        let mut c = self.0.lock().unwrap();
        c.advance();
        if endpoint.contains("dead") {
            return Err(refused());
        }
        Ok(c.blocks.len() as u64)
    }

    async fn block(&self, endpoint: String, height: u64) -> Result<Block, Failure> {
        let mut c = self.0.lock().unwrap();
        c.advance();
        if endpoint.contains("dead") {
            return Err(refused());
        }
        let i = height.checked_sub(1).ok_or_else(refused)? as usize;
        c.blocks
            .get(i)
            .cloned()
            .ok_or_else(|| Failure::Transport(format!("height {height} is not available")))
    }
}

fn rec(i: usize) -> UsageRecord {
    UsageRecord {
        user: format!("u{}", i % 3),
        provider: "p".into(),
        model: "m".into(),
        route: "r".into(),
        outcome: Outcome::ALL[i % 7] as i32,
        units: 1,
        amount: 0,
        ..Default::default()
    }
}

fn cfg(endpoints: &[&str]) -> ReporterConfig {
    let mut c = ReporterConfig::new(
        endpoints.iter().map(|s| s.to_string()).collect(),
        "tally-test",
    );
    c.flush_interval = Duration::from_millis(200);
    c
}

fn key() -> SigningKey {
    SigningKey::from_bytes(&[3; 32])
}

#[tokio::test(start_paused = true)]
async fn batches_of_at_most_1000_and_interval_flush() {
    let rpc = FakeRpc::default();
    let r = Reporter::start(cfg(&["a"]), key(), rpc.clone()).unwrap();
    for i in 0..2500 {
        r.record(rec(i)).await.unwrap();
    }
    // What reached a mempool (blocks come later).
    let landed = |rpc: &FakeRpc| -> Vec<usize> {
        let mut v: Vec<usize> = rpc.0.lock().unwrap().sent.values().copied().collect();
        v.sort_unstable();
        v
    };
    // Two full reports go at once; the 500 left wait for the interval
    // (200 ms after start), which alone sends them: nothing here calls
    // flush().
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(landed(&rpc), vec![1000, 1000]);
    tokio::time::sleep(Duration::from_millis(140)).await; // 190 ms
    assert_eq!(landed(&rpc), vec![1000, 1000], "sent before the interval");
    tokio::time::sleep(Duration::from_millis(60)).await; // 250 ms
    assert_eq!(landed(&rpc), vec![500, 1000, 1000], "the interval flushed");
    let out = r.shutdown().await;
    assert_eq!(out.len(), 3);
    assert_eq!(r_metrics_total(&rpc), 2500, "and all of it landed");
}

#[tokio::test(start_paused = true)]
async fn lost_acks_resubmit_identical_bytes_and_duplicates_count_as_landed() {
    let rpc = FakeRpc::default();
    rpc.0.lock().unwrap().script = vec![
        Step::LoseAck,
        Step::Refuse,
        Step::Unavailable,
        Step::InCacheNotYet,
    ];
    let r = Reporter::start(cfg(&["a", "b"]), key(), rpc.clone()).unwrap();
    for i in 0..10 {
        r.record(rec(i)).await.unwrap();
    }
    let out = r.shutdown().await;
    assert!(
        matches!(out.as_slice(), [ReportOutcome::Landed { records: 10, .. }]),
        "{out:?}"
    );
    let c = rpc.0.lock().unwrap();
    assert_eq!(c.landed.len(), 1, "landed once");
    let hashes: BTreeSet<_> = c.calls.iter().map(|(_, h)| *h).collect();
    assert_eq!(hashes.len(), 1, "every resubmission carried the same bytes");
    assert!(c.calls.len() >= 4);
}

#[tokio::test(start_paused = true)]
async fn a_dead_endpoint_fails_over() {
    let rpc = FakeRpc::default();
    let r = Reporter::start(cfg(&["http://dead", "b"]), key(), rpc.clone()).unwrap();
    for i in 0..1500 {
        r.record(rec(i)).await.unwrap();
    }
    let out = r.shutdown().await;
    let landed: usize = out
        .iter()
        .map(|o| match o {
            ReportOutcome::Landed { records, .. } => *records,
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(landed, 1500);
    assert_eq!(r_metrics_total(&rpc), 1500);
}

fn r_metrics_total(rpc: &FakeRpc) -> usize {
    rpc.0.lock().unwrap().landed.values().sum()
}

#[tokio::test(start_paused = true)]
async fn backpressure_hands_records_back_never_drops_them() {
    let rpc = FakeRpc::default();
    // Every call refused: nothing drains while we fill the buffer.
    rpc.0.lock().unwrap().script = vec![Step::Refuse; 10_000];
    let mut c = cfg(&["a"]);
    c.capacity = 100;
    c.max_records = 1000;
    c.flush_interval = Duration::from_secs(3600);
    let r = Reporter::start(c, key(), rpc.clone()).unwrap();
    let mut accepted = 0;
    let mut handed_back = 0;
    for i in 0..5000 {
        match r.try_record(rec(i)) {
            Ok(()) => accepted += 1,
            Err(ReportError::Full(_, back)) => {
                assert_eq!(*back, rec(i));
                handed_back += 1;
            }
            Err(e) => panic!("{e}"),
        }
        if i % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    assert!(handed_back > 0, "a bounded buffer must push back");
    assert_eq!(accepted + handed_back, 5000);
    // Let the chain recover: everything accepted lands, exactly once.
    rpc.0.lock().unwrap().script.clear();
    let out = r.shutdown().await;
    let landed: usize = out
        .iter()
        .map(|o| match o {
            ReportOutcome::Landed { records, .. } => *records,
            _ => 0,
        })
        .sum();
    assert_eq!(landed, accepted);
    assert_eq!(r_metrics_total(&rpc), accepted);
}

#[tokio::test(start_paused = true)]
async fn shutdown_flushes_and_rejections_are_reported() {
    let rpc = FakeRpc::default();
    let r = Reporter::start(cfg(&["a"]), key(), rpc.clone()).unwrap();
    r.record(rec(1)).await.unwrap();
    let out = r.shutdown().await;
    assert!(matches!(
        out.as_slice(),
        [ReportOutcome::Landed { records: 1, .. }]
    ));

    // A chain that refuses (e.g. insufficient balance) is surfaced, by code.
    #[derive(Clone)]
    struct Refusing;
    impl Transport for Refusing {
        async fn broadcast_commit(&self, _: String, _: Vec<u8>) -> Result<Broadcast, Failure> {
            Err(Failure::Rejected("not used".into()))
        }
        async fn broadcast_sync(&self, _: String, _: Vec<u8>) -> Result<Admission, Failure> {
            Ok(Admission::Refused {
                code: 13,
                log: "user u1 has 0 credits".into(),
                data: Vec::new(),
            })
        }
        async fn lookup(&self, _: String, _: [u8; 32]) -> Result<Option<Included>, Failure> {
            Ok(None)
        }
        async fn latest_height(&self, _: String) -> Result<u64, Failure> {
            Ok(1)
        }
        async fn block(&self, _: String, height: u64) -> Result<Block, Failure> {
            Ok(Block {
                height,
                time: 0,
                txs: Vec::new(),
            })
        }
    }
    let r = Reporter::start(cfg(&["a"]), key(), Refusing).unwrap();
    r.record(rec(1)).await.unwrap();
    r.flush().await;
    assert_eq!(r.metrics().rejected.lock().unwrap().get(&13), Some(&1));
    let out = r.shutdown().await;
    assert!(
        matches!(out.as_slice(), [ReportOutcome::Rejected { code: 13, .. }]),
        "{out:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_counts_only_with_this_reports_own_body_hash() {
    // The id was taken by a different report: a refusal the caller sees,
    // never a landing.
    for step in [Step::TakenByOther, Step::DuplicateNoData] {
        let rpc = FakeRpc::default();
        rpc.0.lock().unwrap().script = vec![step];
        let r = Reporter::start(cfg(&["a"]), key(), rpc.clone()).unwrap();
        r.record(rec(1)).await.unwrap();
        let out = r.shutdown().await;
        match out.as_slice() {
            [ReportOutcome::Rejected { code: 7, log, .. }] => {
                assert!(log.starts_with(tally_client::reporter::ID_TAKEN), "{log}");
            }
            other => panic!("{step:?}: {other:?}"),
        }
        assert!(rpc.0.lock().unwrap().landed.is_empty());
    }
    // Its own body, already in a block (the first answer was lost): landed.
    let rpc = FakeRpc::default();
    rpc.0.lock().unwrap().script = vec![Step::LoseAck];
    let r = Reporter::start(cfg(&["a"]), key(), rpc.clone()).unwrap();
    r.record(rec(1)).await.unwrap();
    let out = r.shutdown().await;
    assert!(
        matches!(out.as_slice(), [ReportOutcome::Landed { records: 1, .. }]),
        "{out:?}"
    );

    // The same through a block lookup after "already in cache".
    #[derive(Clone)]
    struct InCacheThenFound(Vec<u8>);
    impl Transport for InCacheThenFound {
        async fn broadcast_commit(&self, _: String, _: Vec<u8>) -> Result<Broadcast, Failure> {
            Err(Failure::Rejected("not used".into()))
        }
        async fn broadcast_sync(&self, _: String, _: Vec<u8>) -> Result<Admission, Failure> {
            Ok(Admission::InCache)
        }
        async fn latest_height(&self, _: String) -> Result<u64, Failure> {
            Err(Failure::Transport("no status here".into()))
        }
        async fn block(&self, _: String, _: u64) -> Result<Block, Failure> {
            Err(Failure::Transport("no blocks here".into()))
        }
        async fn lookup(&self, _: String, _: [u8; 32]) -> Result<Option<Included>, Failure> {
            Ok(Some(Included {
                height: 4,
                code: 7,
                data: self.0.clone(),
            }))
        }
    }
    let r = Reporter::start(cfg(&["a"]), key(), InCacheThenFound(vec![1; 32])).unwrap();
    r.record(rec(1)).await.unwrap();
    let out = r.shutdown().await;
    assert!(
        matches!(out.as_slice(), [ReportOutcome::Rejected { code: 7, .. }]),
        "{out:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_transport_gives_the_permits_back_and_the_reporter_goes_on() {
    let rpc = FakeRpc::default();
    rpc.0.lock().unwrap().script = vec![Step::Panic];
    let mut c = cfg(&["a"]);
    c.capacity = 10;
    c.max_records = 10;
    let r = Reporter::start(c, key(), rpc.clone()).unwrap();
    // Fill the buffer: one full report, whose submission panics.
    for i in 0..10 {
        r.try_record(rec(i)).unwrap();
    }
    r.flush().await;
    let out = r.take_outcomes();
    match out.as_slice() {
        [ReportOutcome::Failed {
            records: 10, error, ..
        }] => {
            assert!(error.contains("transport bug"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        r.metrics()
            .failed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // All ten permits are back: ten more records fit at once, and land.
    for i in 10..20 {
        r.try_record(rec(i))
            .unwrap_or_else(|e| panic!("record {i}: {e}"));
    }
    let out = r.shutdown().await;
    assert!(
        matches!(out.as_slice(), [ReportOutcome::Landed { records: 10, .. }]),
        "{out:?}"
    );
    assert_eq!(r_metrics_total(&rpc), 10);
}

/// Sum of records in landed outcomes; panics on any other outcome.
fn all_landed(out: &[ReportOutcome]) -> usize {
    out.iter()
        .map(|o| match o {
            ReportOutcome::Landed { records, .. } => *records,
            other => panic!("{other:?}"),
        })
        .sum()
}

/// Shutdown, bounded (paused clock: the bound passes at once if the
/// reporter would wait forever).
async fn shut(r: Reporter) -> Vec<ReportOutcome> {
    tokio::time::timeout(Duration::from_secs(3600), r.shutdown())
        .await
        .expect("the reporter never finished")
}

#[tokio::test(start_paused = true)]
async fn many_reports_are_in_flight_at_once_and_each_lands_once() {
    let rpc = FakeRpc::default();
    let mut c = cfg(&["a", "b"]);
    c.capacity = 100_000;
    let r = Reporter::start(c, key(), rpc.clone()).unwrap();
    for i in 0..60_000 {
        r.record(rec(i)).await.unwrap();
    }
    let out = shut(r).await;
    assert_eq!(all_landed(&out), 60_000);
    let c = rpc.0.lock().unwrap();
    // The fake's own count: transactions broadcast and in no block yet.
    assert!(
        c.max_unconfirmed >= 30,
        "only {} reports were unconfirmed at once",
        c.max_unconfirmed
    );
    assert_eq!(c.landed.len(), 60);
    assert_eq!(c.landed.values().sum::<usize>(), 60_000);
    assert!(c.inclusions.values().all(|n| *n == 1));
    // Sent once each: no per-report waiting, no needless resubmission.
    assert_eq!(c.calls.len(), 60);
}

#[tokio::test(start_paused = true)]
async fn a_transaction_dropped_from_the_mempool_is_sent_again_with_the_same_bytes() {
    let rpc = FakeRpc::default();
    rpc.0.lock().unwrap().script = vec![Step::Drop, Step::Drop];
    let r = Reporter::start(cfg(&["a", "b"]), key(), rpc.clone()).unwrap();
    r.record(rec(1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let resubmitted = r
        .metrics()
        .resubmitted
        .load(std::sync::atomic::Ordering::Relaxed);
    let out = shut(r).await;
    assert_eq!(all_landed(&out), 1);
    let c = rpc.0.lock().unwrap();
    assert_eq!(c.calls.len(), 3, "two dropped, the third lands");
    assert_eq!(c.sent.len(), 1, "every time the same bytes");
    assert_eq!(c.landed.len(), 1);
    assert_eq!(resubmitted, 2);
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_is_confirmed_from_its_block_without_the_tx_indexer() {
    let rpc = FakeRpc::default();
    {
        let mut c = rpc.0.lock().unwrap();
        c.indexer = false;
        c.script = vec![Step::LoseAck, Step::LoseAck];
    }
    let r = Reporter::start(cfg(&["a", "b"]), key(), rpc.clone()).unwrap();
    r.record(rec(1)).await.unwrap();
    let out = shut(r).await;
    // Landed in block 1 (the follower read it; a CheckTx duplicate answer
    // has no height).
    assert!(
        matches!(
            out.as_slice(),
            [ReportOutcome::Landed {
                records: 1,
                height: 1,
                ..
            }]
        ),
        "{out:?}"
    );
    let c = rpc.0.lock().unwrap();
    assert_eq!(c.landed.len(), 1);
    assert_eq!(c.inclusions.values().copied().collect::<Vec<_>>(), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn claims_full_is_retried_and_a_second_copy_in_a_block_counts_once() {
    let rpc = FakeRpc::default();
    rpc.0.lock().unwrap().script = vec![Step::ClaimsFull, Step::Twice];
    let r = Reporter::start(cfg(&["a"]), key(), rpc.clone()).unwrap();
    r.record(rec(1)).await.unwrap();
    let out = shut(r).await;
    assert_eq!(all_landed(&out), 1, "{out:?}");
    // Let the second copy reach its block.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut c = rpc.0.lock().unwrap();
    c.advance();
    assert_eq!(c.inclusions.values().copied().collect::<Vec<_>>(), vec![2]);
    assert_eq!(c.landed.len(), 1, "the second copy got code 7");
}

#[tokio::test(start_paused = true)]
async fn a_full_mempool_is_retried_until_the_report_lands() {
    let rpc = FakeRpc::default();
    rpc.0.lock().unwrap().script = vec![Step::MempoolFull, Step::MempoolFull];
    let r = Reporter::start(cfg(&["a"]), key(), rpc.clone()).unwrap();
    r.record(rec(1)).await.unwrap();
    let out = shut(r).await;
    assert_eq!(all_landed(&out), 1, "{out:?}");
    let c = rpc.0.lock().unwrap();
    assert_eq!(c.landed.len(), 1);
}

fn any_step() -> impl proptest::strategy::Strategy<Value = Option<Step>> {
    use proptest::prelude::*;
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(Step::Refuse)),
        1 => Just(Some(Step::LoseAck)),
        1 => Just(Some(Step::Unavailable)),
        1 => Just(Some(Step::InCacheNotYet)),
        1 => Just(Some(Step::Drop)),
        1 => Just(Some(Step::Twice)),
        1 => Just(Some(Step::ClaimsFull)),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Whatever happens to broadcasts and their answers, every record lands
    /// exactly once, each report always as the same bytes.
    #[test]
    fn every_report_lands_exactly_once_under_lost_and_repeated_answers(
        script in proptest::collection::vec(any_step(), 0..40),
        n in 1usize..4000,
        max_records in 1usize..=1000,
        indexer in proptest::bool::ANY,
        dead_first in proptest::bool::ANY,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let rpc = FakeRpc::default();
        {
            let mut c = rpc.0.lock().unwrap();
            // The faults, in order (a None: one broadcast that behaves,
            // which the empty script does anyway).
            c.script = script.iter().flatten().copied().collect();
            c.indexer = indexer;
        }
        let endpoints: &[&str] = if dead_first { &["http://dead", "a", "b"] } else { &["a", "b"] };
        let mut c = cfg(endpoints);
        c.max_records = max_records;
        c.capacity = 5000;
        let out = rt.block_on(async {
            let r = Reporter::start(c, key(), rpc.clone()).unwrap();
            for i in 0..n {
                r.record(rec(i)).await.unwrap();
            }
            shut(r).await
        });
        let landed: usize = out.iter().map(|o| match o {
            ReportOutcome::Landed { records, .. } => *records,
            _ => 0,
        }).sum();
        proptest::prop_assert_eq!(landed, n, "{:?}", out);
        let chain = rpc.0.lock().unwrap();
        proptest::prop_assert_eq!(chain.landed.values().sum::<usize>(), n);
        proptest::prop_assert_eq!(chain.landed.len(), out.len());
        proptest::prop_assert_eq!(chain.sent.len(), out.len(), "one set of bytes per report");
    }
}

/// The chain stops for longer than the report TTL with a report in its
/// mempool (an upgrade's stop): when it comes back, its first block
/// refuses the old bytes as expired (code 5), and the reporter signs the
/// report again under the same id; it lands exactly once. With
/// `reseal_for` zero, the same run loses the records.
async fn stop_longer_than_the_ttl(reseal_for: Duration) -> (Vec<ReportOutcome>, FakeRpc, u64) {
    let rpc = FakeRpc::default();
    let mut c = cfg(&["a"]);
    c.ttl = Duration::from_secs(2);
    c.reseal_for = reseal_for;
    let r = Reporter::start(c, key(), rpc.clone()).unwrap();
    for i in 0..5 {
        r.record(rec(i)).await.unwrap();
    }
    r.flush().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    rpc.0.lock().unwrap().stopped = true;
    for i in 5..15 {
        r.record(rec(i)).await.unwrap();
    }
    // Sealed by the flush interval and sent (`flush` would wait for its
    // outcome).
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Real time passes beyond the TTL while the chain makes no block (the
    // whole runtime waits: tokio's clock is paused, the wall clock is not).
    std::thread::sleep(Duration::from_millis(3500));
    rpc.0.lock().unwrap().stopped = false;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let resealed = r
        .metrics()
        .resealed
        .load(std::sync::atomic::Ordering::Relaxed);
    (shut(r).await, rpc, resealed)
}

#[tokio::test(start_paused = true)]
async fn a_report_that_expired_unseen_while_the_chain_was_stopped_lands_once_signed_again() {
    let (out, rpc, resealed) = stop_longer_than_the_ttl(Duration::from_secs(3600)).await;
    assert_eq!(all_landed(&out), 15, "{out:?}");
    assert!(resealed >= 1, "nothing was signed again");
    let c = rpc.0.lock().unwrap();
    // Each report id accepted once; the first bytes of the resealed one
    // were refused as expired in a block.
    assert_eq!(c.ids.len(), out.len());
    assert_eq!(c.landed.values().sum::<usize>(), 15);
    let expired_in_block = c
        .blocks
        .iter()
        .flat_map(|b| &b.txs)
        .filter(|t| t.code == 5)
        .count();
    assert!(expired_in_block >= 1, "the stop did not outlast the TTL");
}

#[tokio::test(start_paused = true)]
async fn without_resealing_the_same_stop_loses_the_report() {
    let (out, _, resealed) = stop_longer_than_the_ttl(Duration::ZERO).await;
    assert_eq!(resealed, 0);
    assert!(
        out.iter()
            .any(|o| matches!(o, ReportOutcome::Rejected { code: 5, .. })),
        "{out:?}"
    );
}

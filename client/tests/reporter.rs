//! The reporter against a fake RPC, on tokio's paused clock (no real
//! sleeping): batching limits, identical-bytes resubmission, duplicate =
//! success only with this report's own body hash, backpressure, permits
//! returned after a panicking transport, shutdown flush.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use prost::Message;
use sha2::{Digest, Sha256};
use tally_client::proto::{tx, Outcome, ReportUsage, UsageRecord};
use tally_client::{
    Broadcast, Failure, Included, ReportError, ReportOutcome, Reporter, ReporterConfig, Transport,
};

#[derive(Default)]
struct Chain {
    /// Report bodies landed, by tx hash.
    landed: BTreeMap<[u8; 32], usize>,
    /// Every call: endpoint and tx hash.
    calls: Vec<(String, [u8; 32])>,
    /// Upcoming behaviours, consumed in order; empty: behave.
    script: Vec<Step>,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Connection refused, nothing happens.
    Refuse,
    /// The tx lands but the answer is lost.
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

impl Transport for FakeRpc {
    async fn broadcast_commit(&self, endpoint: String, tx: Vec<u8>) -> Result<Broadcast, Failure> {
        let hash: [u8; 32] = Sha256::digest(&tx).into();
        let mut c = self.0.lock().unwrap();
        c.calls.push((endpoint.clone(), hash));
        if endpoint.contains("dead") {
            return Err(Failure::Transport("connection refused".into()));
        }
        let step = if c.script.is_empty() {
            None
        } else {
            Some(c.script.remove(0))
        };
        match step {
            Some(Step::Refuse) => Err(Failure::Transport("connection refused".into())),
            Some(Step::Unavailable) => Err(Failure::Status {
                code: 503,
                retry_after: Some("1".into()),
                body: String::new(),
            }),
            Some(Step::LoseAck) => {
                let n = records_in(&tx);
                c.landed.entry(hash).or_insert(n);
                Err(Failure::Transport("connection reset".into()))
            }
            Some(Step::InCacheNotYet) => Ok(Broadcast::InCache),
            Some(Step::Panic) => {
                drop(c);
                panic!("transport bug");
            }
            Some(Step::TakenByOther) => Ok(Broadcast::Result {
                code: 7,
                log: "duplicate".into(),
                height: 0,
                data: vec![0xAA; 32],
            }),
            Some(Step::DuplicateNoData) => Ok(Broadcast::Result {
                code: 7,
                log: "duplicate".into(),
                height: 0,
                data: Vec::new(),
            }),
            None => {
                if c.landed.contains_key(&hash) {
                    return Ok(Broadcast::Result {
                        code: 7,
                        log: "duplicate".into(),
                        height: 0,
                        data: body_hash(&tx),
                    });
                }
                let n = records_in(&tx);
                c.landed.insert(hash, n);
                Ok(Broadcast::Result {
                    code: 0,
                    log: String::new(),
                    height: c.landed.len() as u64,
                    data: Vec::new(),
                })
            }
        }
    }

    async fn lookup(&self, _endpoint: String, hash: [u8; 32]) -> Result<Option<Included>, Failure> {
        Ok(self.0.lock().unwrap().landed.get(&hash).map(|_| Included {
            height: 1,
            code: 0,
            data: Vec::new(),
        }))
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
    let landed = |rpc: &FakeRpc| -> Vec<usize> {
        let mut v: Vec<usize> = rpc.0.lock().unwrap().landed.values().copied().collect();
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
            Ok(Broadcast::Result {
                code: 13,
                log: "user u1 has 0 credits".into(),
                height: 3,
                data: Vec::new(),
            })
        }
        async fn lookup(&self, _: String, _: [u8; 32]) -> Result<Option<Included>, Failure> {
            Ok(None)
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
            Ok(Broadcast::InCache)
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

//! The poll loop against a fake hub served on 127.0.0.1 and an in-memory
//! app: which endpoints are tried, what is (not) submitted, what is handed
//! in, and what the metrics page shows. Chain state is written straight
//! into the app's committed store; every expectation is worked out by hand
//! from the state and the hub's script.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tally_abci::{Halt, TallyApp};
use tally_client::RetryPolicy;
use tally_settlement::proto::{HubCall, HubDeposit};
use tally_settlement::state::{chain as chain_state, sync as sync_state};
use tally_settlement::{BatchStatus, Params};
use tally_store::{Backend, MemBackend, Pending};

use super::*;
use crate::config::BreakerConfig;
use crate::metrics::{Metrics, Outcome};

const CHAIN: &str = "hub";
const NONCE: u64 = 7;

/// Standard base64 (the JSON-RPC encoding of values and transactions).
fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// How the fake hub answers `broadcast_tx_commit`.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// CheckTx and FinalizeBlock codes.
    Codes { check: u32, deliver: u32 },
    /// CometBFT's "tx already exists in cache" JSON-RPC error.
    InCache,
    /// HTTP 503 with `Retry-After: 30` (retryable, after 30 s).
    Unavailable,
}

/// The fake hub's script and what it was asked.
#[derive(Debug)]
struct Script {
    tip: u64,
    last_nonce: u64,
    /// Nonce -> height it settled at.
    settled: BTreeMap<u64, u64>,
    /// (hub height, deposit).
    deposits: Vec<(u64, HubDeposit)>,
    broadcast: Answer,
    /// `/last_nonce` answers with an error code.
    refuse_last_nonce: bool,
    /// Overrides every `/deposits` answer: (code, raw value).
    deposits_answer: Option<(u32, &'static str)>,
    /// "status", "query <path>", "broadcast", in arrival order.
    log: Vec<String>,
    /// Base64 of every transaction broadcast.
    txs: Vec<String>,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            tip: 100,
            last_nonce: NONCE - 1,
            settled: BTreeMap::new(),
            deposits: Vec::new(),
            broadcast: Answer::Codes {
                check: 0,
                deliver: 0,
            },
            deposits_answer: None,
            refuse_last_nonce: false,
            log: Vec::new(),
            txs: Vec::new(),
        }
    }
}

fn query_answer(s: &Script, path: &str) -> (u32, Option<Value>) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["last_nonce", CHAIN] if s.refuse_last_nonce => (16, None),
        ["last_nonce", CHAIN] => (0, Some(json!({ "last_nonce": s.last_nonce }))),
        ["batch", CHAIN, n] => match s.settled.get(&n.parse::<u64>().unwrap()) {
            Some(h) => (0, Some(json!({ "nonce": n, "height": h }))),
            None => (22, None),
        },
        ["deposits", from, to] => {
            let (from, to): (u64, u64) = (from.parse().unwrap(), to.parse().unwrap());
            let d: Vec<Value> = s
                .deposits
                .iter()
                .filter(|(h, _)| (from..=to).contains(h))
                .map(|(_, d)| json!({"seq": d.seq, "user": d.user, "amount": d.amount}))
                .collect();
            (0, Some(json!({ "deposits": d })))
        }
        _ => (20, None),
    }
}

/// (HTTP status, body) for one JSON-RPC request.
fn answer(s: &mut Script, req: &Value) -> (u16, Value) {
    let ok = |v: Value| (200, json!({"jsonrpc": "2.0", "id": req["id"], "result": v}));
    match req["method"].as_str().unwrap_or("") {
        "status" => {
            s.log.push("status".into());
            ok(json!({
                "node_info": {"network": CHAIN},
                "sync_info": {"latest_block_height": s.tip.to_string(),
                              "latest_app_hash": "", "catching_up": false}
            }))
        }
        "abci_query" => {
            let path = req["params"]["path"].as_str().unwrap_or("").to_string();
            s.log.push(format!("query {path}"));
            let (code, value) = match s.deposits_answer {
                Some((code, raw)) if path.starts_with("/deposits") => (code, b64(raw.as_bytes())),
                _ => {
                    let (code, v) = query_answer(s, &path);
                    (
                        code,
                        v.map(|v| b64(v.to_string().as_bytes())).unwrap_or_default(),
                    )
                }
            };
            ok(json!({"response": {"code": code, "log": "", "value": value,
                                   "height": s.tip.to_string()}}))
        }
        "broadcast_tx_commit" => {
            s.log.push("broadcast".into());
            s.txs
                .push(req["params"]["tx"].as_str().unwrap_or("").to_string());
            match s.broadcast {
                Answer::Codes { check, deliver } => ok(json!({
                    "check_tx": {"code": check, "log": format!("check {check}")},
                    "tx_result": {"code": deliver, "log": format!("deliver {deliver}")},
                    "height": (s.tip + 1).to_string(), "hash": "AB"
                })),
                Answer::InCache => (
                    500,
                    json!({"jsonrpc": "2.0", "id": req["id"], "error": {"code": -32603,
                        "message": "Internal error", "data": "tx already exists in cache"}}),
                ),
                Answer::Unavailable => (503, json!({})),
            }
        }
        m => panic!("fake hub: unexpected method {m}"),
    }
}

/// A hub endpoint on 127.0.0.1 answering from its [`Script`].
struct FakeHub {
    url: String,
    script: Arc<Mutex<Script>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHub {
    fn start(script: Script) -> FakeHub {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let port = server.server_addr().to_ip().unwrap().port();
        let script = Arc::new(Mutex::new(script));
        let (srv, sc) = (server.clone(), script.clone());
        let thread = std::thread::spawn(move || {
            while let Ok(mut rq) = srv.recv() {
                let mut body = String::new();
                rq.as_reader().read_to_string(&mut body).unwrap();
                let req: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let (status, v) = answer(&mut sc.lock().unwrap(), &req);
                let mut resp =
                    tiny_http::Response::from_string(v.to_string()).with_status_code(status);
                resp.add_header(
                    tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap(),
                );
                if status == 503 {
                    // A floor under the client's jittered backoff.
                    resp.add_header(tiny_http::Header::from_bytes("Retry-After", "30").unwrap());
                }
                let _ = rq.respond(resp);
            }
        });
        FakeHub {
            url: format!("http://127.0.0.1:{port}"),
            script,
            server,
            thread: Some(thread),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Script) -> T) -> T {
        f(&mut self.script.lock().unwrap())
    }

    fn log(&self) -> Vec<String> {
        self.with(|s| s.log.clone())
    }

    fn broadcasts(&self) -> usize {
        self.log().iter().filter(|l| *l == "broadcast").count()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Writes `f`'s changes to `backend` as the next committed height.
fn commit(backend: &Arc<MemBackend>, f: impl FnOnce(&mut Pending)) {
    let b: Arc<dyn Backend> = backend.clone();
    let mut p = Pending::open(b).unwrap();
    f(&mut p);
    let h = p.committed().height + 1;
    p.commit(h).unwrap();
}

/// The one pending call the test batches carry.
fn call() -> HubCall {
    HubCall {
        id: 1,
        user: "alice".into(),
        provider: "bob".into(),
        amount: 25,
        window: 3,
    }
}

/// Chain state: `params`, and nonce 7's attempt `attempt` started now
/// with its batch (call 1) signed.
fn chain_with_signed_batch(params: &Params, attempt: u32) -> Arc<MemBackend> {
    let backend = Arc::new(MemBackend::new());
    commit(&backend, |kv| {
        chain_state::put_params(kv, params).unwrap();
        sync_state::put_sync_state(kv, CHAIN, &sync_at(attempt));
        kv_put_call(kv);
        sync_state::put_batch(kv, CHAIN, NONCE, &signed_batch());
    });
    backend
}

fn kv_put_call(kv: &mut Pending) {
    sync_state::put_pending_call(kv, CHAIN, &call());
}

fn sync_at(attempt: u32) -> SyncState {
    SyncState {
        last_sync: unix_now(),
        attempt,
        current_nonce: NONCE,
        next_nonce: NONCE + 1,
        attempts_total: 9,
        failures: 2,
        ..Default::default()
    }
}

fn signed_batch() -> BatchRecord {
    BatchRecord {
        chain: CHAIN.into(),
        nonce: NONCE,
        call_ids: vec![1],
        status: BatchStatus::Signed.value(),
        signature: vec![0xAB; 96],
        ..Default::default()
    }
}

/// The hub transaction a submission of [`signed_batch`] must carry.
fn expected_tx() -> String {
    b64(&HubTx {
        sum: Some(hub_tx::Sum::SubmitBatch(SubmitBatch {
            chain: CHAIN.into(),
            nonce: NONCE,
            calls: vec![call()],
            signature: vec![0xAB; 96],
        })),
    }
    .encode_to_vec())
}

fn app(backend: &Arc<MemBackend>) -> TallyApp {
    let (halt, _log) = Halt::recording();
    TallyApp::new(backend.clone(), halt).unwrap()
}

/// Rank 0, no stagger, one confirmation, quick retries.
fn config(endpoints: Vec<String>) -> RelayConfig {
    let mut cfg = RelayConfig::new(endpoints);
    cfg.rank = Some(0);
    cfg.stagger = Duration::ZERO;
    cfg.policy = RetryPolicy {
        base: Duration::from_millis(10),
        cap: Duration::from_millis(20),
        budget: 2,
        per_try_timeout: Duration::from_secs(5),
        max_elapsed: Duration::from_secs(10),
    };
    cfg
}

fn relay(app: TallyApp, cfg: RelayConfig, metrics: &Metrics) -> Relay {
    Relay {
        hub: Hub::new(&cfg.hub_endpoints, cfg.hub_timeouts, cfg.breaker),
        transport: HttpTransport::new(cfg.policy.per_try_timeout),
        app,
        cfg,
        metrics: metrics.relay().clone(),
        done: None,
        signed_seen: None,
        in_flight: None,
    }
}

/// Waits for the submission in flight (if any) to end.
async fn settle(relay: &mut Relay) {
    if let Some(f) = relay.in_flight.take() {
        tokio::time::timeout(Duration::from_secs(20), f.task)
            .await
            .expect("submission ended")
            .unwrap();
    }
}

/// Waits (at most 2 s) for the hub's first broadcast.
async fn wait_for_broadcast(hub: &FakeHub) {
    for _ in 0..200 {
        if hub.broadcasts() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(hub.broadcasts(), 1, "{:?}", hub.log());
}

/// The value of the sample line `name` in a Prometheus text exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

fn outcome(m: &Metrics, o: &str) -> Option<f64> {
    sample(
        &m.encode(),
        &format!("tally_relay_submissions_total{{outcome=\"{o}\"}}"),
    )
}

fn failed_result(attempt: u32) -> HubResult {
    HubResult {
        chain: CHAIN.into(),
        nonce: NONCE,
        attempt,
        settled: false,
    }
}

#[tokio::test]
async fn an_endpoint_whose_breaker_is_open_is_not_tried() {
    let (a, b) = (
        FakeHub::start(Script::default()),
        FakeHub::start(Script::default()),
    );
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![a.url.clone(), b.url.clone()]);
    cfg.breaker = BreakerConfig {
        failure_threshold: 1,
        open_for: Duration::from_secs(600),
        probes: 1,
    };
    let mut r = relay(app(&backend), cfg, &metrics);
    r.hub.breakers()[0].record(false);
    r.poll().await;
    settle(&mut r).await;
    // Endpoint a: not one request, for reads or the submission.
    assert_eq!(a.log(), Vec::<String>::new());
    // Endpoint b: the tip, the deposit range 1..=10 (tip 100 is deep
    // enough), nonce 7's settlement, then the submission's last-nonce
    // check and its one broadcast, with the batch's exact bytes.
    assert_eq!(
        b.log(),
        [
            "status",
            "query /deposits/1/10",
            "query /batch/hub/7",
            "query /last_nonce/hub",
            "broadcast"
        ]
    );
    assert_eq!(b.with(|s| s.txs.clone()), [expected_tx()]);
    let text = metrics.encode();
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
    // No try went to the open endpoint: no transport retry at all.
    assert_eq!(
        sample(&text, "tally_retries_total{layer=\"transport\"}"),
        Some(0.0)
    );
    let state = |e: &str| {
        sample(
            &text,
            &format!("tally_hub_circuit_state{{endpoint=\"{e}\"}}"),
        )
    };
    assert_eq!((state(&a.url), state(&b.url)), (Some(2.0), Some(0.0)));
}

#[tokio::test]
async fn a_nonce_the_hub_already_settled_is_not_submitted() {
    // The hub's last nonce is 7 already (its /batch answer is not in yet).
    let hub = FakeHub::start(Script {
        last_nonce: NONCE,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(hub.broadcasts(), 0, "{:?}", hub.log());
    assert_eq!(outcome(&metrics, "already_settled"), Some(1.0));
    assert_eq!(outcome(&metrics, "ok"), Some(0.0));
    assert!(app.held().results().is_empty());
    // Submitted once per attempt: the next poll does not start another.
    r.poll().await;
    assert!(r.in_flight.is_none());
    // One behind: the batch is submitted.
    hub.with(|s| s.last_nonce = NONCE - 1);
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(hub.broadcasts(), 1);
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
}

#[tokio::test]
async fn hub_result_codes_are_handled_as_documented() {
    let ok = |check, deliver| Answer::Codes { check, deliver };
    // (answer, outcome label, whether `failed` is handed in)
    let cases = [
        (ok(0, 0), "ok", false),
        (ok(0, 4), "already_settled", false),
        (Answer::InCache, "in_cache", false),
        (ok(0, 3), "refused", true),
        (ok(2, 0), "refused", true),
        (ok(0, 16), "refused", true),
        (ok(0, 77), "refused", true),
        (ok(4, 0), "already_settled", false),
    ];
    for (answer, label, fails) in cases {
        let hub = FakeHub::start(Script {
            broadcast: answer,
            ..Script::default()
        });
        let backend = chain_with_signed_batch(&Params::default(), 3);
        let app = app(&backend);
        let metrics = Metrics::new("tally");
        let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
        r.poll().await;
        settle(&mut r).await;
        let case = format!("{answer:?}");
        assert_eq!(hub.broadcasts(), 1, "{case}");
        for o in Outcome::ALL {
            let want = if o.as_str() == label { 1.0 } else { 0.0 };
            assert_eq!(outcome(&metrics, o.as_str()), Some(want), "{case}: {o:?}");
        }
        let want: Vec<HubResult> = if fails {
            vec![failed_result(3)]
        } else {
            vec![]
        };
        assert_eq!(app.held().results(), want.as_slice(), "{case}");
    }
}

#[tokio::test]
async fn a_submission_in_flight_is_cancelled_once_the_hub_shows_the_nonce_settled() {
    let hub = FakeHub::start(Script {
        broadcast: Answer::Unavailable,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.confirmations = 2;
    // After the first refused try the submission waits 30 s (the hub's
    // Retry-After) to retry.
    cfg.policy = RetryPolicy {
        base: Duration::from_secs(30),
        cap: Duration::from_secs(30),
        budget: 3,
        per_try_timeout: Duration::from_secs(5),
        max_elapsed: Duration::from_secs(120),
    };
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    wait_for_broadcast(&hub).await;
    // Settled at 100 with the tip at 101: one confirmation of two. The
    // submission is moot already; nothing is handed in yet.
    hub.with(|s| {
        s.settled.insert(NONCE, 100);
        s.tip = 101;
    });
    r.poll().await;
    assert!(r.in_flight.is_none(), "still in flight");
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(outcome(&metrics, "cancelled"), Some(1.0));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(app.held().results().is_empty());
    // Two deep: `settled` is handed in, and nothing was tried again.
    hub.with(|s| s.tip = 102);
    r.poll().await;
    assert_eq!(
        app.held().results(),
        [HubResult {
            settled: true,
            ..failed_result(1)
        }]
    );
    assert_eq!(hub.broadcasts(), 1);
    assert_eq!(outcome(&metrics, "failed"), Some(0.0));
    assert_eq!(outcome(&metrics, "refused"), Some(0.0));
}

fn dep(seq: u64, user: &str, amount: u64) -> HubDeposit {
    HubDeposit {
        seq,
        user: user.into(),
        amount,
    }
}

/// A chain with no attempt running and its deposit cursor at
/// (`height`, `seq`).
fn chain_with_cursor(params: &Params, height: u64, seq: u64) -> Arc<MemBackend> {
    let backend = Arc::new(MemBackend::new());
    commit(&backend, |kv| {
        chain_state::put_params(kv, params).unwrap();
        sync_state::put_hub_height(kv, CHAIN, height);
        sync_state::put_deposit_seq(kv, CHAIN, seq);
    });
    backend
}

fn deposits_script(tip: u64) -> Script {
    Script {
        tip,
        deposits: vec![
            (2, dep(1, "alice", 5)),
            (10, dep(2, "bob", 7)),
            (11, dep(3, "carol", 9)),
            (20, dep(4, "dave", 11)),
        ],
        ..Script::default()
    }
}

#[tokio::test]
async fn a_deposit_range_waits_for_its_confirmation_depth() {
    let hub = FakeHub::start(deposits_script(12));
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.confirmations = 3;
    let mut r = relay(app.clone(), cfg, &metrics);
    // Range 1..=10 needs the tip at 13: at 12 it is not even read.
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    assert!(!hub.log().iter().any(|l| l.starts_with("query /deposits")));
    hub.with(|s| s.tip = 13);
    r.poll().await;
    assert_eq!(
        app.held().blocks(),
        [HubBlock {
            chain: CHAIN.into(),
            from_height: 1,
            to_height: 10,
            deposits: vec![dep(1, "alice", 5), dep(2, "bob", 7)],
            more: false,
        }]
    );
}

#[tokio::test]
async fn a_range_the_cursor_moved_past_is_neither_read_nor_held() {
    let hub = FakeHub::start(deposits_script(40));
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    assert_eq!(app.held().blocks().len(), 1);
    // The chain credited 1..=10: the cursor is at 11, next seq 3.
    commit(&backend, |kv| {
        sync_state::put_hub_height(kv, CHAIN, 11);
        sync_state::put_deposit_seq(kv, CHAIN, 3);
    });
    r.poll().await;
    assert_eq!(
        app.held().blocks(),
        [HubBlock {
            chain: CHAIN.into(),
            from_height: 11,
            to_height: 20,
            deposits: vec![dep(3, "carol", 9), dep(4, "dave", 11)],
            more: false,
        }]
    );
    let ranges: Vec<String> = hub
        .log()
        .into_iter()
        .filter(|l| l.starts_with("query /deposits"))
        .collect();
    assert_eq!(ranges, ["query /deposits/1/10", "query /deposits/11/20"]);
}

#[tokio::test]
async fn hand_ins_stay_within_their_caps() {
    // A range with 4 deposits and messages of at most 3.
    let hub = FakeHub::start(Script {
        tip: 40,
        deposits: (1..=4).map(|s| (s, dep(s, "u", s * 10))).collect(),
        ..Script::default()
    });
    let params = Params {
        max_block_deposits: 3,
        ..Params::default()
    };
    let backend = chain_with_cursor(&params, 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    let blocks = app.held().blocks().to_vec();
    assert_eq!(blocks.len(), 1);
    assert_eq!(
        blocks[0].deposits,
        [dep(1, "u", 10), dep(2, "u", 20), dep(3, "u", 30)]
    );
    assert!(blocks[0].more);
    // 70 attempts of nonce 7 each seen settled: 70 distinct results handed
    // in, of which the inbox keeps the newest MAX_HELD (64): attempts 7..=70.
    hub.with(|s| {
        s.settled.insert(NONCE, 30);
    });
    for attempt in 1..=70 {
        commit(&backend, |kv| {
            sync_state::put_sync_state(kv, CHAIN, &sync_at(attempt));
        });
        r.poll().await;
    }
    let held = app.held();
    assert_eq!(held.results().len(), tally_abci::inbox::MAX_HELD);
    assert_eq!(held.results().len(), 64);
    let attempts: Vec<u32> = held.results().iter().map(|x| x.attempt).collect();
    assert_eq!(attempts, (7..=70).collect::<Vec<u32>>());
    assert!(held.results().iter().all(|x| x.settled && x.nonce == NONCE));
}

/// `GET path` from `addr`, the whole answer as text.
fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test]
async fn the_metrics_page_shows_what_the_relay_saw() {
    let (a, b) = (
        FakeHub::start(Script::default()),
        FakeHub::start(Script::default()),
    );
    b.with(|s| s.tip = 20);
    let backend = chain_with_signed_batch(&Params::default(), 1);
    // Cursor at height 4; a second pending call of window 9.
    commit(&backend, |kv| {
        sync_state::put_hub_height(kv, CHAIN, 4);
        sync_state::put_pending_call(
            kv,
            CHAIN,
            &HubCall {
                id: 2,
                window: 9,
                ..call()
            },
        );
    });
    let metrics = Arc::new(Metrics::new("tally"));
    let server = crate::metrics::serve("127.0.0.1:0", metrics.clone()).unwrap();
    let mut cfg = config(vec![a.url.clone(), b.url.clone()]);
    cfg.breaker = BreakerConfig {
        failure_threshold: 1,
        open_for: Duration::from_secs(600),
        probes: 1,
    };
    let mut r = relay(app(&backend), cfg, &metrics);
    r.hub.breakers()[0].record(false);
    let before = unix_now();
    r.poll().await;
    let after = unix_now();
    settle(&mut r).await;
    let page = get(server.local_addr().unwrap(), "/metrics");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let v = |name: &str| sample(&page, name);
    // From sync_at(1): 9 attempts, 2 failures, next nonce 8 (nonces
    // 1..=7 begun), so 9 - 7 = 2 attempts beyond each batch's first.
    assert_eq!(v("tally_sync_attempts_total"), Some(9.0));
    assert_eq!(v("tally_sync_failures_total"), Some(2.0));
    assert_eq!(v("tally_retries_total{layer=\"settlement\"}"), Some(2.0));
    assert_eq!(v("tally_retries_total{layer=\"transport\"}"), Some(0.0));
    // Tip 20, cursor 4: heights 4..=20 are 17 blocks not credited.
    assert_eq!(v("tally_hub_cursor_lag_blocks"), Some(17.0));
    // Calls 1 (window 3) and 2 (window 9); the oldest window ended at
    // (3 + 1) * 60 s.
    assert_eq!(v("tally_pending_hub_calls"), Some(2.0));
    let age = v("tally_oldest_pending_call_age_seconds").unwrap() as u64;
    assert!((before - 240..=after - 240).contains(&age), "{age}");
    assert_eq!(
        v(&format!(
            "tally_hub_circuit_state{{endpoint=\"{}\"}}",
            a.url
        )),
        Some(2.0)
    );
    assert_eq!(
        v(&format!(
            "tally_hub_circuit_state{{endpoint=\"{}\"}}",
            b.url
        )),
        Some(0.0)
    );
    assert_eq!(
        v("tally_relay_submissions_total{outcome=\"ok\"}"),
        Some(1.0)
    );
}

#[tokio::test]
async fn spent_retries_fail_the_attempt() {
    // Nothing listens there: every read and try fails on the transport.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let backend = chain_with_signed_batch(&Params::default(), 2);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![dead]);
    cfg.breaker.failure_threshold = 100;
    let mut r = relay(app.clone(), cfg, &metrics);
    // The hub cannot be read, and the batch is submitted all the same: one
    // try and the budget's 2 retries, then `failed` for attempt 2.
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(app.held().results(), [failed_result(2)]);
    assert_eq!(outcome(&metrics, "failed"), Some(1.0));
    assert_eq!(
        sample(
            &metrics.encode(),
            "tally_retries_total{layer=\"transport\"}"
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn the_deadline_fails_the_attempt_and_stops_its_submission() {
    let hub = FakeHub::start(Script {
        broadcast: Answer::Unavailable,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.policy.base = Duration::from_secs(30);
    cfg.policy.cap = Duration::from_secs(30);
    cfg.policy.max_elapsed = Duration::from_secs(120);
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    wait_for_broadcast(&hub).await;
    assert!(r.in_flight.is_some());
    // The attempt started 30 s ago: the deadline (30 s) has passed.
    commit(&backend, |kv| {
        let st = SyncState {
            last_sync: unix_now() - 30,
            ..sync_at(1)
        };
        sync_state::put_sync_state(kv, CHAIN, &st);
    });
    r.poll().await;
    assert!(r.in_flight.is_none());
    assert_eq!(app.held().results(), [failed_result(1)]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(outcome(&metrics, "cancelled"), Some(1.0));
    assert_eq!(hub.broadcasts(), 1);
}

#[tokio::test]
async fn a_refused_or_garbled_deposit_answer_is_not_handed_in() {
    let hub = FakeHub::start(Script {
        deposits_answer: Some((21, "")),
        ..deposits_script(40)
    });
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    hub.with(|s| s.deposits_answer = Some((0, "not json")));
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    // A JSON-RPC answer is an answer: the endpoint's breaker stays closed.
    assert_eq!(
        r.hub.breakers()[0].state(),
        tally_client::BreakerState::Closed
    );
    hub.with(|s| s.deposits_answer = None);
    r.poll().await;
    assert_eq!(app.held().blocks().len(), 1);
    assert_eq!(
        hub.log()
            .iter()
            .filter(|l| *l == "query /deposits/1/10")
            .count(),
        3
    );
}

#[test]
fn the_relay_thread_polls_serves_metrics_and_stops() {
    let hub = FakeHub::start(Script::default());
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.poll = Duration::from_millis(20);
    cfg.metrics_listen = Some(port.to_string());
    let stop = crate::spawn(app.clone(), cfg).unwrap();
    let waited = (0..500).find(|_| {
        std::thread::sleep(Duration::from_millis(10));
        hub.broadcasts() == 1
    });
    assert!(waited.is_some(), "{:?}", hub.log());
    let page = (0..100)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            get(port, "/metrics")
        })
        .find(|p| sample(p, "tally_relay_submissions_total{outcome=\"ok\"}") == Some(1.0));
    assert!(page.is_some());
    stop.send(true).unwrap();
    // Stopped: no more reads of the hub, and the metrics port is released.
    std::thread::sleep(Duration::from_millis(200));
    let seen = hub.log().len();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(hub.log().len(), seen);
    assert_eq!(hub.broadcasts(), 1);
    let released = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        std::net::TcpListener::bind(port).is_ok()
    });
    assert!(released, "{port} still served");
}

#[tokio::test]
async fn rank_one_submits_a_stagger_after_it_first_saw_the_batch_signed() {
    let hub = FakeHub::start(Script::default());
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.rank = Some(1);
    cfg.stagger = Duration::from_millis(300);
    let mut r = relay(app(&backend), cfg, &metrics);
    r.poll().await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    r.poll().await;
    assert!(r.in_flight.is_none());
    assert_eq!(hub.broadcasts(), 0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(hub.broadcasts(), 1);
    assert_eq!(hub.with(|s| s.txs.clone()), [expected_tx()]);
}

#[tokio::test]
async fn a_new_attempt_cancels_the_previous_ones_submission() {
    let hub = FakeHub::start(Script {
        broadcast: Answer::Unavailable,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.policy.base = Duration::from_secs(30);
    cfg.policy.cap = Duration::from_secs(30);
    cfg.policy.max_elapsed = Duration::from_secs(120);
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    wait_for_broadcast(&hub).await;
    // Attempt 1 failed on the chain; attempt 2's batch is signed.
    commit(&backend, |kv| {
        sync_state::put_sync_state(kv, CHAIN, &sync_at(2));
    });
    hub.with(|s| {
        s.broadcast = Answer::Codes {
            check: 0,
            deliver: 0,
        }
    });
    r.poll().await;
    assert_eq!(r.in_flight.as_ref().map(|f| f.key), Some((NONCE, 2)));
    settle(&mut r).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(outcome(&metrics, "cancelled"), Some(1.0));
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
    assert_eq!(hub.broadcasts(), 2);
    assert!(app.held().results().is_empty());
}

#[tokio::test]
async fn a_hub_behind_or_without_a_last_nonce_still_gets_the_batch() {
    // (last nonce 3: behind the chain's 7), then (no last nonce at all).
    for (last, refused) in [(3, false), (0, true)] {
        let hub = FakeHub::start(Script {
            last_nonce: last,
            refuse_last_nonce: refused,
            ..Script::default()
        });
        let backend = chain_with_signed_batch(&Params::default(), 1);
        let metrics = Metrics::new("tally");
        let mut r = relay(app(&backend), config(vec![hub.url.clone()]), &metrics);
        r.poll().await;
        settle(&mut r).await;
        assert_eq!(hub.broadcasts(), 1, "{last} {refused}");
        assert_eq!(outcome(&metrics, "ok"), Some(1.0));
    }
}

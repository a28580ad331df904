//! The poll loop against a fake hub served on 127.0.0.1 and an in-memory
//! app: which endpoints are tried, what is (not) submitted, what is handed
//! in, and what the metrics page shows. Chain state is written straight
//! into the app's committed store; every expectation is worked out by hand
//! from the state and the hub's script.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tally_abci::{Halt, TallyApp};
use tally_client::RetryPolicy;
use tally_settlement::proto::{HubBlock, HubCall, HubDeposit};
use tally_settlement::state::{chain as chain_state, sync as sync_state};
use tally_settlement::{BatchStatus, Params};
use tally_store::{Backend, MemBackend, Pending};

use super::*;
use crate::config::BreakerConfig;
use crate::metrics::{Outcome, RelayMetrics};
use prost::Message;
use tally_hub_types::{hub_tx, HubTx, SubmitBatch};

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
    /// `/deposits` queries answer HTTP 503 (the endpoint fails the read).
    deposits_unavailable: bool,
    /// The `deposit_count` of `/deposits` answers instead of the true one.
    count_override: Option<u64>,
    /// The height `abci_query` answers say they are from instead of `tip`.
    answer_height: Option<u64>,
    /// The `height` parameter of every `abci_query`, in arrival order.
    query_heights: Vec<String>,
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
            deposits_unavailable: false,
            count_override: None,
            answer_height: None,
            query_heights: Vec::new(),
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
            // The hub's cumulative count: every deposit at or below `to`.
            let count = s
                .count_override
                .unwrap_or_else(|| s.deposits.iter().filter(|(h, _)| *h <= to).count() as u64);
            (0, Some(json!({ "deposits": d, "deposit_count": count })))
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
            s.query_heights
                .push(req["params"]["height"].as_str().unwrap_or("").to_string());
            if s.deposits_unavailable && path.starts_with("/deposits") {
                return (503, json!({}));
            }
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
            let height = s.answer_height.unwrap_or(s.tip);
            ok(json!({"response": {"code": code, "log": "", "value": value,
                                   "height": height.to_string()}}))
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

/// A JSON-RPC endpoint on 127.0.0.1 answering from its script `S` with
/// `answer` (status, body): the fake reference hub ([`FakeHub`]) and the
/// fake EVM hub (`evm.rs`).
struct Fake<S> {
    url: String,
    script: Arc<Mutex<S>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<S: Send + 'static> Fake<S> {
    fn serve(script: S, answer: fn(&mut S, &Value) -> (u16, Value)) -> Self {
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
        Fake {
            url: format!("http://127.0.0.1:{port}"),
            script,
            server,
            thread: Some(thread),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut S) -> T) -> T {
        f(&mut self.script.lock().unwrap())
    }
}

impl<S> Drop for Fake<S> {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A reference hub endpoint answering from its [`Script`].
type FakeHub = Fake<Script>;

impl FakeHub {
    fn start(script: Script) -> FakeHub {
        Fake::serve(script, answer)
    }

    fn log(&self) -> Vec<String> {
        self.with(|s| s.log.clone())
    }

    fn broadcasts(&self) -> usize {
        self.log().iter().filter(|l| *l == "broadcast").count()
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
        kind: 0,
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

/// The relay's families in a registry of their own, as the node's
/// metrics page shows them.
struct Metrics {
    registry: prometheus_client::registry::Registry,
    relay: RelayMetrics,
}

impl Metrics {
    fn new(prefix: &str) -> Self {
        let mut registry = prometheus_client::registry::Registry::with_prefix(prefix);
        let relay = RelayMetrics::register(&mut registry);
        Self { registry, relay }
    }

    fn relay(&self) -> &RelayMetrics {
        &self.relay
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry).unwrap();
        out
    }
}

/// The relay's loop over `app` (through [`crate::Chain`]).
fn relay(app: TallyApp, cfg: RelayConfig, metrics: &Metrics) -> Relay {
    let hub = Hub::new(&cfg).unwrap();
    Relay::new(Arc::new(app), hub, cfg, metrics.relay().clone())
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

mod deposits;
mod evm;
mod metrics;
mod submission;

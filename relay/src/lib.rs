//! The relay: runs inside `tallyd`, beside consensus and never inside an
//! ABCI call. After each commit it reads the chain's settlement state; it
//! submits the signed batch of the current attempt to the hub (staggered by
//! signer rank, transport retries per the client's policy, failover across
//! hub endpoints), watches the hub, and hands what it saw to the node's
//! signer: `settled` once the hub shows the nonce settled `confirmations`
//! blocks deep, `failed` when the submission was refused, the transport
//! budget was spent, or the attempt passed `attempt_deadline_secs`.
//! The chain acts on either once t validators sign it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use prost::Message;
use rand::SeedableRng;
use serde_json::{json, Value};
use tally_abci::TallyApp;
use tally_client::{
    Breaker, BreakerState, Broadcast, Failure, HttpTransport, RetryError, RetryPolicy, Transport,
};
use tally_hub::machine::{hub_tx, HubCode, HubTx, SubmitBatch};
use tally_settlement::proto::{HubBlock, HubDeposit, HubResult};
use tally_settlement::sync;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

pub mod decide;

/// How the relay behaves.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Hub CometBFT RPC endpoints, in failover order.
    pub hub_endpoints: Vec<String>,
    /// Hub blocks a result must be under before it is reported.
    pub confirmations: u64,
    /// This validator's signer rank (share index - 1): it submits
    /// `rank * stagger` after it first sees an attempt's batch signed, so
    /// one hub tx is the norm. `None` (no key share): never submits.
    pub rank: Option<u32>,
    /// Delay between ranks.
    pub stagger: Duration,
    /// How often the chain and the hub are read.
    pub poll: Duration,
    /// Transport retry policy of one submission.
    pub policy: RetryPolicy,
    /// Where to serve Prometheus metrics (`None`: not served).
    pub metrics_listen: Option<String>,
    /// Metric name prefix.
    pub metrics_prefix: String,
}

/// The relay's counters and gauges.
#[derive(Debug, Default)]
pub struct RelayMetrics {
    submissions: Mutex<BTreeMap<&'static str, u64>>,
    transport_retries: AtomicU64,
    settlement_retries: AtomicU64,
    gauges: Mutex<BTreeMap<String, f64>>,
}

impl RelayMetrics {
    fn submitted(&self, outcome: &'static str) {
        *self
            .submissions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(outcome)
            .or_default() += 1;
    }

    fn gauge(&self, name: &str, v: f64) {
        self.gauges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), v);
    }

    /// Prometheus text exposition with `prefix`.
    pub fn render(&self, prefix: &str) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "# TYPE {prefix}_relay_submissions_total counter\n"
        ));
        for (outcome, n) in self
            .submissions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            out.push_str(&format!(
                "{prefix}_relay_submissions_total{{outcome=\"{outcome}\"}} {n}\n"
            ));
        }
        out.push_str(&format!("# TYPE {prefix}_retries_total counter\n"));
        out.push_str(&format!(
            "{prefix}_retries_total{{layer=\"transport\"}} {}\n",
            self.transport_retries.load(Ordering::Relaxed)
        ));
        out.push_str(&format!(
            "{prefix}_retries_total{{layer=\"settlement\"}} {}\n",
            self.settlement_retries.load(Ordering::Relaxed)
        ));
        let mut last_family = String::new();
        for (name, v) in self.gauges.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let family = name.split('{').next().unwrap_or(name).to_string();
            if family != last_family {
                let kind = if family.ends_with("_total") {
                    "counter"
                } else {
                    "gauge"
                };
                out.push_str(&format!("# TYPE {prefix}_{family} {kind}\n"));
                last_family = family;
            }
            out.push_str(&format!("{prefix}_{name} {v}\n"));
        }
        out
    }
}

/// Why a hub read failed.
#[derive(Debug, thiserror::Error)]
#[error("hub: {0}")]
pub struct HubError(String);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Reads from the hub through its CometBFT RPC. Every read goes through
/// the endpoints' circuit breakers (shared with submissions): an endpoint
/// whose breaker is open is skipped unless every one is.
#[derive(Clone, Debug)]
struct Hub {
    endpoints: Vec<String>,
    breakers: Arc<Vec<Breaker>>,
    agent: ureq::Agent,
}

/// Endpoint indexes to try, in failover order: those whose breaker is not
/// open, or all of them if every breaker is open.
fn usable(breakers: &[Breaker]) -> Vec<usize> {
    let open = |i: &usize| breakers[*i].state() == BreakerState::Open;
    let mut v: Vec<usize> = (0..breakers.len()).filter(|i| !open(i)).collect();
    if v.is_empty() {
        v = (0..breakers.len()).collect();
    }
    v
}

impl Hub {
    fn call(&self, method: &str, params: Value) -> Result<Value, HubError> {
        let mut last = String::from("no endpoint");
        for i in usable(&self.breakers) {
            let b = &self.breakers[i];
            if !b.allow() {
                last = format!("{}: circuit open", self.endpoints[i]);
                continue;
            }
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
            let got = self
                .agent
                .post(&self.endpoints[i])
                .send_json(body)
                .map_err(|e| e.to_string())
                .and_then(|r| r.into_json::<Value>().map_err(|e| e.to_string()));
            b.record(got.is_ok());
            match got {
                Ok(v) => return Ok(v["result"].clone()),
                Err(e) => last = format!("{}: {e}", self.endpoints[i]),
            }
        }
        Err(HubError(last))
    }

    /// The hub's latest height.
    fn tip(&self) -> Result<u64, HubError> {
        let r = self.call("status", json!({}))?;
        r["sync_info"]["latest_block_height"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| HubError("no height in status".into()))
    }

    /// The JSON value of the hub's query `path`; `None` if the hub answered
    /// it with an error code (logged at debug level).
    fn query(&self, path: &str) -> Result<Option<Value>, HubError> {
        let r = self.call(
            "abci_query",
            json!({"path": path, "data": "", "height": "0", "prove": false}),
        )?;
        let resp = &r["response"];
        if resp["code"].as_u64().unwrap_or(0) != 0 {
            tracing::debug!(path, code = %resp["code"], log = %resp["log"], "hub query refused");
            return Ok(None);
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(resp["value"].as_str().unwrap_or(""))
            .map_err(|e| HubError(format!("{path}: {e}")))?;
        serde_json::from_slice(&raw)
            .map(Some)
            .map_err(|e| HubError(format!("{path}: {e}")))
    }

    /// Deposits in hub heights `from..=to`, by sequence number.
    fn deposits(&self, from: u64, to: u64) -> Result<Vec<HubDeposit>, HubError> {
        let path = format!("/deposits/{from}/{to}");
        let v = self
            .query(&path)?
            .ok_or_else(|| HubError(format!("{path} refused")))?;
        let mut out: Vec<HubDeposit> = v["deposits"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| HubDeposit {
                        seq: d["seq"].as_u64().unwrap_or(0),
                        user: d["user"].as_str().unwrap_or("").to_string(),
                        amount: d["amount"].as_u64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by_key(|d| d.seq);
        Ok(out)
    }

    /// The height at which `nonce` of `chain` settled on the hub, if it did.
    fn settled_at(&self, chain: &str, nonce: u64) -> Result<Option<u64>, HubError> {
        Ok(self
            .query(&format!("/batch/{chain}/{nonce}"))?
            .and_then(|v| v["height"].as_u64()))
    }

    /// The last nonce of `chain` the hub settled (0: none yet).
    fn last_nonce(&self, chain: &str) -> Result<u64, HubError> {
        let path = format!("/last_nonce/{chain}");
        self.query(&path)?
            .and_then(|v| v["last_nonce"].as_u64())
            .ok_or_else(|| HubError(format!("{path}: no last_nonce")))
    }
}

/// Starts the relay on its own thread; returns the sender that stops it.
pub fn spawn(app: TallyApp, cfg: RelayConfig) -> std::io::Result<watch::Sender<bool>> {
    let (stop, rx) = watch::channel(false);
    std::thread::Builder::new()
        .name("tally-relay".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "relay runtime failed to start");
                    return;
                }
            };
            rt.block_on(run(app, cfg, rx));
        })?;
    Ok(stop)
}

async fn serve_metrics(addr: String, prefix: String, metrics: Arc<RelayMetrics>) {
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(addr, error = %e, "metrics endpoint not served");
            return;
        }
    };
    tracing::info!(addr, "Prometheus metrics at /metrics");
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let body = metrics.render(&prefix);
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = sock.read(&mut buf).await;
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}

/// A submission running as its own task, so the loop keeps observing the
/// hub (and can stop it once the nonce settled or the attempt ended).
struct InFlight {
    key: (u64, u32),
    task: tokio::task::JoinHandle<()>,
    cancel: watch::Sender<bool>,
}

impl InFlight {
    /// No further tries: a try on the wire still completes (and its
    /// outcome is recorded), a wait before the next one ends at once.
    fn cancel(self) {
        let _ = self.cancel.send(true);
    }
}

/// Everything one submission needs, owned so it can run as a task.
struct Submission {
    app: TallyApp,
    /// Its endpoints and breakers are the submission's too.
    hub: Hub,
    metrics: Arc<RelayMetrics>,
    transport: HttpTransport,
    policy: RetryPolicy,
    shutdown: watch::Receiver<bool>,
    chain: String,
    nonce: u64,
    attempt: u32,
    tx: Vec<u8>,
}

impl Submission {
    async fn run(mut self) {
        let (nonce, attempt) = (self.nonce, self.attempt);
        // The hub's last settled nonce first: a nonce it already settled
        // needs no transaction (an unreadable hub is left to the tries).
        let (hub, chain) = (self.hub.clone(), self.chain.clone());
        match tokio::task::spawn_blocking(move || hub.last_nonce(&chain)).await {
            Ok(Ok(last)) if last >= nonce => {
                self.metrics.submitted("already_settled");
                tracing::info!(
                    nonce,
                    attempt,
                    last,
                    "the hub already settled this nonce; nothing to submit"
                );
                return;
            }
            Ok(Ok(last)) if last + 1 < nonce => tracing::warn!(
                nonce,
                attempt,
                last,
                "the hub is behind the chain's nonces; submitting anyway (it will refuse a gap)"
            ),
            _ => {}
        }
        let usable = usable(&self.hub.breakers);
        let mut rng = rand::rngs::StdRng::from_entropy();
        let (breakers, metrics, transport, tx, endpoints) = (
            &self.hub.breakers,
            &self.metrics,
            &self.transport,
            &self.tx,
            &self.hub.endpoints,
        );
        let r = self
            .policy
            .run(&usable, &mut self.shutdown, &mut rng, |i: &usize, n| {
                let i = *i;
                if n > 1 {
                    metrics.transport_retries.fetch_add(1, Ordering::Relaxed);
                }
                // A half-open breaker takes a probe only when it is tried.
                let allowed = breakers[i].allow();
                let fut = transport.broadcast_commit(endpoints[i].clone(), tx.clone());
                let endpoint = endpoints[i].clone();
                async move {
                    if !allowed {
                        return Err(Failure::Transport(format!("{endpoint}: circuit open")));
                    }
                    tracing::debug!(nonce, attempt, endpoint, try_no = n, "submitting to the hub");
                    let r = fut.await;
                    breakers[i].record(r.is_ok());
                    if let Err(e) = &r {
                        tracing::info!(nonce, attempt, endpoint, try_no = n, error = %e, "hub submission try failed");
                    }
                    r
                }
            })
            .await;
        let result = |settled| HubResult {
            chain: self.chain.clone(),
            nonce,
            attempt,
            settled,
        };
        match r {
            Ok(Broadcast::Result { code, log, height })
                if code == HubCode::Ok as u32 || code == HubCode::AlreadySettled as u32 =>
            {
                self.metrics
                    .submitted(if code == 0 { "ok" } else { "already_settled" });
                tracing::info!(
                    nonce,
                    attempt,
                    code,
                    log,
                    height,
                    "batch submitted to the hub"
                );
            }
            Ok(Broadcast::InCache) => {
                self.metrics.submitted("in_cache");
                tracing::info!(
                    nonce,
                    attempt,
                    "batch already in the hub's mempool or a block"
                )
            }
            Ok(Broadcast::Result { code, log, .. }) => {
                tracing::warn!(
                    nonce,
                    attempt,
                    code,
                    log,
                    "hub refused the batch; signing failed"
                );
                self.metrics.submitted("refused");
                self.app.hand_in(result(false));
            }
            Err(RetryError::Shutdown) => {
                // The hub settled the nonce, the attempt ended, or the node
                // is stopping: no further tries.
                self.metrics.submitted("cancelled");
                tracing::info!(
                    nonce,
                    attempt,
                    "submission stopped before its retries were spent"
                );
            }
            Err(e) => {
                tracing::warn!(nonce, attempt, error = %e, layer = "transport", "submission failed; signing failed");
                self.metrics.submitted("failed");
                self.app.hand_in(result(false));
            }
        }
    }
}

async fn run(app: TallyApp, cfg: RelayConfig, mut stop: watch::Receiver<bool>) {
    let metrics = Arc::new(RelayMetrics::default());
    if let Some(addr) = cfg.metrics_listen.clone() {
        tokio::spawn(serve_metrics(
            addr,
            cfg.metrics_prefix.clone(),
            metrics.clone(),
        ));
    }
    let breakers: Arc<Vec<Breaker>> = Arc::new(
        cfg.hub_endpoints
            .iter()
            .map(|_| Breaker::new(3, Duration::from_secs(10), 1))
            .collect(),
    );
    let hub = Hub {
        endpoints: cfg.hub_endpoints.clone(),
        breakers: breakers.clone(),
        agent: ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .build(),
    };
    let transport = HttpTransport::new(cfg.policy.per_try_timeout);
    // (nonce, attempt) whose submission already started here.
    let mut done: Option<(u64, u32)> = None;
    // When this relay first saw (nonce, attempt) signed: ranks are
    // staggered from there, so a slow signing round does not let every
    // relay submit at once.
    let mut signed_seen: Option<((u64, u32), tokio::time::Instant)> = None;
    let mut in_flight: Option<InFlight> = None;
    match cfg.rank {
        Some(rank) => tracing::info!(hub = ?cfg.hub_endpoints, rank, "relay started"),
        None => tracing::info!(
            hub = ?cfg.hub_endpoints,
            "relay started without a key share: observes the hub, never submits"
        ),
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(cfg.poll) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            if let Some(f) = in_flight.take() {
                f.task.abort();
            }
            return; // the runtime, and any cancelled task, ends with the thread
        }
        if in_flight.as_ref().is_some_and(|f| f.task.is_finished()) {
            in_flight = None;
        }
        let kv = app.committed_state();
        let Ok(p) = tally_settlement::params(kv) else {
            continue;
        };
        // The hub's tip, read once per poll for deposits and settlement.
        let h = hub.clone();
        let tip = match tokio::task::spawn_blocking(move || h.tip()).await {
            Ok(Ok(tip)) => Some(tip),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "hub not readable");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "hub read task failed");
                None
            }
        };
        // Deposits: the next fixed range of hub heights, once it is
        // `confirmations` blocks deep, goes to the signer.
        if let (Ok(sync::HubCursor { height: cursor, .. }), Some(tip)) =
            (sync::hub_cursor(kv, &p.hub_chain), tip)
        {
            metrics.gauge(
                "hub_cursor_lag_blocks",
                tip.saturating_sub(cursor.saturating_sub(1)) as f64,
            );
            if let Some((from, to)) =
                decide::deposit_range(cursor, p.hub_block_range, tip, cfg.confirmations)
            {
                let h = hub.clone();
                match tokio::task::spawn_blocking(move || h.deposits(from, to)).await {
                    Ok(Ok(deposits)) => app.hand_in(HubBlock {
                        chain: p.hub_chain.clone(),
                        from_height: from,
                        to_height: to,
                        deposits,
                    }),
                    Ok(Err(e)) => tracing::debug!(error = %e, "hub deposits not readable"),
                    Err(e) => tracing::warn!(error = %e, "hub read task failed"),
                }
            }
        }
        let Ok(st) = sync::sync_state(kv, &p.hub_chain) else {
            continue;
        };
        metrics.gauge("sync_attempts_total", st.attempts_total as f64);
        metrics.gauge("sync_failures_total", st.failures as f64);
        // Attempts beyond each batch's first: the chain's settlement retries.
        metrics.settlement_retries.store(
            st.attempts_total.saturating_sub(st.next_nonce.max(1) - 1),
            Ordering::Relaxed,
        );
        if let Ok(pending) = sync::pending_calls(kv, &p.hub_chain, None, 1000) {
            metrics.gauge("pending_hub_calls", pending.len() as f64);
            let oldest = pending
                .first()
                .map(|c| unix_now().saturating_sub((c.window + 1) * p.settlement_window_secs))
                .unwrap_or(0);
            metrics.gauge("oldest_pending_call_age_seconds", oldest as f64);
        }
        for (e, b) in cfg.hub_endpoints.iter().zip(breakers.iter()) {
            metrics.gauge(
                &format!("hub_circuit_state{{endpoint=\"{e}\"}}"),
                f64::from(b.state().gauge()),
            );
        }
        let key = (st.current_nonce, st.attempt);
        // A submission for an attempt that is no longer current is moot.
        if let Some(f) = in_flight.take_if(|f| f.key != key) {
            f.cancel();
        }
        let (chain, nonce, attempt) = (p.hub_chain.clone(), st.current_nonce, st.attempt);
        if nonce == 0 || attempt == 0 {
            continue;
        }
        let batch = sync::batch(kv, &chain, nonce).ok().flatten();
        // Observe the hub: has it settled this nonce, and how deep?
        let view = match tip {
            Some(tip) => {
                let (h, c) = (hub.clone(), chain.clone());
                tokio::task::spawn_blocking(move || h.settled_at(&c, nonce))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|settled_at| decide::HubView { settled_at, tip })
            }
            None => None,
        };
        let now = tokio::time::Instant::now();
        let since_signed = match (&batch, signed_seen) {
            (Some(b), Some((k, t)))
                if b.status == sync::BatchStatus::Signed.value() && k == key =>
            {
                Some(now.duration_since(t))
            }
            (Some(b), _) if b.status == sync::BatchStatus::Signed.value() => {
                signed_seen = Some((key, now));
                Some(Duration::ZERO)
            }
            _ => None,
        };
        let step = decide::decide(&decide::Inputs {
            state: &st,
            batch: batch.as_ref(),
            hub: view,
            confirmations: cfg.confirmations,
            now_unix: unix_now(),
            attempt_deadline_secs: p.attempt_deadline_secs,
            since_signed,
            rank: cfg.rank,
            stagger: cfg.stagger,
            submitted: done == Some(key),
        });
        let result = |settled| HubResult {
            chain: chain.clone(),
            nonce,
            attempt,
            settled,
        };
        let batch = match (step, batch) {
            (decide::Step::Idle, _) => continue,
            (decide::Step::SettledShallow | decide::Step::Settled, _) => {
                // Whatever this relay still had in flight is moot.
                if let Some(f) = in_flight.take() {
                    f.cancel();
                }
                if step == decide::Step::Settled {
                    app.hand_in(result(true));
                }
                continue;
            }
            (decide::Step::DeadlinePassed { elapsed }, _) => {
                if let Some(f) = in_flight.take() {
                    f.cancel();
                }
                tracing::warn!(
                    nonce,
                    attempt,
                    elapsed,
                    layer = "settlement",
                    "attempt deadline passed without settlement; signing failed"
                );
                app.hand_in(result(false));
                continue;
            }
            (decide::Step::Submit, Some(b)) => b,
            (decide::Step::Submit, None) => continue,
        };
        let rank = cfg.rank.unwrap_or_default();
        let calls: Vec<_> = batch
            .call_ids
            .iter()
            .filter_map(|id| sync::hub_call(kv, *id).ok().flatten())
            .collect();
        if calls.len() != batch.call_ids.len() {
            continue;
        }
        let tx = HubTx {
            sum: Some(hub_tx::Sum::SubmitBatch(SubmitBatch {
                chain: chain.clone(),
                nonce,
                calls,
                signature: batch.signature.clone(),
            })),
        }
        .encode_to_vec();
        done = Some(key);
        tracing::info!(
            nonce,
            attempt,
            rank,
            "submitting the signed batch to the hub"
        );
        let (cancel, cancel_rx) = watch::channel(false);
        let sub = Submission {
            app: app.clone(),
            hub: hub.clone(),
            metrics: metrics.clone(),
            transport: transport.clone(),
            policy: cfg.policy.clone(),
            shutdown: cancel_rx,
            chain,
            nonce,
            attempt,
            tx,
        };
        in_flight = Some(InFlight {
            key,
            task: tokio::spawn(sub.run()),
            cancel,
        });
    }
}

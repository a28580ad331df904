//! The open-loop load: transactions built before a step, sent at a fixed
//! rate with `broadcast_tx_async` over several keep-alive connections; a
//! block follower that notes when each sent transaction first shows up in
//! a committed block; and a reader that queries Tally while it runs.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use base64::Engine;
use ed25519_dalek::SigningKey;
use rand::Rng;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tally_settlement::proto::{ReportUsage, UsageRecord};
use tally_settlement::RouteId;

use crate::traffic::{route_path, Traffic};

/// The one place a benchmark report is put together (records, chain,
/// id, expiry), so that another encoding of the records can be switched
/// in here.
pub fn build_report(
    records: Vec<UsageRecord>,
    chain_id: &str,
    report_id: [u8; 16],
    expires_at: u64,
) -> ReportUsage {
    ReportUsage {
        chain_id: chain_id.to_string(),
        report_id: report_id.to_vec(),
        expires_at,
        records,
        route_calls: Vec::new(),
    }
}

/// Signed Tally reports over a fixed set of routes.
#[derive(Debug)]
pub struct ReportGen {
    traffic: Traffic,
    key: SigningKey,
    chain_id: String,
    run: u64,
    next: u64,
    /// Reports in the compact form (ADR 0014) instead of one record a call.
    pub compact: bool,
}

impl ReportGen {
    /// Reports signed by `key` for `chain_id`, over `dims` = users x
    /// providers x models x routes (the bench's default is 20 x 10 x 2 x 5),
    /// each record's route drawn uniformly.
    pub fn new(key: SigningKey, chain_id: &str, dims: [usize; 4]) -> Self {
        let run = rand::thread_rng().gen();
        Self {
            traffic: Traffic::new(run, key.clone(), chain_id, dims),
            key,
            chain_id: chain_id.into(),
            run,
            next: 0,
            compact: true,
        }
    }

    /// The users charged (they need balance and allowances in genesis).
    pub fn users(&self) -> &[String] {
        &self.traffic.users
    }

    /// A random route of the traffic, for queries.
    pub fn route(&mut self) -> RouteId {
        let pick = |t: &mut Traffic, v: fn(&Traffic) -> &Vec<String>| {
            let n = v(t).len();
            let i = t.pick(0..n);
            v(t)[i].clone()
        };
        RouteId {
            user: pick(&mut self.traffic, |t| &t.users),
            provider: pick(&mut self.traffic, |t| &t.providers),
            model: pick(&mut self.traffic, |t| &t.models),
            route: pick(&mut self.traffic, |t| &t.routes),
        }
    }

    /// A signed report transaction of `n` random records expiring at
    /// `expires_at` (unix seconds).
    pub fn tx(&mut self, n: usize, expires_at: u64) -> Vec<u8> {
        self.next += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.run.to_be_bytes());
        id[8..].copy_from_slice(&self.next.to_be_bytes());
        let records = self.traffic.records(n, 10);
        let mut report = build_report(records, &self.chain_id, id, expires_at);
        if self.compact {
            report = tally_settlement::calls::compact(report);
        }
        tally_settlement::sign_report(&self.key, &report)
    }
}

/// A unique kvstore transaction `key=value` of exactly `size` bytes (at
/// least the key's length + 1); only `[0-9a-z-]` besides the one `=`.
pub fn kv_tx(run: u64, i: u64, size: usize) -> Vec<u8> {
    let mut tx = format!("nb{run:016x}-{i:012}=").into_bytes();
    let pad = b"0123456789abcdefghijklmnopqrstuvwxyz";
    while tx.len() < size {
        tx.push(pad[tx.len() % pad.len()]);
    }
    tx
}

/// A step's transactions, ready to send.
#[derive(Debug, Default)]
pub struct Batch {
    /// JSON-RPC `broadcast_tx_async` (or `_sync`) request bodies.
    pub bodies: Vec<String>,
    /// Transaction size in bytes, by index.
    pub sizes: Vec<usize>,
    /// SHA-256 of each transaction to its index.
    pub index: HashMap<[u8; 32], usize>,
}

impl Batch {
    /// A batch of `txs`, sent with `broadcast_tx_async`.
    pub fn new(txs: impl Iterator<Item = Vec<u8>>) -> Self {
        Self::with_method(txs, "broadcast_tx_async")
    }

    /// A batch of `txs`, sent with the JSON-RPC method `method`
    /// (`broadcast_tx_async` or `broadcast_tx_sync`).
    pub fn with_method(txs: impl Iterator<Item = Vec<u8>>, method: &str) -> Self {
        let mut b = Batch::default();
        for tx in txs {
            let h: [u8; 32] = Sha256::digest(&tx).into();
            b.index.insert(h, b.bodies.len());
            b.sizes.push(tx.len());
            b.bodies.push(format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{"tx":"{}"}}}}"#,
                base64::engine::general_purpose::STANDARD.encode(&tx)
            ));
        }
        b
    }

    /// Mean transaction size.
    pub fn mean_size(&self) -> usize {
        self.sizes.iter().sum::<usize>() / self.sizes.len().max(1)
    }
}

/// What the senders saw.
#[derive(Debug, Default)]
pub struct Sent {
    /// Transactions sent.
    pub sent: u64,
    /// Accepted by the node.
    pub accepted: u64,
    /// Refused (JSON-RPC error) or failed (transport).
    pub refused: u64,
    /// Refusals by message (first 60 characters).
    pub reasons: BTreeMap<String, u64>,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout(Duration::from_secs(20))
        .max_idle_connections_per_host(1)
        .build()
}

/// A body, read whole (blocks may be larger than ureq's string limit).
fn read_all(r: ureq::Response) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.into_reader().read_to_end(&mut buf)?;
    Ok(buf)
}

/// Sends `batch` at `rate` tx/s from `t0` over `conns` threads, each with
/// its own keep-alive connection to one of `urls` in turn, for at most
/// `dur` (what is not sent by then is dropped). Notes each send instant in
/// `sent_at` (ns after `t0`, + 1).
pub fn send(
    batch: &Batch,
    urls: &[String],
    rate: f64,
    conns: usize,
    t0: Instant,
    dur: Duration,
    sent_at: &[AtomicU64],
) -> Sent {
    let total = Mutex::new(Sent::default());
    std::thread::scope(|s| {
        for k in 0..conns {
            let url = urls[k % urls.len()].clone();
            let total = &total;
            s.spawn(move || {
                let agent = agent();
                let mut mine = Sent::default();
                for j in (k..batch.bodies.len()).step_by(conns) {
                    let due = t0 + Duration::from_secs_f64(j as f64 / rate);
                    let now = Instant::now();
                    if due > t0 + dur || now > t0 + dur {
                        break;
                    }
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let at = t0.elapsed().as_nanos() as u64 + 1;
                    sent_at[j].store(at, Ordering::Relaxed);
                    mine.sent += 1;
                    let answer = agent
                        .post(&url)
                        .set("Content-Type", "application/json")
                        .send_string(&batch.bodies[j]);
                    let body = match answer {
                        Ok(r) | Err(ureq::Error::Status(_, r)) => read_all(r).unwrap_or_default(),
                        Err(e) => {
                            let m = e.to_string();
                            *mine
                                .reasons
                                .entry(m.chars().take(60).collect())
                                .or_default() += 1;
                            mine.refused += 1;
                            continue;
                        }
                    };
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let code = v["result"]["code"].as_u64();
                    if v.get("error").is_some() || code.is_none_or(|c| c != 0) {
                        let m = match v.get("error") {
                            Some(e) => format!("{} {}", e["message"], e["data"]),
                            None => format!("code {:?}", code),
                        };
                        *mine
                            .reasons
                            .entry(m.chars().take(60).collect())
                            .or_default() += 1;
                        mine.refused += 1;
                    } else {
                        mine.accepted += 1;
                    }
                }
                let mut t = total.lock().unwrap_or_else(|e| e.into_inner());
                t.sent += mine.sent;
                t.accepted += mine.accepted;
                t.refused += mine.refused;
                for (m, n) in mine.reasons {
                    *t.reasons.entry(m).or_default() += n;
                }
            });
        }
    });
    total.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// A committed block as the follower saw it.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// When the follower saw it, ns after the step's start.
    pub at: u64,
    /// The step's transactions in it with code 0.
    pub ok: u64,
    /// Their bytes.
    pub ok_bytes: u64,
    /// The step's transactions in it with another code.
    pub failed: u64,
}

/// Follows committed blocks of one node during a step.
#[derive(Debug)]
pub struct Follower {
    stop: Arc<AtomicBool>,
    height: Arc<AtomicU64>,
    handle: Option<JoinHandle<Vec<Seen>>>,
}

/// `GET url/path` as JSON.
pub fn get_json(agent: &ureq::Agent, url: &str) -> Result<Value> {
    let r = match agent.get(url).call() {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(e).context(url.to_string()),
    };
    Ok(serde_json::from_slice(&read_all(r)?)?)
}

/// Latest height of the node at `url`.
pub fn height(agent: &ureq::Agent, url: &str) -> Result<u64> {
    let v = get_json(agent, &format!("{url}/status"))?;
    v["result"]["sync_info"]["latest_block_height"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .context("no height in /status")
}

/// Transactions in the mempool of the node at `url`.
pub fn unconfirmed(agent: &ureq::Agent, url: &str) -> Result<u64> {
    let v = get_json(agent, &format!("{url}/num_unconfirmed_txs"))?;
    v["result"]["n_txs"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .context("no n_txs in /num_unconfirmed_txs")
}

impl Follower {
    /// Follows blocks after `from` at `url` every 100 ms, matching their
    /// transactions against `batch` and noting the first commit instant
    /// of each (ns after `t0`, + 1) in `committed_at`.
    pub fn start(
        url: String,
        from: u64,
        batch: Arc<Batch>,
        t0: Instant,
        committed_at: Arc<Vec<AtomicU64>>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let at_height = Arc::new(AtomicU64::new(from));
        let (st, hh) = (stop.clone(), at_height.clone());
        let handle = std::thread::spawn(move || {
            let agent = agent();
            let mut seen = Vec::new();
            let mut next = from + 1;
            while !st.load(Ordering::Relaxed) {
                let top = height(&agent, &url).unwrap_or(0);
                while next <= top {
                    let Ok(b) = get_json(&agent, &format!("{url}/block?height={next}")) else {
                        break;
                    };
                    let Ok(res) = get_json(&agent, &format!("{url}/block_results?height={next}"))
                    else {
                        break;
                    };
                    let at = t0.elapsed().as_nanos() as u64 + 1;
                    let mut s = Seen {
                        at,
                        ok: 0,
                        ok_bytes: 0,
                        failed: 0,
                    };
                    let txs = b["result"]["block"]["data"]["txs"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let results = res["result"]["txs_results"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    for (i, t) in txs.iter().enumerate() {
                        let Some(tx) = t
                            .as_str()
                            .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
                        else {
                            continue;
                        };
                        let h: [u8; 32] = Sha256::digest(&tx).into();
                        let Some(&idx) = batch.index.get(&h) else {
                            continue;
                        };
                        let _ = committed_at[idx].compare_exchange(
                            0,
                            at,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                        let code = results.get(i).and_then(|r| r["code"].as_u64()).unwrap_or(0);
                        if code == 0 {
                            s.ok += 1;
                            s.ok_bytes += tx.len() as u64;
                        } else {
                            s.failed += 1;
                        }
                    }
                    seen.push(s);
                    hh.store(next, Ordering::Relaxed);
                    next += 1;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        });
        Follower {
            stop,
            height: at_height,
            handle: Some(handle),
        }
    }

    /// The last height it has read.
    pub fn height(&self) -> u64 {
        self.height.load(Ordering::Relaxed)
    }

    /// Stops it; the blocks it saw.
    pub fn finish(mut self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Queries `/sla/route/...` of random routes at `per_sec` over `urls` in
/// turn until `stop`; the latencies (ms) of the queries answered with code
/// 0, and how many failed.
pub fn query_reader(
    urls: Vec<String>,
    paths: Vec<String>,
    per_sec: f64,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(Vec<f64>, u64)> {
    std::thread::spawn(move || {
        let conn =
            tally_client::rpc::Connector::new(Duration::from_secs(2), Duration::from_secs(10));
        let clients: Vec<_> = urls.iter().map(|u| conn.client(u)).collect();
        let t0 = Instant::now();
        let (mut lat, mut failed) = (Vec::new(), 0u64);
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let due = t0 + Duration::from_secs_f64(i as f64 / per_sec);
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            let q0 = Instant::now();
            match clients[i % clients.len()].abci_query(&paths[i % paths.len()]) {
                Ok(a) if a.code == 0 => lat.push(q0.elapsed().as_secs_f64() * 1e3),
                _ => failed += 1,
            }
            i += 1;
        }
        (lat, failed)
    })
}

/// Query paths of `n` random routes of `gen`.
pub fn query_paths(gen: &mut ReportGen, n: usize) -> Vec<String> {
    (0..n).map(|_| route_path(&gen.route())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_txs_are_unique_sized_and_one_pair() {
        let a = kv_tx(7, 1, 300);
        let b = kv_tx(7, 2, 300);
        assert_eq!(a.len(), 300);
        assert_ne!(a, b);
        assert_eq!(a.iter().filter(|c| **c == b'=').count(), 1);
        assert!(!a.contains(&b':'));
        // Never shorter than the key.
        assert!(kv_tx(7, 3, 5).len() > 5);
    }

    #[test]
    fn reports_verify_and_batches_index_by_sha256() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let mut g = ReportGen::new(key, "c", [20, 10, 2, 5]);
        let txs: Vec<Vec<u8>> = (0..3).map(|_| g.tx(10, 1_000)).collect();
        let b = Batch::new(txs.clone().into_iter());
        for (i, tx) in txs.iter().enumerate() {
            let h: [u8; 32] = Sha256::digest(tx).into();
            assert_eq!(b.index[&h], i);
            assert!(b.bodies[i].contains(&base64::engine::general_purpose::STANDARD.encode(tx)));
        }
        assert_eq!(b.mean_size(), txs.iter().map(Vec::len).sum::<usize>() / 3);
        // The tx decodes to a signed report of 10 records for chain "c".
        let tx = tally_settlement::decode_tx(&txs[0]).unwrap();
        let Some(tally_settlement::proto::tx::Sum::Report(r)) = tx.sum else {
            panic!("not a report")
        };
        let body = <ReportUsage as prost::Message>::decode(r.body.as_slice()).unwrap();
        // In the compact form by default: no per-call records, 10 calls
        // over the groups.
        let calls: usize = body.route_calls.iter().map(|g| g.outcomes.len()).sum();
        assert_eq!(
            (
                body.records.len(),
                calls,
                body.chain_id.as_str(),
                body.expires_at
            ),
            (0, 10, "c", 1_000)
        );
    }
}

//! A gateway simulator: reports usage records of every outcome class
//! through the [`Reporter`] as fast as the chain takes them, then prints the
//! rate and what landed. Used by the localnet demo and the benchmark.
//!
//! cargo run --release -p tally-client --example load -- \
//!   --key localnet/.data/gateway.key --endpoints http://127.0.0.1:26657,http://127.0.0.1:26667 \
//!   [--records 100000 | --seconds 60] [--provider load-prov] \
//!   [--in-flight 256] [--capacity 50000] [--users alice,bob,carol] \
//!   [--latency-ms-mean 700 [--ttft-ms-mean 150]]
//!
//! `--users`: who the records charge (0 credits each, but the chain still
//! wants an allowance for the gateway): the localnet's users by default.
//! `--in-flight`: reports sent and not yet confirmed, at most
//! (`ReporterConfig::max_in_flight`); `--capacity`: records buffered or in
//! flight, at most (`ReporterConfig::capacity`).
//!
//! `--latency-ms-mean MS`: give every record a latency bucket, drawn from an
//! exponential distribution with this mean (milliseconds), as a gateway
//! measuring its calls with `tally_client::CallTimer` would; `--ttft-ms-mean
//! MS` adds a TTFT bucket to the `ok` records the same way (never above the
//! call's latency). Off by default: records carry no buckets. Buckets need
//! a chain at app version 4; an older one refuses them (code 38), and the
//! run fails.

use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use rand::Rng;
use tally_client::proto::{Outcome, UsageRecord};
use tally_client::{CallTiming, HttpTransport, ReportOutcome, Reporter, ReporterConfig};
use tally_settlement::slo::latency::{Counts, Percentiles};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn load_key(path: &str) -> Result<SigningKey, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let seed: [u8; 32] = hex::decode(v["secret_key"].as_str().unwrap_or(""))
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("{path}: secret_key must be 32 bytes of hex"))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// A mean in milliseconds from `--name`, if given: positive and finite.
fn mean_ms(args: &[String], name: &str) -> Result<Option<f64>, String> {
    let Some(v) = arg(args, name) else {
        return Ok(None);
    };
    match v.parse::<f64>() {
        Ok(m) if m.is_finite() && m > 0.0 => Ok(Some(m)),
        _ => Err(format!("{name} {v}: a positive number of milliseconds")),
    }
}

/// A draw from the exponential distribution with mean `mean` ms.
fn exponential(rng: &mut impl Rng, mean: f64) -> Duration {
    let u: f64 = rng.gen(); // [0, 1): 1 - u is never 0
    Duration::try_from_secs_f64(-mean * (1.0 - u).ln() / 1000.0).unwrap_or(Duration::MAX)
}

/// `p50/p95/p99` of a histogram as bucket bounds, e.g. `p95 [512,724) ms`.
fn summary(p: &Percentiles) -> String {
    let est = |e: &tally_settlement::slo::latency::Estimate| match e.hi_ms {
        Some(hi) => format!("[{},{hi})", e.lo_ms),
        None => format!("[{},..)", e.lo_ms),
    };
    format!(
        "{} measured, p50 {} p95 {} p99 {} ms",
        p.measured,
        est(&p.p50),
        est(&p.p95),
        est(&p.p99)
    )
}

fn chain_id(endpoint: &str) -> Result<String, String> {
    let v: serde_json::Value = ureq::get(&format!("{endpoint}/status"))
        .call()
        .map_err(|e| format!("{endpoint}: {e}"))?
        .into_json()
        .map_err(|e| e.to_string())?;
    v["result"]["node_info"]["network"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "no chain id".into())
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let key = load_key(&arg(&args, "--key").ok_or("--key FILE is required")?)?;
    let endpoints: Vec<String> = arg(&args, "--endpoints")
        .unwrap_or_else(|| "http://127.0.0.1:26657".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let records: Option<u64> = arg(&args, "--records").and_then(|v| v.parse().ok());
    let seconds: Option<u64> = arg(&args, "--seconds").and_then(|v| v.parse().ok());
    let provider = arg(&args, "--provider").unwrap_or_else(|| "load-prov".into());
    let users: Vec<String> = arg(&args, "--users")
        .unwrap_or_else(|| "alice,bob,carol".into())
        .split(',')
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect();
    if users.is_empty() {
        return Err("--users needs at least one name".into());
    }
    let latency_mean = mean_ms(&args, "--latency-ms-mean")?;
    let ttft_mean = mean_ms(&args, "--ttft-ms-mean")?;
    if ttft_mean.is_some() && latency_mean.is_none() {
        return Err("--ttft-ms-mean needs --latency-ms-mean".into());
    }
    let mut rng = rand::thread_rng();
    let (mut latency_counts, mut ttft_counts) = (Counts::default(), Counts::default());
    let chain = endpoints
        .iter()
        .find_map(|e| chain_id(e).ok())
        .ok_or("no endpoint answers /status")?;
    let mut cfg = ReporterConfig::new(endpoints, &chain);
    if let Some(n) = arg(&args, "--in-flight") {
        cfg.max_in_flight = n.parse().map_err(|e| format!("--in-flight {n}: {e}"))?;
    }
    if let Some(n) = arg(&args, "--capacity") {
        cfg.capacity = n.parse().map_err(|e| format!("--capacity {n}: {e}"))?;
    }
    let reporter = Reporter::start(cfg, key, HttpTransport::new(Duration::from_secs(15)))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut per_class = [0u64; 7];
    loop {
        if records.is_some_and(|n| sent >= n)
            || seconds.is_some_and(|s| start.elapsed() >= Duration::from_secs(s))
        {
            break;
        }
        if records.is_none() && seconds.is_none() && sent >= 10_000 {
            break;
        }
        let class = (sent % 7) as usize;
        per_class[class] += 1;
        let mut r = UsageRecord {
            user: users[(sent % users.len() as u64) as usize].clone(),
            provider: provider.clone(),
            model: "org/load-model".into(),
            route: format!("/v1/load-{}", sent % 4),
            outcome: Outcome::ALL[class] as i32,
            units: 10,
            amount: 0,
            ..Default::default()
        };
        if let Some(mean) = latency_mean {
            let latency = exponential(&mut rng, mean);
            let ttft = ttft_mean
                .filter(|_| class == 0)
                .map(|m| exponential(&mut rng, m).min(latency));
            let timing = CallTiming { latency, ttft };
            timing.apply(&mut r);
            latency_counts.add(r.latency_bucket as u8, 1);
            if r.ttft_bucket != 0 {
                ttft_counts.add(r.ttft_bucket as u8, 1);
            }
        }
        reporter.record(r).await.map_err(|e| e.to_string())?;
        sent += 1;
    }
    let m = reporter.metrics();
    let (confirmed, resubmitted) = (
        m.confirmed.load(std::sync::atomic::Ordering::Relaxed),
        m.resubmitted.load(std::sync::atomic::Ordering::Relaxed),
    );
    let outcomes = reporter.shutdown().await;
    let secs = start.elapsed().as_secs_f64();
    let landed: usize = outcomes
        .iter()
        .map(|o| {
            if let ReportOutcome::Landed { records, .. } = o {
                *records
            } else {
                0
            }
        })
        .sum();
    let failed = outcomes
        .iter()
        .filter(|o| !matches!(o, ReportOutcome::Landed { .. }))
        .count();
    println!("sent {sent} records in {secs:.1} s: {:.0} records/s; landed {landed}; reports {} ({failed} not landed)", sent as f64 / secs, outcomes.len());
    println!(
        "  confirmed from blocks (before shutdown): {confirmed}; sent again unseen: {resubmitted}"
    );
    for (o, n) in Outcome::ALL.iter().zip(per_class) {
        println!("  {:<11} {n}", o.name());
    }
    if let Some(p) = latency_counts.percentiles() {
        println!("  latency: {}", summary(&p));
    }
    if let Some(p) = ttft_counts.percentiles() {
        println!("  ttft:    {}", summary(&p));
    }
    if landed as u64 != sent {
        return Err(format!("{} records did not land", sent - landed as u64));
    }
    Ok(())
}

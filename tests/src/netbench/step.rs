//! One step of the sweep (build, send, follow, drain, measure) and the
//! table and summary printed from the steps.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};

use super::load::{self, Batch, Follower, ReportGen};
use super::net::{App, Kind, Net};
use super::stats::{self, MempoolCounters, ProcSample, StepRow};
use super::Options;

/// Waits until every validator of `net` reached height `h`.
pub fn wait_blocks(net: &mut Net, h: u64) -> Result<()> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .build();
    let start = Instant::now();
    for url in net.rpc_urls() {
        while load::height(&agent, &url).unwrap_or(0) < h {
            net.check_alive()?;
            if start.elapsed() > Duration::from_secs(90) {
                bail!("{url} did not reach height {h} in 90 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

fn samples(net: &Net) -> Vec<(Kind, Option<ProcSample>)> {
    net.procs
        .iter()
        .map(|p| (p.kind, stats::sample(p.pid())))
        .collect()
}

/// Runs one step of `secs` at `rate` tx/s of `records`-record reports
/// (Tally) or `bytes`-byte `key=value` transactions (kvstore).
#[allow(clippy::too_many_arguments)]
pub fn run(
    net: &mut Net,
    o: &Options,
    gen: &mut ReportGen,
    records: usize,
    bytes: usize,
    rate: f64,
    step: usize,
    clk_tck: u64,
) -> Result<StepRow> {
    net.check_alive()?;
    let dur = Duration::from_secs(o.step_secs);
    let n = (rate * o.step_secs as f64).ceil() as usize;
    // Built right before the step: reports expire 500 s from now (at most
    // 600 s past the block time are accepted).
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let run_id: u64 = rand::random();
    let method = if o.sync {
        "broadcast_tx_sync"
    } else {
        "broadcast_tx_async"
    };
    let batch = Arc::new(match net.app {
        App::Tally => Batch::with_method((0..n).map(|_| gen.tx(records, now + 500)), method),
        App::Kvstore => {
            Batch::with_method((0..n as u64).map(|i| load::kv_tx(run_id, i, bytes)), method)
        }
    });
    let urls = net.rpc_urls();
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build();
    let from = load::height(&agent, &urls[0])?;
    let sent_at: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let committed_at: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let before = samples(net);
    let mp_before = mempool_counters(net, &agent);
    let t0 = Instant::now();
    let follower = Follower::start(
        urls[0].clone(),
        from,
        batch.clone(),
        t0,
        committed_at.clone(),
    );
    let stop_q = Arc::new(AtomicBool::new(false));
    let reader = (net.app == App::Tally && o.query_rate > 0.0).then(|| {
        let paths = load::query_paths(gen, 200);
        load::query_reader(urls.clone(), paths, o.query_rate, stop_q.clone())
    });
    let sent = load::send(&batch, &urls, rate, o.conns, t0, dur, &sent_at);
    if let Some(rest) = dur.checked_sub(t0.elapsed()) {
        std::thread::sleep(rest);
    }
    let window = t0.elapsed().as_secs_f64();
    let after = samples(net);
    let mp_full_at = mempool_counters(net, &agent);
    stop_q.store(true, Ordering::Relaxed);
    let (mut qlat, _qfail) = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    // Drain: every mempool empty, then the follower up to the top.
    let drain0 = Instant::now();
    while drain0.elapsed() < Duration::from_secs(o.drain_secs) {
        let left: u64 = urls
            .iter()
            .map(|u| load::unconfirmed(&agent, u).unwrap_or(1))
            .sum();
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let top = load::height(&agent, &urls[0])?;
    let f0 = Instant::now();
    while follower.height() < top && f0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = follower.finish();
    let mut mempool = mempool_counters(net, &agent).since(mp_before);
    mempool.max_size = mp_full_at.max_size;

    let (ok_rate, bytes_rate) = window_rate(&seen, dur);
    let mut lat: Vec<f64> = sent_at
        .iter()
        .zip(committed_at.iter())
        .filter_map(|(s, c)| {
            let (s, c) = (s.load(Ordering::Relaxed), c.load(Ordering::Relaxed));
            (s > 0 && c > 0).then(|| c.saturating_sub(s) as f64 / 1e6)
        })
        .collect();
    let committed_any = lat.len() as u64;
    let (lat_p50, lat_p99) = stats::p50_p99(&mut lat);
    let (query_p50, query_p99) = stats::p50_p99(&mut qlat);
    let secs = dur.as_secs_f64();
    let mut row = StepRow {
        app: net.app.name().into(),
        records,
        tx_bytes: batch.mean_size(),
        step,
        offered: rate,
        sent: sent.sent as f64 / secs,
        accepted: sent.accepted,
        refused: sent.refused,
        committed: ok_rate,
        committed_bytes: bytes_rate,
        records_s: if net.app == App::Tally {
            ok_rate * records as f64
        } else {
            0.0
        },
        ok_total: seen.iter().map(|s| s.ok).sum(),
        failed: seen.iter().map(|s| s.failed).sum(),
        lost: sent.accepted.saturating_sub(committed_any),
        lat_p50,
        lat_p99,
        query_p50,
        query_p99,
        queries: qlat.len() as u64,
        mempool,
        ..StepRow::default()
    };
    row.elapsed_s = net.started.elapsed().as_secs_f64();
    row.step_secs = secs;
    row.fds = after.iter().filter_map(|(_, a)| a.map(|a| a.fds)).sum();
    row.disk_mib = (0..net.validators())
        .map(|i| stats::dir_bytes(&net.home(i)))
        .sum::<u64>() as f64
        / (1024.0 * 1024.0);
    for ((kind, b), (_, a)) in before.iter().zip(&after) {
        let (Some(b), Some(a)) = (b, a) else { continue };
        let cpu = stats::cpu_pct(a.ticks.saturating_sub(b.ticks), clk_tck, window);
        let (rss, hwm) = (a.rss_kib as f64 / 1024.0, a.hwm_kib as f64 / 1024.0);
        let (c, r, h) = match kind {
            Kind::App => (&mut row.app_cpu, &mut row.app_rss, &mut row.app_hwm),
            Kind::Comet => (&mut row.comet_cpu, &mut row.comet_rss, &mut row.comet_hwm),
        };
        *c += cpu;
        *r += rss;
        *h += hwm;
    }
    eprintln!(
        "    mempools: {} accepted then dropped as full, {} refused by CheckTx, {} evicted by recheck, {} rechecks, {} txs in the fullest at the step's end",
        mempool.full, mempool.refused, mempool.evicted, mempool.rechecked, mempool.max_size
    );
    if !sent.reasons.is_empty() {
        let mut r: Vec<_> = sent.reasons.into_iter().collect();
        r.sort_by_key(|x| std::cmp::Reverse(x.1));
        eprintln!("    refused: {:?}", &r[..r.len().min(3)]);
    }
    Ok(row)
}

/// CometBFT's mempool counters summed over the validators (a node whose
/// metrics page does not answer adds nothing).
fn mempool_counters(net: &Net, agent: &ureq::Agent) -> MempoolCounters {
    (0..net.validators())
        .filter_map(|i| {
            let url = net.metrics_url(i);
            let r = agent.get(&url).call().ok()?;
            r.into_string().ok()
        })
        .map(|t| MempoolCounters::parse(&t))
        .fold(MempoolCounters::default(), MempoolCounters::plus)
}

/// Committed tx/s and bytes/s while the step sent: over the blocks seen
/// within `dur` that hold the step's transactions, from the first such
/// block to the last (the first one's own transactions excluded, they were
/// sent before the interval), so neither the latency before the first
/// commit nor the drain after the step counts. With fewer than two such
/// blocks, what they hold over `dur`.
pub fn window_rate(seen: &[load::Seen], dur: Duration) -> (f64, f64) {
    let end = dur.as_nanos() as u64;
    let blocks: Vec<&load::Seen> = seen.iter().filter(|s| s.at <= end && s.ok > 0).collect();
    match blocks.as_slice() {
        [first, rest @ .., last] if last.at > first.at => {
            let secs = (last.at - first.at) as f64 / 1e9;
            let ok: u64 = rest.iter().map(|s| s.ok).sum::<u64>() + last.ok;
            let bytes: u64 = rest.iter().map(|s| s.ok_bytes).sum::<u64>() + last.ok_bytes;
            (ok as f64 / secs, bytes as f64 / secs)
        }
        _ => {
            let secs = dur.as_secs_f64();
            let ok: u64 = blocks.iter().map(|s| s.ok).sum();
            let bytes: u64 = blocks.iter().map(|s| s.ok_bytes).sum();
            (ok as f64 / secs, bytes as f64 / secs)
        }
    }
}

/// The header of [`table_line`].
pub const TABLE_HEADER: &str = "app      rec  bytes step  offered    sent  accepted refused committed    KB/s   records/s  p50 ms  p99 ms lost  app CPU% comet CPU% app MiB comet MiB  q p50 q p99";

/// One table line of a step.
pub fn table_line(r: &StepRow) -> String {
    format!(
        "{:<8} {:>4} {:>6} {:>4} {:>8.0} {:>7.0} {:>9} {:>7} {:>9.1} {:>7.0} {:>11.0} {:>7.0} {:>7.0} {:>4} {:>9.0} {:>10.0} {:>7.0} {:>9.0} {:>6.1} {:>5.1}",
        r.app,
        r.records,
        r.tx_bytes,
        r.step,
        r.offered,
        r.sent,
        r.accepted,
        r.refused,
        r.committed,
        r.committed_bytes / 1024.0,
        r.records_s,
        r.lat_p50,
        r.lat_p99,
        r.lost,
        r.app_cpu,
        r.comet_cpu,
        r.app_rss,
        r.comet_rss,
        r.query_p50,
        r.query_p99
    )
}

/// The step with the highest committed tx/s of `app` at `records`.
fn best<'a>(rows: &'a [StepRow], app: &str, records: usize) -> Option<&'a StepRow> {
    rows.iter()
        .filter(|r| r.app == app && r.records == records)
        .max_by(|a, b| a.committed.total_cmp(&b.committed))
}

/// The summary: saturation per application and size, the ratio Tally /
/// kvstore at equal size, and Tally's disk use per million records.
pub fn summary(
    rows: &[StepRow],
    tally_db_start: u64,
    tally_db: u64,
    node_data: u64,
    records: u64,
) -> String {
    let mut s = String::from("saturation (step with the most committed tx/s):\n");
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.records).collect();
    sizes.dedup();
    sizes.sort_unstable();
    sizes.dedup();
    for &n in &sizes {
        for app in ["kvstore", "tally"] {
            if let Some(b) = best(rows, app, n) {
                let _ = writeln!(
                    s,
                    "  {app:<8} {n:>4}-record size ({} B): {:.1} tx/s, {:.0} KB/s{} at {:.0} offered; latency p50 {:.0} ms p99 {:.0} ms; CPU app {:.0}% cometbft {:.0}%; RSS app {:.0} MiB cometbft {:.0} MiB{}",
                    b.tx_bytes,
                    b.committed,
                    b.committed_bytes / 1024.0,
                    if app == "tally" { format!(", {:.0} records/s", b.records_s) } else { String::new() },
                    b.offered,
                    b.lat_p50,
                    b.lat_p99,
                    b.app_cpu,
                    b.comet_cpu,
                    b.app_rss,
                    b.comet_rss,
                    if app == "tally" { format!("; query p50 {:.1} ms p99 {:.1} ms", b.query_p50, b.query_p99) } else { String::new() },
                );
            }
        }
        if let (Some(t), Some(k)) = (best(rows, "tally", n), best(rows, "kvstore", n)) {
            if k.committed > 0.0 {
                let _ = writeln!(
                    s,
                    "  tally / kvstore at {n}-record size: {:.2} (tx/s), {:.2} (bytes/s)",
                    t.committed / k.committed,
                    t.committed_bytes / k.committed_bytes.max(1.0)
                );
            }
        }
    }
    if records > 0 {
        let _ = writeln!(
            s,
            "tally validator 0 on disk: tally.db {:.1} MiB ({:.1} MiB at the start), whole data dir (with CometBFT's) {:.1} MiB, for {} records committed: {:.1} MiB per million records in tally.db (growth: {:.1}; {:.1} MiB with CometBFT's)",
            tally_db as f64 / 1048576.0,
            tally_db_start as f64 / 1048576.0,
            node_data as f64 / 1048576.0,
            records,
            tally_db as f64 / 1048576.0 / (records as f64 / 1e6),
            tally_db.saturating_sub(tally_db_start) as f64 / 1048576.0 / (records as f64 / 1e6),
            node_data as f64 / 1048576.0 / (records as f64 / 1e6),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use load::Seen;

    #[test]
    fn window_rate_counts_between_the_first_and_last_block() {
        let b = |at_ms: u64, ok: u64| Seen {
            at: at_ms * 1_000_000,
            ok,
            ok_bytes: ok * 100,
            failed: 0,
        };
        // An empty block, then blocks of 10, 20, 30 at 1 s, 2 s, 3 s, and
        // one after the 4 s window (the drain): (20 + 30) / 2 s.
        let seen = [
            b(500, 0),
            b(1000, 10),
            b(2000, 20),
            b(3000, 30),
            b(4500, 99),
        ];
        let (tx, bytes) = window_rate(&seen, Duration::from_secs(4));
        assert!((tx - 25.0).abs() < 1e-9, "{tx}");
        assert!((bytes - 2500.0).abs() < 1e-6);
        // One block: its txs over the whole window.
        assert_eq!(window_rate(&[b(1000, 8)], Duration::from_secs(4)).0, 2.0);
        assert_eq!(window_rate(&[], Duration::from_secs(4)).0, 0.0);
    }
}

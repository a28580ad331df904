//! The network benchmark's pure parts: percentiles, the sweep's stop rule,
//! `/proc` readings, the directory walk and the CSV rows.

use std::fmt::Write as _;
use std::path::Path;

/// The `p` quantile (0..=1) of `sorted` by nearest rank on `len - 1`
/// (0 for an empty slice).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p.clamp(0.0, 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Sorts `v` and returns its p50 and p99.
pub fn p50_p99(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (percentile(v, 0.5), percentile(v, 0.99))
}

/// The sweep stops once committed throughput stopped rising: each of the
/// last two steps stayed below `1 + min_gain` (0.05 = 5 %) times the best
/// of the steps before it. Measured against the best so far, not the step
/// before, so that noise around the ceiling (a dip, then a rebound) does
/// not count as a gain.
pub fn saturated(committed: &[f64], min_gain: f64) -> bool {
    let n = committed.len();
    if n < 3 {
        return false;
    }
    let flat = |i: usize| {
        let best = committed[..i].iter().copied().fold(f64::MIN, f64::max);
        committed[i] < best * (1.0 + min_gain)
    };
    flat(n - 2) && flat(n - 1)
}

/// CPU time and memory of one process, from `/proc/PID/stat` and
/// `/proc/PID/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// utime + stime, in clock ticks.
    pub ticks: u64,
    /// Resident set size (VmRSS), KiB.
    pub rss_kib: u64,
    /// Peak resident set size (VmHWM), KiB.
    pub hwm_kib: u64,
    /// Open file descriptors (entries of `/proc/PID/fd`).
    pub fds: u64,
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The
/// command name (field 2) is in parentheses and may hold spaces and `)`,
/// so the fields are counted from the last `)`.
pub fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The KiB value of `key` (e.g. `VmRSS`) in a `/proc/PID/status` text.
pub fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.split(':').next() == Some(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Reads process `pid` (None once it is gone).
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcSample {
        ticks: stat_ticks(&stat)?,
        rss_kib: status_kib(&status, "VmRSS").unwrap_or(0),
        hwm_kib: status_kib(&status, "VmHWM").unwrap_or(0),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count() as u64)
            .unwrap_or(0),
    })
}

/// CPU % (100 = one core busy) of `ticks` clock ticks over `secs`.
pub fn cpu_pct(ticks: u64, clk_tck: u64, secs: f64) -> f64 {
    if secs <= 0.0 || clk_tck == 0 {
        return 0.0;
    }
    ticks as f64 / clk_tck as f64 / secs * 100.0
}

/// Bytes of the regular files under `dir` (symlinks not followed).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// One step of the sweep, as measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepRow {
    /// `tally` or `kvstore`.
    pub app: String,
    /// Records per Tally report (the kvstore's txs have the same size).
    pub records: usize,
    /// Mean transaction size, bytes.
    pub tx_bytes: usize,
    /// Step number from 1.
    pub step: usize,
    /// Offered rate, tx/s (the target).
    pub offered: f64,
    /// Rate actually sent, tx/s.
    pub sent: f64,
    /// Accepted by `broadcast_tx_async`.
    pub accepted: u64,
    /// Refused by `broadcast_tx_async` (mempool full, ...) or failed.
    pub refused: u64,
    /// Committed with code 0 while the step ran, tx/s.
    pub committed: f64,
    /// Committed bytes/s.
    pub committed_bytes: f64,
    /// Committed records/s (Tally; 0 for kvstore).
    pub records_s: f64,
    /// Committed with code 0 during the step and the drain after it.
    pub ok_total: u64,
    /// Committed with a non-zero code (whole step and drain).
    pub failed: u64,
    /// Accepted but never committed by the end of the drain.
    pub lost: u64,
    /// Broadcast to commit latency, ms.
    pub lat_p50: f64,
    /// Broadcast to commit latency, ms.
    pub lat_p99: f64,
    /// CPU % of the app processes (sum over validators; 0 for kvstore,
    /// which runs inside CometBFT).
    pub app_cpu: f64,
    /// CPU % of the CometBFT processes (sum).
    pub comet_cpu: f64,
    /// RSS of the app processes at the step's end (sum), MiB.
    pub app_rss: f64,
    /// RSS of the CometBFT processes (sum), MiB.
    pub comet_rss: f64,
    /// Peak RSS (VmHWM) of the app processes (sum), MiB.
    pub app_hwm: f64,
    /// Peak RSS (VmHWM) of the CometBFT processes (sum), MiB.
    pub comet_hwm: f64,
    /// `abci_query` latency during the step, ms (Tally).
    pub query_p50: f64,
    /// `abci_query` latency during the step, ms (Tally).
    pub query_p99: f64,
    /// Queries answered during the step.
    pub queries: u64,
    /// Seconds from the network's start to the step's end.
    pub elapsed_s: f64,
    /// The step's length, s.
    pub step_secs: f64,
    /// Open files of every process at the step's end (sum).
    pub fds: u64,
    /// Bytes under every validator's home at the step's end (sum), MiB.
    pub disk_mib: f64,
    /// CometBFT's mempool counters over the step and its drain, summed
    /// over the validators (a transaction counts at every node its gossip
    /// reached): see [`MempoolCounters`].
    pub mempool: MempoolCounters,
}

/// Why transactions left or never entered CometBFT's mempools: the deltas
/// of CometBFT's own counters (`cometbft_mempool_*` on its Prometheus
/// port). With `broadcast_tx_async` none of these reach the sender: a
/// transaction counted here was "accepted" and then vanished.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MempoolCounters {
    /// `rejected_txs`: CheckTx passed but the mempool was full when its
    /// answer came back (or the transaction was already there).
    pub full: f64,
    /// `failed_txs`: CheckTx refused it (the app's code).
    pub refused: f64,
    /// `evicted_txs`: the recheck after a block refused it.
    pub evicted: f64,
    /// `recheck_times`: transactions rechecked.
    pub rechecked: f64,
    /// Largest `size` (transactions in one mempool) seen at the step's end.
    pub max_size: f64,
}

impl MempoolCounters {
    /// The counters in Prometheus text `metrics`, one node's.
    pub fn parse(metrics: &str) -> Self {
        let get = |name: &str| -> f64 {
            metrics
                .lines()
                .filter(|l| !l.starts_with('#'))
                .filter(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        Self {
            full: get("cometbft_mempool_rejected_txs"),
            refused: get("cometbft_mempool_failed_txs"),
            evicted: get("cometbft_mempool_evicted_txs"),
            rechecked: get("cometbft_mempool_recheck_times"),
            max_size: get("cometbft_mempool_size"),
        }
    }

    /// Sums the counters of several nodes (`max_size`: the largest).
    pub fn plus(self, o: Self) -> Self {
        Self {
            full: self.full + o.full,
            refused: self.refused + o.refused,
            evicted: self.evicted + o.evicted,
            rechecked: self.rechecked + o.rechecked,
            max_size: self.max_size.max(o.max_size),
        }
    }

    /// What happened between `before` and `self` (`max_size`: `self`'s).
    pub fn since(self, before: Self) -> Self {
        Self {
            full: (self.full - before.full).max(0.0),
            refused: (self.refused - before.refused).max(0.0),
            evicted: (self.evicted - before.evicted).max(0.0),
            rechecked: (self.rechecked - before.rechecked).max(0.0),
            max_size: self.max_size,
        }
    }
}

/// The CSV header of [`csv_row`].
pub const CSV_HEADER: &str = "app,records_per_report,tx_bytes,step,offered_tx_s,sent_tx_s,accepted,refused,\
committed_tx_s,committed_bytes_s,records_s,committed_total,failed,lost,latency_p50_ms,latency_p99_ms,\
app_cpu_pct,cometbft_cpu_pct,app_rss_mib,cometbft_rss_mib,app_hwm_mib,cometbft_hwm_mib,\
query_p50_ms,query_p99_ms,queries,mempool_full,mempool_refused,mempool_evicted,mempool_rechecked,\
elapsed_s,open_files,disk_mib,step_secs";

/// One CSV line (no newline) of `r`.
pub fn csv_row(r: &StepRow) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{},{},{},{},{:.1},{:.1},{},{},{:.1},{:.0},{:.1},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.2},{:.2},{},{:.0},{:.0},{:.0},{:.0},{:.0},{},{:.1},{:.0}",
        r.app,
        r.records,
        r.tx_bytes,
        r.step,
        r.offered,
        r.sent,
        r.accepted,
        r.refused,
        r.committed,
        r.committed_bytes,
        r.records_s,
        r.ok_total,
        r.failed,
        r.lost,
        r.lat_p50,
        r.lat_p99,
        r.app_cpu,
        r.comet_cpu,
        r.app_rss,
        r.comet_rss,
        r.app_hwm,
        r.comet_hwm,
        r.query_p50,
        r.query_p99,
        r.queries,
        r.mempool.full,
        r.mempool.refused,
        r.mempool.evicted,
        r.mempool.rechecked,
        r.elapsed_s,
        r.fds,
        r.disk_mib,
        r.step_secs
    );
    s
}

/// The whole CSV file of `rows`.
pub fn csv(rows: &[StepRow]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in rows {
        s.push_str(&csv_row(r));
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mempool_counters_are_read_by_exact_name_and_summed_over_labels() {
        let text = "# HELP cometbft_mempool_rejected_txs x\n\
# TYPE cometbft_mempool_rejected_txs counter\n\
cometbft_mempool_rejected_txs{chain_id=\"a\"} 7\n\
cometbft_mempool_rejected_txs_total{chain_id=\"a\"} 1000\n\
cometbft_mempool_failed_txs{chain_id=\"a\"} 3\n\
cometbft_mempool_evicted_txs 2\n\
cometbft_mempool_recheck_times{chain_id=\"a\"} 1.5e3\n\
cometbft_mempool_size{chain_id=\"a\"} 4999\n\
cometbft_mempool_size_bytes{chain_id=\"a\"} 123456\n";
        let c = MempoolCounters::parse(text);
        assert_eq!(
            c,
            MempoolCounters {
                full: 7.0,
                refused: 3.0,
                evicted: 2.0,
                rechecked: 1500.0,
                max_size: 4999.0
            }
        );
        let two = c.plus(MempoolCounters {
            max_size: 10.0,
            full: 1.0,
            ..Default::default()
        });
        assert_eq!((two.full, two.max_size), (8.0, 4999.0));
        let d = two.since(c);
        assert_eq!((d.full, d.refused, d.max_size), (1.0, 0.0, 4999.0));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        // 1..=100: rank (99 * p) rounded, counted from 0.
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 51.0); // index 49.5 -> 50
        assert_eq!(percentile(&v, 0.99), 99.0); // index 98.01 -> 98
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        let mut w = vec![5.0, 1.0, 3.0];
        assert_eq!(p50_p99(&mut w), (3.0, 5.0));
    }

    #[test]
    fn sweep_stops_after_two_flat_steps() {
        assert!(!saturated(&[100.0, 200.0], 0.05));
        assert!(!saturated(&[100.0, 200.0, 300.0], 0.05));
        // One flat step is not enough.
        assert!(!saturated(&[100.0, 200.0, 204.0, 300.0], 0.05));
        // 200 -> 209 (+4.5 %) -> 212 (+1.4 %): stop.
        assert!(saturated(&[100.0, 200.0, 209.0, 212.0], 0.05));
        // A fall counts as no gain.
        assert!(saturated(&[300.0, 250.0, 240.0], 0.05));
        // A dip and a rebound to the old best is no gain either (the
        // measured Tally sweep: 530, 455, 503).
        assert!(saturated(&[338.0, 434.0, 486.0, 530.0, 455.0, 503.0], 0.05));
        assert!(!saturated(
            &[338.0, 434.0, 486.0, 530.0, 455.0, 569.0],
            0.05
        ));
        // Exactly +5 % is a gain.
        assert!(!saturated(&[100.0, 105.0, 110.25], 0.05));
    }

    #[test]
    fn proc_stat_and_status_parse() {
        // A command name with a space and a ')' in it; utime 1234 and
        // stime 56 are fields 14 and 15.
        let stat = "4242 (tall yd) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 1234 56 0 0 20 0 9 0 100 200000 3000 18446744073709551615";
        assert_eq!(stat_ticks(stat), Some(1290));
        assert_eq!(stat_ticks("garbage"), None);
        let status = "Name:\ttallyd\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t9\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(102_400));
        assert_eq!(status_kib(status, "VmHWM"), Some(204_800));
        assert_eq!(status_kib(status, "VmSwap"), None);
        // 250 ticks at 100 Hz over 2 s: 1.25 cores.
        assert!((cpu_pct(250, 100, 2.0) - 125.0).abs() < 1e-9);
        // This very process is readable and has used some CPU.
        let me = sample(std::process::id()).expect("own /proc entry");
        assert!(me.rss_kib > 0 && me.hwm_kib >= me.rss_kib);
    }

    #[test]
    fn dir_bytes_sums_files_below() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), [0u8; 1000]).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub").join("b"), [0u8; 24]).unwrap();
        assert_eq!(dir_bytes(d.path()), 1024);
        assert_eq!(dir_bytes(&d.path().join("missing")), 0);
    }

    #[test]
    fn csv_has_one_line_per_step_and_matching_columns() {
        let r = StepRow {
            app: "tally".into(),
            records: 100,
            tx_bytes: 8123,
            step: 2,
            offered: 75.0,
            sent: 74.96,
            accepted: 1124,
            refused: 1,
            committed: 70.24,
            committed_bytes: 570_640.6,
            records_s: 7025.0,
            ok_total: 1100,
            lat_p50: 1234.56,
            lat_p99: 2500.0,
            query_p99: 3.457,
            queries: 300,
            mempool: MempoolCounters {
                full: 12.0,
                refused: 3.0,
                evicted: 0.0,
                rechecked: 4567.0,
                max_size: 5000.0,
            },
            elapsed_s: 600.4,
            fds: 321,
            disk_mib: 45.67,
            step_secs: 60.0,
            ..StepRow::default()
        };
        let text = csv(&[r.clone(), r]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert_eq!(
            lines[1],
            "tally,100,8123,2,75.0,75.0,1124,1,70.2,570641,7025.0,1100,0,0,1234.6,2500.0,\
             0.0,0.0,0.0,0.0,0.0,0.0,0.00,3.46,300,12,3,0,4567,600,321,45.7,60"
        );
    }
}

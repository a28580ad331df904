//! `tally-bench network`: Tally against CometBFT's kvstore on the same
//! machine in one run. Each application gets its own 4-validator network on
//! loopback with the same CometBFT settings ([`net`]); an open-loop load
//! ([`load`]) offers transactions of the same sizes (Tally reports of 1, 100
//! or 1,000 records; kvstore `key=value` padded to the same bytes) at a rate
//! that rises step by step until committed throughput stops rising.
//! Per step: offered, accepted, committed tx/s and bytes/s, broadcast to
//! commit latency, CPU and memory of every process, and for Tally
//! `abci_query` latency under load. Output: a table, a CSV and a PNG
//! ([`plot`]).

pub mod delay;
pub mod load;
pub mod net;
pub mod plot;
pub mod stats;
mod step;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ed25519_dalek::SigningKey;

use delay::Latency;
use load::ReportGen;
use net::{App, Layout, Net, CHAIN_ID, VALIDATORS};
use stats::StepRow;

/// The benchmark's options.
#[derive(Clone, Debug)]
pub struct Options {
    /// Applications, in order.
    pub apps: Vec<App>,
    /// Records per Tally report; one sweep per size and application.
    pub sizes: Vec<usize>,
    /// First offered rate, tx/s (default: 100 / sqrt(records)).
    pub start_rate: Option<f64>,
    /// Factor between steps.
    pub factor: f64,
    /// Highest offered rate.
    pub rate_cap: f64,
    /// Seconds of each step.
    pub step_secs: u64,
    /// Most steps per sweep.
    pub max_steps: usize,
    /// Sending connections (threads).
    pub conns: usize,
    /// Queries per second against Tally during each step.
    pub query_rate: f64,
    /// Most seconds to wait for the mempools to drain after a step.
    pub drain_secs: u64,
    /// Output directory.
    pub out: PathBuf,
    /// Tally reports in the compact form (`route_calls`, ADR 0014, the
    /// SDK's default) or as one `UsageRecord` per call.
    pub compact: bool,
    /// Users x providers x models x routes the records are spread over.
    pub dims: [usize; 4],
    /// `broadcast_tx_sync` instead of `broadcast_tx_async`: the sender then
    /// sees CheckTx's code, and a refusal counts as refused, not lost.
    pub sync: bool,
    /// Every step at the start rate, never stopping at saturation: a soak
    /// (`--constant --step-secs 60 --max-steps 60` is an hour), with the
    /// processes' memory, open files and disk per step in `soak.png`.
    pub constant: bool,
    /// Validators, namespaces and P2P latency.
    pub layout: Layout,
    /// After each sweep, one more step at 80 % of its best committed rate.
    pub at_80: bool,
}

/// Tally's network's first port (validator i: + 10 i, + 0..=5).
pub const TALLY_PORT_BASE: u16 = 18656;
/// The kvstore network's first port.
pub const KVSTORE_PORT_BASE: u16 = 19656;

const USAGE: &str = "tally-bench network [--apps tally,kvstore] [--sizes 1,100[,1000]] \
[--records-per-report N] [--start-rate N] [--factor F] [--rate-cap N] [--step-secs N] \
[--max-steps N] [--conns N] [--query-rate N] [--drain-secs N] [--encoding compact|plain] \
[--routes U,P,M,R] [--broadcast async|sync] [--constant] [--validators N] [--app-version V] [--netns] \
[--latency DELAY_MS,JITTER_MS] [--at-80] [--out DIR] | --plot CSV [PNG] | --plot-soak CSV [PNG]";

impl Options {
    /// Parses the arguments after `network`.
    pub fn parse(args: &[String]) -> Result<Self> {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tally-target"))
            })
            .unwrap_or_else(|| PathBuf::from("target"));
        let mut o = Options {
            apps: vec![App::Tally, App::Kvstore],
            sizes: vec![1, 100],
            start_rate: None,
            factor: 1.5,
            rate_cap: 20_000.0,
            step_secs: 20,
            max_steps: 16,
            conns: 8,
            query_rate: 20.0,
            drain_secs: 90,
            out: target.join("bench").join("network"),
            compact: true,
            dims: [20, 10, 2, 5],
            sync: false,
            constant: false,
            at_80: false,
            layout: Layout {
                validators: VALIDATORS,
                netns: false,
                latency: None,
                app_version: tally_settlement::upgrade::LATEST_APP_VERSION,
            },
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = || {
                it.next()
                    .with_context(|| format!("{a} needs a value; {USAGE}"))
            };
            let num = |v: &String| -> Result<f64> {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .with_context(|| format!("{a} needs a positive number, got {v:?}"))
            };
            match a.as_str() {
                "--apps" => {
                    o.apps = val()?
                        .split(',')
                        .map(|s| match s {
                            "tally" => Ok(App::Tally),
                            "kvstore" => Ok(App::Kvstore),
                            _ => bail!("unknown app {s:?} (tally, kvstore)"),
                        })
                        .collect::<Result<_>>()?
                }
                "--sizes" | "--records-per-report" => {
                    o.sizes = val()?
                        .split(',')
                        .map(|s| {
                            s.parse()
                                .ok()
                                .filter(|n| (1..=1000).contains(n))
                                .with_context(|| format!("{a}: {s:?} is not 1..=1000"))
                        })
                        .collect::<Result<_>>()?
                }
                "--start-rate" => o.start_rate = Some(num(val()?)?),
                "--factor" => o.factor = num(val()?)?.max(1.01),
                "--rate-cap" => o.rate_cap = num(val()?)?,
                "--step-secs" => o.step_secs = num(val()?)?.ceil() as u64,
                "--max-steps" => o.max_steps = num(val()?)? as usize,
                "--conns" => o.conns = num(val()?)? as usize,
                "--query-rate" => o.query_rate = num(val()?)?,
                "--drain-secs" => o.drain_secs = num(val()?)? as u64,
                "--out" => o.out = PathBuf::from(val()?),
                "--routes" => {
                    let d: Vec<usize> = val()?
                        .split(',')
                        .map(|x| x.parse().ok().filter(|n| *n > 0))
                        .collect::<Option<_>>()
                        .with_context(|| {
                            format!("--routes is U,P,M,R (positive counts); {USAGE}")
                        })?;
                    o.dims = d
                        .try_into()
                        .map_err(|_| anyhow::anyhow!("--routes needs four counts U,P,M,R"))?;
                }
                "--encoding" => {
                    o.compact = match val()?.as_str() {
                        "compact" => true,
                        "plain" => false,
                        other => bail!("--encoding is compact or plain, got {other:?}"),
                    }
                }
                "--broadcast" => {
                    o.sync = match val()?.as_str() {
                        "async" => false,
                        "sync" => true,
                        other => bail!("--broadcast is async or sync, got {other:?}"),
                    }
                }
                "--constant" => o.constant = true,
                "--at-80" => o.at_80 = true,
                "--validators" => o.layout.validators = num(val()?)? as usize,
                "--app-version" => {
                    let v = num(val()?)? as u64;
                    if !(1..=tally_settlement::upgrade::LATEST_APP_VERSION).contains(&v) {
                        bail!(
                            "--app-version must be 1..={}, got {v}",
                            tally_settlement::upgrade::LATEST_APP_VERSION
                        );
                    }
                    o.layout.app_version = v;
                }
                "--netns" => o.layout.netns = true,
                "--latency" => {
                    let v: Vec<u64> = val()?
                        .split(',')
                        .map(|x| x.parse().ok())
                        .collect::<Option<_>>()
                        .filter(|v: &Vec<u64>| v.len() == 2 && v[0] > 0 && v[1] <= v[0])
                        .context("--latency is DELAY_MS,JITTER_MS (whole ms, delay > 0, jitter <= delay)")?;
                    o.layout.latency = Some(Latency {
                        delay: std::time::Duration::from_millis(v[0]),
                        jitter: std::time::Duration::from_millis(v[1]),
                    });
                }
                "-h" | "--help" => bail!("usage: {USAGE}"),
                other => bail!("unknown option {other:?}; usage: {USAGE}"),
            }
        }
        if o.apps.is_empty() || o.sizes.is_empty() || o.max_steps == 0 || o.conns == 0 {
            bail!("usage: {USAGE}");
        }
        Ok(o)
    }

    fn start(&self, records: usize) -> f64 {
        self.start_rate
            .unwrap_or_else(|| (100.0 / (records as f64).sqrt()).max(2.0))
    }
}

/// What one application's network left behind, for the summary.
#[derive(Debug, Default)]
struct Disk {
    tally_db_start: u64,
    tally_db: u64,
    node_data: u64,
    records: u64,
}

/// Runs the benchmark with the arguments after `network`.
pub fn main(args: &[String]) -> Result<()> {
    if let [flag, csv, rest @ ..] = args {
        if flag == "--plot" || flag == "--plot-soak" {
            // Redraw a finished run's plot from its CSV.
            let rows = plot::read_csv(&std::fs::read_to_string(csv)?)?;
            let png = rest
                .first()
                .map_or_else(|| PathBuf::from(csv).with_extension("png"), PathBuf::from);
            if flag == "--plot" {
                plot::draw(&rows, &png)?;
            } else {
                plot::draw_soak(&rows, &png)?;
            }
            println!("plot: {}", png.display());
            return Ok(());
        }
    }
    let o = Options::parse(args)?;
    std::fs::create_dir_all(&o.out)?;
    let gateway = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let mut gen = ReportGen::new(gateway.clone(), CHAIN_ID, o.dims);
    gen.compact = o.compact;
    // Tally's mean report size per record count: the kvstore's tx size.
    let sizes: Vec<(usize, usize)> = o
        .sizes
        .iter()
        .map(|&r| {
            let b = load::Batch::new((0..20).map(|_| gen.tx(r, u64::MAX / 2)));
            (r, b.mean_size())
        })
        .collect();
    let clk_tck = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100u64);
    println!(
        "network benchmark: apps {:?}, records per report {:?} (tx bytes {:?}), {} s steps, x{} from {} tx/s, {} connections, {} CPUs",
        o.apps.iter().map(|a| a.name()).collect::<Vec<_>>(),
        o.sizes,
        sizes.iter().map(|s| s.1).collect::<Vec<_>>(),
        o.step_secs,
        o.factor,
        o.sizes.iter().map(|r| format!("{:.0}", o.start(*r))).collect::<Vec<_>>().join("/"),
        o.conns,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );
    let mut rows: Vec<StepRow> = Vec::new();
    let mut disk = Disk::default();
    let mut settings: Vec<(App, Vec<(String, String)>)> = Vec::new();
    for &app in &o.apps {
        let base = match app {
            App::Tally => TALLY_PORT_BASE,
            App::Kvstore => KVSTORE_PORT_BASE,
        };
        let mut net = Net::start(app, base, &o.out, &gateway, gen.users(), o.layout)
            .with_context(|| format!("starting the {} network", app.name()))?;
        step::wait_blocks(&mut net, 3)?;
        if app == App::Tally {
            disk.tally_db_start = stats::dir_bytes(&net.home(0).join("data").join("tally.db"));
        }
        let s = net.settings()?;
        println!(
            "\n{} network up (RPC {}){}; CometBFT settings:",
            app.name(),
            net.rpc_urls().join(" "),
            if app == App::Tally {
                format!(", app version {}", o.layout.app_version)
            } else {
                String::new()
            }
        );
        for (k, v) in &s {
            println!("  {k:<28} {v}");
        }
        settings.push((app, s));
        println!("{}", step::TABLE_HEADER);
        for &(records, bytes) in &sizes {
            let mut committed = Vec::new();
            let mut rate = o.start(records);
            for n in 1..=o.max_steps {
                let row = step::run(&mut net, &o, &mut gen, records, bytes, rate, n, clk_tck)?;
                println!("{}", step::table_line(&row));
                committed.push(row.committed);
                if app == App::Tally {
                    disk.records += row.ok_total * records as u64;
                }
                rows.push(row);
                std::fs::write(o.out.join("network.csv"), stats::csv(&rows))?;
                if o.constant {
                    continue;
                }
                if stats::saturated(&committed, 0.05) || rate * o.factor > o.rate_cap {
                    break;
                }
                rate *= o.factor;
            }
            if o.at_80 && !o.constant {
                // One more step at 80 % of the best committed rate.
                let best = committed.iter().copied().fold(0.0, f64::max);
                let n = committed.len() + 1;
                let row = step::run(
                    &mut net,
                    &o,
                    &mut gen,
                    records,
                    bytes,
                    best * 0.8,
                    n,
                    clk_tck,
                )?;
                println!("{}   <- 80 % of {best:.0}", step::table_line(&row));
                if app == App::Tally {
                    disk.records += row.ok_total * records as u64;
                }
                rows.push(row);
                std::fs::write(o.out.join("network.csv"), stats::csv(&rows))?;
            }
        }
        if app == App::Tally {
            disk.tally_db = stats::dir_bytes(&net.home(0).join("data").join("tally.db"));
            disk.node_data = stats::dir_bytes(&net.home(0).join("data"));
        }
        net.stop();
    }
    if settings.len() == 2 {
        let diff: Vec<_> = settings[0]
            .1
            .iter()
            .zip(&settings[1].1)
            .filter(|(a, b)| a != b && a.0 != "proxy_app")
            .collect();
        if !diff.is_empty() {
            bail!("the networks' settings differ: {diff:?}");
        }
    }
    let csv = o.out.join("network.csv");
    std::fs::write(&csv, stats::csv(&rows))?;
    let png = o.out.join("network.png");
    if let Err(e) = plot::draw(&rows, &png) {
        eprintln!("no plot: {e:#}");
    }
    if o.constant {
        let soak = o.out.join("soak.png");
        match plot::draw_soak(&rows, &soak) {
            Ok(()) => println!("soak plot: {}", soak.display()),
            Err(e) => eprintln!("no soak plot: {e:#}"),
        }
    }
    let summary = step::summary(
        &rows,
        disk.tally_db_start,
        disk.tally_db,
        disk.node_data,
        disk.records,
    );
    print!("\n{summary}");
    std::fs::write(o.out.join("summary.txt"), &summary)?;
    println!("\nCSV: {}\nplot: {}", csv.display(), png.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn layout_options() {
        let o = Options::parse(&[]).unwrap();
        assert_eq!(
            (o.layout.validators, o.layout.netns, o.layout.latency),
            (4, false, None)
        );
        let o = Options::parse(&args(&[
            "--validators",
            "16",
            "--netns",
            "--latency",
            "50,10",
        ]))
        .unwrap();
        assert_eq!(o.layout.validators, 16);
        assert!(o.layout.netns);
        assert_eq!(
            o.layout.latency,
            Some(Latency {
                delay: std::time::Duration::from_millis(50),
                jitter: std::time::Duration::from_millis(10)
            })
        );
        for bad in ["50", "0,0", "50,60", "a,b", "50,10,1"] {
            assert!(Options::parse(&args(&["--latency", bad])).is_err(), "{bad}");
        }
    }

    #[test]
    fn constant_is_off_unless_asked_for() {
        assert!(!Options::parse(&[]).unwrap().constant);
        assert!(Options::parse(&args(&["--constant"])).unwrap().constant);
    }

    #[test]
    fn broadcast_mode_is_async_unless_sync_is_asked_for() {
        assert!(!Options::parse(&[]).unwrap().sync);
        assert!(
            Options::parse(&args(&["--broadcast", "sync"]))
                .unwrap()
                .sync
        );
        assert!(
            !Options::parse(&args(&["--broadcast", "async"]))
                .unwrap()
                .sync
        );
        let e = Options::parse(&args(&["--broadcast", "commit"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--broadcast is async or sync, got \"commit\""
        );
        let b = load::Batch::with_method([vec![1u8, 2]].into_iter(), "broadcast_tx_sync");
        assert_eq!(
            b.bodies,
            vec![r#"{"jsonrpc":"2.0","id":1,"method":"broadcast_tx_sync","params":{"tx":"AQI="}}"#]
        );
    }
}

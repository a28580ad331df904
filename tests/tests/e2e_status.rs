//! Metrics and `tallyd status` on a real 4-validator localnet (with the hub
//! chain and relays), one network shared by the named tests below, run in
//! order by `tally_tests::harness`:
//!
//! 1. `served_pages_have_every_name_the_deploy_files_use`: every `tally_*`
//!    name of `deploy/grafana/tally.json` and `deploy/prometheus/
//!    tally-rules.yml` is on validator 0's tallyd page, every `cometbft_*`
//!    name on its CometBFT page (the served text is the oracle);
//! 2. `app_metrics_count_a_landed_report`: a report of 3 records landed
//!    through RPC moves `tally_reports_accepted_total` by 1 and
//!    `tally_records_accepted_total` by 3 on every validator; one signed
//!    by a stranger moves `tally_tx_rejected_total{phase="check_tx",
//!    code="unknown_gateway"}`; `tally_app_height` follows CometBFT's height;
//!    the share is loaded;
//! 3. `status_of_a_healthy_node_exits_0`: `tallyd status --home node0`
//!    (metrics address from its app.toml) exits 0, every check passes;
//! 4. `status_with_a_frozen_app_exits_13`: validator 1's tallyd stopped
//!    with SIGSTOP (its app answers nothing): exit 13, `app_height`
//!    failing; after SIGCONT it is healthy again;
//! 5. `status_with_cometbft_stopped_exits_10`: validator 2's CometBFT
//!    stopped: exit 10; restarted: healthy again.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED,
//! failed with `TALLY_E2E_REQUIRED`) and built `tallyd` and `tally-hub`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use tally_node::records::build_report;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, run_tallyd, Localnet};
use tally_tests::metric_names::{dashboard_exprs, dashboard_path, referenced, rules_path, served};

/// Ports from here, or the next free block.
const PORT_BASE: u16 = 22656;
const WINDOW_SECS: u64 = 3600;

const TESTS: [Test<Net>; 5] = [
    Test {
        name: "served_pages_have_every_name_the_deploy_files_use",
        needs: &[],
        run: served_pages_have_every_name_the_deploy_files_use,
    },
    Test {
        name: "app_metrics_count_a_landed_report",
        needs: &[],
        run: app_metrics_count_a_landed_report,
    },
    Test {
        name: "status_of_a_healthy_node_exits_0",
        needs: &[],
        run: status_of_a_healthy_node_exits_0,
    },
    Test {
        name: "status_with_a_frozen_app_exits_13",
        needs: &[],
        run: status_with_a_frozen_app_exits_13,
    },
    Test {
        name: "status_with_cometbft_stopped_exits_10",
        needs: &[],
        run: status_with_cometbft_stopped_exits_10,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

struct Net {
    net: Localnet,
}

impl Net {
    fn start() -> Result<Self> {
        let base = free_port_base(PORT_BASE, 4)?;
        let net = Localnet::start(4, base, "500ms", WINDOW_SECS)?;
        net.wait_height(0, 3, Duration::from_secs(60))?;
        Ok(Self { net })
    }

    fn port(&self, i: usize, offset: u16) -> u16 {
        self.net.port_base() + 10 * i as u16 + offset
    }

    /// tallyd's metrics page of validator `i`.
    fn tally_page(&self, i: usize) -> Result<String> {
        get(&format!("http://127.0.0.1:{}/metrics", self.port(i, 5)))
    }

    /// CometBFT's metrics page of validator `i`.
    fn cometbft_page(&self, i: usize) -> Result<String> {
        get(&format!("http://127.0.0.1:{}/metrics", self.port(i, 4)))
    }

    fn home(&self, i: usize) -> PathBuf {
        self.net.dir().join(format!("node{i}"))
    }

    /// `kill -SIG` the process in validator `i`'s `file` (`tallyd.pid`, `cometbft.pid`).
    fn signal(&self, i: usize, file: &str, sig: &str) -> Result<()> {
        let pid = std::fs::read_to_string(self.home(i).join(file))?;
        let st = Command::new("kill")
            .args([format!("-{sig}"), pid.trim().to_string()])
            .status()?;
        ensure!(st.success(), "kill -{sig} {} failed", pid.trim());
        Ok(())
    }

    /// `tallyd status --json` for validator `i` (metrics address from its
    /// app.toml): its exit code and JSON.
    fn status(&self, i: usize) -> Result<(i32, Value)> {
        let home = self.home(i).display().to_string();
        let out = run_tallyd(&[
            "status",
            "--json",
            "--home",
            &home,
            "--node",
            &self.net.rpc_url(i),
            "--timeout",
            "3s",
        ])?;
        let code = out
            .status
            .code()
            .context("tallyd status killed by a signal")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v: Value = serde_json::from_str(stdout.trim()).with_context(|| {
            format!(
                "tallyd status printed {stdout:?}, stderr {:?}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        ensure!(
            v["exit_code"].as_i64() == Some(i64::from(code)),
            "exit {code} but JSON says {v}"
        );
        Ok((code, v))
    }

    /// Waits until `tallyd status` of validator `i` exits `want`.
    fn wait_status(&self, i: usize, want: i32, timeout: Duration) -> Result<Value> {
        let start = Instant::now();
        loop {
            let (code, v) = self.status(i)?;
            if code == want {
                return Ok(v);
            }
            if start.elapsed() > timeout {
                bail!("validator {i}: status exits {code}, want {want}: {v}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

fn get(url: &str) -> Result<String> {
    Ok(ureq::get(url)
        .timeout(Duration::from_secs(5))
        .call()
        .with_context(|| format!("GET {url}"))?
        .into_string()?)
}

/// The value of the series written exactly as `series`.
fn value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn check(v: &Value, name: &str) -> String {
    v["checks"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .map(|c| c["state"].as_str().unwrap_or("?").to_string())
        .unwrap_or_default()
}

fn served_pages_have_every_name_the_deploy_files_use(f: &mut Net) -> Result<()> {
    // The relay sets its breaker gauges on its first poll.
    let start = Instant::now();
    let tally = loop {
        let page = f.tally_page(0)?;
        if page.contains("tally_hub_circuit_state{") || start.elapsed() > Duration::from_secs(20) {
            break page;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let cometbft = f.cometbft_page(0)?;
    let (tally_names, cometbft_names) = (served(&tally), served(&cometbft));
    let json = std::fs::read_to_string(dashboard_path())?;
    let rules = std::fs::read_to_string(rules_path())?;
    let mut text = dashboard_exprs(&json)?.join("\n");
    text.push('\n');
    text.push_str(&rules);
    let used_tally = referenced(&text, &["tally"]);
    let used_cometbft = referenced(&text, &["cometbft"]);
    ensure!(used_tally.len() >= 20 && used_cometbft.len() >= 8);
    let missing = |used: &BTreeSet<String>, have: &BTreeSet<String>| -> Vec<String> {
        used.iter()
            .filter(|n| !have.contains(*n))
            .cloned()
            .collect()
    };
    let m = missing(&used_tally, &tally_names);
    ensure!(m.is_empty(), "not on tallyd's page: {m:?}\n{tally}");
    let m = missing(&used_cometbft, &cometbft_names);
    ensure!(
        m.is_empty(),
        "not on CometBFT's page: {m:?}\n{cometbft_names:?}"
    );
    println!(
        "{} tally and {} cometbft names checked",
        used_tally.len(),
        used_cometbft.len()
    );
    Ok(())
}

fn app_metrics_count_a_landed_report(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let before: Vec<String> = (0..4).map(|i| f.tally_page(i)).collect::<Result<_>>()?;
    let key = net.gateway_key()?;
    let chain_id = net.rpc(0).status()?.chain_id;
    let record = |outcome: Outcome| UsageRecord {
        user: "alice".into(),
        provider: "metrics-prov".into(),
        model: "m/1".into(),
        route: "/v1/m".into(),
        outcome: outcome as i32,
        units: 1,
        amount: 0,
        ..Default::default()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let recs = vec![
        record(Outcome::Ok),
        record(Outcome::Transient),
        record(Outcome::Client),
    ];
    let built = build_report(&key, &chain_id, recs, now + 300);
    let c = net.rpc(0).broadcast_tx_commit(&built.tx)?;
    ensure!(c.check_code == 0 && c.code == 0, "{c:?}");
    // A report signed by a key that is not a gateway's is refused by
    // CheckTx (code 2).
    let stranger = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let bad = build_report(&stranger, &chain_id, vec![record(Outcome::Ok)], now + 300).tx;
    let (code, _, _) = net.rpc(0).broadcast_tx_sync(&bad)?;
    ensure!(code == 2, "CheckTx code {code}");
    net.wait_height(3, c.height + 1, Duration::from_secs(30))?;
    for (i, old) in before.iter().enumerate() {
        let start = Instant::now();
        let page = loop {
            let p = f.tally_page(i)?;
            if value(&p, "tally_app_height").unwrap_or(0.0) >= c.height as f64
                || start.elapsed() > Duration::from_secs(20)
            {
                break p;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let d = |s: &str| value(&page, s).unwrap_or(-1.0) - value(old, s).unwrap_or(0.0);
        ensure!(
            d("tally_reports_accepted_total") == 1.0,
            "validator {i}: {page}"
        );
        ensure!(
            d("tally_records_accepted_total") == 3.0,
            "validator {i}: {page}"
        );
        ensure!(
            value(&page, "tally_bls_share_loaded") == Some(1.0),
            "validator {i}"
        );
        let comet = net.height(i) as f64;
        let app = value(&page, "tally_app_height").unwrap_or(0.0);
        ensure!(
            (comet - app).abs() <= 2.0,
            "validator {i}: app {app}, CometBFT {comet}"
        );
    }
    let page = f.tally_page(0)?;
    let s = "tally_tx_rejected_total{phase=\"check_tx\",code=\"unknown_gateway\"}";
    ensure!(
        value(&page, s).unwrap_or(0.0) - value(&before[0], s).unwrap_or(0.0) == 1.0,
        "{page}"
    );
    Ok(())
}

fn status_of_a_healthy_node_exits_0(f: &mut Net) -> Result<()> {
    let v = f.wait_status(0, 0, Duration::from_secs(30))?;
    ensure!(v["healthy"] == true, "{v}");
    for name in [
        "cometbft",
        "synced",
        "recent_block",
        "app_height",
        "metrics",
        "bls_share",
        "hub",
        "settlement",
    ] {
        ensure!(check(&v, name) == "ok", "{name}: {v}");
    }
    // The table form prints the same verdict.
    let home = f.home(0).display().to_string();
    let out = run_tallyd(&["status", "--home", &home, "--node", &f.net.rpc_url(0)])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.code() == Some(0), "{text}");
    ensure!(text.contains("healthy: yes (exit 0)"), "{text}");
    Ok(())
}

/// SIGCONT on drop, so a failing test leaves the app running.
struct Thaw<'a>(&'a Net, usize);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        let _ = self.0.signal(self.1, "tallyd.pid", "CONT");
    }
}

fn status_with_a_frozen_app_exits_13(f: &mut Net) -> Result<()> {
    f.wait_status(1, 0, Duration::from_secs(30))?;
    f.signal(1, "tallyd.pid", "STOP")?;
    let thaw = Thaw(f, 1);
    let (code, v) = f.status(1)?;
    ensure!(code == 13, "exit {code}: {v}");
    ensure!(check(&v, "app_height") == "fail", "{v}");
    ensure!(check(&v, "cometbft") == "ok", "{v}");
    drop(thaw);
    f.wait_status(1, 0, Duration::from_secs(60))?;
    Ok(())
}

/// Starts validator `i` again on drop (only what is not running).
struct Restart<'a>(&'a Net, usize);

impl Drop for Restart<'_> {
    fn drop(&mut self) {
        let _ = self.0.net.node("start", self.1);
    }
}

fn status_with_cometbft_stopped_exits_10(f: &mut Net) -> Result<()> {
    f.wait_status(2, 0, Duration::from_secs(30))?;
    f.signal(2, "cometbft.pid", "TERM")?;
    let restart = Restart(f, 2);
    let v = f.wait_status(2, 10, Duration::from_secs(20))?;
    ensure!(check(&v, "cometbft") == "fail", "{v}");
    drop(restart);
    f.wait_status(2, 0, Duration::from_secs(90))?;
    Ok(())
}

//! `tallyd status`: is this node healthy? Reads CometBFT's `/status` and
//! `/abci_info`, the node's metrics page and chain state (through the
//! usual queries), hands what it saw to [`crate::health::decide`] and
//! prints the checks as a table or JSON. Exits 0 when healthy, otherwise
//! with the first failing check's code (listed in `crate::health`).

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::AppConfig;
use crate::health::{self, CometStatus, Limits, Observed, Settlement};
use anyhow::Context as _;
use clap::Args;
use serde_json::{json, Value};
use tally_client::rpc::RpcClient;

use super::args::{parse_duration, NodeArgs};
use super::{Command, Context};

/// Whether this node is healthy, for people and scripts.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct StatusCommand {
    /// CometBFT RPC of the node.
    #[command(flatten)]
    pub node: NodeArgs,
    /// The node's metrics page (default: from the home's app.toml
    /// `metrics_listen`; without either the metrics checks are skipped).
    #[arg(long, value_name = "URL")]
    pub metrics: Option<String>,
    /// Prefix of metric names (default: app.toml's `metrics_prefix`, or tally).
    #[arg(long)]
    pub metrics_prefix: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Oldest acceptable latest block (s, m, h).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub max_block_age: Duration,
    /// Blocks the app may be below CometBFT.
    #[arg(long, default_value_t = 1)]
    pub max_app_lag: u64,
    /// Oldest acceptable unsettled hub call (s, m, h).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub max_batch_age: Duration,
    /// How long each read may take.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// The node is not healthy: exit with this code (`main` exits with it,
/// without an `error:` line; the report was printed).
#[derive(Debug, thiserror::Error)]
#[error("node not healthy (exit code {0})")]
pub struct Unhealthy(pub u8);

impl Command for StatusCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let limits = Limits {
            max_block_age: self.max_block_age.as_secs(),
            max_app_lag: self.max_app_lag,
            max_batch_age: self.max_batch_age.as_secs(),
        };
        let cfg = AppConfig::load(ctx.home()).ok();
        let metrics_url = self.metrics.clone().or_else(|| {
            let listen = &cfg.as_ref()?.metrics_listen;
            (!listen.is_empty()).then(|| metrics_url_of(listen))
        });
        let prefix = self
            .metrics_prefix
            .clone()
            .or_else(|| cfg.as_ref().map(|c| c.metrics_prefix.clone()))
            .unwrap_or_else(|| "tally".into());
        let rpc = RpcClient::new(&self.node.primary(), self.timeout, self.timeout);
        let observed = observe(&rpc, metrics_url.as_deref(), &prefix, self.timeout);
        let report = health::decide(&observed, &limits);
        let mut out = std::io::stdout().lock();
        if self.json {
            let v = json!({
                "healthy": report.healthy,
                "exit_code": report.exit_code,
                "node": self.node.display(),
                "metrics": metrics_url,
                "checks": report.checks,
            });
            writeln!(out, "{v}")?;
        } else {
            writeln!(out, "{:<13} {:<8} DETAIL", "CHECK", "STATE")?;
            for c in &report.checks {
                let state = serde_json::to_value(c.state)?;
                let state = state.as_str().unwrap_or("?");
                writeln!(out, "{:<13} {:<8} {}", c.name, state, c.detail)?;
            }
            let verdict = if report.healthy { "yes" } else { "NO" };
            writeln!(out, "healthy: {verdict} (exit {})", report.exit_code)?;
        }
        out.flush()?;
        if report.healthy {
            Ok(())
        } else {
            Err(Unhealthy(report.exit_code).into())
        }
    }
}

/// `http://ADDR/metrics` for a listen address (a wildcard host becomes
/// loopback).
fn metrics_url_of(listen: &str) -> String {
    let addr = listen
        .strip_prefix("0.0.0.0:")
        .map(|p| format!("127.0.0.1:{p}"))
        .or_else(|| listen.strip_prefix("[::]:").map(|p| format!("[::1]:{p}")))
        .unwrap_or_else(|| listen.to_string());
    format!("http://{addr}/metrics")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn observe(rpc: &RpcClient, metrics: Option<&str>, prefix: &str, timeout: Duration) -> Observed {
    let cometbft = comet_status(rpc).map_err(|e| format!("{e:#}"));
    let app_height = rpc
        .call("abci_info", json!({}))
        .map_err(|e| format!("abci_info: {e}"))
        .and_then(|v| {
            let h = &v["response"]["last_block_height"];
            // CometBFT leaves the field out at height 0.
            match h {
                Value::Null => Ok(0),
                _ => num(h).ok_or_else(|| format!("abci_info: bad height {h}")),
            }
        });
    let block_time = cometbft.as_ref().map(|s| s.block_time).ok();
    let settlement = match block_time {
        Some(t) => settlement(rpc, t).map_err(|e| format!("{e:#}")),
        None => Err("no status".into()),
    };
    let metrics = metrics.map(|url| {
        fetch_metrics(url, timeout)
            .map(|text| health::parse_metrics(&text, prefix))
            .map_err(|e| format!("{url}: {e:#}"))
    });
    let upgrade = upgrade(rpc).map_err(|e| format!("{e:#}"));
    Observed {
        now: unix_now(),
        cometbft,
        app_height,
        metrics,
        settlement,
        upgrade,
    }
}

/// `/upgrade`, with the newest app version this binary carries.
fn upgrade(rpc: &RpcClient) -> anyhow::Result<health::UpgradeView> {
    let v = query(rpc, "/upgrade")?.context("no /upgrade")?;
    let p = &v["pending"];
    let pending = p["name"].as_str().map(|name| {
        (
            name.to_string(),
            p["app_version"].as_u64().unwrap_or(0),
            p["height"].as_u64().unwrap_or(0),
        )
    });
    Ok(health::UpgradeView {
        app_version: v["app_version"].as_u64().unwrap_or(0),
        pending,
        binary_max: tally_settlement::upgrade::LATEST_APP_VERSION,
    })
}

/// A JSON number or a decimal string (CometBFT writes int64 as strings).
fn num(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

fn comet_status(rpc: &RpcClient) -> anyhow::Result<CometStatus> {
    let v = rpc.call("status", json!({}))?;
    let sync = &v["sync_info"];
    let time = sync["latest_block_time"].as_str().unwrap_or_default();
    let block_time = tendermint::Time::parse_from_rfc3339(time)
        .with_context(|| format!("latest_block_time {time:?}"))?
        .unix_timestamp();
    Ok(CometStatus {
        chain_id: v["node_info"]["network"]
            .as_str()
            .unwrap_or_default()
            .into(),
        height: num(&sync["latest_block_height"]).context("latest_block_height")?,
        block_time: u64::try_from(block_time).unwrap_or(0),
        catching_up: sync["catching_up"].as_bool().unwrap_or(false),
        validator_address: v["validator_info"]["address"]
            .as_str()
            .unwrap_or_default()
            .into(),
    })
}

/// The query's JSON value; `None` for code 22 (not found).
fn query(rpc: &RpcClient, path: &str) -> anyhow::Result<Option<Value>> {
    let a = rpc.abci_query(path)?;
    match a.code {
        0 => Ok(Some(
            serde_json::from_slice(&a.value)
                .with_context(|| format!("query {path}: value is not JSON"))?,
        )),
        22 => Ok(None),
        c => anyhow::bail!("query {path}: code {c}: {}", a.log),
    }
}

/// The settlement pipeline at block time `now`, from `/params`, `/dkg`,
/// `/sync`, `/batch` and `/hubcalls`.
fn settlement(rpc: &RpcClient, now: u64) -> anyhow::Result<Settlement> {
    let params = query(rpc, "/params")?.context("no params")?;
    let chain = params["hub_chain"].as_str().unwrap_or("hub").to_string();
    let window_secs = params["settlement_window_secs"].as_u64().unwrap_or(60);
    let signers = query(rpc, "/dkg")?
        .map(|d| {
            d["signers"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let seg = tally_settlement::query_path::encode(&chain);
    let sync = query(rpc, &format!("/sync/{seg}"))?.unwrap_or(Value::Null);
    let nonce = sync["nonce"].as_u64();
    let first_window = |calls: &Value| calls["calls"][0]["window"].as_u64();
    let batch_age_secs = match nonce {
        Some(n) => query(rpc, &format!("/batch/{seg}/{n}"))?
            .as_ref()
            .and_then(first_window)
            .map(|w| health::window_age(now, w, window_secs)),
        None => None,
    };
    let pending_age_secs = query(rpc, &format!("/hubcalls/{seg}?limit=1"))?
        .as_ref()
        .and_then(first_window)
        .map(|w| health::window_age(now, w, window_secs));
    Ok(Settlement {
        nonce,
        attempt: sync["attempt"].as_u64().unwrap_or(0),
        batch_age_secs,
        pending_age_secs,
        signers,
    })
}

fn fetch_metrics(url: &str, timeout: Duration) -> anyhow::Result<String> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout(timeout)
        .build();
    let r = agent.get(url).call()?;
    Ok(r.into_string()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Commands};

    fn status(args: &[&str]) -> Result<StatusCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Status(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses_with_defaults_and_limits() {
        let c = status(&["status"]).unwrap();
        assert!(!c.json);
        assert_eq!(c.max_block_age, Duration::from_secs(30));
        assert_eq!(c.max_batch_age, Duration::from_secs(600));
        assert_eq!(c.max_app_lag, 1);
        assert_eq!(c.metrics, None);
        let c = status(&[
            "status",
            "--json",
            "--node",
            "http://127.0.0.1:1",
            "--metrics",
            "http://127.0.0.1:2/metrics",
            "--max-block-age",
            "2m",
            "--max-app-lag",
            "3",
        ])
        .unwrap();
        assert!(c.json);
        assert_eq!(c.node.primary(), "http://127.0.0.1:1");
        assert_eq!(c.max_block_age, Duration::from_secs(120));
        assert_eq!(c.max_app_lag, 3);
        assert!(status(&["status", "--max-block-age", "soon"]).is_err());
    }

    #[test]
    fn metrics_urls_from_listen_addresses() {
        assert_eq!(
            metrics_url_of("127.0.0.1:26661"),
            "http://127.0.0.1:26661/metrics"
        );
        assert_eq!(
            metrics_url_of("0.0.0.0:9100"),
            "http://127.0.0.1:9100/metrics"
        );
    }

    #[test]
    fn a_node_that_is_not_there_is_unhealthy_with_code_10() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // The listener is dropped: nothing answers on that port.
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context {
            home: dir.path().to_path_buf(),
        };
        let url = format!("http://127.0.0.1:{port}");
        let e = status(&["status", "--node", &url, "--timeout", "1s"])
            .unwrap()
            .execute(&ctx)
            .unwrap_err();
        assert_eq!(e.downcast_ref::<Unhealthy>().map(|u| u.0), Some(10));
    }
}

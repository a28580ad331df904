//! `tallyd status`'s health decision, apart from the I/O that feeds it:
//! [`Observed`] is what the command read (CometBFT's `/status` and
//! `/abci_info`, the node's metrics page, chain state through queries),
//! [`decide`] turns it into a [`Report`] of checks and one exit code.
//!
//! The checks run in a fixed order and the first failing one gives the
//! exit code, so a script can tell the most basic fault apart:
//!
//! | code | check | fails when |
//! |---|---|---|
//! | 0 | | every check passed or was skipped |
//! | 10 | `cometbft` | CometBFT's RPC does not answer `/status` |
//! | 11 | `synced` | CometBFT is catching up (block sync or state sync) |
//! | 12 | `recent_block` | the latest block is older than `max_block_age` |
//! | 13 | `app_height` | the app does not answer `/abci_info`, or its height is more than `max_app_lag` below CometBFT's |
//! | 14 | `metrics` | the metrics page (configured or given) does not answer |
//! | 15 | `bls_share` | this node's validator holds a share of the active key but the app has none loaded |
//! | 16 | `hub` | the relay runs and every hub endpoint's circuit breaker is open |
//! | 17 | `settlement` | the oldest unsettled hub call (in the current batch or waiting for one) is older than `max_batch_age` |
//! | 18 | `upgrade` | an approved upgrade plan is pending whose app version this binary does not carry ("upgrade needed": the node stops at its height) |
//!
//! Exit code 1 is a failure of the command itself and 2 a usage error.

use serde::Serialize;

/// CometBFT's `/status`, the parts the checks use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CometStatus {
    /// Chain id.
    pub chain_id: String,
    /// Latest block height.
    pub height: u64,
    /// Latest block time, unix seconds.
    pub block_time: u64,
    /// Whether it is catching up.
    pub catching_up: bool,
    /// This node's consensus address (hex, upper or lower case).
    pub validator_address: String,
}

/// What the node's metrics page says (names without the prefix).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsView {
    /// `bls_share_loaded`, if present.
    pub share_loaded: Option<bool>,
    /// `hub_circuit_state{endpoint}`: 0 closed, 1 half-open, 2 open.
    pub circuits: Vec<(String, u8)>,
    /// `app_height`, if present.
    pub app_height: Option<u64>,
}

/// The settlement pipeline, from chain state (block-time ages).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Nonce of the batch being settled, if any.
    pub nonce: Option<u64>,
    /// Its attempt number (0: none).
    pub attempt: u64,
    /// Latest block time minus the end of the window of the oldest call
    /// in that batch.
    pub batch_age_secs: Option<u64>,
    /// The same for the oldest call not yet in a batch.
    pub pending_age_secs: Option<u64>,
    /// Addresses holding a share in genesis (hex); empty without a key.
    pub signers: Vec<String>,
}

/// Everything the command observed. An `Err` is why it could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Local clock, unix seconds.
    pub now: u64,
    /// `/status`.
    pub cometbft: Result<CometStatus, String>,
    /// `/abci_info`'s `last_block_height`.
    pub app_height: Result<u64, String>,
    /// The metrics page; `None` when no address is known.
    pub metrics: Option<Result<MetricsView, String>>,
    /// Chain state; `Err` when the queries failed.
    pub settlement: Result<Settlement, String>,
    /// `/upgrade`; `Err` when the query failed.
    pub upgrade: Result<UpgradeView, String>,
}

/// The upgrade state, from `/upgrade`, and what this binary carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpgradeView {
    /// The app version the chain runs.
    pub app_version: u64,
    /// The pending plan: name, app version, height.
    pub pending: Option<(String, u64, u64)>,
    /// The newest app version this binary carries.
    pub binary_max: u64,
}

/// The thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Oldest acceptable latest block, seconds.
    pub max_block_age: u64,
    /// How far the app may be below CometBFT's height (a block being
    /// executed between the two reads).
    pub max_app_lag: u64,
    /// Oldest acceptable unsettled hub call, seconds.
    pub max_batch_age: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_block_age: 30,
            max_app_lag: 1,
            max_batch_age: 600,
        }
    }
}

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Passed.
    Ok,
    /// Failed: the node is not healthy.
    Fail,
    /// Not applicable, or its input was not available for a reason an
    /// earlier check already reports.
    Skipped,
}

/// One check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Its name.
    pub name: &'static str,
    /// Outcome.
    pub state: State,
    /// What was seen.
    pub detail: String,
    /// The exit code when this is the first failing check.
    pub code: u8,
}

/// The checks in order, and the verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// No check failed.
    pub healthy: bool,
    /// 0, or the first failing check's code.
    pub exit_code: u8,
    /// Every check, in order.
    pub checks: Vec<Check>,
}

/// Exit codes, by check (see the module docs).
pub mod code {
    /// CometBFT's RPC does not answer.
    pub const COMETBFT: u8 = 10;
    /// CometBFT is catching up.
    pub const SYNCED: u8 = 11;
    /// No recent block.
    pub const RECENT_BLOCK: u8 = 12;
    /// The app does not answer or lags.
    pub const APP_HEIGHT: u8 = 13;
    /// The metrics page does not answer.
    pub const METRICS: u8 = 14;
    /// A signer without its share.
    pub const BLS_SHARE: u8 = 15;
    /// Every hub endpoint's breaker is open.
    pub const HUB: u8 = 16;
    /// Settlement is stuck.
    pub const SETTLEMENT: u8 = 17;
    /// An upgrade is pending that this binary cannot run.
    pub const UPGRADE: u8 = 18;
}

fn check(name: &'static str, code: u8, state: State, detail: impl Into<String>) -> Check {
    Check {
        name,
        state,
        detail: detail.into(),
        code,
    }
}

/// Decides the checks from what was observed.
pub fn decide(o: &Observed, l: &Limits) -> Report {
    use State::{Fail, Ok as Pass, Skipped};
    let mut checks = Vec::new();
    let comet = o.cometbft.as_ref().ok();
    checks.push(match &o.cometbft {
        Ok(s) => check(
            "cometbft",
            code::COMETBFT,
            Pass,
            format!("chain {}, height {}", s.chain_id, s.height),
        ),
        Err(e) => check("cometbft", code::COMETBFT, Fail, e.clone()),
    });
    checks.push(match comet {
        None => check("synced", code::SYNCED, Skipped, "no status"),
        Some(s) if s.catching_up => check("synced", code::SYNCED, Fail, "catching up"),
        Some(_) => check("synced", code::SYNCED, Pass, "not catching up"),
    });
    checks.push(match comet {
        None => check("recent_block", code::RECENT_BLOCK, Skipped, "no status"),
        Some(s) => {
            let age = o.now.saturating_sub(s.block_time);
            let state = if age <= l.max_block_age { Pass } else { Fail };
            let detail = format!("latest block {age} s old (at most {})", l.max_block_age);
            check("recent_block", code::RECENT_BLOCK, state, detail)
        }
    });
    checks.push(match (comet, &o.app_height) {
        (_, Err(e)) => check("app_height", code::APP_HEIGHT, Fail, e.clone()),
        (None, Ok(h)) => check(
            "app_height",
            code::APP_HEIGHT,
            Skipped,
            format!("app at {h}"),
        ),
        (Some(s), Ok(h)) => {
            let lag = s.height.saturating_sub(*h);
            let state = if lag <= l.max_app_lag { Pass } else { Fail };
            let detail = format!("app at {h}, CometBFT at {} ({lag} behind)", s.height);
            check("app_height", code::APP_HEIGHT, state, detail)
        }
    });
    let view = match &o.metrics {
        None => {
            checks.push(check(
                "metrics",
                code::METRICS,
                Skipped,
                "no metrics address (app.toml metrics_listen or --metrics)",
            ));
            None
        }
        Some(Err(e)) => {
            checks.push(check("metrics", code::METRICS, Fail, e.clone()));
            None
        }
        Some(Ok(v)) => {
            checks.push(check(
                "metrics",
                code::METRICS,
                Pass,
                "metrics page answers",
            ));
            Some(v)
        }
    };
    checks.push(share_check(o, comet, view));
    checks.push(match view {
        None => check("hub", code::HUB, Skipped, "no metrics"),
        Some(v) if v.circuits.is_empty() => check("hub", code::HUB, Skipped, "no relay"),
        Some(v) => {
            let open = v.circuits.iter().filter(|(_, s)| *s == 2).count();
            let state = if open < v.circuits.len() { Pass } else { Fail };
            let detail = format!(
                "{} of {} hub endpoints with an open circuit breaker",
                open,
                v.circuits.len()
            );
            check("hub", code::HUB, state, detail)
        }
    });
    checks.push(match &o.settlement {
        Err(e) => check("settlement", code::SETTLEMENT, Skipped, e.clone()),
        Ok(s) if s.signers.is_empty() => check(
            "settlement",
            code::SETTLEMENT,
            Skipped,
            "no threshold key: batches are never signed",
        ),
        Ok(s) => {
            let age = s.batch_age_secs.max(s.pending_age_secs);
            let state = if age.unwrap_or(0) <= l.max_batch_age {
                Pass
            } else {
                Fail
            };
            let batch = match (s.nonce, s.batch_age_secs) {
                (Some(n), Some(a)) => format!("batch {n} attempt {} waiting {a} s", s.attempt),
                _ => "no batch in flight".to_string(),
            };
            let pending = match s.pending_age_secs {
                Some(a) => format!("oldest pending call {a} s"),
                None => "no pending calls".to_string(),
            };
            let detail = format!("{batch}, {pending} (at most {})", l.max_batch_age);
            check("settlement", code::SETTLEMENT, state, detail)
        }
    });
    checks.push(upgrade_check(&o.upgrade, comet));
    let exit_code = checks
        .iter()
        .find(|c| c.state == Fail)
        .map_or(0, |c| c.code);
    Report {
        healthy: exit_code == 0,
        exit_code,
        checks,
    }
}

fn upgrade_check(u: &Result<UpgradeView, String>, comet: Option<&CometStatus>) -> Check {
    let u = match u {
        Err(e) => return check("upgrade", code::UPGRADE, State::Skipped, e.clone()),
        Ok(u) => u,
    };
    let Some((name, version, height)) = &u.pending else {
        let detail = format!("app version {}, no upgrade pending", u.app_version);
        return check("upgrade", code::UPGRADE, State::Ok, detail);
    };
    let left = comet.map_or(String::new(), |s| {
        format!(" (in {} blocks)", height.saturating_sub(s.height))
    });
    if *version > u.binary_max {
        let detail = format!(
            "UPGRADE NEEDED: {name:?} switches to app version {version} at height {height}{left}; this binary carries versions up to {}",
            u.binary_max
        );
        return check("upgrade", code::UPGRADE, State::Fail, detail);
    }
    let detail = format!(
        "{name:?} switches to app version {version} at height {height}{left}; this binary carries it"
    );
    check("upgrade", code::UPGRADE, State::Ok, detail)
}

fn share_check(o: &Observed, comet: Option<&CometStatus>, view: Option<&MetricsView>) -> Check {
    let skip = |why: &str| check("bls_share", code::BLS_SHARE, State::Skipped, why);
    let (Some(s), Ok(st)) = (comet, &o.settlement) else {
        return skip("validator address or genesis key not read");
    };
    let signer = st
        .signers
        .iter()
        .any(|a| a.eq_ignore_ascii_case(&s.validator_address));
    if !signer {
        return skip("this node holds no share of the active key");
    }
    match view.and_then(|v| v.share_loaded) {
        None => skip("no metrics"),
        Some(true) => check("bls_share", code::BLS_SHARE, State::Ok, "share loaded"),
        Some(false) => check(
            "bls_share",
            code::BLS_SHARE,
            State::Fail,
            "the active key gives this validator a share but none is loaded (data/bls_share_epoch_<E>.json or config/bls_share.json)",
        ),
    }
}

/// Reads the metrics [`MetricsView`] needs from a Prometheus text page
/// whose names start with `prefix_`.
pub fn parse_metrics(text: &str, prefix: &str) -> MetricsView {
    let mut v = MetricsView::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(prefix).and_then(|r| r.strip_prefix('_')) else {
            continue;
        };
        let Some((series, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        match name {
            "bls_share_loaded" => v.share_loaded = Some(value >= 1.0),
            "app_height" => v.app_height = Some(value as u64),
            "hub_circuit_state" => {
                let endpoint = labels
                    .split_once("endpoint=\"")
                    .map(|(_, r)| r.split('"').next().unwrap_or_default())
                    .unwrap_or_default();
                v.circuits.push((endpoint.to_string(), value as u8));
            }
            _ => {}
        }
    }
    v
}

/// The seconds since the window `window` ended, at block time `now`.
pub fn window_age(now: u64, window: u64, window_secs: u64) -> u64 {
    now.saturating_sub(window.saturating_add(1).saturating_mul(window_secs))
}

#[cfg(test)]
mod tests;

//! Verdicts and reputation (ADR 0021): each provider with a policy is
//! judged once per window, in the block that closes the window, before any
//! of the window's debts become hub calls.
//!
//! For a window `W` and a provider with policy `P`, from the provider's
//! totals `pw/<provider>\0W` and its histogram `plat/<provider>\0W`:
//!
//! - `judged = requests - cancel - client` (cancellations and the client's
//!   own mistakes never count, for or against);
//! - `judged < P.min_requests`: **not judged** (a record only if the
//!   provider served anything in `W`);
//! - else **breached** if `fail_count * 1000000 > P.max_fail_ppm * judged`
//!   (exactly at the ceiling is met), or if a p95 ceiling `C` is set, at
//!   least `P.min_requests` calls were measured and `slow * 20 > measured`
//!   where `slow` counts the measured calls at or above `C`: exactly when
//!   the nearest-rank p95 is at or above `C`;
//! - else **met**.
//!
//! A judged window moves the provider's reputation (`rep/<provider>`, in
//! ppm, starting at 1000000): `score = (15 * score + sample) / 16`, rounded
//! down, with `sample` 1000000 for met and 0 for breached. A window's
//! weight therefore halves after 10.7 judged windows ((15/16)^11 = 0.49).
//!
//! The verdict record `slov/<provider>\0W` (provable) keeps the figures,
//! the policy, the reputation after it and, as the window's debts become
//! hub calls, what was credited back ([`credit`]).

use serde::{Deserialize, Serialize};
use tally_store::{Kv, KvRead};

use crate::error::Fatal;
use crate::keys;
use crate::record::Counters;
use crate::slo::latency::{Counts, Histogram};
use crate::slo::policy::{all_in_force, Policy, PPM};
use crate::state::chain::party_window;
use crate::types::Event;

/// What a window's figures say about a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Within every objective.
    Met,
    /// Over at least one objective: its charges are credited back.
    Breached,
    /// Fewer judged calls than the policy's minimum.
    NotJudged,
}

/// A provider's verdict for one window (`slov/`, the query's JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// The provider.
    pub provider: String,
    /// The window.
    pub window: u64,
    /// Met, breached or not judged.
    pub status: Status,
    /// Which objectives were missed: `fail_rate`, `latency`, `ttft`.
    pub reasons: Vec<String>,
    /// Every call.
    pub requests: u64,
    /// `requests - cancel - client`.
    pub judged: u64,
    /// Failures (never cancel, never client).
    pub fail_count: u64,
    /// The failure classes.
    pub rate_limit: u64,
    /// Authentication or payment refusals.
    pub auth: u64,
    /// 5xx, network and timeouts.
    pub transient: u64,
    /// Unclassified failures.
    pub unknown: u64,
    /// `fail_count * 1000000 / judged`, rounded down (0 when nothing was
    /// judged).
    pub fail_ppm: u64,
    /// Calls with a measured latency, and those at or above the ceiling.
    pub measured_latency: u64,
    /// Of them, at or above `policy.p95_latency_ms`.
    pub slow_latency: u64,
    /// Calls with a measured TTFT.
    pub measured_ttft: u64,
    /// Of them, at or above `policy.p95_ttft_ms`.
    pub slow_ttft: u64,
    /// What the window charged for the provider's calls.
    pub charged: u64,
    /// The policy it was judged by.
    pub policy: Policy,
    /// Credited back so far (grows while the window becomes hub calls).
    pub credited: u64,
    /// Users credited so far.
    pub credited_users: u64,
    /// The provider's reputation after this window (ppm).
    pub reputation_ppm: u64,
}

/// A provider's reputation (`rep/`, the query's JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reputation {
    /// The score in ppm.
    pub score_ppm: u64,
    /// Windows judged.
    pub judged: u64,
    /// Of them, breached.
    pub breached: u64,
    /// The last window judged.
    pub last_window: u64,
}

impl Default for Reputation {
    fn default() -> Self {
        Reputation {
            score_ppm: PPM,
            judged: 0,
            breached: 0,
            last_window: 0,
        }
    }
}

impl Reputation {
    /// The reputation after one more judged window.
    pub fn after(self, window: u64, breached: bool) -> Self {
        let sample = if breached { 0 } else { PPM };
        Reputation {
            score_ppm: (15 * self.score_ppm + sample) / 16,
            judged: self.judged + 1,
            breached: self.breached + u64::from(breached),
            last_window: window,
        }
    }
}

/// The verdict on `totals` and `hist` under `policy` (reputation and
/// credits not filled in).
pub fn decide(
    provider: &str,
    window: u64,
    policy: &Policy,
    totals: &Counters,
    hist: &Histogram,
) -> Verdict {
    let judged = totals
        .requests
        .saturating_sub(totals.cancel)
        .saturating_sub(totals.client);
    let fail = totals.fail_count();
    let slow = |c: &Counts, ceiling: u64| {
        if ceiling == 0 {
            0
        } else {
            c.at_or_over(ceiling)
        }
    };
    let mut v = Verdict {
        provider: provider.to_string(),
        window,
        status: Status::NotJudged,
        reasons: Vec::new(),
        requests: totals.requests,
        judged,
        fail_count: fail,
        rate_limit: totals.rate_limit,
        auth: totals.auth,
        transient: totals.transient,
        unknown: totals.unknown,
        fail_ppm: if judged == 0 {
            0
        } else {
            (u128::from(fail) * u128::from(PPM) / u128::from(judged)) as u64
        },
        measured_latency: hist.latency.total(),
        slow_latency: slow(&hist.latency, policy.p95_latency_ms),
        measured_ttft: hist.ttft.total(),
        slow_ttft: slow(&hist.ttft, policy.p95_ttft_ms),
        charged: totals.amount,
        policy: *policy,
        credited: 0,
        credited_users: 0,
        reputation_ppm: 0,
    };
    if judged < policy.min_requests {
        return v;
    }
    if u128::from(fail) * u128::from(PPM) > u128::from(policy.max_fail_ppm) * u128::from(judged) {
        v.reasons.push("fail_rate".into());
    }
    let p95_over = |ceiling: u64, measured: u64, slow: u64| {
        ceiling != 0
            && measured >= policy.min_requests
            && u128::from(slow) * 20 > u128::from(measured)
    };
    if p95_over(policy.p95_latency_ms, v.measured_latency, v.slow_latency) {
        v.reasons.push("latency".into());
    }
    if p95_over(policy.p95_ttft_ms, v.measured_ttft, v.slow_ttft) {
        v.reasons.push("ttft".into());
    }
    v.status = if v.reasons.is_empty() {
        Status::Met
    } else {
        Status::Breached
    };
    v
}

/// The credit a breached verdict returns on `amount` owed: `amount *
/// credit_ppm / 1000000` rounded up (in the user's favour), at most
/// `amount`; 0 for any other verdict.
pub fn credit_on(v: Option<&Verdict>, amount: u64) -> u64 {
    match v {
        Some(v) if v.status == Status::Breached => {
            let c =
                (u128::from(amount) * u128::from(v.policy.credit_ppm)).div_ceil(u128::from(PPM));
            (c as u64).min(amount)
        }
        _ => 0,
    }
}

/// A provider's verdict for `window`.
pub fn verdict(kv: &impl KvRead, provider: &str, window: u64) -> Result<Option<Verdict>, Fatal> {
    kv.get(&keys::slo_verdict(provider, window))?
        .map(|b| serde_json::from_slice(&b).map_err(|_| Fatal::Corrupt("slo verdict")))
        .transpose()
}

/// Stores `v`.
pub fn put_verdict(kv: &mut impl Kv, v: &Verdict) {
    kv.put(
        keys::slo_verdict(&v.provider, v.window),
        serde_json::to_vec(v).unwrap_or_default(),
    );
}

/// A provider's reputation (the starting one if never judged).
pub fn reputation(kv: &impl KvRead, provider: &str) -> Result<Reputation, Fatal> {
    kv.get(&keys::reputation(provider))?
        .map(|b| serde_json::from_slice(&b).map_err(|_| Fatal::Corrupt("reputation")))
        .transpose()
        .map(Option::unwrap_or_default)
}

/// A provider's histogram in `window` (empty if nothing was measured).
pub fn provider_histogram(
    kv: &impl KvRead,
    provider: &str,
    window: u64,
) -> Result<Histogram, Fatal> {
    match kv.get(&keys::provider_latency(provider, window))? {
        None => Ok(Histogram::default()),
        Some(b) => Histogram::decode(&b).ok_or(Fatal::Corrupt("latency histogram")),
    }
}

/// Judges every provider with a policy on closed window `window`: writes
/// the verdicts of the providers that served anything in it and the
/// reputations of those judged; returns one `slo_breach` event per breach
/// and one `slo_judged` summary.
pub fn judge_window(kv: &mut impl Kv, window: u64) -> Result<Vec<Event>, Fatal> {
    let mut events = Vec::new();
    let (mut met, mut breached, mut not_judged) = (0u64, 0u64, 0u64);
    for (provider, f) in all_in_force(kv)? {
        let Some(totals) = party_window(kv, &keys::provider_window(&provider, window))? else {
            continue;
        };
        let hist = provider_histogram(kv, &provider, window)?;
        let mut v = decide(&provider, window, &f.policy, &totals.totals, &hist);
        let rep = reputation(kv, &provider)?;
        match v.status {
            Status::NotJudged => {
                not_judged += 1;
                v.reputation_ppm = rep.score_ppm;
            }
            s => {
                let is_breach = s == Status::Breached;
                let next = rep.after(window, is_breach);
                kv.put(
                    keys::reputation(&provider),
                    serde_json::to_vec(&next).unwrap_or_default(),
                );
                v.reputation_ppm = next.score_ppm;
                if is_breach {
                    breached += 1;
                    events.push(breach_event(&v));
                } else {
                    met += 1;
                }
            }
        }
        put_verdict(kv, &v);
    }
    if met + breached + not_judged > 0 {
        events.push(Event::new(
            "slo_judged",
            [
                ("window", window.to_string()),
                ("met", met.to_string()),
                ("breached", breached.to_string()),
                ("not_judged", not_judged.to_string()),
            ],
        ));
    }
    Ok(events)
}

fn breach_event(v: &Verdict) -> Event {
    Event::new(
        "slo_breach",
        [
            ("window", v.window.to_string()),
            ("provider", v.provider.clone()),
            ("reasons", v.reasons.join(",")),
            ("judged", v.judged.to_string()),
            ("fail_count", v.fail_count.to_string()),
            ("fail_ppm", v.fail_ppm.to_string()),
            ("max_fail_ppm", v.policy.max_fail_ppm.to_string()),
            ("slow_latency", v.slow_latency.to_string()),
            ("measured_latency", v.measured_latency.to_string()),
            ("slow_ttft", v.slow_ttft.to_string()),
            ("measured_ttft", v.measured_ttft.to_string()),
            ("charged", v.charged.to_string()),
            ("credit_ppm", v.policy.credit_ppm.to_string()),
            ("reputation_ppm", v.reputation_ppm.to_string()),
        ],
    )
}

#[cfg(test)]
mod tests;

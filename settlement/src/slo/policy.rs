//! Objective policies (ADR 0021): what a provider promises, set by an
//! `slo` proposal and in force from a named future window.
//!
//! `slo/<provider>` holds the policy in force and the first window it
//! judges. An accepted change is stored per provider under
//! `slon/<from_window><provider>` (a new policy or a removal) and becomes
//! the policy in force in the first block of a window at or after
//! `from_window`, right after that block judged the window it closed
//! ([`crate::slo::begin_block`]): a window is always judged by the policies
//! in force while it was open.

use serde::{Deserialize, Serialize};
use tally_store::{Kv, KvRead};

use crate::error::Fatal;
use crate::ident::check_party;
use crate::keys;
use crate::proto::{Proposal, SloChange, SloPolicy};
use crate::slo::latency::{is_bound, BOUNDS_MS};
use crate::state::chain::cur_window;
use crate::types::Event;

/// Most providers one change names.
pub const MAX_CHANGES: usize = 256;
/// Most policies in force and scheduled together: a window close judges
/// each one (the cost the closing note measures).
pub const MAX_POLICIES: usize = 10_000;
/// How far ahead of the current window a change may be scheduled.
pub const MAX_AHEAD_WINDOWS: u64 = 100_000;
/// One million: ppm values are shares of it.
pub const PPM: u64 = 1_000_000;

/// A provider's objectives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Fail-rate ceiling in ppm of the judged calls; exactly at the ceiling
    /// is met.
    pub max_fail_ppm: u32,
    /// Fewer judged calls (requests - cancel - client) and the window is
    /// not judged.
    pub min_requests: u64,
    /// p95 latency ceiling (ms, a bucket bound), 0 for none.
    pub p95_latency_ms: u64,
    /// p95 TTFT ceiling (ms, a bucket bound), 0 for none.
    pub p95_ttft_ms: u64,
    /// Share of a breached window's charges credited back, in ppm.
    pub credit_ppm: u32,
}

impl Policy {
    fn of(p: &SloPolicy) -> Self {
        Policy {
            max_fail_ppm: p.max_fail_ppm,
            min_requests: p.min_requests,
            p95_latency_ms: p.p95_latency_ms,
            p95_ttft_ms: p.p95_ttft_ms,
            credit_ppm: p.credit_ppm,
        }
    }

    /// The reason this policy is out of range.
    pub fn invalid(&self) -> Option<String> {
        if u64::from(self.max_fail_ppm) > PPM {
            return Some(format!("max_fail_ppm {} is above {PPM}", self.max_fail_ppm));
        }
        if u64::from(self.credit_ppm) > PPM {
            return Some(format!("credit_ppm {} is above {PPM}", self.credit_ppm));
        }
        if self.min_requests == 0 {
            return Some("min_requests must be at least 1".into());
        }
        for (name, ms) in [
            ("p95_latency_ms", self.p95_latency_ms),
            ("p95_ttft_ms", self.p95_ttft_ms),
        ] {
            if ms != 0 && !is_bound(ms) {
                return Some(format!(
                    "{name} {ms} is not a bucket bound (0 for none, or one of {BOUNDS_MS:?})"
                ));
            }
        }
        None
    }
}

/// The policy in force for a provider (`slo/<provider>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InForce {
    /// The objectives.
    pub policy: Policy,
    /// The first window they judge.
    pub since_window: u64,
    /// The proposal that set them.
    pub proposal: u64,
}

/// A scheduled change (`slon/<from_window><provider>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scheduled {
    /// The new policy; `None` removes the provider's policy.
    pub policy: Option<Policy>,
    /// The proposal that scheduled it.
    pub proposal: u64,
}

fn decode<T: for<'de> Deserialize<'de>>(b: &[u8], what: &'static str) -> Result<T, Fatal> {
    serde_json::from_slice(b).map_err(|_| Fatal::Corrupt(what))
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// The policy in force for `provider`.
pub fn in_force(kv: &impl KvRead, provider: &str) -> Result<Option<InForce>, Fatal> {
    kv.get(&keys::slo_policy(provider))?
        .map(|b| decode(&b, "slo policy"))
        .transpose()
}

/// Every policy in force, by provider (at most [`MAX_POLICIES`]).
pub fn all_in_force(kv: &impl KvRead) -> Result<Vec<(String, InForce)>, Fatal> {
    kv.scan_prefix(keys::SLO_POLICY, MAX_POLICIES + 1)?
        .into_iter()
        .map(|(k, v)| {
            let provider = String::from_utf8(k[keys::SLO_POLICY.len()..].to_vec())
                .map_err(|_| Fatal::Corrupt("slo policy key"))?;
            Ok((provider, decode(&v, "slo policy")?))
        })
        .collect()
}

/// Every scheduled change: (from_window, provider, change), by window.
pub fn all_scheduled(kv: &impl KvRead) -> Result<Vec<(u64, String, Scheduled)>, Fatal> {
    kv.scan_prefix(keys::SLO_NEXT, MAX_POLICIES + 1)?
        .into_iter()
        .map(|(k, v)| {
            let (w, p) = keys::parse_slo_next(&k).ok_or(Fatal::Corrupt("slo schedule key"))?;
            let p =
                String::from_utf8(p.to_vec()).map_err(|_| Fatal::Corrupt("slo schedule key"))?;
            Ok((w, p, decode(&v, "slo schedule")?))
        })
        .collect()
}

/// Whether change `c` can be scheduled now; the reason it cannot
/// otherwise. Checked when the proposal opens and when it is accepted.
pub fn check(kv: &impl KvRead, c: Option<&SloChange>) -> Result<Result<(), String>, Fatal> {
    let Some(c) = c else {
        return Ok(Err("an slo proposal carries a change".into()));
    };
    let now = cur_window(kv)?.unwrap_or(0);
    if c.from_window <= now {
        return Ok(Err(format!(
            "from_window {} is not after the current window {now}",
            c.from_window
        )));
    }
    if c.from_window - now > MAX_AHEAD_WINDOWS {
        return Ok(Err(format!(
            "from_window {} is more than {MAX_AHEAD_WINDOWS} windows ahead of {now}",
            c.from_window
        )));
    }
    if c.policies.is_empty() || c.policies.len() > MAX_CHANGES {
        return Ok(Err(format!(
            "a change names 1 to {MAX_CHANGES} providers, not {}",
            c.policies.len()
        )));
    }
    let scheduled = all_scheduled(kv)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut added = 0usize;
    for p in &c.policies {
        if let Err(e) = check_party("provider", &p.provider) {
            return Ok(Err(e.to_string()));
        }
        if !seen.insert(p.provider.as_str()) {
            return Ok(Err(format!("provider {} is named twice", p.provider)));
        }
        if let Some((w, _, _)) = scheduled.iter().find(|(_, q, _)| *q == p.provider) {
            return Ok(Err(format!(
                "provider {} already has a change scheduled from window {w}",
                p.provider
            )));
        }
        let has = in_force(kv, &p.provider)?.is_some();
        if p.remove {
            if Policy::of(p) != Policy::default() {
                return Ok(Err(format!(
                    "the removal of {} carries no objectives",
                    p.provider
                )));
            }
            if !has {
                return Ok(Err(format!(
                    "provider {} has no policy to remove",
                    p.provider
                )));
            }
            continue;
        }
        if let Some(why) = Policy::of(p).invalid() {
            return Ok(Err(format!("provider {}: {why}", p.provider)));
        }
        if !has {
            added += 1;
        }
    }
    let total = all_in_force(kv)?.len() + scheduled.len() + added;
    if total > MAX_POLICIES {
        return Ok(Err(format!(
            "{total} policies in force and scheduled would pass the cap of {MAX_POLICIES}"
        )));
    }
    Ok(Ok(()))
}

/// Schedules the change of accepted proposal `p` (checked again by the
/// caller); returns the `slo_scheduled` event.
pub fn schedule(kv: &mut impl Kv, p: &Proposal) -> Result<Event, Fatal> {
    let c = p.slo.clone().unwrap_or_default();
    for q in &c.policies {
        let s = Scheduled {
            policy: (!q.remove).then(|| Policy::of(q)),
            proposal: p.id,
        };
        kv.put(keys::slo_next(c.from_window, &q.provider), encode(&s));
    }
    let providers: Vec<&str> = c.policies.iter().map(|q| q.provider.as_str()).collect();
    Ok(Event::new(
        "slo_scheduled",
        [
            ("proposal", p.id.to_string()),
            ("from_window", c.from_window.to_string()),
            ("providers", providers.join(",")),
        ],
    ))
}

/// Puts every change scheduled from `now_window` or earlier in force (or
/// removes the policy); returns one `slo_changed` event per window of
/// changes.
pub fn apply_due(kv: &mut impl Kv, now_window: u64) -> Result<Vec<Event>, Fatal> {
    let end = keys::slo_next_from(now_window.saturating_add(1));
    let due = kv.scan(keys::SLO_NEXT, &end, MAX_POLICIES + 1)?;
    let mut events = Vec::new();
    let mut by_window: Vec<(u64, Vec<String>)> = Vec::new();
    for (k, v) in due {
        let (w, provider) = keys::parse_slo_next(&k).ok_or(Fatal::Corrupt("slo schedule key"))?;
        let provider =
            String::from_utf8(provider.to_vec()).map_err(|_| Fatal::Corrupt("slo schedule key"))?;
        let s: Scheduled = decode(&v, "slo schedule")?;
        match s.policy {
            Some(policy) => kv.put(
                keys::slo_policy(&provider),
                encode(&InForce {
                    policy,
                    since_window: now_window,
                    proposal: s.proposal,
                }),
            ),
            None => kv.delete(keys::slo_policy(&provider)),
        }
        kv.delete(k);
        match by_window.last_mut() {
            Some((lw, ps)) if *lw == w => ps.push(provider),
            _ => by_window.push((w, vec![provider])),
        }
    }
    for (w, providers) in by_window {
        events.push(Event::new(
            "slo_changed",
            [
                ("from_window", w.to_string()),
                ("window", now_window.to_string()),
                ("providers", providers.join(",")),
            ],
        ));
    }
    Ok(events)
}

/// A change as queries show it (`/proposals`).
pub fn change_json(c: &SloChange) -> serde_json::Value {
    let policies: Vec<serde_json::Value> = c
        .policies
        .iter()
        .map(|p| {
            if p.remove {
                serde_json::json!({"provider": p.provider, "remove": true})
            } else {
                serde_json::json!({"provider": p.provider, "policy": Policy::of(p)})
            }
        })
        .collect();
    serde_json::json!({"from_window": c.from_window, "policies": policies})
}

//! Governed parameters (ADR 0020): a `params` proposal changes named
//! parameters from the first block of a future settlement window.
//!
//! - **Versions.** `meta/params` holds the parameters in force and
//!   `meta/params_since` the first window they govern (absent: 0). An
//!   accepted change is stored as its values only, under
//!   `par/next/<from_window>` (a second change for the same window is merged
//!   into it, the later value winning). The first block of window `W` (the
//!   switch runs in [`begin_block`], before anything else of the block but
//!   the upgrade switch) applies every change with `from_window <= W` to the
//!   parameters in force, checks the result again ([`check_step`]) and makes
//!   it current; the version it replaces is kept under `par/at/<since>`, so
//!   every block of a window runs the window's own version and the
//!   conversion of a closed window into hub calls reads that window's
//!   version ([`params_at`]). A kept version is dropped once no window it
//!   governs is open or still being converted.
//! - **Refusals.** Checked when the proposal opens, when it is accepted and
//!   (the last three) again at the switch, with the reason in the proposal
//!   or in a `params_refused` event: a window that is not after the current
//!   one or more than [`MAX_AHEAD_WINDOWS`] ahead, or before a window a
//!   change is already scheduled for; an unknown parameter, one named twice,
//!   a value of the wrong type; the rule of each parameter ([`RULES`]); a
//!   result genesis would refuse ([`Params::validate`]); a `max_tx_bytes`
//!   below the largest system transaction the current validator set can
//!   need ([`crate::tx::system_tx_bound`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tally_store::{prefix_end, Kv, KvRead};

use crate::dkg::state as dkg_state;
use crate::error::Fatal;
use crate::genesis::Params;
use crate::keys;
use crate::proto::{ParamChange, Proposal};
use crate::state::chain::{cur_window, oldest_closing, params, put_params_raw};
pub use crate::state::chain::{params_at, params_since as since};
use crate::state::put_u64;
use crate::state::sync::{batch, sync_state};
use crate::types::{Event, PRUNE_VERSION};

/// Most parameters one change names.
pub const MAX_VALUES: usize = 32;
/// How far ahead of the current window a change may be scheduled.
pub const MAX_AHEAD_WINDOWS: u64 = 100_000;
/// Most windows with a change scheduled at once.
pub const MAX_SCHEDULED: usize = 8;

/// What may change about a parameter once the chain runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Any value genesis would accept.
    Free,
    /// Never: the reason.
    Fixed(&'static str),
    /// Only upwards: vote extensions made under the old cap in the block
    /// before the switch go into the next block's system transaction.
    RaiseOnly,
    /// Not while a DKG or re-key ceremony runs (its phases are counted in
    /// these blocks).
    NoCeremony,
    /// Not below the number of calls of the batch being settled.
    CoversBatch,
    /// Only to its off value (0) before the state runs this app version:
    /// earlier versions do not read it.
    FromVersion(u64),
}

/// Every parameter and its rule, in the order of [`Params`].
pub const RULES: &[(&str, Rule)] = &[
    (
        "settlement_window_secs",
        Rule::Fixed("window numbers are block time divided by it: a new length would renumber every window"),
    ),
    ("max_report_records", Rule::Free),
    ("max_report_expiry_secs", Rule::Free),
    ("max_tx_bytes", Rule::Free),
    (
        "hub_chain",
        Rule::Fixed("the deposit cursor, batch nonces and the group key's registration belong to one hub chain"),
    ),
    ("max_batch_calls", Rule::CoversBatch),
    ("sync_window_secs", Rule::Free),
    ("failure_backdate_secs", Rule::Free),
    ("attempt_deadline_secs", Rule::Free),
    ("partial_expiry_blocks", Rule::Free),
    (
        "hub_block_range",
        Rule::Fixed("a range credited in several messages would be recomputed over other heights"),
    ),
    ("max_block_deposits", Rule::Free),
    ("max_vote_extension_bytes", Rule::RaiseOnly),
    ("max_extension_partials", Rule::RaiseOnly),
    ("max_block_messages", Rule::RaiseOnly),
    ("max_close_per_block", Rule::Free),
    ("settled_retention_windows", Rule::Free),
    ("dkg_phase_blocks", Rule::NoCeremony),
    ("proposal_expiry_blocks", Rule::Free),
    ("sla_keep_windows", Rule::FromVersion(PRUNE_VERSION)),
];

/// A change waiting for its window (`par/next/<from_window>`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scheduled {
    /// The proposals that scheduled it, in acceptance order.
    pub proposals: Vec<u64>,
    /// The new values by parameter name.
    pub values: BTreeMap<String, Value>,
}

/// Every scheduled change, by window, oldest first.
pub fn scheduled(kv: &impl KvRead) -> Result<Vec<(u64, Scheduled)>, Fatal> {
    let rows = kv.scan_prefix(keys::PARAMS_NEXT, MAX_SCHEDULED + 1)?;
    rows.into_iter()
        .map(|(k, v)| {
            let w = keys::parse_window_suffix(&k, keys::PARAMS_NEXT)
                .ok_or(Fatal::Corrupt("scheduled params key"))?;
            let s = serde_json::from_slice(&v).map_err(|_| Fatal::Corrupt("scheduled params"))?;
            Ok((w, s))
        })
        .collect()
}

/// `base` with `values` set.
fn apply(base: &Params, values: &BTreeMap<String, Value>) -> Result<Params, String> {
    let mut obj = match serde_json::to_value(base) {
        Ok(Value::Object(m)) => m,
        _ => return Err("parameters do not encode as an object".into()),
    };
    for (k, v) in values {
        obj.insert(k.clone(), v.clone());
    }
    serde_json::from_value(Value::Object(obj)).map_err(|e| format!("a value does not fit: {e}"))
}

/// The values a change names, typed like the parameters they replace.
pub fn parse_values(c: &ParamChange) -> Result<BTreeMap<String, Value>, String> {
    if c.values.is_empty() || c.values.len() > MAX_VALUES {
        return Err(format!("a change names 1 to {MAX_VALUES} parameters"));
    }
    let defaults = Params::default().to_json();
    let mut out = BTreeMap::new();
    for v in &c.values {
        let typed = match defaults.get(&v.name) {
            None => return Err(format!("no parameter {:?}", v.name)),
            Some(Value::String(_)) => Value::String(v.value.clone()),
            Some(_) => match v.value.parse::<u64>() {
                Ok(n) => json!(n),
                Err(_) => return Err(format!("{} = {:?} is not a whole number", v.name, v.value)),
            },
        };
        if out.insert(v.name.clone(), typed).is_some() {
            return Err(format!("{} is named twice", v.name));
        }
    }
    Ok(out)
}

/// The rules of each parameter that changes from `old` to `new`, the
/// ranges genesis checks and the system-transaction bound, against the
/// state now (a running ceremony, the batch being settled, the validator
/// count).
pub fn check_step(
    kv: &impl KvRead,
    old: &Params,
    new: &Params,
) -> Result<Result<(), String>, Fatal> {
    if let Err(e) = new.validate() {
        return Ok(Err(e.to_string()));
    }
    let (Value::Object(a), Value::Object(b)) = (
        serde_json::to_value(old).unwrap_or(Value::Null),
        serde_json::to_value(new).unwrap_or(Value::Null),
    ) else {
        return Ok(Err("parameters do not encode as an object".into()));
    };
    for (name, rule) in RULES {
        let (was, now) = (a.get(*name), b.get(*name));
        if was == now {
            continue;
        }
        let num = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
        let why = match rule {
            Rule::Free => None,
            Rule::Fixed(why) => Some(format!("{name} cannot change: {why}")),
            Rule::RaiseOnly if num(now) < num(was) => Some(format!(
                "{name} may only be raised ({} to {}): vote extensions made under the old cap go into the block after the switch",
                num(was),
                num(now)
            )),
            Rule::RaiseOnly => None,
            Rule::NoCeremony => dkg_state::ceremony(kv)?.map(|c| {
                format!("{name} cannot change while DKG round {} runs (its phases are counted in these blocks)", c.round)
            }),
            Rule::FromVersion(v) => {
                let version = crate::state::chain::app_version(kv)?;
                (version < *v && num(now) != 0).then(|| {
                    format!("{name} takes effect from app version {v}; the chain runs version {version}")
                })
            }
            Rule::CoversBatch => {
                let calls = batch_calls(kv, &old.hub_chain)?;
                (num(now) < calls as u64).then(|| {
                    format!("{name} = {} is below the {calls} calls of the batch being settled", num(now))
                })
            }
        };
        if let Some(why) = why {
            return Ok(Err(why));
        }
    }
    // The largest system transaction must still fit (or fit no worse than
    // before: a genesis may have started short of it).
    let signers = dkg_state::validators(kv)?.len().max(1);
    let version = crate::state::chain::app_version(kv)?;
    let excess = |p: &Params| {
        crate::tx::SYSTEM_FIELDS
            .iter()
            .map(|f| {
                (crate::tx::system_tx_bound(p, signers, *f, version) as u64)
                    .saturating_sub(p.max_tx_bytes)
            })
            .max()
            .unwrap_or(0)
    };
    let (was, now) = (excess(old), excess(new));
    if now > 0 && now > was {
        return Ok(Err(format!(
            "max_tx_bytes {} is {now} bytes short of the largest system transaction {signers} signers may need",
            new.max_tx_bytes
        )));
    }
    Ok(Ok(()))
}

/// Calls of the batch being settled on `chain` (0 with none).
fn batch_calls(kv: &impl KvRead, chain: &str) -> Result<usize, Fatal> {
    let nonce = sync_state(kv, chain)?.current_nonce;
    if nonce == 0 {
        return Ok(0);
    }
    Ok(batch(kv, chain, nonce)?.map_or(0, |b| b.call_ids.len()))
}

/// The parameters in force from window `w` with everything scheduled up
/// to and including it applied, and the same before `w`'s own change.
fn projected(
    kv: &impl KvRead,
    w: u64,
    extra: &BTreeMap<String, Value>,
) -> Result<Result<(Params, Params), String>, Fatal> {
    let mut before = params(kv)?;
    let mut at_w = BTreeMap::new();
    for (sw, s) in scheduled(kv)? {
        if sw < w {
            before = match apply(&before, &s.values) {
                Ok(p) => p,
                Err(e) => return Ok(Err(e)),
            };
        } else if sw == w {
            at_w = s.values;
        }
    }
    at_w.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(apply(&before, &at_w).map(|after| (before, after)))
}

/// Whether change `c` can be scheduled now (`None`: the proposal carries
/// none); the reason it cannot otherwise. Checked when the proposal is
/// opened and when it is accepted.
pub fn check(kv: &impl KvRead, c: Option<&ParamChange>) -> Result<Result<(), String>, Fatal> {
    let Some(c) = c else {
        return Ok(Err("a params proposal carries a change".into()));
    };
    let window = cur_window(kv)?.unwrap_or(0);
    if c.from_window <= window {
        return Ok(Err(format!(
            "from_window {} is not after the current window {window}: a window closes under the parameters it opened with",
            c.from_window
        )));
    }
    if c.from_window - window > MAX_AHEAD_WINDOWS {
        return Ok(Err(format!(
            "from_window {} is more than {MAX_AHEAD_WINDOWS} windows after the current window {window}",
            c.from_window
        )));
    }
    let sched = scheduled(kv)?;
    if let Some((last, _)) = sched.last().filter(|(w, _)| *w > c.from_window) {
        return Ok(Err(format!(
            "a change is scheduled from window {last}: schedule from that window or later"
        )));
    }
    if sched.len() >= MAX_SCHEDULED && !sched.iter().any(|(w, _)| *w == c.from_window) {
        return Ok(Err(format!(
            "{MAX_SCHEDULED} changes are scheduled already"
        )));
    }
    let values = match parse_values(c) {
        Ok(v) => v,
        Err(e) => return Ok(Err(e)),
    };
    match projected(kv, c.from_window, &values)? {
        Ok((before, after)) => check_step(kv, &before, &after),
        Err(e) => Ok(Err(e)),
    }
}

/// Schedules the change of accepted proposal `p` (checked again by the
/// caller); returns the `params_scheduled` event.
pub fn schedule(kv: &mut impl Kv, p: &Proposal) -> Result<Event, Fatal> {
    let c = p.params.clone().unwrap_or_default();
    let values = parse_values(&c).map_err(|_| Fatal::Corrupt("checked param change"))?;
    let key = keys::params_next(c.from_window);
    let mut s: Scheduled = match kv.get(&key)? {
        Some(b) => serde_json::from_slice(&b).map_err(|_| Fatal::Corrupt("scheduled params"))?,
        None => Scheduled::default(),
    };
    s.proposals.push(p.id);
    s.values.extend(values.clone());
    kv.put(key, serde_json::to_vec(&s).unwrap_or_default());
    Ok(Event::new(
        "params_scheduled",
        [
            ("proposal", p.id.to_string()),
            ("from_window", c.from_window.to_string()),
            ("changes", Value::Object(Map::from_iter(values)).to_string()),
        ],
    ))
}

/// The switch at the start of a block in window `now_window`: every change
/// due is checked against the state now and made current, or dropped with a
/// `params_refused` event; then at most one kept version no open or
/// converting window needs is dropped.
pub fn begin_block(kv: &mut impl Kv, now_window: u64) -> Result<Vec<Event>, Fatal> {
    let mut events = Vec::new();
    for (w, s) in scheduled(kv)? {
        if w > now_window {
            break;
        }
        kv.delete(keys::params_next(w));
        let old = params(kv)?;
        let ids = s
            .proposals
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let verdict = match apply(&old, &s.values) {
            Ok(new) => check_step(kv, &old, &new)?.map(|()| new),
            Err(e) => Err(e),
        };
        match verdict {
            Ok(new) => {
                let was = since(kv)?;
                kv.put(
                    keys::params_at(was),
                    serde_json::to_vec(&old).unwrap_or_default(),
                );
                put_params_raw(kv, &new);
                put_u64(kv, keys::PARAMS_SINCE.to_vec(), now_window);
                events.push(Event::new(
                    "params_changed",
                    [
                        ("window", now_window.to_string()),
                        ("proposals", ids),
                        (
                            "changes",
                            Value::Object(Map::from_iter(s.values)).to_string(),
                        ),
                    ],
                ));
            }
            Err(why) => events.push(Event::new(
                "params_refused",
                [
                    ("window", now_window.to_string()),
                    ("proposals", ids),
                    ("reason", why),
                ],
            )),
        }
    }
    prune(kv, now_window)?;
    Ok(events)
}

/// Drops the oldest kept version when the next version starts at or before
/// the oldest window still open or converting.
fn prune(kv: &mut impl Kv, now_window: u64) -> Result<(), Fatal> {
    let rows = kv.scan(keys::PARAMS_AT, &prefix_end(keys::PARAMS_AT), 2)?;
    let Some((first, _)) = rows.first() else {
        return Ok(());
    };
    let next_start = match rows.get(1) {
        Some((k, _)) => keys::parse_window_suffix(k, keys::PARAMS_AT)
            .ok_or(Fatal::Corrupt("kept params key"))?,
        None => since(kv)?,
    };
    // The previous block's window may be closed by this very block, after
    // this runs: it still counts as open.
    let needed = [
        oldest_closing(kv)?.map(|c| c.window),
        cur_window(kv)?,
        Some(now_window),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(now_window);
    if next_start <= needed {
        kv.delete(first.clone());
    }
    Ok(())
}

/// `/params`: the parameters in force, the window they govern from, and
/// every scheduled change with the parameters it would make.
pub fn json(kv: &impl KvRead) -> Result<Value, Fatal> {
    let current = params(kv)?;
    let mut out = current.to_json();
    let mut base = current;
    let mut list = Vec::new();
    for (w, s) in scheduled(kv)? {
        let after = apply(&base, &s.values).unwrap_or_else(|_| base.clone());
        list.push(json!({
            "from_window": w,
            "proposals": s.proposals,
            "changes": s.values,
        }));
        base = after;
    }
    if let Value::Object(m) = &mut out {
        m.insert("since_window".into(), json!(since(kv)?));
        m.insert("scheduled".into(), Value::Array(list));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

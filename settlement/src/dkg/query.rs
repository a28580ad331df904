//! The validator-set and key queries of [`crate::query`]: `/validators`,
//! `/proposals?from=ID` and `/dkg`. Read-only JSON over committed state,
//! hex for every key and address.
//!
//! - `/validators`: `{"validators": [{"address", "pubkey", "power",
//!   "share_index"}], "total_power"}`; `share_index` is its index in the
//!   active key or `null`.
//! - `/proposals?from=ID`: up to [`PROPOSALS_PAGE`] proposals from id `ID`
//!   (default 1), each with its action and status by name (`add`, `remove`,
//!   `rekey`, `recover`; `open`, `accepted`, `applied`, `refused`; `pubkey`
//!   and `address` `null` for the last two), its approvals,
//!   the current power of its approvers and the current total power;
//!   `next_from` is the id to ask for next, or `null`.
//! - `/dkg`: the active key as before (`threshold`, `validators`,
//!   `group_key`, `public_shares`, `signers`, `dst`) plus its `epoch`; the
//!   running `ceremony` (round, kind, phase at the last height, heights,
//!   dealer and player counts, ceremony keys, dealings, acks and reveals
//!   so far), the
//!   `next_key` waiting to activate and the `last_ceremony` that made a
//!   key (each `null` when there is none). Without a key the key fields are
//!   `null` (or empty); a chain with no key and no ceremony at all answers
//!   `NotFound`, as before the on-chain DKG. `next_key.activate_height` is
//!   0 while the rotation that hands the key to the hub is unsigned.
//! - `/rotations?from=N`: up to [`ROTATIONS_PAGE`] key rotations from nonce
//!   `N` (default 1): `{nonce, hub, epoch, from_epoch, group_key,
//!   signature, governed, made_height, signed_height, active_height}`
//!   (`signature` `null` until signed and for a governed rotation, heights
//!   0 until reached), and `next_from`.

use serde_json::{json, Value};
use tally_store::KvRead;

use super::msg::address_of;
use super::state::{self as st};
use super::types::Phase;
use crate::codes::Code;
use crate::error::{reject, ExecError, Fatal};
use crate::proto::{Ceremony, Proposal, ValidatorRecord};
use crate::query_path;

/// Most proposals one `/proposals` answer holds.
pub const PROPOSALS_PAGE: usize = 100;

fn bad(msg: impl Into<String>) -> ExecError {
    reject(Code::BadArgument, msg)
}

fn hex_or_null(b: &[u8]) -> Value {
    if b.is_empty() {
        Value::Null
    } else {
        json!(hex::encode(b))
    }
}

/// `/validators`.
pub fn validators(kv: &impl KvRead) -> Result<Value, ExecError> {
    let signers = match st::active_key_record(kv)? {
        Some(k) => k
            .signer_addresses()
            .map_err(|_| Fatal::Corrupt("dkg signers"))?,
        None => Vec::new(),
    };
    let share_index = |a: &[u8; 20]| {
        signers
            .iter()
            .position(|s| s == a)
            .and_then(|i| u32::try_from(i + 1).ok())
    };
    let vals = st::validators(kv)?;
    let total: u64 = vals
        .iter()
        .map(|(_, v)| v.power)
        .fold(0, u64::saturating_add);
    let rows: Vec<Value> = vals
        .iter()
        .map(|(a, v)| {
            json!({
                "address": hex::encode(a),
                "pubkey": hex::encode(&v.pubkey),
                "power": v.power,
                "share_index": share_index(a),
            })
        })
        .collect();
    Ok(json!({"validators": rows, "total_power": total}))
}

/// The `from` parameter of a listing (`what` names its numbers), default
/// 1; any other parameter is refused.
pub(crate) fn from_param(qs: Option<&str>, what: &str) -> Result<u64, ExecError> {
    let mut from = 1u64;
    for (k, v) in query_path::parse_params(qs).map_err(|e| bad(e.to_string()))? {
        match k.as_str() {
            "from" => {
                from = v
                    .parse()
                    .map_err(|_| bad(format!("from must be a {what}, got {v:?}")))?
            }
            _ => return Err(bad(format!("unknown query parameter {k:?}; use from"))),
        }
    }
    Ok(from)
}

/// `/proposals?from=ID`.
pub fn proposals(kv: &impl KvRead, qs: Option<&str>) -> Result<Value, ExecError> {
    let from = from_param(qs, "proposal id")?;
    let vals = st::validators(kv)?;
    let total: u64 = vals
        .iter()
        .map(|(_, v)| v.power)
        .fold(0, u64::saturating_add);
    let mut page = st::proposals_from(kv, from, PROPOSALS_PAGE + 1)?;
    let next = if page.len() > PROPOSALS_PAGE {
        page.truncate(PROPOSALS_PAGE);
        page.last().map(|p| p.id.saturating_add(1))
    } else {
        None
    };
    let rows = page
        .iter()
        .map(|p| proposal_json(p, &vals, total))
        .collect::<Result<Vec<Value>, Fatal>>()?;
    Ok(json!({"proposals": rows, "next_from": next}))
}

fn proposal_json(
    p: &Proposal,
    vals: &[([u8; 20], ValidatorRecord)],
    total: u64,
) -> Result<Value, Fatal> {
    let approving: u64 = vals
        .iter()
        .filter(|(a, _)| p.approvals.iter().any(|x| x.as_slice() == a.as_slice()))
        .map(|(_, v)| v.power)
        .fold(0, u64::saturating_add);
    let mut v = json!({
        "id": p.id,
        "action": st::proposal_action(p)?.name(),
        "pubkey": hex_or_null(&p.pubkey),
        "address": (!p.pubkey.is_empty()).then(|| hex::encode(address_of(&p.pubkey))),
        "power": p.power,
        "proposer": hex::encode(&p.proposer),
        "height": p.height,
        "status": st::proposal_status(p)?.name(),
        "reason": p.reason,
        "applied_height": p.applied_height,
        "approvals": p.approvals.iter().map(hex::encode).collect::<Vec<_>>(),
        "approving_power": approving,
        "total_power": total,
        "upgrade": p.upgrade.as_ref().map(crate::upgrade::plan_json),
    });
    // Governance payloads of app version 3, shown only when carried.
    if let Some(c) = &p.params {
        let values: serde_json::Map<String, Value> = c
            .values
            .iter()
            .map(|x| (x.name.clone(), Value::String(x.value.clone())))
            .collect();
        v["params"] = json!({"from_window": c.from_window, "values": values});
    }
    if let Some(c) = &p.gateway {
        let op = crate::gov::gateway::Op::from_value(c.op).map_or("unknown", |o| o.name());
        v["gateway"] = json!({"op": op, "name": c.name, "pubkey": hex_or_null(&c.pubkey)});
    }
    if let Some(c) = &p.slo {
        v["slo"] = crate::slo::policy::change_json(c);
    }
    Ok(v)
}

fn ceremony_json(kv: &impl KvRead, c: &Ceremony, h: u64) -> Result<Value, ExecError> {
    let [keys, dealings, acks, reveals] = st::round_counts(kv, c.round)?;
    Ok(json!({
        "round": c.round,
        "kind": st::ceremony_kind(c)?.name(),
        "phase": Phase::at(c, h).name(),
        "start_height": c.start_height,
        "keys_end": c.keys_end,
        "deal_end": c.deal_end,
        "ack_end": c.ack_end,
        "end": c.end,
        "threshold": c.threshold,
        "epoch": c.epoch,
        "proposal": c.proposal,
        "attempt": c.attempt,
        "dealers": c.dealers.len(),
        "players": c.players.len(),
        "keys": keys,
        "dealings": dealings,
        "acks": acks,
        "reveals": reveals,
    }))
}

/// `/dkg`.
pub fn dkg(kv: &impl KvRead) -> Result<Value, ExecError> {
    let key = st::active_key_record(kv)?;
    let running = st::ceremony(kv)?;
    let next = st::next_key(kv)?;
    let last = st::last_ceremony(kv)?;
    if key.is_none() && running.is_none() && next.is_none() && last.is_none() {
        return Err(reject(
            Code::NotFound,
            "this chain has no threshold key (no dkg in genesis) and no ceremony",
        ));
    }
    let h = st::last_height(kv)?;
    let mut v = match &key {
        Some(k) => json!({
            "epoch": k.epoch,
            "threshold": k.threshold,
            "validators": k.public_shares.len(),
            "group_key": k.group_key,
            "public_shares": k.public_shares,
            "signers": k.signers,
        }),
        None => json!({
            "epoch": null, "threshold": null, "validators": 0, "group_key": null,
            "public_shares": [], "signers": [],
        }),
    };
    v["dst"] = json!(String::from_utf8_lossy(crate::bls::DST));
    v["height"] = json!(h);
    v["ceremony"] = match &running {
        Some(c) => ceremony_json(kv, c, h)?,
        None => Value::Null,
    };
    v["next_key"] = match &next {
        Some(n) => {
            let k = st::next_key_record(n)?;
            json!({
                "epoch": k.epoch,
                "activate_height": n.activate_height,
                "proposal": n.proposal,
                "rotation": n.rotation,
                "threshold": k.threshold,
                "group_key": k.group_key,
                "signers": k.signers,
            })
        }
        None => Value::Null,
    };
    v["last_ceremony"] = match &last {
        Some(c) => json!({
            "round": c.round,
            "kind": st::ceremony_kind(c)?.name(),
            "epoch": c.epoch,
            "qualified": c.qualified,
            "dealers": c.dealers.len(),
            "players": c.players.len(),
        }),
        None => Value::Null,
    };
    Ok(v)
}

/// Rotations one `/rotations` answer lists at most.
pub const ROTATIONS_PAGE: usize = 100;

/// `/rotations?from=N`.
pub fn rotations(kv: &impl KvRead, qs: Option<&str>) -> Result<Value, ExecError> {
    let from = from_param(qs, "rotation nonce")?;
    let mut page = st::rotations(kv, from, ROTATIONS_PAGE + 1)?;
    let next = if page.len() > ROTATIONS_PAGE {
        page.truncate(ROTATIONS_PAGE);
        page.last().map(|r| r.nonce.saturating_add(1))
    } else {
        None
    };
    let rows: Vec<Value> = page
        .iter()
        .map(|r| {
            json!({
                "nonce": r.nonce,
                "hub": r.hub,
                "epoch": r.epoch,
                "from_epoch": r.from_epoch,
                "group_key": hex::encode(&r.group_key),
                "signature": (!r.signature.is_empty()).then(|| hex::encode(&r.signature)),
                "governed": r.governed,
                "made_height": r.made_height,
                "signed_height": r.signed_height,
                "active_height": r.active_height,
            })
        })
        .collect();
    Ok(json!({"rotations": rows, "next_from": next}))
}

#[cfg(test)]
mod tests;

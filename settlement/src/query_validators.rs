//! The validator-set and key queries of [`crate::query`]: `/validators`,
//! `/proposals?from=ID` and `/dkg`. Read-only JSON over committed state,
//! hex for every key and address.
//!
//! - `/validators`: `{"validators": [{"address", "pubkey", "power",
//!   "enc_key", "share_index"}], "total_power"}`; `enc_key` is `null` for a
//!   validator without an encryption key, `share_index` is its index in the
//!   active key or `null`.
//! - `/proposals?from=ID`: up to [`PROPOSALS_PAGE`] proposals from id `ID`
//!   (default 1), each with its action and status by name (`add`, `remove`,
//!   `update`; `open`, `accepted`, `applied`, `refused`), its approvals,
//!   the current power of its approvers and the current total power;
//!   `next_from` is the id to ask for next, or `null`.
//! - `/dkg`: the active key as before (`threshold`, `validators`,
//!   `group_key`, `public_shares`, `signers`, `dst`) plus its `epoch`; the
//!   running `ceremony` (round, kind, phase at the last height, heights,
//!   dealer and player counts, dealings, acks and reveals so far), the
//!   `next_key` waiting to activate and the `last_ceremony` that made a
//!   key (each `null` when there is none). Without a key the key fields are
//!   `null` (or empty); a chain with no key and no ceremony at all answers
//!   `NotFound`, as before the on-chain DKG.

use serde_json::{json, Value};
use tally_store::{prefix_end, KvRead};

use crate::codes::Code;
use crate::dkg::state::{self as st, STATUS_ACCEPTED, STATUS_APPLIED, STATUS_OPEN, STATUS_REFUSED};
use crate::dkg::tx::{ADD, REMOVE, UPDATE};
use crate::dkg::{FRESH, RESHARE};
use crate::error::{reject, ExecError};
use crate::genesis::DkgGenesis;
use crate::keys;
use crate::proto::{Ceremony, Proposal};
use crate::query_path;
use crate::state::sync::threshold_key;

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
    let key = threshold_key(kv)?;
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
                "enc_key": hex_or_null(&v.enc_key),
                "share_index": key.as_ref().and_then(|k| k.index_of(a)),
            })
        })
        .collect();
    Ok(json!({"validators": rows, "total_power": total}))
}

/// A proposal action's name.
pub fn action_name(action: u32) -> &'static str {
    match action {
        ADD => "add",
        REMOVE => "remove",
        UPDATE => "update",
        _ => "unknown",
    }
}

/// A proposal status's name.
pub fn status_name(status: u32) -> &'static str {
    match status {
        STATUS_OPEN => "open",
        STATUS_ACCEPTED => "accepted",
        STATUS_APPLIED => "applied",
        STATUS_REFUSED => "refused",
        _ => "unknown",
    }
}

/// `/proposals?from=ID`.
pub fn proposals(kv: &impl KvRead, qs: Option<&str>) -> Result<Value, ExecError> {
    let mut from = 1u64;
    for (k, v) in query_path::parse_params(qs).map_err(|e| bad(e.to_string()))? {
        match k.as_str() {
            "from" => {
                from = v
                    .parse()
                    .map_err(|_| bad(format!("from must be a proposal id, got {v:?}")))?
            }
            _ => return Err(bad(format!("unknown query parameter {k:?}; use from"))),
        }
    }
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
    let rows: Vec<Value> = page
        .iter()
        .map(|p| proposal_json(p, &vals, total))
        .collect();
    Ok(json!({"proposals": rows, "next_from": next}))
}

fn proposal_json(
    p: &Proposal,
    vals: &[([u8; 20], crate::proto::ValidatorRecord)],
    total: u64,
) -> Value {
    let approving: u64 = vals
        .iter()
        .filter(|(a, _)| p.approvals.iter().any(|x| x.as_slice() == a.as_slice()))
        .map(|(_, v)| v.power)
        .fold(0, u64::saturating_add);
    json!({
        "id": p.id,
        "action": action_name(p.action),
        "pubkey": hex::encode(&p.pubkey),
        "address": hex::encode(crate::dkg::address_of(&p.pubkey)),
        "power": p.power,
        "enc_key": hex_or_null(&p.enc_key),
        "proposer": hex::encode(&p.proposer),
        "height": p.height,
        "status": status_name(p.status),
        "reason": p.reason,
        "applied_height": p.applied_height,
        "approvals": p.approvals.iter().map(hex::encode).collect::<Vec<_>>(),
        "approving_power": approving,
        "total_power": total,
    })
}

fn kind_name(kind: u32) -> &'static str {
    match kind {
        FRESH => "fresh",
        RESHARE => "reshare",
        _ => "unknown",
    }
}

/// The phase of `c` once block `h` is committed: what the next block may
/// still carry.
pub fn phase_name(c: &Ceremony, h: u64) -> &'static str {
    if h < c.deal_end {
        "dealings"
    } else if h < c.ack_end {
        "acks"
    } else if h < c.end {
        "reveals"
    } else {
        "finalising"
    }
}

fn count(kv: &impl KvRead, prefix: &[u8]) -> Result<u64, ExecError> {
    let mut n = 0u64;
    kv.for_each(prefix, &prefix_end(prefix), &mut |_, _| {
        n += 1;
        true
    })?;
    Ok(n)
}

fn ceremony_json(kv: &impl KvRead, c: &Ceremony, h: u64) -> Result<Value, ExecError> {
    Ok(json!({
        "round": c.round,
        "kind": kind_name(c.kind),
        "phase": phase_name(c, h),
        "start_height": c.start_height,
        "deal_end": c.deal_end,
        "ack_end": c.ack_end,
        "end": c.end,
        "threshold": c.threshold,
        "old_threshold": c.old_threshold,
        "epoch": c.epoch,
        "proposal": c.proposal,
        "attempt": c.attempt,
        "dealers": c.dealers.len(),
        "players": c.players.len(),
        "dealings": count(kv, &keys::dealing_round(c.round))?,
        "acks": count(kv, &keys::ack_round(c.round))?,
        "reveals": count(kv, &keys::reveal_round(c.round))?,
    }))
}

/// `/dkg`.
pub fn dkg(kv: &impl KvRead) -> Result<Value, ExecError> {
    let key = threshold_key(kv)?;
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
            "epoch": k.genesis.epoch,
            "threshold": k.genesis.threshold,
            "validators": k.genesis.public_shares.len(),
            "group_key": k.genesis.group_key,
            "public_shares": k.genesis.public_shares,
            "signers": k.genesis.signers,
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
            let k: DkgGenesis = serde_json::from_slice(&n.key)
                .map_err(|_| ExecError::Fatal(crate::Fatal::Corrupt("next key")))?;
            json!({
                "epoch": k.epoch,
                "activate_height": n.activate_height,
                "proposal": n.proposal,
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
            "kind": kind_name(c.kind),
            "epoch": c.epoch,
            "qualified": c.qualified,
            "dealers": c.dealers.len(),
            "players": c.players.len(),
        }),
        None => Value::Null,
    };
    Ok(v)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use tally_store::{MemBackend, Pending};

    use crate::dkg::state as st;
    use crate::proto::{
        Ceremony, CeremonyDealer, CeremonyPlayer, Dealing, NextKey, Proposal, ValidatorRecord,
    };
    use crate::query::query;
    use crate::Code;

    fn ask(kv: &Pending, path: &str) -> serde_json::Value {
        let r = query(kv, path);
        assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
        serde_json::from_slice(&r.value).unwrap()
    }

    fn empty() -> Pending {
        Pending::open(Arc::new(MemBackend::new())).unwrap()
    }

    /// Two validators ([1; 20] power 10 without an encryption key, [2; 20]
    /// power 20 with one) and a 1-of-1 key held by [2; 20].
    fn with_validators() -> (Pending, crate::DkgGenesis) {
        let mut kv = empty();
        st::put_validator(
            &mut kv,
            &[1; 20],
            &ValidatorRecord {
                pubkey: vec![0x11; 32],
                power: 10,
                enc_key: Vec::new(),
            },
        );
        st::put_validator(
            &mut kv,
            &[2; 20],
            &ValidatorRecord {
                pubkey: vec![0x22; 32],
                power: 20,
                enc_key: vec![0xab; 48],
            },
        );
        let (pubs, _) = crate::bls::deal(1, 1, &[[7u8; 64]]).unwrap();
        let key = crate::DkgGenesis {
            threshold: 1,
            group_key: hex::encode(pubs.group.compress()),
            public_shares: vec![hex::encode(pubs.shares[0].compress())],
            signers: vec!["02".repeat(20)],
            epoch: 3,
        };
        crate::state::sync::put_threshold_key(&mut kv, &key).unwrap();
        (kv, key)
    }

    #[test]
    fn validators_show_keys_powers_and_share_indexes() {
        let (kv, _) = with_validators();
        assert_eq!(
            ask(&kv, "/validators"),
            json!({"validators": [
                {"address": "01".repeat(20), "pubkey": "11".repeat(32), "power": 10,
                 "enc_key": null, "share_index": null},
                {"address": "02".repeat(20), "pubkey": "22".repeat(32), "power": 20,
                 "enc_key": "ab".repeat(48), "share_index": 1},
            ], "total_power": 30})
        );
        assert_eq!(
            ask(&empty(), "/validators"),
            json!({"validators": [], "total_power": 0})
        );
        assert_eq!(query(&kv, "/validators?x=1").code, Code::BadArgument);
    }

    fn proposal(id: u64, status: u32, approvals: Vec<Vec<u8>>) -> Proposal {
        Proposal {
            id,
            action: 1,
            pubkey: vec![0x33; 32],
            power: 5,
            enc_key: vec![0xcd; 48],
            proposer: vec![1; 20],
            height: 40,
            status,
            approvals,
            reason: String::new(),
            applied_height: 0,
        }
    }

    #[test]
    fn proposals_are_paged_by_id_with_status_names_and_approving_power() {
        let (mut kv, _) = with_validators();
        st::put_proposal(&mut kv, &proposal(1, 1, vec![vec![1; 20]]));
        let mut refused = proposal(2, 4, vec![vec![1; 20], vec![2; 20]]);
        refused.action = 2;
        refused.enc_key.clear();
        refused.reason = "expired without enough approvals".into();
        st::put_proposal(&mut kv, &refused);
        let v = ask(&kv, "/proposals");
        assert_eq!(v["next_from"], json!(null));
        let p = &v["proposals"];
        assert_eq!(p.as_array().unwrap().len(), 2);
        assert_eq!(p[0]["id"], 1);
        assert_eq!(p[0]["action"], "add");
        assert_eq!(p[0]["status"], "open");
        assert_eq!(p[0]["pubkey"], "33".repeat(32));
        assert_eq!(p[0]["enc_key"], "cd".repeat(48));
        assert_eq!(p[0]["approvals"], json!(["01".repeat(20)]));
        assert_eq!(p[0]["approving_power"], 10);
        assert_eq!(p[0]["total_power"], 30);
        assert_eq!(p[1]["action"], "remove");
        assert_eq!(p[1]["status"], "refused");
        assert_eq!(p[1]["enc_key"], json!(null));
        assert_eq!(p[1]["reason"], "expired without enough approvals");
        assert_eq!(p[1]["approving_power"], 30);
        let v = ask(&kv, "/proposals?from=2");
        assert_eq!(v["proposals"].as_array().unwrap().len(), 1);
        assert_eq!(v["proposals"][0]["id"], 2);
        for id in 3..=103 {
            st::put_proposal(&mut kv, &proposal(id, 3, Vec::new()));
        }
        let v = ask(&kv, "/proposals");
        assert_eq!(v["proposals"].as_array().unwrap().len(), 100);
        assert_eq!(v["proposals"][99]["id"], 100);
        assert_eq!(v["proposals"][99]["status"], "applied");
        assert_eq!(v["next_from"], 101);
        let v = ask(&kv, "/proposals?from=101");
        assert_eq!(v["proposals"].as_array().unwrap().len(), 3);
        assert_eq!(v["next_from"], json!(null));
        assert_eq!(query(&kv, "/proposals?from=x").code, Code::BadArgument);
        assert_eq!(query(&kv, "/proposals?limit=2").code, Code::BadArgument);
    }

    fn ceremony(round: u64) -> Ceremony {
        Ceremony {
            round,
            kind: 2,
            start_height: 100,
            deal_end: 110,
            ack_end: 120,
            end: 130,
            dealers: vec![CeremonyDealer {
                address: vec![2; 20],
                share_index: 1,
            }],
            players: (1..=3u8)
                .map(|i| CeremonyPlayer {
                    address: vec![i; 20],
                    ..Default::default()
                })
                .collect(),
            threshold: 2,
            old_threshold: 1,
            proposal: 9,
            epoch: 4,
            qualified: Vec::new(),
            attempt: 1,
        }
    }

    #[test]
    fn dkg_shows_the_key_the_running_ceremony_and_what_comes_next() {
        assert_eq!(query(&empty(), "/dkg").code, Code::NotFound);
        let (mut kv, key) = with_validators();
        let v = ask(&kv, "/dkg");
        assert_eq!(v["epoch"], 3);
        assert_eq!(v["threshold"], 1);
        assert_eq!(v["group_key"], json!(key.group_key));
        assert_eq!(v["signers"], json!(["02".repeat(20)]));
        assert_eq!(v["ceremony"], json!(null));
        assert_eq!(v["next_key"], json!(null));
        assert_eq!(v["last_ceremony"], json!(null));

        st::put_last_height(&mut kv, 112);
        st::put_ceremony(&mut kv, Some(&ceremony(6)));
        let d = Dealing {
            round: 6,
            ..Default::default()
        };
        st::put_dealing(&mut kv, 1, &d);
        st::put_ack(&mut kv, 6, 1, 1);
        st::put_ack(&mut kv, 6, 1, 2);
        st::put_reveal(&mut kv, 6, 1, 3, &[5; 32]);
        // An older round's data is not counted.
        st::put_dealing(
            &mut kv,
            1,
            &Dealing {
                round: 5,
                ..Default::default()
            },
        );
        st::put_ack(&mut kv, 5, 1, 3);
        let mut last = ceremony(5);
        last.kind = 1;
        last.epoch = 3;
        last.qualified = vec![1];
        st::put_last_ceremony(&mut kv, &last);
        let next = crate::DkgGenesis {
            epoch: 4,
            ..key.clone()
        };
        st::put_next_key(
            &mut kv,
            Some(&NextKey {
                key: serde_json::to_vec(&next).unwrap(),
                activate_height: 133,
                proposal: 9,
            }),
        );
        let v = ask(&kv, "/dkg");
        assert_eq!(v["height"], 112);
        assert_eq!(
            v["ceremony"],
            json!({"round": 6, "kind": "reshare", "phase": "acks", "start_height": 100,
                   "deal_end": 110, "ack_end": 120, "end": 130, "threshold": 2,
                   "old_threshold": 1, "epoch": 4, "proposal": 9, "attempt": 1,
                   "dealers": 1, "players": 3, "dealings": 1, "acks": 2, "reveals": 1})
        );
        assert_eq!(
            v["next_key"],
            json!({"epoch": 4, "activate_height": 133, "proposal": 9, "threshold": 1,
                   "group_key": key.group_key, "signers": ["02".repeat(20)]})
        );
        assert_eq!(
            v["last_ceremony"],
            json!({"round": 5, "kind": "fresh", "epoch": 3, "qualified": [1],
                   "dealers": 1, "players": 3})
        );
        for (h, phase) in [
            (109, "dealings"),
            (120, "reveals"),
            (129, "reveals"),
            (130, "finalising"),
        ] {
            st::put_last_height(&mut kv, h);
            assert_eq!(ask(&kv, "/dkg")["ceremony"]["phase"], phase, "height {h}");
        }
        // No key yet, but a ceremony: the key fields are empty, not an error.
        let mut kv = empty();
        st::put_ceremony(&mut kv, Some(&ceremony(1)));
        let v = ask(&kv, "/dkg");
        assert_eq!(v["group_key"], json!(null));
        assert_eq!(v["signers"], json!([]));
        assert_eq!(v["ceremony"]["dealings"], 0);
    }
}

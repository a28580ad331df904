//! The ceremony's life in `begin_block`: activating a reshared key at its
//! height, finalising a ceremony at its `end` height, starting the next
//! one, and expiring proposals nobody approved.
//!
//! Finalisation (ack-or-reveal): a dealer qualifies when its dealing is on
//! chain and every player either acked it or had its share revealed and
//! checked, with at most `players - threshold` reveals (so at least
//! `threshold` players hold secret shares of it). A fresh key needs
//! `threshold` qualified dealers and is the sum of their polynomials; a
//! reshare needs the current key's threshold of them and combines their
//! polynomials with the Lagrange coefficients of their current indices at
//! 0, so the constant term, the group key, is unchanged. Too few: the
//! round's data is deleted and the same ceremony runs again as the next
//! round (a reshare gives up after [`MAX_RESHARE_ROUNDS`] and refuses its
//! proposal); the current key, if any, stays.

use blst::min_pk::PublicKey;
use num_bigint::BigUint;
use tally_store::{prefix_end, Kv};

use super::crypto::{combine_commitments, eval_commitment, threshold_for};
use super::state::{self as st, STATUS_ACCEPTED, STATUS_APPLIED, STATUS_OPEN, STATUS_REFUSED};
use super::tx::{ADD, REMOVE};
use super::{FRESH, RESHARE};
use crate::bls::lagrange_at_zero;
use crate::error::Fatal;
use crate::genesis::DkgGenesis;
use crate::keys;
use crate::proto::{Ceremony, CeremonyDealer, CeremonyPlayer, NextKey, Proposal, ValidatorRecord};
use crate::state::chain::params;
use crate::state::sync::{put_threshold_key, threshold_key};
use crate::state::{put_u64, u64_or};
use crate::types::{Block, Event};

/// Rounds a reshare may fail before its proposal is refused.
pub const MAX_RESHARE_ROUNDS: u64 = 3;

/// The validator-set and key work at the start of `block`.
pub fn begin_block(kv: &mut impl Kv, block: &Block) -> Result<Vec<Event>, Fatal> {
    let h = block.height;
    st::put_last_height(kv, h);
    let mut events = Vec::new();
    if let Some(next) = st::next_key(kv)? {
        if h >= next.activate_height {
            events.push(activate(kv, &next)?);
        }
    }
    if let Some(c) = st::ceremony(kv)? {
        if h >= c.end {
            events.push(finalise(kv, h, c)?);
        }
    }
    expire_proposals(kv, h, &mut events)?;
    if st::ceremony(kv)?.is_none() && st::next_key(kv)?.is_none() {
        if let Some(e) = start_next(kv, h)? {
            events.push(e);
        }
    }
    Ok(events)
}

/// The active key becomes `next`; stored partials of the old key are
/// dropped (they can never combine with the new key's), and the proposal
/// changes the stored validator set as CometBFT does at this height.
fn activate(kv: &mut impl Kv, next: &NextKey) -> Result<Event, Fatal> {
    let key: DkgGenesis =
        serde_json::from_slice(&next.key).map_err(|_| Fatal::Corrupt("next key"))?;
    put_threshold_key(kv, &key).map_err(|_| Fatal::Corrupt("next key"))?;
    kv.delete_range(keys::PSIG.to_vec(), prefix_end(keys::PSIG));
    if let Some(p) = st::proposal(kv, next.proposal)? {
        apply_change(kv, &p)?;
    }
    st::put_next_key(kv, None);
    Ok(Event::new(
        "key_epoch",
        [
            ("epoch", key.epoch.to_string()),
            ("group_key", key.group_key.clone()),
            ("signers", key.signers.len().to_string()),
        ],
    ))
}

fn apply_change(kv: &mut impl Kv, p: &Proposal) -> Result<(), Fatal> {
    let addr = super::msg::address_of(&p.pubkey);
    let old = st::validator(kv, &addr)?;
    let rec = match p.action {
        ADD => ValidatorRecord {
            pubkey: p.pubkey.clone(),
            power: p.power,
            enc_key: p.enc_key.clone(),
        },
        REMOVE => ValidatorRecord {
            pubkey: p.pubkey.clone(),
            power: 0,
            enc_key: Vec::new(),
        },
        _ => ValidatorRecord {
            pubkey: p.pubkey.clone(),
            power: p.power,
            enc_key: if p.enc_key.is_empty() {
                old.map(|o| o.enc_key).unwrap_or_default()
            } else {
                p.enc_key.clone()
            },
        },
    };
    st::put_validator(kv, &addr, &rec);
    Ok(())
}

/// The set `p` would make: current validators with the change applied.
fn next_set(
    kv: &impl tally_store::KvRead,
    p: Option<&Proposal>,
) -> Result<Vec<CeremonyPlayer>, Fatal> {
    let mut set: Vec<CeremonyPlayer> = st::validators(kv)?
        .into_iter()
        .map(|(a, v)| CeremonyPlayer {
            address: a.to_vec(),
            pubkey: v.pubkey,
            power: v.power,
            enc_key: v.enc_key,
        })
        .collect();
    if let Some(p) = p {
        let addr = super::msg::address_of(&p.pubkey).to_vec();
        set.retain(|v| v.address != addr);
        let old_enc = st::validator(kv, &addr)?
            .map(|v| v.enc_key)
            .unwrap_or_default();
        if p.action != REMOVE {
            set.push(CeremonyPlayer {
                address: addr,
                pubkey: p.pubkey.clone(),
                power: p.power,
                enc_key: if p.enc_key.is_empty() {
                    old_enc
                } else {
                    p.enc_key.clone()
                },
            });
        }
        set.sort_by(|a, b| a.address.cmp(&b.address));
    }
    Ok(set)
}

fn next_round(kv: &mut impl Kv) -> Result<u64, Fatal> {
    let r = u64_or(kv, keys::CEREMONY_ROUND, 0)?.saturating_add(1);
    put_u64(kv, keys::CEREMONY_ROUND.to_vec(), r);
    Ok(r)
}

/// `c` (kind, dealers, players, old threshold, proposal, epoch and
/// attempt filled in) scheduled from `h`: its round, phase windows and
/// threshold.
fn schedule(kv: &mut impl Kv, h: u64, c: Ceremony) -> Result<Ceremony, Fatal> {
    let phase = params(kv)?.dkg_phase_blocks.max(1);
    Ok(Ceremony {
        round: next_round(kv)?,
        start_height: h,
        deal_end: h.saturating_add(phase),
        ack_end: h.saturating_add(2 * phase),
        end: h.saturating_add(3 * phase),
        threshold: threshold_for(c.players.len() as u32),
        qualified: Vec::new(),
        ..c
    })
}

fn started(c: &Ceremony) -> Event {
    Event::new(
        "dkg_started",
        [
            ("round", c.round.to_string()),
            (
                "kind",
                if c.kind == FRESH { "fresh" } else { "reshare" }.to_string(),
            ),
            ("dealers", c.dealers.len().to_string()),
            ("players", c.players.len().to_string()),
            ("threshold", c.threshold.to_string()),
            ("end", c.end.to_string()),
        ],
    )
}

/// With nothing running: a fresh key when there is none and every
/// validator has an encryption key; else the reshare of the oldest
/// accepted proposal (or, with no key, its change applied directly).
fn start_next(kv: &mut impl Kv, h: u64) -> Result<Option<Event>, Fatal> {
    let key = threshold_key(kv)?;
    let accepted = st::open_proposals(kv)?
        .into_iter()
        .find(|p| p.status == STATUS_ACCEPTED);
    if let Some(mut p) = accepted {
        let players = next_set(kv, Some(&p))?;
        if let Some(v) = players.iter().find(|v| v.enc_key.is_empty()) {
            p.status = STATUS_REFUSED;
            p.reason = format!(
                "validator {} has no encryption key",
                hex::encode(&v.address)
            );
            st::put_proposal(kv, &p);
            return Ok(Some(proposal_closed(&p)));
        }
        let Some(key) = key else {
            // No key to keep: the set changes at once.
            apply_change(kv, &p)?;
            st::put_validator_updates(kv, h, vec![update_of(&p)]);
            p.status = STATUS_APPLIED;
            p.applied_height = h;
            st::put_proposal(kv, &p);
            return Ok(Some(proposal_closed(&p)));
        };
        let dealers = key
            .signers
            .iter()
            .enumerate()
            .map(|(i, a)| CeremonyDealer {
                address: a.to_vec(),
                share_index: i as u32 + 1,
            })
            .collect();
        let c = schedule(
            kv,
            h,
            Ceremony {
                kind: RESHARE,
                dealers,
                players,
                old_threshold: key.shares.threshold,
                proposal: p.id,
                epoch: key.genesis.epoch + 1,
                ..Ceremony::default()
            },
        )?;
        st::put_ceremony(kv, Some(&c));
        return Ok(Some(started(&c)));
    }
    if key.is_none() {
        let players = next_set(kv, None)?;
        if players.is_empty() || players.iter().any(|v| v.enc_key.is_empty()) {
            return Ok(None);
        }
        let dealers = players
            .iter()
            .map(|p| CeremonyDealer {
                address: p.address.clone(),
                share_index: 0,
            })
            .collect();
        let c = schedule(
            kv,
            h,
            Ceremony {
                kind: FRESH,
                dealers,
                players,
                epoch: 1,
                ..Ceremony::default()
            },
        )?;
        st::put_ceremony(kv, Some(&c));
        return Ok(Some(started(&c)));
    }
    Ok(None)
}

fn update_of(p: &Proposal) -> ValidatorRecord {
    ValidatorRecord {
        pubkey: p.pubkey.clone(),
        power: if p.action == REMOVE { 0 } else { p.power },
        enc_key: Vec::new(),
    }
}

fn proposal_closed(p: &Proposal) -> Event {
    Event::new(
        "validator_proposal",
        [
            ("id", p.id.to_string()),
            ("status", p.status.to_string()),
            ("reason", p.reason.clone()),
        ],
    )
}

/// The qualified dealers' positions and commitments (ack-or-reveal).
pub fn qualified(
    kv: &impl tally_store::KvRead,
    c: &Ceremony,
) -> Result<Vec<(u32, Vec<PublicKey>)>, Fatal> {
    let n = c.players.len() as u32;
    let max_reveals = n.saturating_sub(c.threshold);
    let mut out = Vec::new();
    for d in 1..=c.dealers.len() as u32 {
        let Some(dealing) = st::dealing(kv, c.round, d)? else {
            continue;
        };
        let mut reveals = 0u32;
        let mut covered = true;
        for p in 1..=n {
            if st::has_ack(kv, c.round, d, p)? {
                continue;
            }
            if st::reveal(kv, c.round, d, p)?.is_some() {
                reveals += 1;
            } else {
                covered = false;
                break;
            }
        }
        if !covered || reveals > max_reveals {
            continue;
        }
        let commitment = st::commitment(&dealing)?;
        out.push((d, commitment));
    }
    Ok(out)
}

/// The weights a ceremony combines qualified dealings with: none for a
/// fresh key, the Lagrange coefficients of the dealers' current indices
/// at 0 for a reshare.
pub fn weights(c: &Ceremony, qualified: &[u32]) -> Result<Option<Vec<BigUint>>, Fatal> {
    if c.kind != RESHARE {
        return Ok(None);
    }
    let xs: Vec<u32> = qualified
        .iter()
        .map(|d| {
            c.dealers
                .get(*d as usize - 1)
                .map(|x| x.share_index)
                .unwrap_or(0)
        })
        .collect();
    lagrange_at_zero(&xs)
        .map(Some)
        .map_err(|_| Fatal::Corrupt("dealer indices"))
}

fn finalise(kv: &mut impl Kv, h: u64, mut c: Ceremony) -> Result<Event, Fatal> {
    let q = qualified(kv, &c)?;
    let need = if c.kind == RESHARE {
        c.old_threshold
    } else {
        c.threshold
    } as usize;
    let made = if q.len() >= need {
        make_key(kv, &c, &q)?
    } else {
        None
    };
    let Some(key) = made else {
        return fail(kv, h, c, q.len(), need);
    };
    c.qualified = q.iter().map(|(d, _)| *d).collect();
    if let Some(last) = st::last_ceremony(kv)? {
        st::delete_round(kv, last.round);
    }
    st::put_last_ceremony(kv, &c);
    st::put_ceremony(kv, None);
    let ev = Event::new(
        "dkg_finalised",
        [
            ("round", c.round.to_string()),
            ("epoch", key.epoch.to_string()),
            ("qualified", c.qualified.len().to_string()),
            ("group_key", key.group_key.clone()),
        ],
    );
    if c.kind == FRESH {
        put_threshold_key(kv, &key).map_err(|_| Fatal::Corrupt("key"))?;
        return Ok(ev);
    }
    let bytes = serde_json::to_vec(&key).map_err(|_| Fatal::Corrupt("key"))?;
    // CometBFT applies validator updates returned at h from h + 2: the
    // BLS key switches at the same height.
    st::put_next_key(
        kv,
        Some(&NextKey {
            key: bytes,
            activate_height: h.saturating_add(2),
            proposal: c.proposal,
        }),
    );
    if let Some(mut p) = st::proposal(kv, c.proposal)? {
        st::put_validator_updates(kv, h, vec![update_of(&p)]);
        p.status = STATUS_APPLIED;
        p.applied_height = h;
        st::put_proposal(kv, &p);
    }
    Ok(ev)
}

/// The key the qualified dealings make, `None` if it does not come out
/// well-formed (a point at infinity, or a reshare whose group key moved).
fn make_key(
    kv: &impl tally_store::KvRead,
    c: &Ceremony,
    q: &[(u32, Vec<PublicKey>)],
) -> Result<Option<DkgGenesis>, Fatal> {
    let positions: Vec<u32> = q.iter().map(|(d, _)| *d).collect();
    let w = weights(c, &positions)?;
    let commits: Vec<&[PublicKey]> = q.iter().map(|(_, c)| c.as_slice()).collect();
    let Ok(group_poly) = combine_commitments(&commits, w.as_deref()) else {
        return Ok(None);
    };
    let Some(group) = group_poly.first() else {
        return Ok(None);
    };
    if c.kind == RESHARE {
        let current = threshold_key(kv)?.map(|k| k.shares.group.compress());
        if current != Some(group.compress()) {
            return Ok(None);
        }
    }
    let mut shares = Vec::with_capacity(c.players.len());
    for j in 1..=c.players.len() as u32 {
        match eval_commitment(&group_poly, j) {
            Ok(p) => shares.push(hex::encode(p.compress())),
            Err(_) => return Ok(None),
        }
    }
    Ok(Some(DkgGenesis {
        threshold: c.threshold,
        group_key: hex::encode(group.compress()),
        public_shares: shares,
        signers: c.players.iter().map(|p| hex::encode(&p.address)).collect(),
        epoch: c.epoch,
    }))
}

fn fail(kv: &mut impl Kv, h: u64, c: Ceremony, got: usize, need: usize) -> Result<Event, Fatal> {
    st::delete_round(kv, c.round);
    let ev = Event::new(
        "dkg_failed",
        [
            ("round", c.round.to_string()),
            ("qualified", got.to_string()),
            ("needed", need.to_string()),
        ],
    );
    if c.kind == RESHARE && u64::from(c.attempt) + 1 >= MAX_RESHARE_ROUNDS {
        if let Some(mut p) = st::proposal(kv, c.proposal)? {
            p.status = STATUS_REFUSED;
            p.reason = format!("its reshare failed {MAX_RESHARE_ROUNDS} times");
            st::put_proposal(kv, &p);
        }
        st::put_ceremony(kv, None);
        return Ok(ev);
    }
    let attempt = c.attempt.saturating_add(1);
    let again = schedule(kv, h, Ceremony { attempt, ..c })?;
    st::put_ceremony(kv, Some(&again));
    Ok(ev)
}

fn expire_proposals(kv: &mut impl Kv, h: u64, events: &mut Vec<Event>) -> Result<(), Fatal> {
    let ttl = params(kv)?.proposal_expiry_blocks;
    for mut p in st::open_proposals(kv)? {
        if p.status == STATUS_OPEN && h >= p.height.saturating_add(ttl) {
            p.status = STATUS_REFUSED;
            p.reason = "expired without enough approvals".into();
            st::put_proposal(kv, &p);
            events.push(proposal_closed(&p));
        }
    }
    Ok(())
}

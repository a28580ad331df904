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
use tally_store::{Kv, KvRead};

use super::crypto::{combine_commitments, eval_commitment, threshold_for};
use super::key::KeyEpoch;
use super::msg::address_of;
use super::rules::{check_change, check_updates};
use super::state::{self as st};
use super::types::{CeremonyKind, ProposalAction, ProposalStatus};
use crate::bls::{lagrange_at_zero, parse_public_key};
use crate::error::Fatal;
use crate::proto::{Ceremony, CeremonyDealer, CeremonyPlayer, NextKey, Proposal, ValidatorRecord};
use crate::state::chain::params;
use crate::state::sync::delete_all_partials;
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
    let key = st::next_key_record(next)?;
    st::put_active_key(kv, &key)?;
    delete_all_partials(kv);
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
    let addr = address_of(&p.pubkey);
    let old = st::validator(kv, &addr)?;
    let rec = match st::proposal_action(p)? {
        ProposalAction::Add => ValidatorRecord {
            pubkey: p.pubkey.clone(),
            power: p.power,
            enc_key: p.enc_key.clone(),
        },
        ProposalAction::Remove => ValidatorRecord {
            pubkey: p.pubkey.clone(),
            power: 0,
            enc_key: Vec::new(),
        },
        ProposalAction::Update => ValidatorRecord {
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
fn next_set(kv: &impl KvRead, p: Option<&Proposal>) -> Result<Vec<CeremonyPlayer>, Fatal> {
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
        let addr = address_of(&p.pubkey).to_vec();
        set.retain(|v| v.address != addr);
        let old_enc = st::validator(kv, &addr)?
            .map(|v| v.enc_key)
            .unwrap_or_default();
        if st::proposal_action(p)? != ProposalAction::Remove {
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

/// `c` (kind, dealers, players, old threshold, proposal, epoch and
/// attempt filled in) scheduled from `h`: its round, phase windows and
/// threshold.
fn schedule(kv: &mut impl Kv, h: u64, c: Ceremony) -> Result<Ceremony, Fatal> {
    let phase = params(kv)?.dkg_phase_blocks.max(1);
    Ok(Ceremony {
        round: st::next_round(kv)?,
        start_height: h,
        deal_end: h.saturating_add(phase),
        ack_end: h.saturating_add(2 * phase),
        end: h.saturating_add(3 * phase),
        threshold: threshold_for(c.players.len() as u32),
        qualified: Vec::new(),
        ..c
    })
}

fn started(c: &Ceremony, kind: CeremonyKind) -> Event {
    Event::new(
        "dkg_started",
        [
            ("round", c.round.to_string()),
            ("kind", kind.name().to_string()),
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
    let key = st::active_key_record(kv)?;
    let mut accepted = None;
    for p in st::open_proposals(kv)? {
        if st::proposal_status(&p)? == ProposalStatus::Accepted {
            accepted = Some(p);
            break;
        }
    }
    if let Some(mut p) = accepted {
        let action = st::proposal_action(&p)?;
        let set = st::validators(kv)?;
        if let Err(why) = check_change(&set, action, &address_of(&p.pubkey), p.power) {
            return refuse(kv, &mut p, why);
        }
        let players = next_set(kv, Some(&p))?;
        let Some(key) = key else {
            // No key to keep: the set changes at once.
            let update = update_of(&p)?;
            if let Err(why) = check_update(&set, &update) {
                return refuse(kv, &mut p, why);
            }
            apply_change(kv, &p)?;
            st::put_validator_updates(kv, h, vec![update]);
            p.status = ProposalStatus::Applied.into();
            p.applied_height = h;
            st::put_proposal(kv, &p);
            return Ok(Some(proposal_closed(&p)));
        };
        if let Some(v) = players.iter().find(|v| v.enc_key.is_empty()) {
            let why = format!(
                "validator {} has no encryption key",
                hex::encode(&v.address)
            );
            return refuse(kv, &mut p, why);
        }
        let signers = key
            .signer_addresses()
            .map_err(|_| Fatal::Corrupt("dkg signers"))?;
        let dealers = signers
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
                kind: CeremonyKind::Reshare.into(),
                dealers,
                players,
                old_threshold: key.threshold,
                proposal: p.id,
                epoch: key.epoch + 1,
                ..Ceremony::default()
            },
        )?;
        st::put_ceremony(kv, Some(&c));
        return Ok(Some(started(&c, CeremonyKind::Reshare)));
    }
    if key.is_none() {
        return start_fresh(kv, h);
    }
    Ok(None)
}

/// A fresh key's ceremony, once every validator has an encryption key.
fn start_fresh(kv: &mut impl Kv, h: u64) -> Result<Option<Event>, Fatal> {
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
            kind: CeremonyKind::Fresh.into(),
            dealers,
            players,
            epoch: 1,
            ..Ceremony::default()
        },
    )?;
    st::put_ceremony(kv, Some(&c));
    Ok(Some(started(&c, CeremonyKind::Fresh)))
}

fn update_of(p: &Proposal) -> Result<ValidatorRecord, Fatal> {
    let removed = st::proposal_action(p)? == ProposalAction::Remove;
    Ok(ValidatorRecord {
        pubkey: p.pubkey.clone(),
        power: if removed { 0 } else { p.power },
        enc_key: Vec::new(),
    })
}

/// Closes accepted proposal `p` as refused with `why` (it no longer fits
/// the set it would run on).
fn refuse(kv: &mut impl Kv, p: &mut Proposal, why: String) -> Result<Option<Event>, Fatal> {
    p.status = ProposalStatus::Refused.into();
    p.reason = why;
    st::put_proposal(kv, p);
    Ok(Some(proposal_closed(p)))
}

/// CometBFT's check of `update` against `set`, the set it applies to
/// (the stored set: changes reach it only through this module, one at a
/// time, so it is CometBFT's next set whenever an update is made).
fn check_update(
    set: &[([u8; 20], ValidatorRecord)],
    update: &ValidatorRecord,
) -> Result<(), String> {
    let powers: Vec<([u8; 20], u64)> = set.iter().map(|(a, v)| (*a, v.power)).collect();
    check_updates(&powers, &[(address_of(&update.pubkey), update.power)])
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
pub fn qualified(kv: &impl KvRead, c: &Ceremony) -> Result<Vec<(u32, Vec<PublicKey>)>, Fatal> {
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
    if st::ceremony_kind(c)? != CeremonyKind::Reshare {
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
    let kind = st::ceremony_kind(&c)?;
    let need = if kind == CeremonyKind::Reshare {
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
    // The change is checked once more before anything of the current key
    // is replaced: a reshare whose update CometBFT would refuse ends here.
    let proposal = match kind {
        CeremonyKind::Reshare => st::proposal(kv, c.proposal)?,
        CeremonyKind::Fresh => None,
    };
    let update = proposal.as_ref().map(update_of).transpose()?;
    if let (Some(mut p), Some(u)) = (proposal.clone(), update.as_ref()) {
        if let Err(why) = check_update(&st::validators(kv)?, u) {
            st::delete_round(kv, c.round);
            st::put_ceremony(kv, None);
            let _ = refuse(kv, &mut p, why.clone())?;
            return Ok(Event::new(
                "dkg_failed",
                [
                    ("round", c.round.to_string()),
                    ("proposal", p.id.to_string()),
                    ("reason", why),
                ],
            ));
        }
    }
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
    if kind == CeremonyKind::Fresh {
        st::put_active_key(kv, &key)?;
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
    if let (Some(mut p), Some(u)) = (proposal, update) {
        st::put_validator_updates(kv, h, vec![u]);
        p.status = ProposalStatus::Applied.into();
        p.applied_height = h;
        st::put_proposal(kv, &p);
    }
    Ok(ev)
}

/// The key the qualified dealings make, `None` if it does not come out
/// well-formed (a point at infinity, or a reshare whose group key moved).
fn make_key(
    kv: &impl KvRead,
    c: &Ceremony,
    q: &[(u32, Vec<PublicKey>)],
) -> Result<Option<KeyEpoch>, Fatal> {
    let positions: Vec<u32> = q.iter().map(|(d, _)| *d).collect();
    let w = weights(c, &positions)?;
    let commits: Vec<&[PublicKey]> = q.iter().map(|(_, c)| c.as_slice()).collect();
    let Ok(group_poly) = combine_commitments(&commits, w.as_deref()) else {
        return Ok(None);
    };
    let Some(group) = group_poly.first() else {
        return Ok(None);
    };
    if st::ceremony_kind(c)? == CeremonyKind::Reshare {
        let current = match st::active_key_record(kv)? {
            Some(k) => Some(group_key(&k)?),
            None => None,
        };
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
    Ok(Some(KeyEpoch {
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
    let reshare = st::ceremony_kind(&c)? == CeremonyKind::Reshare;
    if reshare && u64::from(c.attempt) + 1 >= MAX_RESHARE_ROUNDS {
        if let Some(mut p) = st::proposal(kv, c.proposal)? {
            p.status = ProposalStatus::Refused.into();
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
        let open = st::proposal_status(&p)? == ProposalStatus::Open;
        if open && h >= p.height.saturating_add(ttl) {
            p.status = ProposalStatus::Refused.into();
            p.reason = "expired without enough approvals".into();
            st::put_proposal(kv, &p);
            events.push(proposal_closed(&p));
        }
    }
    Ok(())
}

/// The compressed group key of a stored key record (checked when the key
/// was made, so one that does not parse now is corruption).
fn group_key(k: &KeyEpoch) -> Result<[u8; 48], Fatal> {
    hex::decode(&k.group_key)
        .ok()
        .and_then(|b| parse_public_key(&b).ok())
        .map(|p| p.compress())
        .ok_or(Fatal::Corrupt("dkg group key"))
}

//! The ceremony's life in `begin_block`: finalising a ceremony at its
//! `end` height, activating a new key once the outgoing key signed its
//! rotation, starting the next ceremony, and expiring proposals nobody
//! approved.
//!
//! A ceremony runs four phases of `dkg_phase_blocks` each: ceremony keys
//! (each player registers an encryption key made for this round only, ADR
//! 0018), dealings, acks, reveals. A player that registered no key gets
//! no share of this key: nothing is encrypted to it, it cannot ack, and
//! its share is never revealed (it signs as if offline until the next
//! key).
//!
//! Finalisation (ack-or-reveal): at least `threshold` players must have
//! registered keys; a dealer qualifies when its dealing is on chain and
//! every player with a key either acked it or had its share revealed and
//! checked, with at most `keyed - threshold` reveals (so at least
//! `threshold` players hold secret shares of it). A key needs `threshold`
//! qualified dealers and is the sum of their polynomials: the first key
//! (`fresh`) and every key after a set change (`rekey`, dealt by the next
//! set) have a secret no past committee ever held shares of. Too few: the
//! round's data is deleted and the same ceremony runs again as the next
//! round (a re-key gives up after [`MAX_REKEY_ROUNDS`] and refuses its
//! proposal; a first key that failed yields to accepted proposals, which
//! apply at once, so validators that never deal can be removed); the
//! current key, if any, stays.
//!
//! A re-key's key does not become active when it is made. It waits in
//! `cer/next` with a rotation (`rot/<nonce>`) that the *outgoing* key must
//! sign through vote extensions ([`super::rotation`]); the hub accepts the
//! new key only with that signature. The block that combines it returns
//! the validator update, and the new key becomes active two blocks later,
//! when CometBFT's set changes. A recovery's key (no signature possible)
//! activates two blocks after it is made, and its rotation is governed.

use blst::min_pk::PublicKey;
use tally_store::{Kv, KvRead};

use super::crypto::{combine_commitments, eval_commitment, threshold_for};
use super::key::KeyEpoch;
use super::msg::address_of;
use super::rotation;
use super::rules::{check_change, check_update, proposal_closed, refuse, update_of};
use super::state::{self as st};
use super::types::{CeremonyKind, ProposalAction, ProposalStatus};
use crate::error::Fatal;
use crate::proto::{Ceremony, CeremonyDealer, CeremonyPlayer, NextKey, Proposal};
use crate::state::chain::params;
use crate::state::sync::delete_all_partials;
use crate::sync::batch::resign_current_batch;
use crate::types::{Block, Event};

/// Rounds a re-key may fail before its proposal is refused.
pub const MAX_REKEY_ROUNDS: u64 = 3;

/// The validator-set and key work at the start of `block`.
pub fn begin_block(kv: &mut impl Kv, block: &Block) -> Result<Vec<Event>, Fatal> {
    let h = block.height;
    st::put_last_height(kv, h);
    let mut events = Vec::new();
    if let Some(next) = st::next_key(kv)? {
        // 0: the rotation is not signed yet.
        if next.activate_height != 0 && h >= next.activate_height {
            events.push(activate(kv, h, &next)?);
        }
    }
    if let Some(c) = st::ceremony(kv)? {
        if h >= c.end {
            events.extend(finalise(kv, h, c)?);
        }
    }
    expire_proposals(kv, h, &mut events)?;
    events.extend(rotation::yield_to_recovery(kv)?);
    if st::ceremony(kv)?.is_none() && st::next_key(kv)?.is_none() {
        if let Some(e) = start_next(kv, h)? {
            events.push(e);
        }
    }
    Ok(events)
}

/// The active key becomes `next`; stored partials of the old key are
/// dropped (they can never combine with the new key's), a batch the old
/// key signed but the hub has not settled is signed again by the new key,
/// and the proposal changes the stored validator set as CometBFT does at
/// this height.
fn activate(kv: &mut impl Kv, h: u64, next: &NextKey) -> Result<Event, Fatal> {
    let key = st::next_key_record(next)?;
    st::put_active_key(kv, &key)?;
    delete_all_partials(kv);
    resign_current_batch(kv, &params(kv)?)?;
    rotation::activated(kv, next.rotation, h)?;
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

/// The stored set as CometBFT's will be once `p`'s update (if any)
/// applies.
fn apply_change(kv: &mut impl Kv, p: &Proposal) -> Result<(), Fatal> {
    if let Some(rec) = update_of(p)? {
        st::put_validator(kv, &address_of(&p.pubkey), &rec);
    }
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
        })
        .collect();
    if let Some(u) = p.map(update_of).transpose()?.flatten() {
        let addr = address_of(&u.pubkey).to_vec();
        set.retain(|v| v.address != addr);
        if u.power > 0 {
            set.push(CeremonyPlayer {
                address: addr,
                pubkey: u.pubkey,
                power: u.power,
            });
        }
        set.sort_by(|a, b| a.address.cmp(&b.address));
    }
    Ok(set)
}

/// `c` (kind, dealers, players, proposal, epoch and attempt filled in)
/// scheduled from `h`: its round, phase windows and threshold.
fn schedule(kv: &mut impl Kv, h: u64, c: Ceremony) -> Result<Ceremony, Fatal> {
    let phase = params(kv)?.dkg_phase_blocks.max(3);
    Ok(Ceremony {
        round: st::next_round(kv)?,
        start_height: h,
        keys_end: h.saturating_add(phase),
        deal_end: h.saturating_add(2 * phase),
        ack_end: h.saturating_add(3 * phase),
        end: h.saturating_add(4 * phase),
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

/// With nothing running: the re-key of the oldest accepted proposal (or,
/// with no key, its change applied directly); else a fresh key when there
/// is none.
fn start_next(kv: &mut impl Kv, h: u64) -> Result<Option<Event>, Fatal> {
    let key = st::active_key_record(kv)?;
    // The oldest accepted proposal, but a recovery first: the others may
    // wait on signers that are gone.
    let mut accepted: Option<Proposal> = None;
    for p in st::open_proposals(kv)? {
        if st::proposal_status(&p)? != ProposalStatus::Accepted {
            continue;
        }
        let recovery = st::proposal_action(&p)? == ProposalAction::Recover;
        if recovery || accepted.is_none() {
            accepted = Some(p);
        }
        if recovery {
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
            // No key to keep: the set changes at once (a re-key has
            // nothing to do: the first key is made next).
            let update = update_of(&p)?;
            if let Err(why) = check_update(&set, update.as_ref()) {
                return refuse(kv, &mut p, why);
            }
            apply_change(kv, &p)?;
            if let Some(u) = update {
                st::put_validator_updates(kv, h, vec![u]);
            }
            p.status = ProposalStatus::Applied.into();
            p.applied_height = h;
            st::put_proposal(kv, &p);
            return Ok(Some(proposal_closed(&p)));
        };
        let c = schedule(
            kv,
            h,
            Ceremony {
                kind: CeremonyKind::Rekey.into(),
                dealers: dealers_of(&players),
                players,
                proposal: p.id,
                // Past every key ever made: a key dropped unsigned for a
                // recovery keeps its epoch, never reused for another key.
                epoch: key
                    .epoch
                    .max(st::last_ceremony(kv)?.map_or(0, |c| c.epoch))
                    .saturating_add(1),
                ..Ceremony::default()
            },
        )?;
        st::put_ceremony(kv, Some(&c));
        return Ok(Some(started(&c, CeremonyKind::Rekey)));
    }
    if key.is_none() {
        return start_fresh(kv, h);
    }
    Ok(None)
}

/// The first key's ceremony.
fn start_fresh(kv: &mut impl Kv, h: u64) -> Result<Option<Event>, Fatal> {
    let players = next_set(kv, None)?;
    if players.is_empty() {
        return Ok(None);
    }
    let c = schedule(
        kv,
        h,
        Ceremony {
            kind: CeremonyKind::Fresh.into(),
            dealers: dealers_of(&players),
            players,
            epoch: 1,
            ..Ceremony::default()
        },
    )?;
    st::put_ceremony(kv, Some(&c));
    Ok(Some(started(&c, CeremonyKind::Fresh)))
}

/// Every player deals: a fresh secret needs no share of the old one.
fn dealers_of(players: &[CeremonyPlayer]) -> Vec<CeremonyDealer> {
    players
        .iter()
        .map(|p| CeremonyDealer {
            address: p.address.clone(),
        })
        .collect()
}

/// The positions of the players of `c` that registered a key for its
/// round, ascending.
pub fn keyed_players(kv: &impl KvRead, c: &Ceremony) -> Result<Vec<u32>, Fatal> {
    let mut out = Vec::with_capacity(c.players.len());
    for j in 1..=c.players.len() as u32 {
        if st::ceremony_key(kv, c.round, j)?.is_some() {
            out.push(j);
        }
    }
    Ok(out)
}

/// The qualified dealers' positions and commitments (ack-or-reveal over
/// the players with keys); none when fewer than `threshold` players
/// registered keys, since such a key could never sign.
pub fn qualified(kv: &impl KvRead, c: &Ceremony) -> Result<Vec<(u32, Vec<PublicKey>)>, Fatal> {
    let keyed = keyed_players(kv, c)?;
    if keyed.len() < c.threshold as usize {
        return Ok(Vec::new());
    }
    let max_reveals = (keyed.len() as u32).saturating_sub(c.threshold);
    let mut out = Vec::new();
    for d in 1..=c.dealers.len() as u32 {
        let Some(dealing) = st::dealing(kv, c.round, d)? else {
            continue;
        };
        let mut reveals = 0u32;
        let mut covered = true;
        for &p in &keyed {
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

fn finalise(kv: &mut impl Kv, h: u64, mut c: Ceremony) -> Result<Vec<Event>, Fatal> {
    let q = qualified(kv, &c)?;
    let kind = st::ceremony_kind(&c)?;
    let need = c.threshold as usize;
    let made = if q.len() >= need {
        make_key(&c, &q)?
    } else {
        None
    };
    let Some(key) = made else {
        return fail(kv, h, c, q.len(), need);
    };
    // The change is checked once more before anything of the current key
    // is replaced: a re-key whose update CometBFT would refuse ends here.
    let proposal = match kind {
        CeremonyKind::Rekey => st::proposal(kv, c.proposal)?,
        CeremonyKind::Fresh => None,
    };
    if let Some(mut p) = proposal.clone() {
        if let Err(why) = check_update(&st::validators(kv)?, update_of(&p)?.as_ref()) {
            st::delete_round(kv, c.round);
            st::put_ceremony(kv, None);
            let closed = refuse(kv, &mut p, why.clone())?;
            let failed = Event::new(
                "dkg_failed",
                [
                    ("round", c.round.to_string()),
                    ("proposal", p.id.to_string()),
                    ("reason", why),
                ],
            );
            return Ok([Some(failed), closed].into_iter().flatten().collect());
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
    let Some(p) = proposal else {
        st::put_active_key(kv, &key)?;
        return Ok(vec![ev]);
    };
    let from_epoch = st::active_key_record(kv)?.map_or(0, |k| k.epoch);
    let governed = st::proposal_action(&p)? == ProposalAction::Recover;
    let rotation = rotation::begin(kv, h, &key, from_epoch, p.id, governed)?;
    Ok(vec![ev, rotation])
}

/// The key the qualified dealings make, `None` if it does not come out
/// well-formed (a point at infinity).
fn make_key(c: &Ceremony, q: &[(u32, Vec<PublicKey>)]) -> Result<Option<KeyEpoch>, Fatal> {
    let commits: Vec<&[PublicKey]> = q.iter().map(|(_, c)| c.as_slice()).collect();
    let Ok(group_poly) = combine_commitments(&commits, None) else {
        return Ok(None);
    };
    let Some(group) = group_poly.first() else {
        return Ok(None);
    };
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

/// A round of `c` that qualified `got` dealers of the `need` it needed:
/// its data goes, and the ceremony runs again, gives up (a re-key's third
/// round: its proposal is refused, with the same `validator_proposal`
/// event as every other refusal) or yields to accepted proposals.
fn fail(
    kv: &mut impl Kv,
    h: u64,
    c: Ceremony,
    got: usize,
    need: usize,
) -> Result<Vec<Event>, Fatal> {
    st::delete_round(kv, c.round);
    let ev = Event::new(
        "dkg_failed",
        [
            ("round", c.round.to_string()),
            ("qualified", got.to_string()),
            ("needed", need.to_string()),
        ],
    );
    let rekey = st::ceremony_kind(&c)? == CeremonyKind::Rekey;
    if rekey && u64::from(c.attempt) + 1 >= MAX_REKEY_ROUNDS {
        st::put_ceremony(kv, None);
        let closed = match st::proposal(kv, c.proposal)? {
            Some(mut p) => refuse(
                kv,
                &mut p,
                format!("its re-key failed {MAX_REKEY_ROUNDS} times"),
            )?,
            None => None,
        };
        return Ok([Some(ev), closed].into_iter().flatten().collect());
    }
    // A first key that keeps failing yields to accepted proposals: with no
    // key they apply at once (removing the validators that never dealt,
    // say), and the next round starts over with the set they leave.
    if !rekey && has_accepted(kv)? {
        st::put_ceremony(kv, None);
        return Ok(vec![ev]);
    }
    let attempt = c.attempt.saturating_add(1);
    let again = schedule(kv, h, Ceremony { attempt, ..c })?;
    st::put_ceremony(kv, Some(&again));
    Ok(vec![ev])
}

fn has_accepted(kv: &impl KvRead) -> Result<bool, Fatal> {
    for p in st::open_proposals(kv)? {
        if st::proposal_status(&p)? == ProposalStatus::Accepted {
            return Ok(true);
        }
    }
    Ok(false)
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

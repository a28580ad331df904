//! Typed access to the DKG component's state: the active threshold key,
//! the validator set, ceremonies, dealings, acks, reveals and proposals
//! (keys in [`super::keys`]). Every DKG write goes through here. Absent
//! values are `None`; undecodable ones, and stored numbers no enum of
//! [`super::types`] names, are [`Fatal::Corrupt`].

use prost::Message;
use tally_store::{prefix_end, Kv, KvRead};

use super::key::{KeyCache, KeyEpoch, ThresholdKey};
use super::keys;
use super::types::{CeremonyKind, ProposalAction, ProposalStatus};
use crate::error::Fatal;
use crate::keys::{LAST_HEIGHT, PRESENT};
use crate::proto::{
    Ceremony, Dealing, KeyRotation, NextKey, Proposal, ValidatorRecord, ValidatorUpdates,
};
use crate::state::{get_u64, load, put_u64, u64_or};

/// The most validators a set may hold (a cap on every ceremony's size).
pub const MAX_VALIDATORS: usize = 128;

/// Height of the last block begun (0 before the first).
pub fn last_height(kv: &impl KvRead) -> Result<u64, Fatal> {
    u64_or(kv, LAST_HEIGHT, 0)
}

/// Records the height of the block being run.
pub fn put_last_height(kv: &mut impl Kv, height: u64) {
    put_u64(kv, LAST_HEIGHT.to_vec(), height);
}

/// The active threshold key with its points parsed (through `cache`:
/// parsed again only when the stored record changed), if the chain has
/// one.
pub fn active_key(kv: &impl KvRead, cache: &KeyCache) -> Result<Option<ThresholdKey>, Fatal> {
    match kv.get(keys::ACTIVE_KEY)? {
        None => Ok(None),
        Some(b) => cache.parse(&b).map(Some),
    }
}

/// The active threshold key's record alone (hex strings: no point is
/// parsed), if the chain has one.
pub fn active_key_record(kv: &impl KvRead) -> Result<Option<KeyEpoch>, Fatal> {
    match kv.get(keys::ACTIVE_KEY)? {
        None => Ok(None),
        Some(b) => key_record(&b).map(Some),
    }
}

/// Whether the chain has an active threshold key.
pub fn has_active_key(kv: &impl KvRead) -> Result<bool, Fatal> {
    Ok(kv.get(keys::ACTIVE_KEY)?.is_some())
}

/// Makes `k` the active threshold key.
pub fn put_active_key(kv: &mut impl Kv, k: &KeyEpoch) -> Result<(), Fatal> {
    let bytes = serde_json::to_vec(k).map_err(|_| Fatal::Corrupt("key record"))?;
    kv.put(keys::ACTIVE_KEY.to_vec(), bytes);
    Ok(())
}

/// The active key's record, stored as JSON.
fn key_record(bytes: &[u8]) -> Result<KeyEpoch, Fatal> {
    serde_json::from_slice(bytes).map_err(|_| Fatal::Corrupt("key record"))
}

/// One validator by consensus address.
pub fn validator(kv: &impl KvRead, address: &[u8]) -> Result<Option<ValidatorRecord>, Fatal> {
    load(kv, &keys::validator(address), "validator")
}

/// Stores a validator; power 0 deletes it.
pub fn put_validator(kv: &mut impl Kv, address: &[u8], v: &ValidatorRecord) {
    if v.power == 0 {
        kv.delete(keys::validator(address));
    } else {
        kv.put(keys::validator(address), v.encode_to_vec());
    }
}

/// Every validator, by address (ascending).
pub fn validators(kv: &impl KvRead) -> Result<Vec<([u8; 20], ValidatorRecord)>, Fatal> {
    let rows = kv.scan_prefix(keys::VALIDATOR, MAX_VALIDATORS + 1)?;
    let mut out = Vec::with_capacity(rows.len());
    for (k, v) in rows {
        let addr: [u8; 20] = k
            .get(keys::VALIDATOR.len()..)
            .and_then(|a| a.try_into().ok())
            .ok_or(Fatal::Corrupt("validator key"))?;
        let rec = ValidatorRecord::decode(v.as_slice()).map_err(|_| Fatal::Corrupt("validator"))?;
        out.push((addr, rec));
    }
    Ok(out)
}

/// The ceremony running now.
pub fn ceremony(kv: &impl KvRead) -> Result<Option<Ceremony>, Fatal> {
    load(kv, keys::CEREMONY, "ceremony")
}

/// Stores (or with `None` ends) the running ceremony.
pub fn put_ceremony(kv: &mut impl Kv, c: Option<&Ceremony>) {
    match c {
        Some(c) => kv.put(keys::CEREMONY.to_vec(), c.encode_to_vec()),
        None => kv.delete(keys::CEREMONY.to_vec()),
    }
}

/// The last ceremony that made a key.
pub fn last_ceremony(kv: &impl KvRead) -> Result<Option<Ceremony>, Fatal> {
    load(kv, keys::LAST_CEREMONY, "last ceremony")
}

/// Stores the last ceremony that made a key.
pub fn put_last_ceremony(kv: &mut impl Kv, c: &Ceremony) {
    kv.put(keys::LAST_CEREMONY.to_vec(), c.encode_to_vec());
}

/// A ceremony's kind (stored ceremonies always have a known one).
pub fn ceremony_kind(c: &Ceremony) -> Result<CeremonyKind, Fatal> {
    CeremonyKind::try_from(c.kind).map_err(|_| Fatal::Corrupt("ceremony kind"))
}

/// Takes the next ceremony round number (1 for the first ceremony).
pub fn next_round(kv: &mut impl Kv) -> Result<u64, Fatal> {
    let r = u64_or(kv, keys::CEREMONY_ROUND, 0)?.saturating_add(1);
    put_u64(kv, keys::CEREMONY_ROUND.to_vec(), r);
    Ok(r)
}

/// A dealing by round and dealer position.
pub fn dealing(kv: &impl KvRead, round: u64, dealer: u32) -> Result<Option<Dealing>, Fatal> {
    load(kv, &keys::dealing(round, dealer), "dealing")
}

/// Whether `dealer` has a dealing in `round`, without decoding it (an
/// ack names up to every dealer: at n = 100 decoding each 11 KB dealing
/// only to see that it is there cost 4 ms per ack).
pub fn has_dealing(kv: &impl KvRead, round: u64, dealer: u32) -> Result<bool, Fatal> {
    Ok(kv.get(&keys::dealing(round, dealer))?.is_some())
}

/// Stores a dealing.
pub fn put_dealing(kv: &mut impl Kv, dealer: u32, d: &Dealing) {
    kv.put(keys::dealing(d.round, dealer), d.encode_to_vec());
}

/// A stored dealing's commitment as points (checked when the dealing was
/// accepted, so a point that does not parse now is corruption).
pub fn commitment(d: &Dealing) -> Result<Vec<blst::min_pk::PublicKey>, Fatal> {
    commitment_with(d, &crate::envelope::VerifyAll)
}

/// [`commitment`], each point answered from `memo` when this node
/// validated its bytes before ([`crate::envelope::parse_public_key_with`]).
pub fn commitment_with(
    d: &Dealing,
    memo: &dyn crate::envelope::VerifiedSignatures,
) -> Result<Vec<blst::min_pk::PublicKey>, Fatal> {
    d.commitment
        .iter()
        .map(|b| crate::envelope::parse_public_key_with(b, memo))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| Fatal::Corrupt("stored commitment"))
}

/// Whether `player` acked `dealer`'s dealing in `round`.
pub fn has_ack(kv: &impl KvRead, round: u64, dealer: u32, player: u32) -> Result<bool, Fatal> {
    Ok(kv.get(&keys::ack(round, dealer, player))?.is_some())
}

/// Records an ack.
pub fn put_ack(kv: &mut impl Kv, round: u64, dealer: u32, player: u32) {
    kv.put(keys::ack(round, dealer, player), PRESENT.to_vec());
}

/// The share `dealer` revealed for `player` in `round` (32 bytes).
pub fn reveal(
    kv: &impl KvRead,
    round: u64,
    dealer: u32,
    player: u32,
) -> Result<Option<Vec<u8>>, Fatal> {
    Ok(kv.get(&keys::reveal(round, dealer, player))?)
}

/// Records a revealed share.
pub fn put_reveal(kv: &mut impl Kv, round: u64, dealer: u32, player: u32, share: &[u8]) {
    kv.put(keys::reveal(round, dealer, player), share.to_vec());
}

/// Player `player`'s encryption key for `round` (48 bytes), if it
/// registered one.
pub fn ceremony_key(kv: &impl KvRead, round: u64, player: u32) -> Result<Option<Vec<u8>>, Fatal> {
    Ok(kv.get(&keys::ceremony_key(round, player))?)
}

/// Records a player's encryption key for a round.
pub fn put_ceremony_key(kv: &mut impl Kv, round: u64, player: u32, key: &[u8]) {
    kv.put(keys::ceremony_key(round, player), key.to_vec());
}

/// Deletes every ceremony key, dealing, ack and reveal of `round`.
pub fn delete_round(kv: &mut impl Kv, round: u64) {
    for p in [
        keys::ceremony_key_round(round),
        keys::dealing_round(round),
        keys::ack_round(round),
        keys::reveal_round(round),
    ] {
        let end = prefix_end(&p);
        kv.delete_range(p, end);
    }
}

/// How many ceremony keys, dealings, acks and reveals `round` holds so
/// far.
pub fn round_counts(kv: &impl KvRead, round: u64) -> Result<[u64; 4], Fatal> {
    let mut out = [0u64; 4];
    let prefixes = [
        keys::ceremony_key_round(round),
        keys::dealing_round(round),
        keys::ack_round(round),
        keys::reveal_round(round),
    ];
    for (n, p) in out.iter_mut().zip(prefixes) {
        kv.for_each(&p, &prefix_end(&p), &mut |_, _| {
            *n += 1;
            true
        })?;
    }
    Ok(out)
}

/// A proposal by id. An action or status no enum names is corrupt.
pub fn proposal(kv: &impl KvRead, id: u64) -> Result<Option<Proposal>, Fatal> {
    let p: Option<Proposal> = load(kv, &keys::proposal(id), "proposal")?;
    p.map(checked_proposal).transpose()
}

fn checked_proposal(p: Proposal) -> Result<Proposal, Fatal> {
    proposal_action(&p)?;
    proposal_status(&p)?;
    Ok(p)
}

/// A proposal's action (stored proposals always have a known one).
pub fn proposal_action(p: &Proposal) -> Result<ProposalAction, Fatal> {
    ProposalAction::try_from(p.action).map_err(|_| Fatal::Corrupt("proposal action"))
}

/// A proposal's status (stored proposals always have a known one).
pub fn proposal_status(p: &Proposal) -> Result<ProposalStatus, Fatal> {
    ProposalStatus::try_from(p.status).map_err(|_| Fatal::Corrupt("proposal status"))
}

/// Stores a proposal; open and accepted ones are also indexed.
pub fn put_proposal(kv: &mut impl Kv, p: &Proposal) {
    kv.put(keys::proposal(p.id), p.encode_to_vec());
    let pending = ProposalStatus::try_from(p.status).is_ok_and(ProposalStatus::is_pending);
    if pending {
        kv.put(keys::proposal_open(p.id), PRESENT.to_vec());
    } else {
        kv.delete(keys::proposal_open(p.id));
    }
}

/// Open and accepted proposals, by id.
pub fn open_proposals(kv: &impl KvRead) -> Result<Vec<Proposal>, Fatal> {
    let rows = kv.scan_prefix(keys::PROPOSAL_OPEN, usize::MAX)?;
    let mut out = Vec::with_capacity(rows.len());
    for (k, _) in rows {
        let id = k
            .get(keys::PROPOSAL_OPEN.len()..)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or(Fatal::Corrupt("open proposal key"))?;
        out.push(proposal(kv, id)?.ok_or(Fatal::Corrupt("open proposal"))?);
    }
    Ok(out)
}

/// Every proposal from id `from` on, at most `limit`.
pub fn proposals_from(kv: &impl KvRead, from: u64, limit: usize) -> Result<Vec<Proposal>, Fatal> {
    let rows = kv.scan(&keys::proposal(from), &prefix_end(keys::PROPOSAL), limit)?;
    rows.iter()
        .map(|(_, v)| {
            Proposal::decode(v.as_slice())
                .map_err(|_| Fatal::Corrupt("proposal"))
                .and_then(checked_proposal)
        })
        .collect()
}

/// The id the next proposal gets, from 1.
pub fn next_proposal_id(kv: &mut impl Kv) -> Result<u64, Fatal> {
    let id = get_u64(kv, keys::NEXT_PROPOSAL)?.unwrap_or(1);
    put_u64(kv, keys::NEXT_PROPOSAL.to_vec(), id.saturating_add(1));
    Ok(id)
}

/// The rotation with `nonce`.
pub fn rotation(kv: &impl KvRead, nonce: u64) -> Result<Option<KeyRotation>, Fatal> {
    load(kv, &keys::rotation(nonce), "key rotation")
}

/// Stores a rotation.
pub fn put_rotation(kv: &mut impl Kv, r: &KeyRotation) {
    kv.put(keys::rotation(r.nonce), r.encode_to_vec());
}

/// Rotations from nonce `from` on, at most `limit`, ascending.
pub fn rotations(kv: &impl KvRead, from: u64, limit: usize) -> Result<Vec<KeyRotation>, Fatal> {
    let end = tally_store::prefix_end(keys::ROTATION);
    let rows = kv.scan(&keys::rotation(from), &end, limit)?;
    rows.into_iter()
        .map(|(_, v)| KeyRotation::decode(v.as_slice()).map_err(|_| Fatal::Corrupt("key rotation")))
        .collect()
}

/// The nonce of the last rotation made (0: none).
pub fn last_rotation(kv: &impl KvRead) -> Result<u64, Fatal> {
    u64_or(kv, keys::LAST_ROTATION, 0)
}

/// Takes the next rotation nonce.
pub fn next_rotation_nonce(kv: &mut impl Kv) -> Result<u64, Fatal> {
    let n = last_rotation(kv)?.saturating_add(1);
    put_u64(kv, keys::LAST_ROTATION.to_vec(), n);
    Ok(n)
}

/// Drops rotation `nonce`, which must be the last one made and never
/// signed (so no hub ever saw it): its nonce is taken again by the next.
pub fn drop_last_rotation(kv: &mut impl Kv, nonce: u64) -> Result<(), Fatal> {
    if last_rotation(kv)? != nonce {
        return Err(Fatal::Corrupt("dropping a rotation that is not the last"));
    }
    kv.delete(keys::rotation(nonce));
    put_u64(kv, keys::LAST_ROTATION.to_vec(), nonce.saturating_sub(1));
    Ok(())
}

/// The key a re-key made, until it activates.
pub fn next_key(kv: &impl KvRead) -> Result<Option<NextKey>, Fatal> {
    load(kv, keys::NEXT_KEY, "next key")
}

/// The record of the key waiting in `n`.
pub fn next_key_record(n: &NextKey) -> Result<KeyEpoch, Fatal> {
    serde_json::from_slice(&n.key).map_err(|_| Fatal::Corrupt("next key"))
}

/// Stores (or with `None` removes) the waiting key.
pub fn put_next_key(kv: &mut impl Kv, k: Option<&NextKey>) {
    match k {
        Some(k) => kv.put(keys::NEXT_KEY.to_vec(), k.encode_to_vec()),
        None => kv.delete(keys::NEXT_KEY.to_vec()),
    }
}

/// The validator updates recorded for block `height` (empty for any
/// other block).
pub fn validator_updates(kv: &impl KvRead, height: u64) -> Result<Vec<ValidatorRecord>, Fatal> {
    let u: Option<ValidatorUpdates> = load(kv, keys::VALIDATOR_UPDATES, "validator updates")?;
    Ok(match u {
        Some(u) if u.height == height => u.updates,
        _ => Vec::new(),
    })
}

/// Records the validator updates of block `height` (replacing older ones).
pub fn put_validator_updates(kv: &mut impl Kv, height: u64, updates: Vec<ValidatorRecord>) {
    let u = ValidatorUpdates { height, updates };
    kv.put(keys::VALIDATOR_UPDATES.to_vec(), u.encode_to_vec());
}

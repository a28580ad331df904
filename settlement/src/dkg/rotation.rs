//! Key rotations (ADR 0017): how a new key reaches the hub.
//!
//! Every set change makes a key with a fresh secret (a `rekey` ceremony
//! dealt by the next set). The hub knows only the key it holds, so the
//! *outgoing* key signs a rotation naming its successor, and the hub
//! switches keys only on that signature:
//!
//! 1. when the re-key finalises at `h`, [`begin`] stores the rotation
//!    `rot/<nonce>` (`nonce` = 1, 2, ... per chain, with the hub's name,
//!    the new key's epoch and group key) and the new key in `cer/next`
//!    with no activation height;
//! 2. the current validators sign [`crate::sync::rotation_digest`] with the
//!    current key's shares in their vote extensions, like a batch
//!    ([`awaited_digest`], [`awaits`]);
//! 3. the block that combines the signature ([`signed`]) stores it in the
//!    rotation, returns the validator update, and sets the new key to
//!    activate two blocks later, when CometBFT's set changes;
//! 4. at activation ([`super::ceremony`]) the rotation records its height,
//!    and a batch signed by the old key but not settled is signed again.
//!
//! The relay hands the hub every signed rotation it has not applied, in
//! nonce order, before any batch. The records stay in state as the history
//! of keys (`/rotations`).

use tally_store::{Kv, KvRead};

use super::key::KeyEpoch;
use super::rules::{check_update, refuse, update_of};
use super::state as st;
use super::types::ProposalStatus;
use crate::error::Fatal;
use crate::proto::{KeyRotation, NextKey};
use crate::state::chain::params;
use crate::sync::digest::rotation_digest;
use crate::types::{Block, Event};

/// The digest the rotation `r` is signed over.
pub fn digest_of(r: &KeyRotation) -> [u8; 32] {
    rotation_digest(&r.hub, r.nonce, r.epoch, &r.group_key)
}

/// A re-key of proposal `proposal` made `key` at `h` while `from_epoch` is
/// active: its rotation is stored, waiting for the outgoing key's
/// signature.
pub fn begin(
    kv: &mut impl Kv,
    h: u64,
    key: &KeyEpoch,
    from_epoch: u64,
    proposal: u64,
) -> Result<Event, Fatal> {
    let group_key = hex::decode(&key.group_key).map_err(|_| Fatal::Corrupt("new group key"))?;
    let nonce = st::next_rotation_nonce(kv)?;
    let r = KeyRotation {
        nonce,
        hub: params(kv)?.hub_chain,
        epoch: key.epoch,
        group_key,
        from_epoch,
        signature: Vec::new(),
        made_height: h,
        signed_height: 0,
        active_height: 0,
    };
    st::put_rotation(kv, &r);
    let bytes = serde_json::to_vec(key).map_err(|_| Fatal::Corrupt("key"))?;
    st::put_next_key(
        kv,
        Some(&NextKey {
            key: bytes,
            activate_height: 0,
            proposal,
            rotation: nonce,
        }),
    );
    Ok(Event::new(
        "key_rotation",
        [
            ("nonce", nonce.to_string()),
            ("epoch", r.epoch.to_string()),
            ("group_key", key.group_key.clone()),
            ("status", "signing".into()),
        ],
    ))
}

/// The rotation waiting for the current key's signature, if any.
fn waiting(kv: &impl KvRead) -> Result<Option<KeyRotation>, Fatal> {
    let Some(next) = st::next_key(kv)? else {
        return Ok(None);
    };
    if next.rotation == 0 || next.activate_height != 0 {
        return Ok(None);
    }
    Ok(st::rotation(kv, next.rotation)?.filter(|r| r.signature.is_empty()))
}

/// The digest validators should sign now for a rotation, if one waits.
pub fn awaited_digest(kv: &impl KvRead) -> Result<Option<[u8; 32]>, Fatal> {
    Ok(waiting(kv)?.map(|r| digest_of(&r)))
}

/// Whether the chain waits for a signature over `digest` as a rotation.
pub fn awaits(kv: &impl KvRead, digest: &[u8; 32]) -> Result<bool, Fatal> {
    Ok(awaited_digest(kv)? == Some(*digest))
}

/// The outgoing key's signature `sig` over rotation `digest` was combined
/// in `block`: the rotation is signed, the block returns the validator
/// update and the new key activates at `height + 2`. `None` if no rotation
/// waits for that digest.
pub fn signed(
    kv: &mut impl Kv,
    block: &Block,
    digest: &[u8; 32],
    sig: &[u8],
) -> Result<Option<Event>, Fatal> {
    let Some(mut r) = waiting(kv)?.filter(|r| digest_of(r) == *digest) else {
        return Ok(None);
    };
    let mut next = st::next_key(kv)?.ok_or(Fatal::Corrupt("next key"))?;
    let h = block.height;
    if let Some(mut p) = st::proposal(kv, next.proposal)? {
        let u = update_of(&p)?;
        // Checked once more: the signature is kept only if CometBFT will
        // take the change, so the hub never learns a key this chain drops.
        if let Err(why) = check_update(&st::validators(kv)?, &u) {
            st::put_next_key(kv, None);
            return refuse(kv, &mut p, why);
        }
        st::put_validator_updates(kv, h, vec![u]);
        p.status = ProposalStatus::Applied.into();
        p.applied_height = h;
        st::put_proposal(kv, &p);
    }
    r.signature = sig.to_vec();
    r.signed_height = h;
    st::put_rotation(kv, &r);
    next.activate_height = h.saturating_add(2);
    st::put_next_key(kv, Some(&next));
    Ok(Some(Event::new(
        "key_rotation",
        [
            ("nonce", r.nonce.to_string()),
            ("epoch", r.epoch.to_string()),
            ("group_key", hex::encode(&r.group_key)),
            ("status", "signed".into()),
            ("activate_height", next.activate_height.to_string()),
        ],
    )))
}

/// Records that rotation `nonce`'s key became active at `h`.
pub fn activated(kv: &mut impl Kv, nonce: u64, h: u64) -> Result<(), Fatal> {
    if let Some(mut r) = st::rotation(kv, nonce)? {
        r.active_height = h;
        st::put_rotation(kv, &r);
    }
    Ok(())
}

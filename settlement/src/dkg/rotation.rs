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
//!
//! **Recovery** (ADR 0018). When fewer than `t` signers of the current key
//! remain, no rotation can ever be signed. A `recover` proposal (more than
//! 2/3 of the voting power) runs the same re-key, but its rotation is
//! *governed*: it is not signed, the new key activates two blocks after
//! the ceremony, and the hub takes it only through its own governors'
//! `GovernKey` transaction over the same digest. The chain trusts its
//! validators' approval; the hub trusts its governors, who check the key
//! against this chain's `/rotations` and its proofs.

use tally_store::{Kv, KvRead};

use super::key::KeyEpoch;
use super::rules::{check_update, refuse, update_of};
use super::state as st;
use super::types::{ProposalAction, ProposalStatus};
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
/// signature; or, `governed` (a recovery), activating at `h + 2` with no
/// signature.
pub fn begin(
    kv: &mut impl Kv,
    h: u64,
    key: &KeyEpoch,
    from_epoch: u64,
    proposal: u64,
    governed: bool,
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
        governed,
    };
    st::put_rotation(kv, &r);
    let bytes = serde_json::to_vec(key).map_err(|_| Fatal::Corrupt("key"))?;
    let activate_height = if governed { h.saturating_add(2) } else { 0 };
    st::put_next_key(
        kv,
        Some(&NextKey {
            key: bytes,
            activate_height,
            proposal,
            rotation: nonce,
        }),
    );
    if governed {
        if let Some(mut p) = st::proposal(kv, proposal)? {
            p.status = ProposalStatus::Applied.into();
            p.applied_height = h;
            st::put_proposal(kv, &p);
        }
    }
    let mut attrs = vec![
        ("nonce", nonce.to_string()),
        ("epoch", r.epoch.to_string()),
        ("group_key", key.group_key.clone()),
        (
            "status",
            if governed { "governed" } else { "signing" }.into(),
        ),
    ];
    if governed {
        attrs.push(("activate_height", activate_height.to_string()));
    }
    Ok(Event {
        kind: "key_rotation".into(),
        attrs: attrs.into_iter().map(|(k, v)| (k.into(), v)).collect(),
    })
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

/// A rotation waiting for a signature that may never come (fewer than
/// `t` signers of the current key remain) gives way to an accepted
/// recovery: its key is dropped, its rotation deleted (no hub ever saw
/// it: it was never signed, so its nonce is used again) and its proposal
/// refused. `None` when nothing waits or no recovery is accepted.
pub fn yield_to_recovery(kv: &mut impl Kv) -> Result<Option<Event>, Fatal> {
    let Some(r) = waiting(kv)? else {
        return Ok(None);
    };
    let mut recovery = false;
    for p in st::open_proposals(kv)? {
        recovery |= st::proposal_status(&p)? == ProposalStatus::Accepted
            && st::proposal_action(&p)? == ProposalAction::Recover;
    }
    if !recovery {
        return Ok(None);
    }
    let next = st::next_key(kv)?.ok_or(Fatal::Corrupt("next key"))?;
    st::put_next_key(kv, None);
    st::drop_last_rotation(kv, r.nonce)?;
    match st::proposal(kv, next.proposal)? {
        Some(mut p) => refuse(
            kv,
            &mut p,
            format!(
                "its rotation {} was never signed and gave way to a recovery",
                r.nonce
            ),
        ),
        None => Ok(None),
    }
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
        if let Err(why) = check_update(&st::validators(kv)?, u.as_ref()) {
            st::put_next_key(kv, None);
            return refuse(kv, &mut p, why);
        }
        if let Some(u) = u {
            st::put_validator_updates(kv, h, vec![u]);
        }
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

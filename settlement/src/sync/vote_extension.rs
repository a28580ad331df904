//! Vote extensions carry partial threshold signatures: ExtendVote signs
//! what the chain waits for ([`extension`]), VerifyVoteExtension checks the
//! size and structure and that every partial is under the sender's own
//! share index ([`check_extension`]), and the next proposer gathers the
//! valid, new partials of the last commit's extensions into one
//! SubmitPartials system transaction ([`collect_partials`]).
//!
//! An extension carries digests and signatures only (about 140 bytes per
//! partial): the bodies of hub results and hub blocks travel once, in the
//! SubmitPartials, from the proposer's own relay or the chain's pending
//! messages. So an extension's size does not depend on how many deposits
//! a hub range holds, and is capped by `max_extension_partials` and
//! `max_vote_extension_bytes` before anything is decoded.
//!
//! ExtendVote (validators with a share) re-derives the block's
//! `SyncTxStart` from this node's own state and signs its batch only if it
//! is exactly the proposed one; it signs the current batch while unsigned,
//! and the hub blocks and hub results the relay handed in that the chain
//! would act on, skipping what is already stored. VerifyVoteExtension
//! checks the size first (before decoding), then the structure: at most
//! `max_extension_partials` partials, each under the sender's own share
//! index (from the key's `signers`) and of the active key's epoch, a known
//! kind, a 32-byte digest, no message twice, a signature that parses as a
//! subgroup point. No other state is read and no pairing is computed, so
//! an honest extension is never refused; a bad signature counts only
//! against its sender. Partials of another epoch are also ignored in
//! SubmitPartials.

use std::collections::BTreeMap;

use prost::Message;
use tally_store::KvRead;

use super::awaited::{recognize, Bodies};
use crate::bls::{self, Kind, Partial, SecretShare};
use crate::dkg::key::{KeyCache, ThresholdKey};
use crate::dkg::rotation;
use crate::dkg::state::active_key;
use crate::error::Fatal;
use crate::genesis::Params;
use crate::proto::{
    HubBlock, HubResult, PartialSig, SubmitPartials, SyncState, SyncTxStart, VoteExtension,
};
use crate::state::chain::params;
use crate::state::sync::{batch, batch_status, has_partial, pending_message, sync_state};
use crate::types::{Awaited, BatchStatus};

/// The partials a validator with `share` should sign now: the batch of
/// `start` (a SyncTxStart in the block being voted on, which the caller
/// re-derived from its own state), the current unsigned batch, and the hub
/// results (`observed`) and hub blocks (`blocks`) its relay handed in, each
/// only while the chain waits for it and this signer has no partial stored
/// for it. At most `max_extension_partials`, and never more bytes than
/// `max_vote_extension_bytes` (batches first, then results, then blocks).
/// The active key is read through `cache`.
#[allow(clippy::too_many_arguments)]
pub fn extension(
    kv: &impl KvRead,
    cache: &KeyCache,
    chain_id: &str,
    share: &SecretShare,
    share_epoch: u64,
    start: Option<&SyncTxStart>,
    observed: &[HubResult],
    blocks: &[HubBlock],
) -> Result<VoteExtension, Fatal> {
    let mut out = VoteExtension::default();
    let Some(key) = active_key(kv, cache)? else {
        return Ok(out);
    };
    // A share of another key epoch (the old key after a reshare, or the
    // next one before it activates) signs nothing.
    if key.record.epoch != share_epoch || key.shares.share(share.index).is_none() {
        return Ok(out);
    }
    let params = params(kv)?;
    let st = sync_state(kv, &params.hub_chain)?;
    let (wanted, bodies) = wanted_messages(kv, &params, &st, start, observed, blocks)?;
    let max = params.max_extension_partials as usize;
    let mut done: Vec<(Kind, Vec<u8>)> = Vec::new();
    for (kind, digest, derived) in wanted {
        if out.partials.len() >= max {
            break;
        }
        if done.contains(&(kind, digest.clone())) {
            continue;
        }
        done.push((kind, digest.clone()));
        let Ok(d) = <[u8; 32]>::try_from(digest.as_slice()) else {
            continue;
        };
        let message = if derived {
            bls::message(chain_id, kind, &d)
        } else {
            match recognize(kv, chain_id, kind.value(), &d, &bodies)? {
                Some(a) => a.message,
                None => continue,
            }
        };
        if has_partial(kv, &d, share.index)? {
            continue; // already on chain
        }
        out.partials.push(PartialSig {
            index: share.index,
            kind: kind.value(),
            digest: d.to_vec(),
            signature: share.sign(&message).sig_bytes().to_vec(),
            epoch: share_epoch,
        });
    }
    while out.encoded_len() > params.max_vote_extension_bytes as usize {
        out.partials.pop();
    }
    Ok(out)
}

/// The messages an extension may sign, in order (batches, a key
/// rotation, then results, then blocks), as (kind, digest, already known to be awaited), and the
/// bodies of the hub results and blocks the relay handed in.
#[allow(clippy::type_complexity)]
fn wanted_messages(
    kv: &impl KvRead,
    params: &Params,
    st: &SyncState,
    start: Option<&SyncTxStart>,
    observed: &[HubResult],
    blocks: &[HubBlock],
) -> Result<(Vec<(Kind, Vec<u8>, bool)>, Bodies), Fatal> {
    // (kind, digest, already known to be awaited): the batch of a start in
    // the voted block is not in committed state yet, but was re-derived.
    let mut wanted: Vec<(Kind, Vec<u8>, bool)> = Vec::new();
    if let Some(s) = start {
        let signed = match batch(kv, &s.chain, s.batch_nonce)? {
            Some(b) => batch_status(&b)? != BatchStatus::Pending,
            None => false,
        };
        if !signed {
            wanted.push((Kind::Batch, s.digest.clone(), true));
        }
    }
    if st.current_nonce != 0 {
        if let Some(b) = batch(kv, &params.hub_chain, st.current_nonce)? {
            if batch_status(&b)? == BatchStatus::Pending {
                wanted.push((Kind::Batch, b.digest, false));
            }
        }
    }
    if let Some(d) = rotation::awaited_digest(kv)? {
        wanted.push((Kind::KeyRotation, d.to_vec(), true));
    }
    let mut bodies = Bodies::default();
    for r in observed {
        let (d, _) = bodies.add_result(r.clone());
        wanted.push((Kind::HubResult, d.to_vec(), false));
    }
    for b in blocks {
        let (d, _) = bodies.add_block(b.clone());
        wanted.push((Kind::HubBlock, d.to_vec(), false));
    }
    Ok((wanted, bodies))
}

/// Why a vote extension was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadExtension {
    /// More bytes than `max_vote_extension_bytes` (checked before decoding).
    #[error("vote extension is {len} bytes, at most {max}")]
    TooLarge {
        /// Its size.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// Not a `VoteExtension` message.
    #[error("vote extension does not decode")]
    Undecodable,
    /// More partials than `max_extension_partials`.
    #[error("vote extension carries {count} partials, at most {max}")]
    TooManyPartials {
        /// How many.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// The sender holds no share, yet sent partials.
    #[error("the sender holds no threshold share")]
    NotASigner,
    /// A partial under another index than the sender's own.
    #[error("partial under share index {got}, the sender's index is {own}")]
    ForeignIndex {
        /// The index in the partial.
        got: u32,
        /// The sender's bound index.
        own: u32,
    },
    /// A partial that is malformed (unknown kind, digest not 32 bytes,
    /// signature not a valid subgroup point) or signs one message twice.
    #[error("partial {position} is malformed: {why}")]
    Malformed {
        /// Position in the extension.
        position: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// This node could not read its own state.
    #[error("state unreadable: {0}")]
    State(String),
}

/// VerifyVoteExtension's check of the extension `bytes` sent by the
/// validator with consensus `address`: at most `max_vote_extension_bytes`
/// (before decoding) and `max_extension_partials`, every partial under the
/// sender's bound share index, of a known kind, over a 32-byte digest,
/// with a signature that is a valid point, no message twice. Empty bytes
/// always pass. Signatures are not verified here (no pairings): a bad one
/// can only ever count against its own sender's index.
pub fn check_extension(
    kv: &impl KvRead,
    cache: &KeyCache,
    address: &[u8],
    bytes: &[u8],
) -> Result<VoteExtension, BadExtension> {
    if bytes.is_empty() {
        return Ok(VoteExtension::default());
    }
    let p = params(kv).map_err(|e| BadExtension::State(e.to_string()))?;
    let key = active_key(kv, cache).map_err(|e| BadExtension::State(e.to_string()))?;
    check_extension_with(&p, key.as_ref(), address, bytes)
}

/// [`check_extension`] with the parameters and key already read.
pub fn check_extension_with(
    p: &Params,
    key: Option<&ThresholdKey>,
    address: &[u8],
    bytes: &[u8],
) -> Result<VoteExtension, BadExtension> {
    let max = p.max_vote_extension_bytes as usize;
    if bytes.len() > max {
        return Err(BadExtension::TooLarge {
            len: bytes.len(),
            max,
        });
    }
    let ext = VoteExtension::decode(bytes).map_err(|_| BadExtension::Undecodable)?;
    let max_partials = p.max_extension_partials as usize;
    if ext.partials.len() > max_partials {
        return Err(BadExtension::TooManyPartials {
            count: ext.partials.len(),
            max: max_partials,
        });
    }
    if ext.partials.is_empty() {
        return Ok(ext);
    }
    let own = key
        .and_then(|k| k.index_of(address))
        .ok_or(BadExtension::NotASigner)?;
    let epoch = key.map(|k| k.record.epoch).unwrap_or_default();
    let mut seen: Vec<(u32, &[u8])> = Vec::with_capacity(ext.partials.len());
    for (position, q) in ext.partials.iter().enumerate() {
        let bad = |why| BadExtension::Malformed { position, why };
        if q.index != own {
            return Err(BadExtension::ForeignIndex { got: q.index, own });
        }
        if Kind::try_from(q.kind).is_err() {
            return Err(bad("unknown kind"));
        }
        if q.epoch != epoch {
            return Err(bad("signed with a share of another key epoch"));
        }
        if q.digest.len() != 32 {
            return Err(bad("digest is not 32 bytes"));
        }
        if seen.contains(&(q.kind, q.digest.as_slice())) {
            return Err(bad("signs a message twice"));
        }
        seen.push((q.kind, q.digest.as_slice()));
        if Partial::from_bytes(q.index, &q.signature).is_err() {
            return Err(bad("signature is not a valid G2 point"));
        }
    }
    Ok(ext)
}

/// The candidate partials gathered for one message.
struct Harvest {
    /// The message's digest.
    digest: [u8; 32],
    /// The signed bytes.
    message: Vec<u8>,
    /// Its kind.
    kind: Kind,
    /// Body to carry (results and blocks the chain does not hold yet).
    result: Option<HubResult>,
    /// Body to carry (hub blocks the chain does not hold yet).
    block: Option<HubBlock>,
    /// Wire form and parsed form of every candidate, unverified.
    partials: Vec<(PartialSig, Partial)>,
}

/// PrepareProposal: the valid, new partials among the last commit's vote
/// extensions (`votes`: sender's consensus address and extension bytes) as
/// one system transaction, or `None`. Each extension is checked as in
/// VerifyVoteExtension (one that fails is skipped whole); a hub result or
/// block is only included if its body is in `bodies` (this proposer's
/// relay) or held by the chain. Partials are verified before they are
/// de-duplicated, so no bad partial displaces a good one. At most
/// `max_block_messages` messages: batches first, then the messages with
/// most candidates; at most twice that many are verified.
pub fn collect_partials(
    kv: &impl KvRead,
    cache: &KeyCache,
    chain_id: &str,
    votes: &[(Vec<u8>, Vec<u8>)],
    bodies: &Bodies,
) -> Result<Option<SubmitPartials>, Fatal> {
    let Some(key) = active_key(kv, cache)? else {
        return Ok(None);
    };
    let p = params(kv)?;
    let mut by_digest: BTreeMap<[u8; 32], Harvest> = BTreeMap::new();
    let mut known_cache: BTreeMap<(u32, Vec<u8>), Option<Awaited>> = BTreeMap::new();
    for (address, bytes) in votes {
        let Ok(ext) = check_extension_with(&p, Some(&key), address, bytes) else {
            continue;
        };
        for ps in ext.partials {
            let cache_key = (ps.kind, ps.digest.clone());
            let known = match known_cache.get(&cache_key) {
                Some(k) => k.clone(),
                None => {
                    let k = recognize(kv, chain_id, ps.kind, &ps.digest, bodies)?;
                    known_cache.insert(cache_key, k.clone());
                    k
                }
            };
            let Some(a) = known else {
                continue;
            };
            if has_partial(kv, &a.digest, ps.index)? {
                continue;
            }
            let Ok(q) = Partial::from_bytes(ps.index, &ps.signature) else {
                continue;
            };
            let h = by_digest.entry(a.digest).or_insert_with(|| Harvest {
                digest: a.digest,
                message: a.message,
                kind: a.kind,
                result: a.hub_result,
                block: a.hub_block,
                partials: Vec::new(),
            });
            h.partials.push((ps, q));
        }
    }
    let mut order: Vec<Harvest> = by_digest.into_values().collect();
    order.sort_by_key(|h| (h.kind != Kind::Batch, std::cmp::Reverse(h.partials.len())));
    let max_msgs = p.max_block_messages as usize;
    let mut out = SubmitPartials::default();
    let mut taken = 0usize;
    for h in order.into_iter().take(max_msgs.saturating_mul(2)) {
        if taken >= max_msgs {
            break;
        }
        let sigs: Vec<Partial> = h.partials.iter().map(|(_, q)| q.clone()).collect();
        let bad = key.shares.invalid_partials(&h.message, &sigs);
        let mut kept: Vec<u32> = Vec::new();
        let mut any = false;
        for (i, (ps, _)) in h.partials.into_iter().enumerate() {
            if bad.contains(&i) || kept.contains(&ps.index) {
                continue;
            }
            kept.push(ps.index);
            out.partials.push(ps);
            any = true;
        }
        if !any {
            continue;
        }
        taken += 1;
        if pending_message(kv, &h.digest)?.is_none() {
            out.hub_results.extend(h.result);
            out.hub_blocks.extend(h.block);
        }
    }
    Ok((!out.partials.is_empty()).then_some(out))
}

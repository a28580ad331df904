//! Partial signatures on chain: FinalizeTx(SubmitPartials) stores each new
//! valid partial under `psig/<digest>/<index>`; when a message has its
//! threshold they are combined, verified and acted on (a signed batch, a
//! hub result, a hub block), and the message's partials are deleted with
//! one range delete. Partials of messages that never reach the threshold
//! expire after `partial_expiry_blocks`.

use std::collections::{BTreeMap, BTreeSet};

use tally_store::{Kv, KvRead};

use super::awaited::{recognize, Bodies};
use super::batch::batch_signed;
use super::deposits::block_signed;
use super::results::hub_sync_end;
use crate::bls::{Kind, Partial, PublicShares};
use crate::codes::Code;
use crate::dkg::key::KeyCache;
use crate::dkg::rotation;
use crate::dkg::state::active_key;
use crate::error::{reject, ExecError, Fatal};
use crate::genesis::Params;
use crate::proto::{PendingMessage, SubmitPartials};
use crate::state::chain::params;
use crate::state::sync::{
    delete_message, expire_messages_through, has_partial, pending_message, put_partial,
    put_pending_message, stored_partials,
};
use crate::types::{Awaited, Block, Event, TxResult};

/// The candidate partials of one message in a SubmitPartials transaction.
struct Group {
    /// The message.
    awaited: Awaited,
    /// Parsed, new partials, in transaction order (not yet verified; in
    /// non-strict mode possibly two under one index).
    partials: Vec<Partial>,
}

/// The shape limits of a SubmitPartials, checked before any state lookup
/// or pairing: at most `max_block_messages` distinct digests, at most one
/// partial per signer and digest in total (`max_block_messages × n`),
/// every body carried once and referenced by a partial of its kind. Returns
/// the bodies by digest.
pub fn check_shape(tx: &SubmitPartials, p: &Params, signers: usize) -> Result<Bodies, String> {
    let max_msgs = p.max_block_messages as usize;
    let max_partials = max_msgs.saturating_mul(signers);
    if tx.partials.len() > max_partials {
        return Err(format!(
            "{} partials, at most {max_partials} (max_block_messages {max_msgs} x {signers} signers)",
            tx.partials.len()
        ));
    }
    if tx.hub_results.len() + tx.hub_blocks.len() > max_msgs {
        return Err(format!(
            "{} message bodies, at most {max_msgs}",
            tx.hub_results.len() + tx.hub_blocks.len()
        ));
    }
    if let Some(b) = tx
        .hub_blocks
        .iter()
        .find(|b| b.deposits.len() > p.max_block_deposits as usize)
    {
        return Err(format!(
            "hub block {}..{} carries {} deposits, at most {}",
            b.from_height,
            b.to_height,
            b.deposits.len(),
            p.max_block_deposits
        ));
    }
    let mut bodies = Bodies::default();
    for r in &tx.hub_results {
        if !bodies.add_result(r.clone()).1 {
            return Err("a hub result body appears twice".into());
        }
    }
    for b in &tx.hub_blocks {
        if !bodies.add_block(b.clone()).1 {
            return Err("a hub block body appears twice".into());
        }
    }
    let mut digests: BTreeSet<(u32, &[u8])> = BTreeSet::new();
    let mut seen: BTreeSet<(&[u8], u32)> = BTreeSet::new();
    for ps in &tx.partials {
        digests.insert((ps.kind, ps.digest.as_slice()));
        if !seen.insert((ps.digest.as_slice(), ps.index)) {
            return Err(format!(
                "partial of signer {} appears twice for one digest",
                ps.index
            ));
        }
    }
    if digests.len() > max_msgs {
        return Err(format!(
            "partials for {} messages, at most {max_msgs}",
            digests.len()
        ));
    }
    for (kind, d) in bodies.digests() {
        if !digests.contains(&(kind.value(), d.as_slice())) {
            return Err(format!(
                "body {} is not signed by any partial of its kind",
                hex::encode(d)
            ));
        }
    }
    Ok(bodies)
}

/// FinalizeTx(SubmitPartials): stores each new valid partial; at the
/// threshold combines, verifies, acts and range-deletes the message's
/// partials. A transaction outside [`check_shape`] is refused whole.
///
/// With `strict` (ProcessProposal) any partial that is not new, for an
/// awaited message, and valid refuses the whole transaction, and each
/// message costs one batched check. Otherwise such partials are counted as
/// ignored; partials are verified before they are de-duplicated, so a bad
/// partial under a signer's index can never displace that signer's good
/// one.
pub fn apply_partials(
    kv: &mut impl Kv,
    cache: &KeyCache,
    block: &Block,
    chain_id: &str,
    tx: &SubmitPartials,
    strict: bool,
) -> Result<TxResult, ExecError> {
    let key = active_key(kv, cache)?
        .ok_or_else(|| reject(Code::BadSystemTx, "the chain has no threshold key"))?;
    let epoch = key.record.epoch;
    let pubs = key.shares;
    let p = params(kv)?;
    let bodies = check_shape(tx, &p, pubs.shares.len())
        .map_err(|e| reject(Code::BadSystemTx, format!("SubmitPartials refused: {e}")))?;
    let (groups, mut ignored) = group_partials(kv, chain_id, tx, &bodies, &pubs, epoch, strict)?;
    let mut events = Vec::new();
    let mut stored = 0usize;
    // Batches first, then results, then blocks; each message is checked
    // again against the state the previous ones left (acting on one can
    // retire another).
    let mut ordered: Vec<([u8; 32], Group)> = groups.into_iter().collect();
    ordered.sort_by_key(|(d, g)| (g.awaited.kind, *d));
    for (digest, g) in ordered {
        let still = recognize(kv, chain_id, g.awaited.kind.value(), &digest, &bodies)?;
        if still.is_none() {
            ignored += g.partials.len();
            continue;
        }
        let good = if strict {
            if !pubs.all_valid(&g.awaited.message, &g.partials) {
                return Err(reject(
                    Code::BadSystemTx,
                    format!(
                        "partial signatures of message {} do not verify",
                        hex::encode(digest)
                    ),
                ));
            }
            g.partials
        } else {
            let (good, bad) = verified_unique(&pubs, &g.awaited.message, g.partials);
            ignored += bad;
            good
        };
        for q in &good {
            put_partial(kv, &digest, q.index, &q.sig_bytes());
            stored += 1;
        }
        events.extend(record_and_act(kv, block, &p, &pubs, &g.awaited)?);
    }
    Ok(TxResult::ok(
        format!("{stored} partial signature(s) stored, {ignored} ignored"),
        events,
    ))
}

/// The partials of `tx` that are new, parse and are for a message the
/// chain awaits, grouped by message digest, and how many were ignored;
/// with `strict` any other partial refuses the transaction.
fn group_partials(
    kv: &impl KvRead,
    chain_id: &str,
    tx: &SubmitPartials,
    bodies: &Bodies,
    pubs: &PublicShares,
    epoch: u64,
    strict: bool,
) -> Result<(BTreeMap<[u8; 32], Group>, usize), ExecError> {
    let mut groups: BTreeMap<[u8; 32], Group> = BTreeMap::new();
    let mut ignored = 0usize;
    // One recognition per message, not per partial (a hub block body is
    // hashed and its users checked once).
    let mut known_cache: BTreeMap<(u32, &[u8]), Option<Awaited>> = BTreeMap::new();
    for ps in &tx.partials {
        let key = (ps.kind, ps.digest.as_slice());
        let known = match known_cache.get(&key) {
            Some(k) => k.clone(),
            None => {
                let k = recognize(kv, chain_id, ps.kind, &ps.digest, bodies)?;
                known_cache.insert(key, k.clone());
                k
            }
        };
        let parsed = Partial::from_bytes(ps.index, &ps.signature).ok();
        let fresh = match &known {
            // Partials of another key epoch never combine with this key's.
            Some(a) => {
                ps.epoch == epoch
                    && pubs.share(ps.index).is_some()
                    && !has_partial(kv, &a.digest, ps.index)?
            }
            None => false,
        };
        match (known, parsed, fresh) {
            (Some(a), Some(q), true) => groups
                .entry(a.digest)
                .or_insert_with(|| Group {
                    awaited: a,
                    partials: Vec::new(),
                })
                .partials
                .push(q),
            _ if strict => {
                return Err(reject(
                    Code::BadSystemTx,
                    format!(
                        "partial of signer {} is not for a message the chain is waiting for, or already stored",
                        ps.index
                    ),
                ))
            }
            _ => ignored += 1,
        }
    }
    Ok((groups, ignored))
}

/// Verify, then de-duplicate: the valid partials, one per signer, and how
/// many were dropped (invalid, or a second valid copy).
fn verified_unique(
    pubs: &PublicShares,
    msg: &[u8],
    partials: Vec<Partial>,
) -> (Vec<Partial>, usize) {
    let bad = pubs.invalid_partials(msg, &partials);
    let total = partials.len();
    let mut good: Vec<Partial> = Vec::with_capacity(total);
    for (i, q) in partials.into_iter().enumerate() {
        if !bad.contains(&i) && good.iter().all(|x| x.index != q.index) {
            good.push(q);
        }
    }
    let dropped = total - good.len();
    (good, dropped)
}

/// After new partials of `a` were stored: remember the message (with its
/// body) until it expires, and at the threshold combine, delete its
/// partials and act on it.
fn record_and_act(
    kv: &mut impl Kv,
    block: &Block,
    p: &Params,
    pubs: &PublicShares,
    a: &Awaited,
) -> Result<Vec<Event>, Fatal> {
    let digest = a.digest;
    if pending_message(kv, &digest)?.is_none() {
        let m = PendingMessage {
            kind: a.kind.value(),
            first_height: block.height,
            hub_result: a.hub_result.clone(),
            hub_block: a.hub_block.clone(),
        };
        let expires = block.height.saturating_add(p.partial_expiry_blocks);
        put_pending_message(kv, &digest, &m, expires);
    }
    let rows = stored_partials(kv, &digest)?;
    if rows.len() < pubs.threshold as usize {
        return Ok(Vec::new());
    }
    let mut all = Vec::with_capacity(rows.len());
    for (index, sig) in rows {
        all.push(Partial::from_bytes(index, &sig).map_err(|_| Fatal::Corrupt("stored partial"))?);
    }
    let sig = match pubs.combine(&a.message, &all) {
        Ok(s) => s,
        Err(e) => {
            return Ok(vec![Event::new(
                "combine_failed",
                [("digest", hex::encode(digest)), ("error", e.to_string())],
            )])
        }
    };
    let pm = pending_message(kv, &digest)?.ok_or(Fatal::Corrupt("pending message"))?;
    delete_message(
        kv,
        &digest,
        pm.first_height.saturating_add(p.partial_expiry_blocks),
    );
    Ok(match a.kind {
        Kind::Batch => batch_signed(kv, p, &digest, &sig.compress())?
            .into_iter()
            .collect(),
        Kind::KeyRotation => rotation::signed(kv, block, &digest, &sig.compress())?
            .into_iter()
            .collect(),
        Kind::HubResult => match &a.hub_result {
            Some(r) => vec![hub_sync_end(kv, block, p, r)?],
            None => Vec::new(),
        },
        Kind::HubBlock => match &a.hub_block {
            Some(b) => block_signed(kv, p, b)?,
            None => Vec::new(),
        },
    })
}

/// Partials of messages that never reached the threshold in
/// `partial_expiry_blocks` are deleted (range deletes), at the start of
/// block `height`.
pub fn expire_partials(kv: &mut impl Kv, height: u64) -> Result<(), Fatal> {
    expire_messages_through(kv, height)
}

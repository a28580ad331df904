//! Partial signatures on chain: FinalizeTx(SubmitPartials) stores each new
//! valid partial under `psig/<digest>/<index>`; when a message has its
//! threshold they are combined, verified and acted on (a signed batch, a
//! hub result, a hub block), and the message's partials are deleted with
//! one range delete. Partials of messages that never reach the threshold
//! expire after `partial_expiry_blocks`.

use std::collections::BTreeMap;

use tally_store::Kv;

use super::awaited::recognize;
use super::batch::batch_signed;
use super::deposits::credit_deposits;
use super::results::hub_sync_end;
use crate::bls::{Kind, Partial};
use crate::codes::Code;
use crate::error::{reject, ExecError, Fatal};
use crate::proto::{HubBlock, HubResult, PartialSig, PendingMessage, SubmitPartials};
use crate::state::chain::params;
use crate::state::sync::{
    delete_message, expire_messages_through, has_partial, pending_message, put_partial,
    put_pending_message, stored_partials, threshold_key,
};
use crate::types::{Block, Event, TxResult};

/// The new partials of one message in a SubmitPartials transaction.
struct Group {
    /// What the message is.
    kind: Kind,
    /// The signed bytes.
    message: Vec<u8>,
    /// The hub result it is about (results only).
    hub_result: Option<HubResult>,
    /// The hub block it is about (deposits only).
    hub_block: Option<HubBlock>,
    /// The parsed partials, one per signer.
    partials: Vec<Partial>,
}

/// FinalizeTx(SubmitPartials): stores each new valid partial; at the
/// threshold combines, verifies, acts and range-deletes the message's
/// partials. With `strict`, any partial that is not valid and new refuses
/// the whole transaction (ProcessProposal); otherwise such partials are
/// counted as ignored.
pub fn apply_partials(
    kv: &mut impl Kv,
    block: &Block,
    chain_id: &str,
    tx: &SubmitPartials,
    strict: bool,
) -> Result<TxResult, ExecError> {
    let pubs = threshold_key(kv)?
        .ok_or_else(|| reject(Code::BadSystemTx, "the chain has no threshold key"))?
        .shares;
    let p = params(kv)?;
    let mut groups: BTreeMap<[u8; 32], Group> = BTreeMap::new();
    let mut ignored = 0usize;
    for ps in &tx.partials {
        let known = recognize(kv, chain_id, ps)?;
        let parsed = Partial::from_bytes(ps.index, &ps.signature).ok();
        let fresh = match &known {
            Some(a) => !has_partial(kv, &a.digest, ps.index)? && pubs.share(ps.index).is_some(),
            None => false,
        };
        match (known, parsed, fresh) {
            (Some(a), Some(q), true) => {
                let g = groups.entry(a.digest).or_insert_with(|| Group {
                    kind: a.kind,
                    message: a.message,
                    hub_result: ps.hub_result.clone(),
                    hub_block: ps.hub_block.clone(),
                    partials: Vec::new(),
                });
                if g.partials.iter().any(|x| x.index == q.index) {
                    if strict {
                        return Err(reject(
                            Code::BadSystemTx,
                            format!("partial of signer {} appears twice", q.index),
                        ));
                    }
                    ignored += 1;
                } else {
                    g.partials.push(q);
                }
            }
            _ => {
                if strict {
                    return Err(reject(
                        Code::BadSystemTx,
                        format!(
                            "partial of signer {} is not for a message the chain is waiting for, or already stored",
                            ps.index
                        ),
                    ));
                }
                ignored += 1;
            }
        }
    }
    let mut events = Vec::new();
    let mut stored = 0usize;
    // Batches first, then results, then blocks; each message is checked
    // again against the state the previous ones left (acting on one can
    // retire another).
    let mut ordered: Vec<([u8; 32], Group)> = groups.into_iter().collect();
    ordered.sort_by_key(|(d, g)| (g.kind, *d));
    for (digest, g) in ordered {
        let rep = PartialSig {
            index: 0,
            kind: g.kind.value(),
            digest: digest.to_vec(),
            signature: Vec::new(),
            hub_result: g.hub_result.clone(),
            hub_block: g.hub_block.clone(),
        };
        if recognize(kv, chain_id, &rep)?.is_none() {
            ignored += g.partials.len();
            continue;
        }
        let bad = pubs.invalid_partials(&g.message, &g.partials);
        if strict && !bad.is_empty() {
            return Err(reject(
                Code::BadSystemTx,
                format!("{} partial signature(s) do not verify", bad.len()),
            ));
        }
        ignored += bad.len();
        for (i, q) in g.partials.iter().enumerate() {
            if !bad.contains(&i) {
                put_partial(kv, &digest, q.index, &q.sig_bytes());
                stored += 1;
            }
        }
        if pending_message(kv, &digest)?.is_none() {
            let m = PendingMessage {
                kind: g.kind.value(),
                first_height: block.height,
                hub_result: g.hub_result.clone(),
                hub_block: g.hub_block.clone(),
            };
            let expires = block.height.saturating_add(p.partial_expiry_blocks);
            put_pending_message(kv, &digest, &m, expires);
        }
        // Threshold reached?
        let rows = stored_partials(kv, &digest)?;
        if rows.len() < pubs.threshold as usize {
            continue;
        }
        let mut all = Vec::with_capacity(rows.len());
        for (index, sig) in rows {
            all.push(
                Partial::from_bytes(index, &sig).map_err(|_| Fatal::Corrupt("stored partial"))?,
            );
        }
        let sig = match pubs.combine(&g.message, &all) {
            Ok(s) => s,
            Err(e) => {
                events.push(Event::new(
                    "combine_failed",
                    [("digest", hex::encode(digest)), ("error", e.to_string())],
                ));
                continue;
            }
        };
        let pm = pending_message(kv, &digest)?.ok_or(Fatal::Corrupt("pending message"))?;
        delete_message(
            kv,
            &digest,
            pm.first_height.saturating_add(p.partial_expiry_blocks),
        );
        match g.kind {
            Kind::Batch => events.extend(batch_signed(kv, &p, &digest, &sig.compress())?),
            Kind::HubResult => {
                if let Some(r) = &g.hub_result {
                    events.push(hub_sync_end(kv, block, &p, r)?);
                }
            }
            Kind::HubBlock => {
                if let Some(b) = &g.hub_block {
                    events.push(credit_deposits(kv, b)?);
                }
            }
        }
    }
    Ok(TxResult::ok(
        format!("{stored} partial signature(s) stored, {ignored} ignored"),
        events,
    ))
}

/// Partials of messages that never reached the threshold in
/// `partial_expiry_blocks` are deleted (range deletes), at the start of
/// block `height`.
pub fn expire_partials(kv: &mut impl Kv, height: u64) -> Result<(), Fatal> {
    expire_messages_through(kv, height)
}

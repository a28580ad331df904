//! Hub results: what the hub did with one attempt of the current batch,
//! observed by each validator's relay and threshold-signed. A signed
//! result ends the attempt (HubSyncEnd): settled retires the batch (its
//! calls are kept for `settled_retention_windows`, then pruned at a block
//! start); failed backdates `last_sync` so the next attempt waits only the
//! cooldown.
//!
//! Settled: the sync is idle and the next batch may start at once; a
//! `settled` is accepted for any attempt up to the current one, so a late
//! settlement of an earlier submission still counts. Failed (only for the
//! current attempt, once): `last_sync` moves back by
//! `failure_backdate_secs`, so a new attempt for the same batch starts
//! about `sync_window_secs - failure_backdate_secs` (60 s by default) later.
//! No result: the attempt expires after `sync_window_secs` (360 s) and a
//! new one starts. There is no retry limit. Results reach a validator's
//! signer from its relay (`TallyApp::hand_in`), so with the hub down an
//! attempt is reported failed within `attempt_deadline_secs` and the next
//! one comes roughly every 65 s instead of every 360 s.

use tally_store::Kv;

use super::digest::result_digest;
use crate::error::Fatal;
use crate::genesis::Params;
use crate::keys;
use crate::proto::{HubResult, SyncState};
use crate::state::sync::{batch, delete_hub_call, hub_call, put_batch, put_sync_state, sync_state};
use crate::state::withdrawal::{put_withdrawal, withdrawal};
use crate::types::{BatchStatus, Block, Event};

/// Whether the chain waits for a signature on result `r` with `digest`:
/// it is for the current batch of the hub chain, for an attempt that was
/// made (settled) or for the current attempt not yet failed (failed).
pub fn awaits_result(p: &Params, st: &SyncState, r: &HubResult, digest: &[u8; 32]) -> bool {
    let current = r.chain == p.hub_chain && st.current_nonce != 0 && r.nonce == st.current_nonce;
    let attempt_ok = if r.settled {
        r.attempt <= st.attempt
    } else {
        r.attempt == st.attempt && st.failed_attempt < r.attempt
    };
    current && attempt_ok && result_digest(r) == *digest
}

/// HubSyncEnd(chain, ids, ok): a threshold-signed result for `block`.
pub fn hub_sync_end(
    kv: &mut impl Kv,
    block: &Block,
    p: &Params,
    r: &HubResult,
) -> Result<Event, Fatal> {
    let mut st = sync_state(kv, &r.chain)?;
    st.last_result_at = block.time;
    let outcome;
    if r.settled {
        let mut b = batch(kv, &r.chain, r.nonce)?.ok_or(Fatal::Corrupt("settled batch"))?;
        let window = block.time / p.settlement_window_secs;
        let prune_at = window.saturating_add(p.settled_retention_windows);
        kv.put(
            keys::settled_retain(prune_at, &r.chain, r.nonce),
            keys::PRESENT.to_vec(),
        );
        b.status = BatchStatus::Settled.value();
        put_batch(kv, &r.chain, r.nonce, &b);
        mark_withdrawals(kv, &b.call_ids, r.nonce)?;
        st.current_nonce = 0;
        st.attempt = 0;
        st.last_sync = block.time;
        st.settled_batches += 1;
        st.last_error.clear();
        outcome = "settled";
    } else {
        st.last_sync = block.time.saturating_sub(p.failure_backdate_secs);
        st.failures += 1;
        st.failed_attempt = r.attempt;
        st.last_error = format!(
            "attempt {} of batch {} failed on hub {}",
            r.attempt, r.nonce, r.chain
        );
        outcome = "failed";
    }
    put_sync_state(kv, &r.chain, &st);
    Ok(Event::new(
        "hub_sync_end",
        [
            ("chain", r.chain.clone()),
            ("nonce", r.nonce.to_string()),
            ("attempt", r.attempt.to_string()),
            ("outcome", outcome.into()),
            ("retry_layer", "settlement".into()),
        ],
    ))
}

/// Records `nonce` as the batch that paid each withdrawal among `ids`
/// (ADR 0020; payments are only read).
fn mark_withdrawals(kv: &mut impl Kv, ids: &[u64], nonce: u64) -> Result<(), Fatal> {
    for id in ids {
        let Some(call) = hub_call(kv, *id)? else {
            continue;
        };
        if call.kind != crate::types::CALL_WITHDRAW {
            continue;
        }
        if let Some(mut w) = withdrawal(kv, &call.user, *id)? {
            w.settled_nonce = nonce;
            put_withdrawal(kv, &call.user, *id, &w);
        }
    }
    Ok(())
}

/// Most settled batches whose kept calls one block start prunes.
pub const MAX_PRUNE_PER_BLOCK: usize = 16;

/// Deletes the kept calls of settled batches whose retention ended at or
/// before `window` (at most [`MAX_PRUNE_PER_BLOCK`], oldest first; the
/// rest wait for the next block).
pub fn prune_settled(kv: &mut impl Kv, window: u64) -> Result<usize, Fatal> {
    let start = keys::SETTLED_RETAIN.to_vec();
    let end = keys::settled_retain_through(window);
    let mut due = Vec::new();
    let mut bad = false;
    kv.for_each(&start, &end, &mut |k, _| {
        match keys::parse_settled_retain(k) {
            Some(cn) => due.push((k.to_vec(), cn)),
            None => bad = true,
        }
        !bad && due.len() < MAX_PRUNE_PER_BLOCK
    })?;
    if bad {
        return Err(Fatal::Corrupt("settled retention key"));
    }
    for (key, (chain, nonce)) in &due {
        if let Some(b) = batch(kv, chain, *nonce)? {
            for id in &b.call_ids {
                delete_hub_call(kv, *id);
            }
        }
        kv.delete(key.clone());
    }
    Ok(due.len())
}

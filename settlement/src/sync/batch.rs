//! Batches: the proposer's SyncTxStart gathers pending hub calls (made by
//! [`super::close`]) into a batch (or retries the unsettled one), and the
//! batch is marked signed once its group signature is combined.
//!
//! Attempts follow `AsyncBatchState { last_sync, attempt }`: an attempt
//! "runs" for `sync_window_secs` after `last_sync`, and a failure backdates
//! `last_sync` (see [`super::results`]) so the next attempt waits only the
//! cooldown.
//!
//! Per hub chain, `sync/<chain>` holds `last_sync`, `attempt`, the current
//! and next batch nonce, the last failed attempt, counters and the last
//! error. When no sync runs and there is work, the next block begins with
//! a `SyncTxStart`: a new attempt for the current, unsettled batch, or else
//! a new batch of the oldest pending calls (at most `max_batch_calls`, with
//! nonce `next_nonce`). A batch never changes once formed, so every attempt
//! after the first reuses its signature and no call can be paid under two
//! nonces. Its status goes `pending` (waiting for `t` partials), `signed`
//! (group signature stored), `settled`. Until a threshold key exists no
//! sync starts (hub calls still accumulate).

use tally_store::{Kv, KvRead};

use super::digest::batch_digest;
use crate::codes::Code;
use crate::dkg::state::has_active_key;
use crate::error::{reject, ExecError, Fatal};
use crate::genesis::Params;
use crate::proto::{BatchRecord, SyncState, SyncTxStart};
use crate::state::chain::params;
use crate::state::sync::{
    batch, batch_status, hub_call, pending_calls, put_batch, put_sync_state, sync_state,
    unpend_call,
};
use crate::types::{BatchStatus, Block, Event, TxResult};

/// `is_hub_sync_running(now)`: an attempt exists and started (or was
/// backdated to) no more than `sync_window_secs` ago.
pub fn is_running(st: &SyncState, now: u64, p: &Params) -> bool {
    st.attempt > 0 && now.saturating_sub(st.last_sync) <= p.sync_window_secs
}

/// Earliest block time a new attempt may start, if one is running.
pub fn next_attempt_not_before(st: &SyncState, p: &Params) -> Option<u64> {
    (st.attempt > 0).then(|| {
        st.last_sync
            .saturating_add(p.sync_window_secs)
            .saturating_add(1)
    })
}

/// What the proposer must put first in a block at `now`, if anything: a
/// new attempt for the unsettled batch, or a new batch of the oldest
/// pending calls. `None` while a sync runs or nothing is pending, or
/// without a threshold key.
pub fn next_sync_start(kv: &impl KvRead, now: u64) -> Result<Option<SyncTxStart>, Fatal> {
    if !has_active_key(kv)? {
        return Ok(None);
    }
    let p = params(kv)?;
    let chain = p.hub_chain.clone();
    let st = sync_state(kv, &chain)?;
    if is_running(&st, now, &p) {
        return Ok(None);
    }
    if st.current_nonce != 0 {
        let b = batch(kv, &chain, st.current_nonce)?.ok_or(Fatal::Corrupt("current batch"))?;
        return Ok(Some(SyncTxStart {
            chain,
            batch_nonce: b.nonce,
            call_ids: b.call_ids,
            digest: b.digest,
        }));
    }
    let calls = pending_calls(kv, &chain, None, p.max_batch_calls as usize)?;
    if calls.is_empty() {
        return Ok(None);
    }
    let nonce = st.next_nonce.max(1);
    Ok(Some(SyncTxStart {
        digest: batch_digest(&chain, nonce, &calls).to_vec(),
        chain,
        batch_nonce: nonce,
        call_ids: calls.iter().map(|c| c.id).collect(),
    }))
}

/// FinalizeTx(SyncTxStart): `last_sync = now`, attempt recorded; a new
/// batch takes its calls out of the pending set, with the next nonce. A
/// start that is not exactly [`next_sync_start`] is rejected.
pub fn apply_start(
    kv: &mut impl Kv,
    block: &Block,
    tx: &SyncTxStart,
) -> Result<TxResult, ExecError> {
    let want = next_sync_start(kv, block.time)?.ok_or_else(|| {
        reject(
            Code::BadSystemTx,
            "no sync may start now (one is running, or nothing is pending)",
        )
    })?;
    if &want != tx {
        return Err(reject(
            Code::BadSystemTx,
            format!(
                "SyncTxStart does not match state: want nonce {} with {} calls",
                want.batch_nonce,
                want.call_ids.len()
            ),
        ));
    }
    let mut st = sync_state(kv, &tx.chain)?;
    if st.current_nonce == 0 {
        let mut total = 0u64;
        for id in &tx.call_ids {
            let c = hub_call(kv, *id)?.ok_or(Fatal::Corrupt("hub call"))?;
            total = total.saturating_add(c.amount);
            unpend_call(kv, &tx.chain, *id);
        }
        let b = BatchRecord {
            chain: tx.chain.clone(),
            nonce: tx.batch_nonce,
            call_ids: tx.call_ids.clone(),
            digest: tx.digest.clone(),
            status: BatchStatus::Pending.value(),
            signature: Vec::new(),
            formed_height: block.height,
            total,
        };
        put_batch(kv, &tx.chain, tx.batch_nonce, &b);
        st.current_nonce = tx.batch_nonce;
        st.next_nonce = tx.batch_nonce + 1;
        st.attempt = 0;
        st.failed_attempt = 0;
    }
    st.attempt += 1;
    st.attempts_total += 1;
    st.last_sync = block.time;
    put_sync_state(kv, &tx.chain, &st);
    Ok(TxResult::ok(
        format!(
            "sync attempt {} of batch {} on {} ({} calls)",
            st.attempt,
            tx.batch_nonce,
            tx.chain,
            tx.call_ids.len()
        ),
        vec![Event::new(
            "sync_start",
            [
                ("chain", tx.chain.clone()),
                ("nonce", tx.batch_nonce.to_string()),
                ("attempt", st.attempt.to_string()),
                ("retry_layer", "settlement".into()),
            ],
        )],
    ))
}

/// Whether the chain waits for a signature on batch `digest`: it is the
/// current batch of the hub chain and still pending.
pub fn awaits_batch(
    kv: &impl KvRead,
    p: &Params,
    st: &SyncState,
    digest: &[u8],
) -> Result<bool, Fatal> {
    if st.current_nonce == 0 {
        return Ok(false);
    }
    let b = batch(kv, &p.hub_chain, st.current_nonce)?.ok_or(Fatal::Corrupt("current batch"))?;
    Ok(batch_status(&b)? == BatchStatus::Pending && b.digest == digest)
}

/// The group signature `sig` of batch `digest` is combined: the current
/// batch, if it is that one and still pending, becomes signed.
pub fn batch_signed(
    kv: &mut impl Kv,
    p: &Params,
    digest: &[u8; 32],
    sig: &[u8],
) -> Result<Option<Event>, Fatal> {
    let st = sync_state(kv, &p.hub_chain)?;
    if st.current_nonce == 0 {
        return Ok(None);
    }
    let mut b =
        batch(kv, &p.hub_chain, st.current_nonce)?.ok_or(Fatal::Corrupt("current batch"))?;
    if b.digest != digest || batch_status(&b)? != BatchStatus::Pending {
        return Ok(None);
    }
    b.status = BatchStatus::Signed.value();
    b.signature = sig.to_vec();
    put_batch(kv, &p.hub_chain, b.nonce, &b);
    Ok(Some(Event::new(
        "batch_signed",
        [("chain", b.chain), ("nonce", b.nonce.to_string())],
    )))
}

/// A new key became active: the current batch, if the old key signed it
/// and the hub has not settled it, is signed again by the new key (the
/// hub, once it applied the rotation, takes only the new key's
/// signatures). Its calls, nonce and digest do not change.
pub fn resign_current_batch(kv: &mut impl Kv, p: &Params) -> Result<(), Fatal> {
    let st = sync_state(kv, &p.hub_chain)?;
    if st.current_nonce == 0 {
        return Ok(());
    }
    let mut b =
        batch(kv, &p.hub_chain, st.current_nonce)?.ok_or(Fatal::Corrupt("current batch"))?;
    if batch_status(&b)? == BatchStatus::Signed {
        b.status = BatchStatus::Pending.value();
        b.signature = Vec::new();
        put_batch(kv, &p.hub_chain, b.nonce, &b);
    }
    Ok(())
}

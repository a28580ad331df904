//! Settlement sync with a hub chain: `/sync/{chain}` (the attempt, its
//! timing and totals, the deposit cursor), `/batch/{chain}/{nonce}` and the
//! pending `/hubcalls/{chain}`.

use serde_json::{json, Value};

use super::ask::{bad, Ask, MAX_LIMIT};
use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::state::chain::{last_time, params};
use crate::state::sync::batch_status;
use crate::sync;
use crate::time::rfc3339;
use crate::types::BatchStatus;

/// `/sync/{chain}`: an unknown chain answers the idle state.
pub fn sync_state(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let (kv, chain) = (&a.kv, a.arg("chain")?);
    let p = params(kv)?;
    let st = sync::sync_state(kv, chain)?;
    let running = st.attempt > 0 && sync::is_running(&st, last_time(kv)?, &p);
    let pending = sync::pending_calls(kv, chain, None, MAX_LIMIT)?.len();
    let some_if = |b: bool, v: Value| if b { v } else { Value::Null };
    Ok(json!({
        "chain": chain,
        "running": running,
        "last_sync": st.last_sync,
        "last_sync_time": rfc3339(st.last_sync),
        "attempt": st.attempt,
        "nonce": some_if(st.current_nonce != 0, json!(st.current_nonce)),
        "next_nonce": st.next_nonce.max(1),
        "attempts": st.attempts_total,
        "failures": st.failures,
        "settled_batches": st.settled_batches,
        "last_error": some_if(!st.last_error.is_empty(), json!(st.last_error)),
        "last_result_at": some_if(st.last_result_at != 0, json!(rfc3339(st.last_result_at))),
        "next_attempt_not_before": sync::next_attempt_not_before(&st, &p),
        "pending_calls": pending,
        "sync_window_secs": p.sync_window_secs,
        "hub_cursor": sync::hub_cursor(kv, chain)?.height,
        "next_deposit_seq": sync::hub_cursor(kv, chain)?.deposit_seq,
        // Signed hub blocks held ahead of the cursor (app version 5; at
        // most 2 x max_block_messages while the parameters stand).
        "held_hub_blocks": crate::state::sync::held_block_count(kv, chain, 1024)?,
        "failure_backdate_secs": p.failure_backdate_secs,
    }))
}

/// `/batch/{chain}/{nonce}`: code 22 if there is no such batch.
pub fn batch(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let (kv, chain, nonce) = (&a.kv, a.arg("chain")?, a.arg("nonce")?);
    let n: u64 = nonce
        .parse()
        .map_err(|_| bad(format!("nonce must be an integer, got {nonce:?}")))?;
    let b = sync::batch(kv, chain, n)?
        .ok_or_else(|| reject(Code::NotFound, format!("no batch {n} on {chain}")))?;
    let status = batch_status(&b)?;
    let settled = status == BatchStatus::Settled;
    let mut calls = Vec::with_capacity(b.call_ids.len());
    for id in &b.call_ids {
        calls.push(match sync::hub_call(kv, *id)? {
            Some(c) => {
                let mut v = json!({"id": c.id, "user": c.user, "provider": c.provider,
                    "amount": c.amount, "window": c.window, "settled": settled});
                if c.kind == crate::types::CALL_WITHDRAW {
                    v["kind"] = json!("withdrawal");
                }
                v
            }
            // Past `settled_retention_windows`: only the id is left.
            None => json!({"id": id, "settled": true, "pruned": true}),
        });
    }
    let signature = (!b.signature.is_empty()).then(|| hex::encode(&b.signature));
    Ok(json!({
        "chain": b.chain, "nonce": b.nonce, "status": status.name(),
        "digest": hex::encode(&b.digest),
        "signature": signature,
        "formed_height": b.formed_height, "total": b.total, "calls": calls,
    }))
}

/// `/hubcalls/{chain}` (paged by call id): calls not yet in a batch.
pub fn hubcalls(a: &Ask) -> Result<Value, ExecError> {
    let paging = a.paging()?;
    let after = match &paging.cursor {
        Some(c) => Some(u64::from_be_bytes(
            c.as_slice()
                .try_into()
                .map_err(|_| bad("cursor is not a hub call cursor"))?,
        )),
        None => None,
    };
    let chain = a.arg("chain")?;
    let mut calls = sync::pending_calls(&a.kv, chain, after, paging.limit + 1)?;
    let next = if calls.len() > paging.limit {
        calls.truncate(paging.limit);
        calls.last().map(|c| hex::encode(c.id.to_be_bytes()))
    } else {
        None
    };
    let calls: Vec<_> = calls
        .iter()
        .map(|c| {
            let mut v = json!({"id": c.id, "user": c.user, "provider": c.provider, "amount": c.amount, "window": c.window});
            if c.kind == crate::types::CALL_WITHDRAW {
                v["kind"] = json!("withdrawal");
            }
            v
        })
        .collect();
    Ok(json!({"calls": calls, "next_cursor": next}))
}

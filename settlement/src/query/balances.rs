//! A user's money: `/balance/{user}`, `/allowances/{user}` (the
//! allowances the user gave gateways, with what each charged in the
//! current window) and `/withdrawals/{user}`.

use serde_json::{json, Value};

use super::ask::{bad, Ask, MAX_LIMIT};
use crate::error::ExecError;
use crate::ident;
use crate::state::allowance;
use crate::state::chain::{balance as balance_of, last_time, params};

/// The `{user}` argument, checked.
fn user<'a>(a: &Ask<'a>) -> Result<&'a str, ExecError> {
    let user = a.arg("user")?;
    ident::check_party("user", user).map_err(|e| bad(e.log))?;
    Ok(user)
}

/// `/balance/{user}`.
pub fn balance(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let user = user(a)?;
    Ok(json!({ "user": user, "balance": balance_of(&a.kv, user)? }))
}

/// `/allowances/{user}`.
pub fn allowances(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let user = user(a)?;
    let kv = &a.kv;
    let now = last_time(kv)?;
    let window = now / params(kv)?.settlement_window_secs;
    let mut rows = Vec::new();
    for (gateway, al) in allowance::allowances_of(kv, user, None, MAX_LIMIT)? {
        let used = allowance::spent(kv, user, &gateway, window)?;
        rows.push(json!({
            "gateway": gateway,
            "max_per_window": al.max_per_window,
            "expires_at": al.expires_at,
            "expired": al.expires_at <= now,
            "used": used,
        }));
    }
    Ok(json!({
        "user": user,
        "key": allowance::user_key(kv, user)?.map(hex::encode),
        "sequence": allowance::user_seq(kv, user)?,
        "window": window,
        "allowances": rows,
    }))
}

/// `/withdrawals/{user}`: the user's withdrawals by call id (the first
/// `MAX_LIMIT`; `more` when others follow), each `pending` until the batch
/// that pays it settles on the hub (then `settled_nonce` names it).
pub fn withdrawals(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let user = user(a)?;
    let rows = crate::state::withdrawal::withdrawals(&a.kv, user, 0, MAX_LIMIT + 1)?;
    let more = rows.len() > MAX_LIMIT;
    let list: Vec<Value> = rows
        .into_iter()
        .take(MAX_LIMIT)
        .map(|(id, w)| {
            json!({
                "call_id": id,
                "amount": w.amount,
                "sequence": w.sequence,
                "window": w.window,
                "height": w.height,
                "status": if w.settled_nonce == 0 { "pending" } else { "settled" },
                "settled_nonce": (w.settled_nonce != 0).then_some(w.settled_nonce),
            })
        })
        .collect();
    Ok(json!({ "user": user, "withdrawals": list, "more": more }))
}

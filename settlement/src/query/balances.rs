//! A user's money: `/balance/{user}` and `/allowances/{user}` (the
//! allowances the user gave gateways, with what each charged in the
//! current window).

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

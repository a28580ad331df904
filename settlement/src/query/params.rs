//! The chain's configuration as queries show it: `/params` and the
//! registered `/gateways`.

use serde_json::{json, Value};

use super::ask::Ask;
use crate::error::ExecError;
use crate::state::listing;

/// `/params`: the chain parameters in force, `since_window` (the first
/// window they govern) and `scheduled` (changes waiting for their window,
/// oldest first: `from_window`, `proposals`, `changes`).
pub fn params(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    Ok(crate::gov::params::json(&a.kv)?)
}

/// `/gateways`: `{"gateways": [{"name", "pubkey", "status", ...}]}`, by
/// public key: `status` is `active`, `suspended`, `removed` or `retired`
/// (a rotated-out key, with `until`: the block time its reports stop);
/// a rotated gateway's keys also name its `identity` (first key).
pub fn gateways(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let gateways: Vec<Value> = listing::gateways(&a.kv)?
        .into_iter()
        .map(|(key, g)| {
            let mut v =
                json!({ "name": g.name, "pubkey": hex::encode(&key), "status": g.status() });
            if g.identity.as_slice() != key.as_slice() {
                v["identity"] = json!(hex::encode(g.identity));
            }
            if let Some(until) = g.retired_until {
                v["until"] = json!(until);
            }
            v
        })
        .collect();
    Ok(json!({ "gateways": gateways }))
}

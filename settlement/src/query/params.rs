//! The chain's configuration as queries show it: `/params` and the
//! registered `/gateways`.

use serde_json::{json, Value};

use super::ask::Ask;
use crate::error::ExecError;
use crate::state::chain::params as stored_params;
use crate::state::listing;

/// `/params`: the chain parameters.
pub fn params(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    Ok(json!(stored_params(&a.kv)?))
}

/// `/gateways`: `{"gateways": [{"name", "pubkey"}]}`, by public key.
pub fn gateways(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let gateways: Vec<Value> = listing::gateways(&a.kv)?
        .into_iter()
        .map(|(key, name)| json!({ "name": name, "pubkey": hex::encode(key) }))
        .collect();
    Ok(json!({ "gateways": gateways }))
}

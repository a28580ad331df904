//! The threshold key and validator-set queries (`/dkg`, `/validators`,
//! `/proposals?from={id}`, `/rotations?from={nonce}`), adapted to the route table from the DKG component's own handlers ([`crate::dkg::query`]).

use serde_json::Value;

use super::ask::Ask;
use crate::dkg::query as dkg_query;
use crate::error::ExecError;

/// `/dkg`.
pub fn dkg(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    dkg_query::dkg(&a.kv)
}

/// `/validators`.
pub fn validators(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    dkg_query::validators(&a.kv)
}

/// `/proposals?from={id}`.
pub fn proposals(a: &Ask) -> Result<Value, ExecError> {
    dkg_query::proposals(&a.kv, a.query)
}

/// `/rotations?from={nonce}`.
pub fn rotations(a: &Ask) -> Result<Value, ExecError> {
    dkg_query::rotations(&a.kv, a.query)
}

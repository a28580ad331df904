//! The threshold key and validator-set queries (`/dkg`, `/validators`,
//! `/proposals?from={id}`), answered by [`crate::query_validators`].

use serde_json::Value;

use super::ask::Ask;
use crate::error::ExecError;
use crate::query_validators;

/// `/dkg`.
pub fn dkg(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    query_validators::dkg(&a.kv)
}

/// `/validators`.
pub fn validators(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    query_validators::validators(&a.kv)
}

/// `/proposals?from={id}`.
pub fn proposals(a: &Ask) -> Result<Value, ExecError> {
    query_validators::proposals(&a.kv, a.query)
}

//! Which messages the chain is waiting for a threshold signature on: a
//! partial signature is only worth storing (or signing) if its message is
//! one of them. Dispatches on [`Kind`] to the module that owns the kind.

use tally_store::KvRead;

use super::batch::awaits_batch;
use super::deposits::awaits_block;
use super::results::awaits_result;
use crate::bls::{self, Kind};
use crate::error::Fatal;
use crate::proto::PartialSig;
use crate::state::chain::params;
use crate::state::sync::sync_state;
use crate::types::Awaited;

/// The message partial `p` signs, if the chain on `chain_id` is waiting
/// for it: its kind is known, its digest is 32 bytes and matches what the
/// state expects for that kind. The signature itself is not checked.
pub fn recognize(
    kv: &impl KvRead,
    chain_id: &str,
    p: &PartialSig,
) -> Result<Option<Awaited>, Fatal> {
    let Ok(digest) = <[u8; 32]>::try_from(p.digest.as_slice()) else {
        return Ok(None);
    };
    let params = params(kv)?;
    let st = sync_state(kv, &params.hub_chain)?;
    let Ok(kind) = Kind::try_from(p.kind) else {
        return Ok(None);
    };
    let awaited = match kind {
        Kind::Batch => awaits_batch(kv, &params, &st, &digest)?,
        Kind::HubResult => p
            .hub_result
            .as_ref()
            .is_some_and(|r| awaits_result(&params, &st, r, &digest)),
        Kind::HubBlock => match &p.hub_block {
            Some(b) => awaits_block(kv, &params, b, &digest)?,
            None => false,
        },
    };
    Ok(awaited.then(|| Awaited {
        kind,
        digest,
        message: bls::message(chain_id, kind, &digest),
    }))
}

//! Which messages the chain is waiting for a threshold signature on: a
//! partial signature is only worth storing (or signing) if its message is
//! one of them. Dispatches on [`Kind`] to the module that owns the kind.
//!
//! Partials carry only a kind and a digest. A batch is recognised from
//! state alone; a hub result or hub block needs its body, which comes from
//! [`Bodies`]: the ones a SubmitPartials carries (or the relay handed in),
//! else the one stored with the message's pending partials.

use std::collections::BTreeMap;

use tally_store::KvRead;

use super::batch::awaits_batch;
use super::deposits::awaits_block;
use super::digest::{block_digest, result_digest};
use super::results::awaits_result;
use crate::bls::{self, Kind};
use crate::dkg::rotation;
use crate::error::Fatal;
use crate::proto::{HubBlock, HubResult, PendingMessage};
use crate::state::chain::params;
use crate::state::sync::{pending_message, sync_state};
use crate::types::Awaited;

/// Bodies of hub results and hub blocks, keyed by their digest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bodies {
    results: BTreeMap<[u8; 32], HubResult>,
    blocks: BTreeMap<[u8; 32], HubBlock>,
}

impl Bodies {
    /// Adds a hub result; returns its digest and whether it was new.
    pub fn add_result(&mut self, r: HubResult) -> ([u8; 32], bool) {
        let d = result_digest(&r);
        (d, self.results.insert(d, r).is_none())
    }

    /// Adds a hub block; returns its digest and whether it was new.
    pub fn add_block(&mut self, b: HubBlock) -> ([u8; 32], bool) {
        let d = block_digest(&b);
        (d, self.blocks.insert(d, b).is_none())
    }

    /// The hub result with `digest`, if held.
    pub fn result(&self, digest: &[u8; 32]) -> Option<&HubResult> {
        self.results.get(digest)
    }

    /// The hub block with `digest`, if held.
    pub fn block(&self, digest: &[u8; 32]) -> Option<&HubBlock> {
        self.blocks.get(digest)
    }

    /// Digests of every body held, with their kind.
    pub fn digests(&self) -> impl Iterator<Item = (Kind, [u8; 32])> + '_ {
        self.results
            .keys()
            .map(|d| (Kind::HubResult, *d))
            .chain(self.blocks.keys().map(|d| (Kind::HubBlock, *d)))
    }
}

/// The message a partial of `kind` over `digest` signs, if the chain on
/// `chain_id` is waiting for it: the kind is known, the digest is 32 bytes
/// and matches what the state expects for that kind (a hub result or hub
/// block body is looked up in `bodies`, then among pending messages). The
/// signature itself is not checked.
pub fn recognize(
    kv: &impl KvRead,
    chain_id: &str,
    kind: u32,
    digest: &[u8],
    bodies: &Bodies,
) -> Result<Option<Awaited>, Fatal> {
    let Ok(digest) = <[u8; 32]>::try_from(digest) else {
        return Ok(None);
    };
    let Ok(kind) = Kind::try_from(kind) else {
        return Ok(None);
    };
    let params = params(kv)?;
    let st = sync_state(kv, &params.hub_chain)?;
    let mut out = Awaited {
        kind,
        digest,
        message: Vec::new(),
        hub_result: None,
        hub_block: None,
    };
    let awaited = match kind {
        Kind::Batch => awaits_batch(kv, &params, &st, &digest)?,
        Kind::KeyRotation => rotation::awaits(kv, &digest)?,
        Kind::HubResult => {
            out.hub_result = match bodies.result(&digest) {
                Some(r) => Some(r.clone()),
                None => stored_body(kv, &digest, kind)?.and_then(|m| m.hub_result),
            };
            out.hub_result
                .as_ref()
                .is_some_and(|r| awaits_result(&params, &st, r, &digest))
        }
        Kind::HubBlock => {
            out.hub_block = match bodies.block(&digest) {
                Some(b) => Some(b.clone()),
                None => stored_body(kv, &digest, kind)?.and_then(|m| m.hub_block),
            };
            match &out.hub_block {
                Some(b) => awaits_block(kv, &params, b, &digest)?,
                None => false,
            }
        }
    };
    if !awaited {
        return Ok(None);
    }
    out.message = bls::message(chain_id, kind, &digest);
    Ok(Some(out))
}

/// The body stored with the pending partials of `digest`, if it is a
/// message of `kind`.
fn stored_body(
    kv: &impl KvRead,
    digest: &[u8; 32],
    kind: Kind,
) -> Result<Option<PendingMessage>, Fatal> {
    Ok(pending_message(kv, digest)?.filter(|m| m.kind == kind.value()))
}

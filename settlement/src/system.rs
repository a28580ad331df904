//! System transactions, which only the block proposer adds, ahead of user
//! transactions: PrepareProposal computes them ([`prepare_system`]) and
//! ProcessProposal checks a proposal's against committed state
//! ([`verify_system`]). Both run on a throwaway overlay of committed state
//! (`sim`), starting with the block's own start-of-block work.
//!
//! Two kinds exist: `SyncTxStart {chain, batch_nonce, call_ids, digest}`
//! and `SubmitPartials {partials, hub_results, hub_blocks}`. CheckTx
//! refuses both (code 18), so they never come from the mempool. One height
//! `h`:
//!
//! 1. PrepareProposal (the proposer): on the overlay, the block-start work,
//!    a `SyncTxStart` if one is due (applied to the overlay), then one
//!    `SubmitPartials` with the partials of the last commit's vote
//!    extensions (from `h - 1`) that the chain still needs: each extension
//!    checked as VerifyVoteExtension does, each message's candidates
//!    verified first and de-duplicated per signer after (so a bad partial
//!    cannot displace a good one), at most `max_block_messages` messages
//!    (batches first, then those with most signers). Their bytes are taken
//!    from `max_tx_bytes` before any user transaction.
//! 2. ProcessProposal (every validator): by length alone, before decoding,
//!    any transaction over `max_tx_bytes` and any system transaction larger
//!    than an honest one can be (`tx::system_tx_bound`) is refused; then
//!    system transactions out of order (at most one `SyncTxStart`, then at
//!    most one `SubmitPartials`, both before any user transaction), a
//!    `SyncTxStart` that committed state and block time do not call for
//!    exactly, a `SubmitPartials` over its caps (all checked before any
//!    pairing), a partial that is not awaited or already stored, and any
//!    message whose partials fail one batched BLS check (logged as
//!    `BadSystemTx`). User transactions are only length-checked and
//!    decoded, not run, and the adapter answers accept or reject, never
//!    UNKNOWN.
//! 3. ExtendVote and VerifyVoteExtension: [`crate::sync::vote_extension`].
//! 4. FinalizeBlock: block-start work, then every transaction in order;
//!    system transactions run through the same code as in ProcessProposal
//!    but skip (rather than refuse) stale or bad partials, verifying before
//!    de-duplicating.
//!
//! So a batch started at height `h` is normally signed at `h + 1`.

use tally_store::Kv;

use crate::block::begin_block;
use crate::codes::Code;
use crate::dkg::key::KeyCache;
use crate::dkg::state::active_key;
use crate::error::{reject, ExecError, Fatal};
use crate::pipeline::block_scope;
use crate::proto::{tx, SyncTxStart};
use crate::state::chain::{chain_id, params};
use crate::sync::awaited::Bodies;
use crate::sync::batch::{apply_start, next_sync_start};
use crate::sync::partials::apply_partials;
use crate::sync::vote_extension::collect_partials;
use crate::tx::{check_proposed_size, decode_tx, encode_partials, encode_sync_start};
use crate::types::Block;

/// PrepareProposal's system transactions for `block`, computed on `sim`:
/// a sync start when one is due, then the new valid partials of `votes`
/// (the last commit's vote extensions with their senders' consensus
/// addresses), carrying the bodies this proposer's relay handed in
/// (`bodies`) where the chain does not hold them yet. The active key is
/// read through `cache`.
pub fn prepare_system(
    sim: &mut impl Kv,
    cache: &KeyCache,
    block: &Block,
    votes: &[(Vec<u8>, Vec<u8>)],
    bodies: &Bodies,
) -> Result<Vec<Vec<u8>>, ExecError> {
    begin_block(sim, block)?;
    let mut out = Vec::new();
    if let Some(start) = next_sync_start(sim, block.time)? {
        apply_start(sim, block, &start)?;
        out.push(encode_sync_start(start));
    }
    let chain = chain_id(sim)?;
    if let Some(p) = collect_partials(sim, cache, &chain, votes, bodies)? {
        out.push(encode_partials(p));
    }
    Ok(out)
}

/// ProcessProposal's check of a block's system transactions on `sim`:
/// they come first, in the order PrepareProposal puts them (at most one
/// sync start, then at most one SubmitPartials), each exactly what
/// committed state allows, every partial valid and new, within the size
/// caps of [`crate::sync::check_shape`] (checked before any pairing, so a
/// stuffed proposal costs no more than a full honest one). Every
/// transaction's length is checked first ([`check_proposed_size`]), so
/// nothing larger than an honest block holds is ever decoded. User
/// transactions are not run. A block without system transactions passes.
/// An invalid proposal is [`ExecError::Rejected`]; [`ExecError::Fatal`]
/// means this node could not tell. The active key is read through `cache`.
pub fn verify_system(
    sim: &mut impl Kv,
    cache: &KeyCache,
    block: &Block,
    txs: &[&[u8]],
) -> Result<(), ExecError> {
    begin_block(sim, block)?;
    let chain = chain_id(sim)?;
    let p = params(sim)?;
    let signers = active_key(sim, cache)?.map_or(0, |k| k.shares.shares.len());
    let version = crate::state::chain::app_version(sim)?;
    // Sizes first, by length alone, before anything is decoded.
    for (i, t) in txs.iter().enumerate() {
        check_proposed_size(t, &p, signers, version)
            .map_err(|r| reject(r.code, format!("tx {i}: {}", r.log)))?;
    }
    // 0: nothing yet, 1: sync start seen, 2: partials seen, 3: user txs.
    let mut stage = 0u8;
    let mut scopes: std::collections::BTreeSet<Vec<u8>> = Default::default();
    for (i, t) in txs.iter().enumerate() {
        let out_of_place = |what: &str| {
            reject(
                Code::BadSystemTx,
                format!("tx {i}: {what} out of place (system transactions come first: one sync start, then one SubmitPartials)"),
            )
        };
        let decoded = decode_tx(t)?;
        if let Some(scope) = block_scope(&decoded) {
            if !scopes.insert(scope) {
                return Err(reject(
                    Code::TxPending,
                    format!("tx {i}: a second validator message of one sender and kind, or allowance change of one user, in one block"),
                ));
            }
        }
        match decoded.sum {
            Some(tx::Sum::SyncStart(s)) => {
                if stage >= 1 {
                    return Err(out_of_place("sync start"));
                }
                stage = 1;
                apply_start(sim, block, &s)?;
            }
            Some(tx::Sum::Partials(p)) => {
                if stage >= 2 {
                    return Err(out_of_place("SubmitPartials"));
                }
                stage = 2;
                apply_partials(sim, cache, block, &chain, &p, true)?;
            }
            _ => stage = 3,
        }
    }
    Ok(())
}

/// ExtendVote's re-derivation of the sync start in the block being voted
/// on: runs the block's start-of-block work on `sim` (committed state) and
/// returns the start this node computes itself, if `proposed` is exactly
/// one start equal to it. A validator signs a batch only if it derived
/// the same batch from its own state.
pub fn rederive_start(
    sim: &mut impl Kv,
    block: &Block,
    proposed: &[SyncTxStart],
) -> Result<Option<SyncTxStart>, Fatal> {
    let [one] = proposed else {
        return Ok(None);
    };
    begin_block(sim, block)?;
    Ok(next_sync_start(sim, block.time)?.filter(|want| want == one))
}

//! System transactions, which only the block proposer adds, ahead of user
//! transactions: PrepareProposal computes them ([`prepare_system`]) and
//! ProcessProposal checks a proposal's against committed state
//! ([`verify_system`]). Both run on a throwaway overlay of committed state
//! (`sim`), starting with the block's own start-of-block work.

use tally_store::Kv;

use crate::block::begin_block;
use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::proto::tx;
use crate::state::chain::chain_id;
use crate::sync::batch::{apply_start, next_sync_start};
use crate::sync::partials::apply_partials;
use crate::sync::vote_extension::collect_partials;
use crate::tx::{decode_tx, encode_partials, encode_sync_start};
use crate::types::Block;

/// PrepareProposal's system transactions for `block`, computed on `sim`:
/// a sync start when one is due, then the new valid partials of
/// `extensions` (the last commit's vote extensions).
pub fn prepare_system(
    sim: &mut impl Kv,
    block: &Block,
    extensions: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>, ExecError> {
    begin_block(sim, block)?;
    let mut out = Vec::new();
    if let Some(start) = next_sync_start(sim, block.time)? {
        apply_start(sim, block, &start)?;
        out.push(encode_sync_start(start));
    }
    let chain = chain_id(sim)?;
    if let Some(p) = collect_partials(sim, &chain, extensions)? {
        out.push(encode_partials(p));
    }
    Ok(out)
}

/// ProcessProposal's check of a block's system transactions on `sim`:
/// they come first, at most one sync start, each exactly what committed
/// state allows, every partial valid and new. User transactions are not
/// run. A block without system transactions passes. An invalid proposal
/// is [`ExecError::Rejected`]; [`ExecError::Fatal`] means this node could
/// not tell.
pub fn verify_system(sim: &mut impl Kv, block: &Block, txs: &[&[u8]]) -> Result<(), ExecError> {
    begin_block(sim, block)?;
    let chain = chain_id(sim)?;
    let mut user_seen = false;
    let mut starts = 0;
    for (i, t) in txs.iter().enumerate() {
        match decode_tx(t)?.sum {
            Some(tx::Sum::SyncStart(s)) => {
                starts += 1;
                if user_seen || starts > 1 {
                    return Err(reject(
                        Code::BadSystemTx,
                        format!("tx {i}: sync start out of place"),
                    ));
                }
                apply_start(sim, block, &s)?;
            }
            Some(tx::Sum::Partials(p)) => {
                if user_seen {
                    return Err(reject(
                        Code::BadSystemTx,
                        format!("tx {i}: system tx after user txs"),
                    ));
                }
                apply_partials(sim, block, &chain, &p, true)?;
            }
            _ => user_seen = true,
        }
    }
    Ok(())
}

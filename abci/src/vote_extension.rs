//! ExtendVote and VerifyVoteExtension. A signing validator's extension
//! carries partial signatures on what the chain waits for: a batch started
//! in the block voted on (only if this node derives the same batch from its
//! own state), the current batch, and the relay's hand-ins, less those
//! this validator's partial already rides in that block for (so with app
//! version 5 it signs the next hub blocks in flight, ADR 0024). Verification
//! checks size, structure and that every partial is under the sender's own
//! share index, never state this node may not have seen yet (the next
//! proposer verifies the signatures and drops invalid partials), so an
//! honest extension is never refused.

use std::collections::BTreeSet;

use bytes::Bytes;
use prost::Message;
use tally_settlement::proto::{tx, SyncTxStart};
use tally_settlement::{self as settlement, Block};
use tendermint_proto::v0_38::abci::{
    response_verify_vote_extension::VerifyStatus, RequestExtendVote, RequestVerifyVoteExtension,
    ResponseExtendVote, ResponseVerifyVoteExtension,
};
use tracing::warn;

use crate::app::TallyApp;
use crate::convert;

/// What the block being voted on (`txs`) holds for this signer (share
/// `index`): the batches started in it, signed right away, and the digests
/// its SubmitPartials already carries a partial of this signer for. Those
/// hub results and blocks are not signed again, so the extension signs the
/// next ones (with app version 5 several hub blocks are in flight, ADR
/// 0024).
fn voted_block(txs: &[Bytes], index: u32) -> (Vec<SyncTxStart>, BTreeSet<Vec<u8>>) {
    let mut proposed: Vec<SyncTxStart> = Vec::new();
    let mut in_block: BTreeSet<Vec<u8>> = BTreeSet::new();
    for t in txs {
        match settlement::decode_tx(t).ok().and_then(|d| d.sum) {
            Some(tx::Sum::SyncStart(s)) => proposed.push(s),
            Some(tx::Sum::Partials(p)) => in_block.extend(
                p.partials
                    .into_iter()
                    .filter(|q| q.index == index)
                    .map(|q| q.digest),
            ),
            _ => {}
        }
    }
    (proposed, in_block)
}

pub(crate) fn extend_vote(app: &TallyApp, req: RequestExtendVote) -> ResponseExtendVote {
    let signers = app
        .inner
        .signer
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    // The share of the chain's active key epoch, if this node holds it.
    let active = match settlement::dkg::state::active_key(app.committed_state(), app.key_cache()) {
        Ok(Some(k)) => k.record.epoch,
        _ => return ResponseExtendVote::default(),
    };
    let Some((epoch, share)) = signers.into_iter().find(|(e, _)| *e == active) else {
        return ResponseExtendVote::default();
    };
    let (proposed, in_block) = voted_block(&req.txs, share.index);
    let (observed, blocks) = {
        let inbox = app.inbox();
        let fresh = |d: [u8; 32]| !in_block.contains(d.as_slice());
        (
            inbox
                .results()
                .iter()
                .filter(|r| fresh(settlement::sync::result_digest(r)))
                .cloned()
                .collect::<Vec<_>>(),
            inbox
                .blocks()
                .iter()
                .filter(|b| fresh(settlement::sync::block_digest(b)))
                .cloned()
                .collect::<Vec<_>>(),
        )
    };
    let block: Block = convert::block(req.height, req.time.as_ref());
    let start = match app.committed_pending() {
        Ok(mut sim) => settlement::rederive_start(&mut sim, &block, &proposed),
        Err(e) => Err(e.into()),
    };
    let backend = app.committed_state();
    let ext = start.and_then(|start| {
        if start.is_none() && !proposed.is_empty() {
            warn!(
                height = req.height,
                "not signing the proposed sync start: it differs from the one this node derives"
            );
        }
        let chain = settlement::chain_id(backend)?;
        settlement::sync::extension(
            backend,
            app.key_cache(),
            &chain,
            &share,
            epoch,
            start.as_ref(),
            &observed,
            &blocks,
        )
    });
    match ext {
        Ok(e) => ResponseExtendVote {
            vote_extension: e.encode_to_vec().into(),
        },
        // An empty extension is always valid; this node signs next time.
        Err(e) => {
            warn!(height = req.height, error = %e, "empty vote extension");
            ResponseExtendVote::default()
        }
    }
}

pub(crate) fn verify_vote_extension(
    app: &TallyApp,
    req: RequestVerifyVoteExtension,
) -> ResponseVerifyVoteExtension {
    let status = match settlement::sync::check_extension(
        app.committed_state(),
        app.key_cache(),
        &req.validator_address,
        &req.vote_extension,
    ) {
        Ok(_) => VerifyStatus::Accept,
        Err(e) => {
            warn!(
                height = req.height,
                validator = %hex::encode(&req.validator_address),
                error = %e,
                "rejecting vote extension"
            );
            app.metrics().extension_rejected(&e);
            VerifyStatus::Reject
        }
    };
    ResponseVerifyVoteExtension {
        status: status as i32,
    }
}

//! ExtendVote and VerifyVoteExtension. A signing validator's extension
//! carries partial signatures on what the chain waits for: a batch started
//! in the block voted on (only if this node derives the same batch from its
//! own state), the current batch, and the relay's hand-ins. Verification
//! checks size, structure and that every partial is under the sender's own
//! share index, never state this node may not have seen yet (the next
//! proposer verifies the signatures and drops invalid partials), so an
//! honest extension is never refused.

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
    // Batches started in the block being voted on are signed right away.
    let proposed: Vec<SyncTxStart> = req
        .txs
        .iter()
        .filter_map(|t| match settlement::decode_tx(t).ok()?.sum {
            Some(tx::Sum::SyncStart(s)) => Some(s),
            _ => None,
        })
        .collect();
    let (observed, blocks) = {
        let inbox = app.inbox();
        (inbox.results().to_vec(), inbox.blocks().to_vec())
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

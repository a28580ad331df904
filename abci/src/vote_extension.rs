//! ExtendVote and VerifyVoteExtension. A signing validator's extension
//! carries partial signatures on what the chain waits for: batches started
//! in the block voted on, the current batch, and the relay's hand-ins.
//! Verification is structural only (the next proposer drops invalid
//! partials), so an honest extension is never refused for state this node
//! has not seen.

use prost::Message;
use tally_settlement::proto::{tx, SyncTxStart};
use tally_settlement::{self as settlement};
use tendermint_proto::v0_38::abci::{
    response_verify_vote_extension::VerifyStatus, RequestExtendVote, RequestVerifyVoteExtension,
    ResponseExtendVote, ResponseVerifyVoteExtension,
};
use tracing::warn;

use crate::app::TallyApp;

pub(crate) fn extend_vote(app: &TallyApp, req: RequestExtendVote) -> ResponseExtendVote {
    let signer = app
        .inner
        .signer
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let Some(share) = signer else {
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
    let backend = app.committed_state();
    let ext = settlement::chain_id(backend).and_then(|chain| {
        settlement::sync::extension(backend, &chain, &share, &proposed, &observed, &blocks)
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
    let status =
        if settlement::sync::extension_well_formed(app.committed_state(), &req.vote_extension) {
            VerifyStatus::Accept
        } else {
            VerifyStatus::Reject
        };
    ResponseVerifyVoteExtension {
        status: status as i32,
    }
}

//! PrepareProposal and ProcessProposal.
//!
//! The proposer puts the system transactions the state machine computes on
//! committed state first, their bytes reserved before user transactions,
//! then the mempool's transactions in order, skipping what ProcessProposal
//! would refuse. ProcessProposal rejects undecodable transactions and
//! system transactions that committed state does not allow; a local fault
//! while checking halts the node instead of voting on a guess.

use bytes::Bytes;
use tally_settlement::proto::tx;
use tally_settlement::{self as settlement, ExecError};
use tendermint_proto::v0_38::abci::{
    response_process_proposal::ProposalStatus, RequestPrepareProposal, RequestProcessProposal,
    ResponsePrepareProposal, ResponseProcessProposal,
};
use tracing::warn;

use crate::app::TallyApp;
use crate::convert;

pub(crate) fn prepare_proposal(
    app: &TallyApp,
    req: RequestPrepareProposal,
) -> ResponsePrepareProposal {
    if app.stop_if_upgrade_due(u64::try_from(req.height).unwrap_or(0)) {
        // This node lacks the block's app version: it proposes nothing.
        return ResponsePrepareProposal::default();
    }
    let max = usize::try_from(req.max_tx_bytes.max(0)).unwrap_or(usize::MAX);
    let mut used = 0usize;
    let mut txs = Vec::with_capacity(req.txs.len() + 2);
    // System transactions first, their bytes reserved before user txs.
    let block = convert::block(req.height, req.time.as_ref());
    let votes: Vec<(Vec<u8>, Vec<u8>)> = req
        .local_last_commit
        .as_ref()
        .map(|c| {
            c.votes
                .iter()
                .filter(|v| !v.vote_extension.is_empty())
                .map(|v| {
                    let address = v.validator.as_ref().map(|x| x.address.to_vec());
                    (address.unwrap_or_default(), v.vote_extension.to_vec())
                })
                .collect()
        })
        .unwrap_or_default();
    let bodies = app.inbox().bodies();
    let system = app
        .committed_pending()
        .map_err(ExecError::from)
        .and_then(|mut sim| {
            settlement::prepare_system(&mut sim, app.key_cache(), &block, &votes, &bodies)
        });
    match system {
        Ok(sys) => {
            for t in sys {
                if used + t.len() <= max {
                    used += t.len();
                    txs.push(Bytes::from(t));
                }
            }
        }
        // Proposing without system transactions is always valid; the next
        // proposer tries again.
        Err(e) => warn!(height = block.height, error = %e, "no system transactions this block"),
    }
    let mut scopes = std::collections::HashSet::new();
    for tx in req.txs {
        // Skip what ProcessProposal would refuse (undecodable bytes, system
        // transactions from the mempool, a second transaction of one
        // one-per-block scope); keep the mempool order. One decode.
        // Validator messages (DKG dealings, acks, reveals, proposals,
        // approvals) are user transactions signed by a validator.
        let Ok(decoded) = settlement::decode_tx(&tx) else {
            continue;
        };
        if !is_user_tx(&decoded.sum) {
            continue;
        }
        if let Some(scope) = settlement::pipeline::block_scope(&decoded) {
            if !scopes.insert(scope) {
                continue; // stays in the mempool for a later block
            }
        }
        if used.saturating_add(tx.len()) > max {
            continue;
        }
        used += tx.len();
        txs.push(tx);
    }
    ResponsePrepareProposal { txs }
}

pub(crate) fn process_proposal(
    app: &TallyApp,
    req: RequestProcessProposal,
) -> ResponseProcessProposal {
    let status = if app.stop_if_upgrade_due(u64::try_from(req.height).unwrap_or(0)) {
        ProposalStatus::Reject
    } else {
        verdict(app, &req)
    };
    ResponseProcessProposal {
        status: status as i32,
    }
}

fn verdict(app: &TallyApp, req: &RequestProcessProposal) -> ProposalStatus {
    // verify_system checks every transaction's size, then that it decodes,
    // then the system transactions.
    let block = convert::block(req.height, req.time.as_ref());
    let txs: Vec<&[u8]> = req.txs.iter().map(|t| t.as_ref()).collect();
    let verdict = app
        .committed_pending()
        .map_err(ExecError::from)
        .and_then(|mut sim| settlement::verify_system(&mut sim, app.key_cache(), &block, &txs));
    match verdict {
        Ok(()) => ProposalStatus::Accept,
        Err(ExecError::Rejected(e)) => {
            warn!(height = req.height, error = %e, "rejecting proposal: oversized, undecodable or invalid system transaction");
            ProposalStatus::Reject
        }
        Err(ExecError::Fatal(f)) => {
            app.fatal_store_error(block.height, &f.to_string());
            ProposalStatus::Reject
        }
    }
}

/// Whether a decoded transaction is one a user, gateway or validator sends
/// through the mempool (a system transaction is the proposer's own).
fn is_user_tx(sum: &Option<tx::Sum>) -> bool {
    matches!(
        sum,
        None | Some(
            tx::Sum::Report(_) | tx::Sum::Allowance(_) | tx::Sum::Validator(_) | tx::Sum::User(_)
        )
    )
}

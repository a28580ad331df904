//! FinalizeBlock and Commit. FinalizeBlock runs the start-of-block work and
//! every transaction into the pending change set and answers the app hash
//! those writes give; Commit writes the change set durably. A local fault
//! in either halts the node (see `TallyApp::fatal_store_error`): the block
//! is left unexecuted rather than answered with a hash this node cannot
//! reproduce.

use bytes::Bytes;
use tally_settlement::{self as settlement};
use tendermint_proto::v0_38::abci::{
    ExecTxResult, RequestFinalizeBlock, ResponseCommit, ResponseFinalizeBlock,
};
use tracing::warn;

use crate::app::TallyApp;
use crate::convert::{self, codespace};
use crate::metrics::BlockTally;

pub(crate) fn finalize_block(app: &TallyApp, req: RequestFinalizeBlock) -> ResponseFinalizeBlock {
    let block = convert::block(req.height, req.time.as_ref());
    if app.stop_if_upgrade_due(block.height) {
        return ResponseFinalizeBlock::default();
    }
    let mut c = app.consensus();
    if c.finalized.take().is_some() {
        // The same height again without a Commit: start from the state
        // before the first execution.
        warn!(
            height = block.height,
            "FinalizeBlock repeated before Commit; re-executing"
        );
        let before = c.before_block.clone();
        c.pending.set_changes(before);
    } else {
        c.before_block = c.pending.changes().clone();
    }
    let fault = match execute(app, &mut c.pending, &block, &req.txs) {
        Ok(r) => {
            c.finalized = Some(block.height);
            c.tally = Some(BlockTally::from_response(block.height, block.time, &r));
            return r;
        }
        Err(f) => f,
    };
    // Nothing of this block may stay pending.
    let before = c.before_block.clone();
    c.pending.set_changes(before);
    drop(c);
    match fault {
        settlement::Fatal::UpgradeNeeded { plan, max } => {
            app.upgrade_halt(block.height, &plan, max)
        }
        f => app.fatal_store_error(block.height, &f.to_string()),
    }
    ResponseFinalizeBlock::default()
}

/// Runs `block` with `txs` into `pending`: the start-of-block work, every
/// transaction, the validator updates and the app hash. An app version
/// switch in the block goes to `consensus_param_updates`, so the next
/// header carries the new version (ADR 0019).
fn execute(
    app: &TallyApp,
    pending: &mut tally_store::Pending,
    block: &settlement::Block,
    txs: &[Bytes],
) -> Result<ResponseFinalizeBlock, settlement::Fatal> {
    let (sigs, keys) = (app.signatures(), app.key_cache());
    let version_before = settlement::state::chain::app_version(pending)?;
    let events = settlement::begin_block_with(pending, block, app.max_app_version())?;
    let mut tx_results = Vec::with_capacity(txs.len());
    for tx in txs {
        let r = settlement::deliver_tx_with(pending, block, tx, sigs, keys)?;
        tx_results.push(ExecTxResult {
            code: r.code.value(),
            log: r.log,
            data: r.data.into(),
            events: convert::events(r.events),
            codespace: codespace(r.code),
            ..Default::default()
        });
    }
    settlement::end_block(pending, block)?;
    let updates = settlement::dkg::validator_updates(pending, block.height)?;
    let version = settlement::state::chain::app_version(pending)?;
    let app_hash = pending
        .app_hash_at(block.height)
        .map_err(settlement::Fatal::Store)?;
    Ok(ResponseFinalizeBlock {
        events: convert::events(events),
        tx_results,
        validator_updates: convert::validator_updates(&updates),
        consensus_param_updates: (version != version_before)
            .then(|| convert::app_version_update(version)),
        app_hash: Bytes::copy_from_slice(&app_hash),
    })
}

pub(crate) fn commit(app: &TallyApp) -> ResponseCommit {
    if app.halted() {
        return ResponseCommit::default();
    }
    let mut c = app.consensus();
    let Some(height) = c.finalized.take() else {
        warn!("Commit without FinalizeBlock; nothing to write");
        return ResponseCommit::default();
    };
    let tally = c.tally.take();
    match c.pending.commit(height) {
        Ok(meta) => {
            *app.inner
                .committed
                .write()
                .unwrap_or_else(|e| e.into_inner()) = meta;
            if let Some(t) = tally.filter(|t| t.height == height) {
                app.metrics().committed(&t);
            }
        }
        Err(e) => {
            drop(c);
            app.fatal_store_error(height, &e.to_string());
            return ResponseCommit::default();
        }
    }
    drop(c);
    // CometBFT re-checks what is left in the mempool next: those checks
    // claim their scopes again (see `mempool`).
    app.claims().clear();
    if let Some(s) = app.snapshots() {
        s.committed(height);
    }
    ResponseCommit { retain_height: 0 }
}

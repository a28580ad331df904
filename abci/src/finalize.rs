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
    let sigs = app.signatures();
    let keys = app.key_cache();
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
    let version_before = settlement::state::chain::app_version(&c.pending).unwrap_or(1);
    let fault =
        match settlement::begin_block_with(&mut c.pending, &block, app.max_app_version()) {
            Ok(events) => {
                let mut tx_results = Vec::with_capacity(req.txs.len());
                let mut fault = None;
                for tx in &req.txs {
                    match settlement::deliver_tx_with(&mut c.pending, &block, tx, sigs, keys) {
                        Ok(r) => tx_results.push(ExecTxResult {
                            code: r.code.value(),
                            log: r.log,
                            data: r.data.into(),
                            events: convert::events(r.events),
                            codespace: codespace(r.code),
                            ..Default::default()
                        }),
                        Err(f) => {
                            fault = Some(f);
                            break;
                        }
                    }
                }
                match fault {
                    Some(f) => f,
                    None => match settlement::dkg::validator_updates(&c.pending, block.height)
                        .and_then(|u| {
                            let v = settlement::state::chain::app_version(&c.pending)?;
                            c.pending
                                .app_hash_at(block.height)
                                .map(|h| (h, u, v))
                                .map_err(settlement::Fatal::Store)
                        }) {
                        Ok((app_hash, updates, version)) => {
                            c.finalized = Some(block.height);
                            let r = ResponseFinalizeBlock {
                                events: convert::events(events),
                                tx_results,
                                validator_updates: convert::validator_updates(&updates),
                                // A switch: the next header carries the
                                // new app version (ADR 0019).
                                consensus_param_updates: (version != version_before)
                                    .then(|| convert::app_version_update(version)),
                                app_hash: Bytes::copy_from_slice(&app_hash),
                            };
                            c.tally = Some(BlockTally::from_response(block.height, block.time, &r));
                            return r;
                        }
                        Err(f) => f,
                    },
                }
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

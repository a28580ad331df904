//! Work at the start of every block, before its transactions: switch to
//! a new app version when an upgrade plan is due (its migration first of
//! all, [`crate::upgrade`]), forget
//! report ids that can no longer be replayed, apply the parameter changes
//! due in the block's window ([`crate::gov::params`]), close the settlement window
//! the block time has left (its totals freeze), judge it by the
//! service-level objectives it was open under and put in force those due
//! now ([`crate::slo`], app version 4), turn a bounded number of
//! closed windows' debts into escrowed hub calls (see [`crate::sync::close`]),
//! record the block's window and time, expire partial signatures that
//! never reached the threshold, prune the kept calls of batches settled
//! more than `settled_retention_windows` ago, from app version 7 prune the
//! SLA records of windows older than `sla_keep_windows`
//! ([`crate::state::prune`]), and run the DKG's block work
//! (phases of the running ceremony, key activation: [`crate::dkg`]).
//!
//! The window of a block is `block_time / settlement_window_secs` (integer
//! division of unix seconds), so windows are aligned to the epoch, not to
//! genesis, and records always land in the window of the block that
//! executes them. The first block whose window is later than the stored
//! `meta/cur_window` marks that window closed and emits `window_closed`
//! with its route count, requests and amount (its hub calls are counted by
//! the conversion events of [`crate::sync::close`]). Block time never goes
//! backwards, so nothing can be added to a closed window: it is frozen by
//! construction. A window in which no record was written has no `win/`
//! entry and no event.

use tally_store::Kv;

use crate::error::Fatal;
use crate::state::chain::{
    app_version, cur_window, params, put_cur_window, put_last_time, put_window_info, window_info,
};
use crate::state::replay::forget_reports_through;
use crate::sync::close::convert_closed;
use crate::sync::partials::expire_partials;
use crate::sync::results::prune_settled;
use crate::types::{Block, Event, PRUNE_VERSION};
use crate::upgrade::LATEST_APP_VERSION;

/// Runs the start-of-block work for `block` on a node that runs every
/// app version this build carries; returns its events.
pub fn begin_block(kv: &mut impl Kv, block: &Block) -> Result<Vec<Event>, Fatal> {
    begin_block_with(kv, block, LATEST_APP_VERSION)
}

/// [`begin_block`] on a node that runs app versions up to `max_version`:
/// first of all the upgrade switch ([`crate::upgrade::begin_block`]: a due
/// plan's migration, or the next bounded step of one in progress), so the
/// whole block runs the new version's rules; [`Fatal::UpgradeNeeded`]
/// when the due version is above `max_version`.
pub fn begin_block_with(
    kv: &mut impl Kv,
    block: &Block,
    max_version: u64,
) -> Result<Vec<Event>, Fatal> {
    let mut events = crate::upgrade::begin_block(kv, block, max_version)?;
    // Report ids whose expires_at <= now can never be replayed: forget them.
    forget_reports_through(kv, block.time)?;
    // Parameter changes due in this block's window take effect now, so the
    // whole window runs one version (the window length never changes).
    let now_window = block.time / params(kv)?.settlement_window_secs;
    events.extend(crate::gov::params::begin_block(kv, now_window)?);

    let params = params(kv)?;
    let prev = cur_window(kv)?;
    let closed = prev.filter(|prev| now_window > *prev);
    if let Some(prev) = closed {
        if let Some(mut info) = window_info(kv, prev)? {
            info.closed = true;
            put_window_info(kv, prev, &info);
            events.push(Event::new(
                "window_closed",
                [
                    ("window", prev.to_string()),
                    ("routes", info.routes.to_string()),
                    ("requests", info.totals.requests.to_string()),
                    ("amount", info.totals.amount.to_string()),
                ],
            ));
        }
    }
    // Verdicts before the closed window's debts become hub calls (their
    // credits need them), then the objectives due from this window.
    events.extend(crate::slo::begin_block(kv, closed, now_window)?);
    events.extend(convert_closed(kv, closed, &params)?);
    if prev != Some(now_window) {
        put_cur_window(kv, now_window);
    }
    put_last_time(kv, block.time);
    expire_partials(kv, block.height)?;
    prune_settled(kv, now_window)?;
    if app_version(kv)? >= PRUNE_VERSION {
        events.extend(crate::state::prune::begin_block(
            kv,
            now_window,
            params.sla_keep_windows,
        )?);
    }
    events.extend(crate::dkg::begin_block(kv, block)?);
    Ok(events)
}

/// Runs the end-of-block work of `block`, after its last transaction: from
/// app version 6, the digests of the report ids it filed as side state
/// ([`crate::state::replay::commit_block_ids`], ADR 0025).
pub fn end_block(kv: &mut impl Kv, block: &Block) -> Result<(), Fatal> {
    crate::state::replay::commit_block_ids(kv, block.height)?;
    Ok(())
}

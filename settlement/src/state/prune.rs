//! Pruning old windows' SLA records (app version 7, ADR 0026).
//!
//! With `sla_keep_windows = K > 0`, a block in window `N` keeps the SLA
//! records of the windows from `N - K` on and prunes the older ones.
//!
//! - **The horizon.** `meta/sla_kept_from` holds `P`, the first window
//!   kept. Each block raises it to `N - K` when that is higher; it never
//!   goes down, so a larger `K` later keeps more of the future, not what
//!   is gone. Every query at a height answers code 28 (`height_unavailable`)
//!   for a window before that height's `P`, whether or not the pass below
//!   has deleted its keys yet, and listings start at `P`: what a node
//!   answers depends on `P` alone, never on how far the deletion got.
//! - **What is pruned** of a window: its route records (`rr/`) with their
//!   index entries (`ip/`, `iu/`), the providers' and users' window totals
//!   (`pw/`, `uw/`), the latency and TTFT histograms (`lat/`, `plat/`) and
//!   the window's totals (`win/`). Money stays: owed entries, hub calls,
//!   verdicts (they carry credits), reputations and balances are not SLA
//!   records and are never touched here.
//! - **Bounded work.** A pass prunes every window below its target. It
//!   walks `pw/` in key order, one entry per provider and window, so a
//!   provider's windows before the target come first in its range: each is
//!   pruned record by record through the provider's `ip/` index, and the
//!   first kept window skips the rest of the provider in one read. Then it
//!   deletes the `win/` entries below the target. A block does at most
//!   [`PRUNE_PER_BLOCK`] units of work (a route record with its entries, or
//!   one `pw/` or `win/` entry read) and stores where it stopped in
//!   `meta/sla_prune`; the next block resumes there. A new pass starts when
//!   the last finished below `P`.
//! - **Safety.** A report only writes the window of its block, and the
//!   block that closes a window judges it (reading its `pw/` and `plat/`)
//!   before this runs, so with `K >= 1` nothing pruned is read again by
//!   the state machine; queries check `P` first.

use tally_store::{prefix_end, Kv, KvRead};

use super::{get_u64, put_u64};
use crate::codes::Code;
use crate::error::{reject, ExecError, Fatal};
use crate::keys;
use crate::types::Event;

/// Most units of pruning work one block does: a route record deleted with
/// its index entries, its user's window totals and its histogram, or one
/// `pw/` or `win/` entry read.
pub const PRUNE_PER_BLOCK: usize = 1024;

/// The first window whose SLA records are kept (0: none pruned).
pub fn kept_from(kv: &impl KvRead) -> Result<u64, Fatal> {
    Ok(get_u64(kv, keys::SLA_KEPT_FROM)?.unwrap_or(0))
}

/// Why a query about `window` gets code 28, if `window` is before
/// `kept_from`.
pub fn pruned_reason(window: u64, kept_from: u64) -> Option<String> {
    (window < kept_from).then(|| {
        format!(
            "window {window}'s SLA records were pruned: this chain keeps windows from {kept_from} (sla_keep_windows)"
        )
    })
}

/// Code 28 for a window whose SLA records were pruned.
pub fn check_kept(kv: &impl KvRead, window: u64) -> Result<(), ExecError> {
    match pruned_reason(window, kept_from(kv)?) {
        Some(why) => Err(reject(Code::HeightUnavailable, why)),
        None => Ok(()),
    }
}

/// The pass: the window it prunes below and the key it reads next
/// (`None`: finished). No pass yet reads as one finished below window 0.
fn pass(kv: &impl KvRead) -> Result<(u64, Option<Vec<u8>>), Fatal> {
    let Some(b) = kv.get(keys::SLA_PRUNE)? else {
        return Ok((0, None));
    };
    let (target, at) = b.split_at_checked(8).ok_or(Fatal::Corrupt("prune pass"))?;
    let target = u64::from_be_bytes(
        target
            .try_into()
            .map_err(|_| Fatal::Corrupt("prune pass"))?,
    );
    Ok((target, (!at.is_empty()).then(|| at.to_vec())))
}

fn put_pass(kv: &mut impl Kv, target: u64, at: &[u8]) {
    let mut v = target.to_be_bytes().to_vec();
    v.extend_from_slice(at);
    kv.put(keys::SLA_PRUNE.to_vec(), v);
}

/// The key right after `k`.
fn after(k: &[u8]) -> Vec<u8> {
    let mut s = k.to_vec();
    s.push(0);
    s
}

/// The block's pruning, for a block in `now_window` under `keep`
/// (`sla_keep_windows`): raises the horizon, then does at most
/// [`PRUNE_PER_BLOCK`] units of the pass. Emits `sla_pruned {below}` when
/// a pass finishes.
pub fn begin_block(kv: &mut impl Kv, now_window: u64, keep: u64) -> Result<Vec<Event>, Fatal> {
    let mut kept = kept_from(kv)?;
    if keep > 0 && now_window.saturating_sub(keep) > kept {
        kept = now_window - keep;
        put_u64(kv, keys::SLA_KEPT_FROM.to_vec(), kept);
    }
    let (mut target, at) = pass(kv)?;
    let mut at = match at {
        Some(at) => at,
        None if target < kept => {
            target = kept;
            keys::PROVIDER_WINDOW.to_vec()
        }
        None => return Ok(Vec::new()),
    };
    let mut left = PRUNE_PER_BLOCK;
    while left > 0 {
        left -= 1;
        if at.starts_with(keys::PROVIDER_WINDOW) {
            let end = prefix_end(keys::PROVIDER_WINDOW);
            let Some((k, _)) = kv.scan(&at, &end, 1)?.pop() else {
                at = keys::WINDOW.to_vec();
                continue;
            };
            let (provider, w) = keys::parse_party_window(&k, keys::PROVIDER_WINDOW)
                .ok_or(Fatal::Corrupt("pw/ key"))?;
            if w >= target {
                // The provider's later windows are all kept.
                at = prefix_end(&keys::provider_window_prefix(&provider));
                continue;
            }
            if prune_records(kv, &provider, w, &mut left)? {
                kv.delete(keys::provider_latency(&provider, w));
                kv.delete(k.clone());
                at = after(&k);
            } else {
                at = k;
            }
        } else {
            let Some((k, _)) = kv.scan(&at, &keys::window(target), 1)?.pop() else {
                put_pass(kv, target, &[]);
                return Ok(vec![Event::new(
                    "sla_pruned",
                    [("below", target.to_string())],
                )]);
            };
            kv.delete(k.clone());
            at = after(&k);
        }
    }
    put_pass(kv, target, &at);
    Ok(Vec::new())
}

/// Deletes up to `left` of provider's route records in window `w` (each
/// with its `ip/` and `iu/` entries, its user's `uw/` totals and its
/// `lat/` histogram), counting them off `left`; `true` when none is left.
fn prune_records(
    kv: &mut impl Kv,
    provider: &str,
    w: u64,
    left: &mut usize,
) -> Result<bool, Fatal> {
    let prefix = keys::by_provider_prefix(provider, Some(w));
    let rows = kv.scan(&prefix, &prefix_end(&prefix), left.saturating_add(1))?;
    let done = rows.len() <= *left;
    for (k, _) in rows.into_iter().take(*left) {
        let (id, _) = keys::parse_index(&k, true).ok_or(Fatal::Corrupt("ip/ key"))?;
        kv.delete(keys::route(&id, w));
        kv.delete(keys::by_user(&id, w));
        kv.delete(keys::user_window(&id.user, w));
        kv.delete(keys::route_latency(provider, w, &id.model, &id.route));
        kv.delete(k);
        *left -= 1;
    }
    Ok(done)
}

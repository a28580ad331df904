//! Software upgrades (ADR 0019): a plan approved on chain switches the
//! state machine to a new app version at a named height, with the
//! migration that version needs.
//!
//! - **Plans.** An upgrade plan (`name`, `app_version`, `height`,
//!   `binary_sha256`, `info`) is a validator-set proposal of action
//!   `upgrade`, approved on the same path (more than 2/3 of the power). It
//!   is carried out by the transaction that accepts it: the plan becomes the
//!   pending plan (`upg/plan`), or the proposal is refused with the reason
//!   when, at that height, it no longer fits ([`check`]: checked when it
//!   is proposed and again when it is accepted). At most one plan is
//!   pending. A `cancel_upgrade` proposal naming the pending plan removes it
//!   while the height is more than [`CANCEL_MARGIN_BLOCKS`] away.
//! - **The switch.** At the start of block `height`, before anything else
//!   of that block ([`begin_block`]), a node that carries the plan's version
//!   runs its migration inside the block's change set (version 2's in
//!   bounded steps, the first here and one at the start of each following
//!   block until done), records the new app
//!   version (`meta/app_version`) and the plan under `upg/done/<name>`; the
//!   block's transactions run the new rules. The ABCI adapter sees the
//!   version change and returns it in `consensus_param_updates`, so the
//!   header of `height + 1` carries it. A node whose binary lacks the
//!   version gets [`Fatal::UpgradeNeeded`] and must stop before it executes
//!   anything of that block.
//! - **Versions this build carries**: 1 (the default genesis), 2 (report
//!   ids in expiry buckets, [`crate::state::replay`]) and 3 (parameter and
//!   gateway proposals, [`crate::gov`]; no migration) and 4 (objectives,
//!   verdicts and credits, latency in reports, [`crate::slo`]; no
//!   migration) and 5 (hub-block messages in flight,
//!   [`crate::sync::deposits`]; no migration). A genesis may start
//!   at any of them (CometBFT's `consensus_params.version.app`). Every version's rules stay
//!   in the binary, so a node replays old heights with old rules.

use prost::Message;
use serde_json::{json, Value};
use tally_store::{Kv, KvRead};

use crate::dkg::types::ProposalAction;
use crate::error::Fatal;
use crate::keys;
use crate::proto::{Proposal, UpgradePlan};
use crate::state::chain::{app_version, put_app_version};
use crate::state::load;
use crate::state::replay::{migrate_step, start_migration, start_side_ids};
use crate::types::{Block, Event};

/// The newest app version this build carries.
pub const LATEST_APP_VERSION: u64 = 7;
/// A plan's height must be at least this many blocks above the height it
/// is proposed and accepted at.
pub const MIN_LEAD_BLOCKS: u64 = 20;
/// ... and at most this many.
pub const MAX_LEAD_BLOCKS: u64 = 10_000_000;
/// A cancellation must be accepted more than this many blocks before the
/// plan's height (operators may be switching binaries by then).
pub const CANCEL_MARGIN_BLOCKS: u64 = 10;
/// Longest plan name, in bytes.
pub const MAX_NAME: usize = 64;
/// Longest plan info, in bytes.
pub const MAX_INFO: usize = 1024;

/// The pending plan, if any.
pub fn pending_plan(kv: &impl KvRead) -> Result<Option<UpgradePlan>, Fatal> {
    load(kv, keys::UPGRADE_PLAN, "upgrade plan")
}

/// The plan carried out under `name` (its `height` is the height it
/// switched at), if any.
pub fn applied_plan(kv: &impl KvRead, name: &str) -> Result<Option<UpgradePlan>, Fatal> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Ok(None);
    }
    load(kv, &keys::upgrade_done(name), "applied upgrade")
}

/// A plan as queries and events show it.
pub fn plan_json(p: &UpgradePlan) -> Value {
    json!({
        "name": p.name,
        "app_version": p.app_version,
        "height": p.height,
        "binary_sha256": hex::encode(&p.binary_sha256),
        "info": p.info,
    })
}

/// Whether the proposal of `action` with `plan` can be carried out at
/// `height`; the reason it cannot otherwise. Checked when the proposal is
/// opened and again when it is accepted.
pub fn check(
    kv: &impl KvRead,
    height: u64,
    action: ProposalAction,
    plan: Option<&UpgradePlan>,
) -> Result<Result<(), String>, Fatal> {
    let Some(plan) = plan else {
        return Ok(Err(format!("a {} carries a plan", action.name())));
    };
    let pending = pending_plan(kv)?;
    Ok(match action {
        ProposalAction::Upgrade => match check_fields(plan) {
            Err(why) => Err(why),
            Ok(()) if applied_plan(kv, &plan.name)?.is_some() => {
                Err(format!("upgrade {:?} was carried out already", plan.name))
            }
            Ok(()) => check_schedule(plan, height, app_version(kv)?, pending.as_ref()),
        },
        ProposalAction::CancelUpgrade => check_cancel(plan, height, pending.as_ref()),
        other => Err(format!("a {} is not an upgrade action", other.name())),
    })
}

fn check_fields(p: &UpgradePlan) -> Result<(), String> {
    let name_ok = !p.name.is_empty()
        && p.name.len() <= MAX_NAME
        && p.name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'));
    if !name_ok {
        return Err(format!(
            "the plan name {:?} is not 1 to {MAX_NAME} bytes of [a-z0-9._-]",
            p.name
        ));
    }
    if p.binary_sha256.len() != 32 {
        return Err(format!(
            "binary_sha256 is {} bytes, not 32",
            p.binary_sha256.len()
        ));
    }
    if p.info.len() > MAX_INFO {
        return Err(format!("info is longer than {MAX_INFO} bytes"));
    }
    Ok(())
}

fn check_schedule(
    p: &UpgradePlan,
    height: u64,
    current: u64,
    pending: Option<&UpgradePlan>,
) -> Result<(), String> {
    if let Some(q) = pending {
        return Err(format!(
            "upgrade {:?} is already pending (height {}); cancel it first",
            q.name, q.height
        ));
    }
    if p.app_version != current.saturating_add(1) {
        return Err(format!(
            "app_version {} is not the next version: the chain runs version {current}",
            p.app_version
        ));
    }
    if p.height < height.saturating_add(MIN_LEAD_BLOCKS) {
        return Err(format!(
            "height {} is less than {MIN_LEAD_BLOCKS} blocks above {height}",
            p.height
        ));
    }
    if p.height > height.saturating_add(MAX_LEAD_BLOCKS) {
        return Err(format!(
            "height {} is more than {MAX_LEAD_BLOCKS} blocks above {height}",
            p.height
        ));
    }
    Ok(())
}

fn check_cancel(p: &UpgradePlan, height: u64, pending: Option<&UpgradePlan>) -> Result<(), String> {
    let only_name =
        p.app_version == 0 && p.height == 0 && p.binary_sha256.is_empty() && p.info.is_empty();
    if !only_name {
        return Err("a cancellation names the plan and nothing else".into());
    }
    let Some(q) = pending.filter(|q| q.name == p.name) else {
        return Err(format!("no upgrade {:?} is pending", p.name));
    };
    if height.saturating_add(CANCEL_MARGIN_BLOCKS) >= q.height {
        return Err(format!(
            "upgrade {:?} at height {} can no longer be cancelled: the last height to cancel it is {}",
            q.name,
            q.height,
            q.height.saturating_sub(CANCEL_MARGIN_BLOCKS + 1)
        ));
    }
    Ok(())
}

/// Carries out accepted upgrade proposal `p`, already checked and marked
/// applied by [`crate::gov::enact`]: the plan becomes pending, or the
/// pending plan is cancelled. Returns the upgrade's event.
pub fn enact(kv: &mut impl Kv, p: &Proposal) -> Result<Option<Event>, Fatal> {
    let plan = p.upgrade.clone().unwrap_or_default();
    let (kind, named) = if p.action == u32::from(ProposalAction::Upgrade) {
        kv.put(keys::UPGRADE_PLAN.to_vec(), plan.encode_to_vec());
        ("upgrade_scheduled", plan)
    } else {
        // The event names the plan that was cancelled, in full.
        let cancelled = pending_plan(kv)?.unwrap_or(plan);
        kv.delete(keys::UPGRADE_PLAN.to_vec());
        ("upgrade_cancelled", cancelled)
    };
    Ok(Some(plan_event(kind, &named)))
}

fn plan_event(kind: &str, p: &UpgradePlan) -> Event {
    Event::new(
        kind,
        [
            ("name", p.name.clone()),
            ("app_version", p.app_version.to_string()),
            ("height", p.height.to_string()),
            ("binary_sha256", hex::encode(&p.binary_sha256)),
        ],
    )
}

/// The plan the block at `height` must switch to, if one is due: the
/// pending plan once `height` reaches its height.
pub fn due(kv: &impl KvRead, height: u64) -> Result<Option<UpgradePlan>, Fatal> {
    Ok(pending_plan(kv)?.filter(|p| p.height <= height))
}

/// The switch, first thing in a block: when the pending plan is due, runs
/// its migration, records the new app version and the plan as carried
/// out, and returns the `upgrade_applied` event. `max_version` is the
/// newest version this node runs (at most [`LATEST_APP_VERSION`]); a due
/// plan above it is [`Fatal::UpgradeNeeded`]: this node must not execute
/// the block.
pub fn begin_block(kv: &mut impl Kv, block: &Block, max_version: u64) -> Result<Vec<Event>, Fatal> {
    let Some(plan) = due(kv, block.height)? else {
        // A migration in progress (version 2's) takes its next step.
        migrate_step(kv, block.time)?;
        return Ok(Vec::new());
    };
    let max = max_version.min(LATEST_APP_VERSION);
    if plan.app_version > max {
        return Err(Fatal::UpgradeNeeded {
            plan: Box::new(plan),
            max,
        });
    }
    let migrated = migrate(kv, plan.app_version, block)?;
    put_app_version(kv, plan.app_version);
    kv.delete(keys::UPGRADE_PLAN.to_vec());
    kv.put(keys::upgrade_done(&plan.name), plan.encode_to_vec());
    let mut ev = plan_event("upgrade_applied", &plan);
    ev.attrs.push(("migrated".into(), migrated.to_string()));
    Ok(vec![ev])
}

/// The migration into `version` (its first step: the rest runs at the
/// start of the next blocks); returns how many entries it took.
fn migrate(kv: &mut impl Kv, version: u64, block: &Block) -> Result<u64, Fatal> {
    match version {
        2 => start_migration(kv, block.time),
        6 => start_side_ids(kv, block.time),
        _ => Ok(0),
    }
}

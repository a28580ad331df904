//! The adapter's side of software upgrades (ADR 0019): which app versions
//! this node runs, stopping before a block whose version it lacks, and
//! telling CometBFT of a switch.
//!
//! The state machine switches at the start of the plan's block
//! ([`tally_settlement::upgrade`]); FinalizeBlock then returns the new
//! version in `consensus_param_updates.version.app`, so the header of the
//! next height carries it (CometBFT 0.38 reads `Info.app_version` only at
//! genesis). A node that lacks the version stops at the first request of
//! that height (PrepareProposal, ProcessProposal or FinalizeBlock): it
//! proposes, votes for and executes nothing of it, so it cannot fork; it
//! halts with [`HaltReason::UpgradeNeeded`] (exit code 4) and the plan as
//! JSON, which `tallyd` writes to `data/upgrade-info.json`.

use std::sync::atomic::Ordering;

use serde_json::json;
use tally_settlement::proto::UpgradePlan;
use tally_settlement::upgrade::{due, LATEST_APP_VERSION};
use tally_settlement::{self as settlement};
use tally_store::halt::{HaltEvent, HaltReason};
use tracing::error;

use crate::app::TallyApp;

/// Why this node cannot run the next block of its committed state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpgradeStop {
    /// The height it cannot run.
    pub height: u64,
    /// What to tell the operator.
    pub message: String,
    /// The `upgrade-info.json` body.
    pub info: String,
}

/// The `upgrade-info.json` body for `plan` on a node that runs up to
/// `max`.
pub fn upgrade_info(plan: &UpgradePlan, max: u64) -> String {
    json!({
        "name": plan.name,
        "app_version": plan.app_version,
        "height": plan.height,
        "binary_sha256": hex::encode(&plan.binary_sha256),
        "info": plan.info,
        "this_binary_max_app_version": max,
    })
    .to_string()
}

impl TallyApp {
    /// Runs app versions up to `version` only (at most the newest this
    /// build carries): a release that lacks the later ones, for tests.
    pub fn set_max_app_version(&self, version: u64) {
        self.inner
            .max_app_version
            .store(version.min(LATEST_APP_VERSION), Ordering::SeqCst);
    }

    /// The newest app version this node runs.
    pub fn max_app_version(&self) -> u64 {
        self.inner.max_app_version.load(Ordering::SeqCst)
    }

    /// The app version committed state runs under.
    pub fn app_version(&self) -> u64 {
        settlement::state::chain::app_version(self.committed_state()).unwrap_or(1)
    }

    /// Whether this node can run the block after its last commit: `None`
    /// if so; else why not (the state runs a version above this node's, or
    /// the next block switches to one). For the binary to check at start.
    pub fn upgrade_stop(&self) -> Option<UpgradeStop> {
        let next = self.last_commit().height + 1;
        let max = self.max_app_version();
        let state = settlement::state::chain::app_version(self.committed_state()).ok()?;
        if state > max {
            let message = format!(
                "the state runs app version {state}; this binary runs app versions up to {max}: install the release that carries version {state}"
            );
            let info =
                json!({"app_version": state, "this_binary_max_app_version": max}).to_string();
            return Some(UpgradeStop {
                height: next,
                message,
                info,
            });
        }
        let plan = due(self.committed_state(), next).ok()??;
        (plan.app_version > max).then(|| UpgradeStop {
            height: next,
            message: settlement::Fatal::UpgradeNeeded {
                plan: Box::new(plan.clone()),
                max,
            }
            .to_string(),
            info: upgrade_info(&plan, max),
        })
    }

    /// At the first request for `height`: stops this node (and answers
    /// true) if `height` switches to a version it lacks.
    pub(crate) fn stop_if_upgrade_due(&self, height: u64) -> bool {
        if self.halted() {
            return true;
        }
        let Ok(Some(plan)) = due(self.committed_state(), height) else {
            return false;
        };
        let max = self.max_app_version();
        if plan.app_version <= max {
            return false;
        }
        self.upgrade_halt(height, &plan, max);
        true
    }

    /// Logs and halts for `plan`, due at `height`.
    pub(crate) fn upgrade_halt(&self, height: u64, plan: &UpgradePlan, max: u64) {
        let message = settlement::Fatal::UpgradeNeeded {
            plan: Box::new(plan.clone()),
            max,
        }
        .to_string();
        error!(height, name = %plan.name, app_version = plan.app_version, "UPGRADE NEEDED: {message}; stopping before this height");
        self.halt_with(HaltEvent {
            reason: HaltReason::UpgradeNeeded,
            height,
            error: message,
            upgrade_info: Some(upgrade_info(plan, max)),
        });
    }
}

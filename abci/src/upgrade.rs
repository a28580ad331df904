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
        if let Some(stop) = self.state_past_versions(next, max) {
            return Some(stop);
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

    /// Why this node cannot run block `height` of a state that already
    /// runs a version above `max` (restored from a snapshot taken after an
    /// upgrade, or the old binary started on the new state).
    fn state_past_versions(&self, height: u64, max: u64) -> Option<UpgradeStop> {
        let state = settlement::state::chain::app_version(self.committed_state()).ok()?;
        (state > max).then(|| UpgradeStop {
            height,
            message: format!(
                "the state runs app version {state}; this binary runs app versions up to {max}: install the release that carries version {state}"
            ),
            info: json!({"app_version": state, "this_binary_max_app_version": max}).to_string(),
        })
    }

    /// At the first request for `height`: stops this node (and answers
    /// true) if `height` switches to a version it lacks, or its state
    /// already runs one.
    pub(crate) fn stop_if_upgrade_due(&self, height: u64) -> bool {
        if self.halted() {
            return true;
        }
        let max = self.max_app_version();
        if let Some(stop) = self.state_past_versions(height, max) {
            error!(height, "UPGRADE NEEDED: {}; stopping", stop.message);
            self.halt_with(HaltEvent {
                reason: HaltReason::UpgradeNeeded,
                height,
                error: stop.message,
                upgrade_info: Some(stop.info),
            });
            return true;
        }
        let Ok(Some(plan)) = due(self.committed_state(), height) else {
            return false;
        };
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

//! The halt hook: how an ABCI application on this store asks the binary
//! that runs it to stop.
//!
//! Some faults leave a node nothing safe to answer: a genesis `app_state`
//! that cannot be applied, or a local store failure (a failed read, a
//! corrupt value, a failed durable write in Commit). Continuing would
//! report state or an app hash this node cannot reproduce. Library crates
//! never exit the process: the application logs a FATAL line, then calls
//! its [`Halt`] hook with a [`HaltEvent`]. The hook belongs to the binary:
//! `tallyd` and `tally-hub` both exit with [`HaltReason::exit_code`]
//! (2 for genesis, 3 for the store); CometBFT replays from the last commit
//! after the operator fixes the fault and restarts. Tests install
//! [`Halt::recording`], which only records; an application whose hook
//! returns refuses further consensus work.
//!
//! It lives in the store crate because both applications (the settlement
//! chain and the reference hub) already build on it, and neither binary has
//! to link the other's application for it.

use std::fmt;
use std::sync::{Arc, Mutex};

/// Why a node must stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaltReason {
    /// The genesis `app_state` cannot be parsed or applied: fix
    /// genesis.json and restart.
    BadGenesis,
    /// The node's own store failed (a read, a corrupt value, the durable
    /// write): fix the disk and restart.
    StoreFailure,
    /// An approved upgrade plan is due and this binary lacks its app
    /// version: install the binary that carries it and restart (the
    /// state is untouched; the block at the plan's height was not run).
    UpgradeNeeded,
}

impl HaltReason {
    /// Every reason a node halts for.
    pub const ALL: [HaltReason; 3] = [
        HaltReason::BadGenesis,
        HaltReason::StoreFailure,
        HaltReason::UpgradeNeeded,
    ];

    /// The process exit status the binaries use: 2 for genesis, 3 for the
    /// store, 4 for an upgrade this binary cannot run.
    pub const fn exit_code(self) -> i32 {
        match self {
            HaltReason::BadGenesis => 2,
            HaltReason::StoreFailure => 3,
            HaltReason::UpgradeNeeded => 4,
        }
    }
}

/// One request to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaltEvent {
    /// Why.
    pub reason: HaltReason,
    /// The height being worked on (0 at genesis).
    pub height: u64,
    /// What failed, for a person.
    pub error: String,
    /// For [`HaltReason::UpgradeNeeded`]: the plan as JSON, what the binary
    /// writes to `data/upgrade-info.json` for the operator (or a watcher).
    pub upgrade_info: Option<String>,
}

type Hook = dyn Fn(&HaltEvent) + Send + Sync;

/// The hook an application calls when it must stop. Cheap to clone.
#[derive(Clone)]
pub struct Halt {
    hook: Arc<Hook>,
}

impl fmt::Debug for Halt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Halt { .. }")
    }
}

impl Halt {
    /// A hook that runs `hook`. A binary's hook ends the process, e.g.
    /// `Halt::new(|e| std::process::exit(e.reason.exit_code()))`.
    pub fn new(hook: impl Fn(&HaltEvent) + Send + Sync + 'static) -> Self {
        Self {
            hook: Arc::new(hook),
        }
    }

    /// A hook that records every request instead of stopping (tests).
    pub fn recording() -> (Self, HaltLog) {
        let log = HaltLog::default();
        let events = log.events.clone();
        let halt = Self::new(move |e| {
            events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.clone())
        });
        (halt, log)
    }

    /// Asks to stop. Returns only if the hook does (a recording hook).
    pub fn halt(&self, event: HaltEvent) {
        (self.hook)(&event);
    }
}

/// What a [`Halt::recording`] hook saw.
#[derive(Clone, Debug, Default)]
pub struct HaltLog {
    events: Arc<Mutex<Vec<HaltEvent>>>,
}

impl HaltLog {
    /// Every request so far, oldest first.
    pub fn events(&self) -> Vec<HaltEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether nothing asked to stop.
    pub fn is_empty(&self) -> bool {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_the_documented_ones() {
        assert_eq!(HaltReason::BadGenesis.exit_code(), 2);
        assert_eq!(HaltReason::StoreFailure.exit_code(), 3);
        assert_eq!(HaltReason::UpgradeNeeded.exit_code(), 4);
    }

    #[test]
    fn a_recording_hook_records_in_order() {
        let (halt, log) = Halt::recording();
        assert!(log.is_empty());
        let e = HaltEvent {
            reason: HaltReason::StoreFailure,
            height: 7,
            error: "disk".into(),
            upgrade_info: None,
        };
        halt.clone().halt(e.clone());
        assert_eq!(log.events(), vec![e]);
    }
}

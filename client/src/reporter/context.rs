//! [`Context`]: what every report's task shares with the reporter.

use std::sync::Arc;

use super::confirm::Confirmations;
use super::{Metrics, ReporterConfig};

/// What every report's task shares with the reporter.
pub(super) struct Context<T> {
    pub(super) cfg: Arc<ReporterConfig>,
    pub(super) transport: Arc<T>,
    pub(super) metrics: Arc<Metrics>,
    /// The block follower's registry.
    pub(super) conf: Arc<Confirmations>,
    /// The gateway key (a report that expired unseen is signed again).
    pub(super) key: Arc<ed25519_dalek::SigningKey>,
}

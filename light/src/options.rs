//! Verification settings: [`Options`] (trusting period, clock drift) and
//! their defaults.

use std::time::Duration;

/// How long a trust root (or any verified header) may be used to verify
/// newer headers by default: 14 days. CometBFT-only chains have no unbonding
/// period; this bounds how old a validator set may be to be trusted.
pub const DEFAULT_TRUSTING_PERIOD: Duration = Duration::from_secs(14 * 24 * 3600);

/// How far a header's time may be ahead of this machine's clock.
pub const DEFAULT_CLOCK_DRIFT: Duration = Duration::from_secs(10);

/// Verification settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// How long a verified header's validators stay trusted.
    pub trusting_period: Duration,
    /// Allowed clock drift.
    pub clock_drift: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            trusting_period: DEFAULT_TRUSTING_PERIOD,
            clock_drift: DEFAULT_CLOCK_DRIFT,
        }
    }
}

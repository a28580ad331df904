//! [`ReporterConfig`]: how a reporter behaves, and its defaults.

use std::time::Duration;

use crate::retry::RetryPolicy;

/// How a reporter behaves.
#[derive(Clone, Debug)]
pub struct ReporterConfig {
    /// CometBFT RPC endpoints, tried in order with failover.
    pub endpoints: Vec<String>,
    /// The chain's id (reports name it).
    pub chain_id: String,
    /// Records per report (1..=1000).
    pub max_records: usize,
    /// A partly filled report is sealed after this long.
    pub flush_interval: Duration,
    /// Records that may wait in the buffer; `record` waits beyond it.
    pub capacity: usize,
    /// A report's lifetime: `expires_at = now + ttl` (at most 540 s).
    pub ttl: Duration,
    /// Transport retry policy of one submission attempt.
    pub policy: RetryPolicy,
    /// Reports sent and not yet confirmed in a block, at most (each holds
    /// its records' buffer permits, so `capacity / max_records` bounds it
    /// too).
    pub max_in_flight: usize,
    /// How often the block follower asks for the latest height.
    pub confirm_poll: Duration,
    /// A report sent to a mempool and not seen in a block this long after
    /// is sent again (same bytes). A few block times.
    pub resubmit_after: Duration,
    /// When the follower cannot read blocks, a report that may be in a
    /// mempool is given up this long after its `expires_at` (if no node's
    /// index has it).
    pub expiry_grace: Duration,
    /// A report whose `expires_at` passed before any block held it (a
    /// block after that time did not, so its bytes can never land, e.g.
    /// while the chain was stopped for an upgrade) is signed again under
    /// the same report id with a new expiry, for this long after its first
    /// expiry; then it expires. Zero: never signed again.
    pub reseal_for: Duration,
}

impl ReporterConfig {
    /// Defaults for `endpoints` on `chain_id`.
    pub fn new(endpoints: Vec<String>, chain_id: &str) -> Self {
        Self {
            endpoints,
            chain_id: chain_id.into(),
            max_records: 1000,
            flush_interval: Duration::from_millis(500),
            capacity: 50_000,
            ttl: Duration::from_secs(300),
            policy: RetryPolicy::default(),
            max_in_flight: 256,
            confirm_poll: Duration::from_millis(200),
            resubmit_after: Duration::from_secs(8),
            expiry_grace: Duration::from_secs(60),
            reseal_for: Duration::from_secs(3600),
        }
    }
}

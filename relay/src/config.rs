//! How the relay is set up: [`RelayConfig`], which `tallyd` builds from
//! `app.toml`. The defaults here are the values the relay ran with before
//! they became settings; `tallyd` checks the ranges when it loads the file.

use std::path::PathBuf;
use std::time::Duration;

use tally_client::{Breaker, RetryPolicy};

/// Each hub endpoint's circuit breaker, shared by submissions and reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failed calls that open it.
    pub failure_threshold: u32,
    /// How long it stays open before letting probes through.
    pub open_for: Duration,
    /// Probe calls let through while half-open.
    pub probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 3,
            open_for: Duration::from_secs(10),
            probes: 1,
        }
    }
}

impl BreakerConfig {
    /// A new, closed breaker with these settings.
    pub fn breaker(&self) -> Breaker {
        Breaker::new(self.failure_threshold, self.open_for, self.probes)
    }
}

/// How long the relay waits for the hub when it reads from it (tip,
/// deposits, settlement); submissions use the retry policy's per-try
/// timeout instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubTimeouts {
    /// Connecting to an endpoint.
    pub connect: Duration,
    /// One whole read.
    pub read: Duration,
}

impl Default for HubTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            read: Duration::from_secs(5),
        }
    }
}

/// Which height of an EVM hub counts as its tip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EvmTip {
    /// The `latest` block (the chain's `hub_confirmations` still delay
    /// deposit ranges and settlements).
    #[default]
    Latest,
    /// The `finalized` block.
    Finalized,
}

impl EvmTip {
    /// The block tag asked for.
    pub fn tag(self) -> &'static str {
        match self {
            EvmTip::Latest => "latest",
            EvmTip::Finalized => "finalized",
        }
    }
}

/// The EVM hub's relay settings. The contract and its chain id are not
/// here: they come from the chain's `hub_chain` parameter
/// (`evm:<chain id>:0x<address>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvmConfig {
    /// Which block is the hub's tip.
    pub tip: EvmTip,
    /// This validator's secp256k1 relay key (hex, mode 0600): it signs and
    /// pays for this relay's transactions.
    pub key_file: PathBuf,
}

/// The kind of hub the relay talks to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HubKind {
    /// `tally-hub`, the reference hub chain (CometBFT).
    #[default]
    Tally,
    /// The `ITallyHub` contract on an Ethereum-compatible chain.
    Evm(EvmConfig),
}

/// The default interval between reads of the chain and the hub.
pub const DEFAULT_POLL: Duration = Duration::from_millis(500);

/// How the relay behaves.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// The kind of hub (and its own settings).
    pub hub: HubKind,
    /// Hub RPC endpoints (CometBFT's, or an EVM chain's JSON-RPC), in
    /// failover order.
    pub hub_endpoints: Vec<String>,
    /// Hub blocks a result must be under before it is reported.
    pub confirmations: u64,
    /// This validator's signer rank (share index - 1): it submits
    /// `rank * stagger` after it first sees an attempt's batch signed, so
    /// one hub tx is the norm. `None` (no key share): never submits.
    pub rank: Option<u32>,
    /// This validator's consensus address, when its key comes from the
    /// chain's DKG: the rank then follows the active key (its share index
    /// there - 1, none while it holds no share), read at every poll, since
    /// the node may have no share at start and a reshare moves indices.
    pub address: Option<[u8; 20]>,
    /// Delay between ranks.
    pub stagger: Duration,
    /// How often the chain and the hub are read.
    pub poll: Duration,
    /// Transport retry policy of one submission.
    pub policy: RetryPolicy,
    /// The hub endpoints' circuit breakers.
    pub breaker: BreakerConfig,
    /// Timeouts of hub reads.
    pub hub_timeouts: HubTimeouts,
}

impl RelayConfig {
    /// The hub endpoints with their credentials hidden, for logs.
    pub fn shown_hub_endpoints(&self) -> Vec<String> {
        self.hub_endpoints
            .iter()
            .map(|e| tally_client::redact_url(e))
            .collect()
    }

    /// A relay of the reference hub at `hub_endpoints` with every other
    /// setting at its default: one confirmation, no key share (observes, never submits), 2 s
    /// stagger, [`DEFAULT_POLL`], the SDK's retry policy, default breakers
    /// and hub timeouts.
    pub fn new(hub_endpoints: Vec<String>) -> Self {
        Self {
            hub: HubKind::Tally,
            hub_endpoints,
            confirmations: 1,
            rank: None,
            address: None,
            stagger: Duration::from_secs(2),
            poll: DEFAULT_POLL,
            policy: RetryPolicy::default(),
            breaker: BreakerConfig::default(),
            hub_timeouts: HubTimeouts::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_values_the_relay_ran_with() {
        let c = RelayConfig::new(vec!["http://127.0.0.1:26757".into()]);
        assert_eq!(c.poll, Duration::from_millis(500));
        assert_eq!(
            c.breaker,
            BreakerConfig {
                failure_threshold: 3,
                open_for: Duration::from_secs(10),
                probes: 1
            }
        );
        assert_eq!(
            (c.hub_timeouts.connect, c.hub_timeouts.read),
            (Duration::from_secs(2), Duration::from_secs(5))
        );
        assert_eq!(c.policy, RetryPolicy::default());
        assert_eq!(
            c.breaker.breaker().state(),
            tally_client::BreakerState::Closed
        );
    }

    #[test]
    fn hub_endpoints_are_logged_without_credentials() {
        let c = RelayConfig::new(vec![
            "http://127.0.0.1:26757".into(),
            "https://relay:s3cret@hub.example.com/rpc?api_key=K3Y".into(),
        ]);
        assert_eq!(
            c.shown_hub_endpoints(),
            [
                "http://127.0.0.1:26757",
                "https://***@hub.example.com/rpc?api_key=***"
            ]
        );
        // The configured URLs, credentials included, are what is called.
        assert!(c.hub_endpoints[1].contains("s3cret"));
    }
}

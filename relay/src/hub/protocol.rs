//! What the relay asks of one hub endpoint, whatever kind of hub it is:
//! the [`HubProtocol`] trait and the hub-neutral values it reads and
//! submits. [`super::Hub`] keeps what all kinds share (the endpoints in
//! failover order, their breakers, the step that reads the tip and the
//! deposits on one endpoint); an implementation only knows how to talk to
//! the endpoint it is handed:
//!
//! - `reference`: `tally-hub`, a CometBFT chain (`abci_query` paths,
//!   prost `HubTx` through `broadcast_tx_commit`);
//! - `evm`: the `ITallyHub` contract on an Ethereum-compatible chain
//!   (`eth_*` JSON-RPC, a transaction this validator signs and pays for).
//!
//! Every method blocks; the loop and the submissions run them on tokio's
//! blocking pool.

use std::time::Instant;

use tally_client::rpc::RpcClient;
use tally_client::{Broadcast, Failure};
use tally_settlement::proto::{HubCall, HubDeposit};

use super::HubError;

/// One endpoint as an implementation sees it: its place in the failover
/// order (to keep per-endpoint facts, such as a checked chain id) and its
/// client.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Endpoint<'a> {
    /// Index in the configured endpoints.
    pub(crate) index: usize,
    /// Its JSON-RPC client (reads: the read timeouts; submissions: the
    /// retry policy's per-try timeout).
    pub(crate) client: &'a RpcClient,
}

/// Deposits in a range of hub heights as one endpoint answered them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Deposits {
    /// Deposits in the range, by sequence number.
    pub(crate) deposits: Vec<HubDeposit>,
    /// The hub's cumulative deposit count through the range's end.
    pub(crate) count: u64,
    /// The height the answer is from (at least the range's end).
    pub(crate) height: u64,
}

/// What a submission hands the hub, before any hub-specific encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Payload {
    /// A threshold-signed batch.
    Batch {
        /// The hub name the batch was signed for (`hub_chain`).
        chain: String,
        /// Its nonce.
        nonce: u64,
        /// Its calls, ascending by id.
        calls: Vec<HubCall>,
        /// The group signature, compressed (96 bytes).
        signature: Vec<u8>,
    },
    /// A signed key rotation (ADR 0017).
    Rotation {
        /// The hub name the rotation names.
        chain: String,
        /// Its rotation nonce.
        nonce: u64,
        /// The key epoch of the new key.
        epoch: u64,
        /// The new group key, compressed (48 bytes).
        group_key: Vec<u8>,
        /// The old key's signature, compressed (96 bytes).
        signature: Vec<u8>,
    },
}

/// Why one submission try failed: the failure the retry policy classifies,
/// and whether the endpoint itself worked (an answer the hub gave, such
/// as "more gas needed", must not open the endpoint's breaker).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TryFailure {
    /// What the retry policy sees.
    pub(crate) failure: Failure,
    /// The endpoint answered; only the try failed.
    pub(crate) endpoint_ok: bool,
}

impl TryFailure {
    /// A failure of the endpoint (counted against its breaker).
    pub(crate) fn endpoint(failure: Failure) -> Self {
        Self {
            failure,
            endpoint_ok: false,
        }
    }

    /// A retryable failure the endpoint is not to blame for.
    pub(crate) fn retry(msg: String) -> Self {
        Self {
            failure: Failure::Transport(msg),
            endpoint_ok: true,
        }
    }
}

/// One try's limits: when it must have given up waiting (a little before
/// the retry policy's per-try timeout from its start, so the try reports
/// its own timeout).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TryLimits {
    /// The try waits for nothing past this instant.
    pub(crate) deadline: Instant,
}

/// The per-endpoint protocol of one kind of hub. `hub` is always the
/// chain's `hub_chain` parameter as committed (the reference hub's name
/// for the settlement chain, or the EVM hub's `evm:<chain id>:0x<address>`).
///
/// Errors: [`HubError::Unreachable`] when the endpoint could not be used
/// (counted against its breaker); any other error is an answer.
pub(crate) trait HubProtocol: Send + Sync + std::fmt::Debug {
    /// The hub's latest usable height on `ep`.
    fn tip(&self, ep: Endpoint<'_>, hub: &str) -> Result<u64, HubError>;

    /// Deposits in hub heights `range` (`from..=to`) with the hub's
    /// deposit count through `to`, as `ep` answers them with its tip at
    /// `at`; [`HubError::Stale`] when `ep` answers from below `to`.
    fn deposits(
        &self,
        ep: Endpoint<'_>,
        hub: &str,
        at: u64,
        range: (u64, u64),
    ) -> Result<Deposits, HubError>;

    /// The height at which batch `nonce` settled, if it did.
    fn settled_at(&self, ep: Endpoint<'_>, hub: &str, nonce: u64) -> Result<Option<u64>, HubError>;

    /// The last batch nonce the hub settled (0: none yet).
    fn last_nonce(&self, ep: Endpoint<'_>, hub: &str) -> Result<u64, HubError>;

    /// The last key rotation the hub applied (0: none yet).
    fn last_rotation(&self, ep: Endpoint<'_>, hub: &str) -> Result<u64, HubError>;

    /// One submission try of `payload` on `ep`: the hub's code (0 taken,
    /// 4 already there, any other a refusal) or why the try failed.
    fn submit(
        &self,
        ep: Endpoint<'_>,
        payload: &Payload,
        limits: TryLimits,
    ) -> Result<Broadcast, TryFailure>;

    /// The operator command that hands the hub a governed rotation (ADR
    /// 0018), named in the relay's warning when it stops at one.
    fn govern_command(&self) -> &'static str;
}

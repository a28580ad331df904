//! The state machine's plain data: the block a step runs in, the results
//! and events it returns, stored per-window totals, batch status, and the
//! named records that travel between the settlement modules.
//!
//! A leaf module: it imports only other leaves (codes, errors, BLS types,
//! protobuf types, route counters) and holds no logic beyond encoding.

use crate::bls::Kind;
use crate::codes::Code;
use crate::error::{Fatal, Rejection, UnknownValue};
use crate::proto::{HubBlock, HubResult};
use crate::record::Counters;

/// The block a transaction runs in: height and header time (unix seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Height.
    pub height: u64,
    /// Header time, whole unix seconds.
    pub time: u64,
}

/// An ABCI event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Event type.
    pub kind: String,
    /// Key-value attributes.
    pub attrs: Vec<(String, String)>,
}

impl Event {
    /// An event of `kind` with `attrs`, in order.
    pub fn new<const N: usize>(kind: &str, attrs: [(&str, String); N]) -> Self {
        Self {
            kind: kind.into(),
            attrs: attrs.into_iter().map(|(k, v)| (k.into(), v)).collect(),
        }
    }
}

/// The result of running or checking one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxResult {
    /// Result code.
    pub code: Code,
    /// What happened, for a person.
    pub log: String,
    /// Events, empty on rejection.
    pub events: Vec<Event>,
    /// The result's `data` bytes (see [`Rejection::data`]).
    pub data: Vec<u8>,
}

impl TxResult {
    /// An accepted transaction.
    pub fn ok(log: String, events: Vec<Event>) -> Self {
        Self {
            code: Code::Ok,
            log,
            events,
            data: Vec::new(),
        }
    }

    /// A rejected transaction: the rejection's code, log and data, no
    /// events.
    pub fn rejected(r: Rejection) -> Self {
        Self {
            code: r.code,
            log: r.log,
            events: Vec::new(),
            data: r.data,
        }
    }

    /// The answer of a read-only path (mempool check) to a local fault:
    /// code 16 `internal` with the fault as log.
    pub fn internal(f: &Fatal) -> Self {
        Self {
            code: Fatal::CODE,
            log: f.to_string(),
            events: Vec::new(),
            data: Vec::new(),
        }
    }
}

/// Per-window totals kept beside the route records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowInfo {
    /// Sum of the window's route records.
    pub totals: Counters,
    /// Number of route records.
    pub routes: u64,
    /// Whether the window has closed (frozen).
    pub closed: bool,
}

impl WindowInfo {
    /// 89 bytes: the totals (80), the route count (8, big-endian), closed (1).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.totals.encode();
        v.extend_from_slice(&self.routes.to_be_bytes());
        v.push(u8::from(self.closed));
        v
    }

    /// Inverse of [`WindowInfo::encode`]; `None` for any other length.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 89 {
            return None;
        }
        Some(Self {
            totals: Counters::decode(b.get(..80)?)?,
            routes: u64::from_be_bytes(b.get(80..88)?.try_into().ok()?),
            closed: b.get(88) == Some(&1),
        })
    }
}

/// One party's (a provider's or a user's) totals in one window, kept beside
/// the route records so each is provable as a single key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartyWindow {
    /// Sum of the party's route records in the window.
    pub totals: Counters,
    /// Number of the party's route records in the window.
    pub routes: u64,
}

impl PartyWindow {
    /// 88 bytes: the totals (80), the route count (8, big-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.totals.encode();
        v.extend_from_slice(&self.routes.to_be_bytes());
        v
    }

    /// Inverse of [`PartyWindow::encode`]; `None` for any other length.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 88 {
            return None;
        }
        Some(Self {
            totals: Counters::decode(b.get(..80)?)?,
            routes: u64::from_be_bytes(b.get(80..88)?.try_into().ok()?),
        })
    }
}

/// Where a batch is in its life (`BatchRecord.status`; the numbers are
/// stored in state and must not change).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum BatchStatus {
    /// Formed by a SyncTxStart, waiting for its group signature.
    Pending = 0,
    /// The batch has its group signature.
    Signed = 1,
    /// The hub settled the batch.
    Settled = 2,
}

impl BatchStatus {
    /// Every status.
    pub const ALL: [BatchStatus; 3] = [
        BatchStatus::Pending,
        BatchStatus::Signed,
        BatchStatus::Settled,
    ];

    /// The stored number.
    pub fn value(self) -> u32 {
        self as u32
    }

    /// The name queries show.
    pub fn name(self) -> &'static str {
        match self {
            BatchStatus::Pending => "pending",
            BatchStatus::Signed => "signed",
            BatchStatus::Settled => "settled",
        }
    }
}

impl From<BatchStatus> for u32 {
    fn from(s: BatchStatus) -> u32 {
        s.value()
    }
}

impl TryFrom<u32> for BatchStatus {
    type Error = UnknownValue;

    fn try_from(v: u32) -> Result<Self, Self::Error> {
        BatchStatus::ALL
            .into_iter()
            .find(|s| s.value() == v)
            .ok_or(UnknownValue {
                what: "batch status",
                value: v,
            })
    }
}

/// Where a hub chain's deposits continue: the next hub height a HubBlock
/// must start at and the next deposit sequence number expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubCursor {
    /// First hub height of the next HubBlock.
    pub height: u64,
    /// Sequence number of the next deposit.
    pub deposit_seq: u64,
}

/// A message the chain is waiting for a threshold signature on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Awaited {
    /// What it is.
    pub kind: Kind,
    /// Its 32-byte digest.
    pub digest: [u8; 32],
    /// The exact bytes signed (`bls::message`).
    pub message: Vec<u8>,
    /// The hub result it is about (kind 2).
    pub hub_result: Option<HubResult>,
    /// The hub block it is about (kind 3).
    pub hub_block: Option<HubBlock>,
}

/// The first app version with governed parameters and gateways, users
/// after genesis and withdrawals (ADR 0020).
pub const GROWTH_VERSION: u64 = 3;

/// The first app version with service-level objectives, verdicts and
/// credits, and latency buckets in reports (ADR 0021).
pub const SLO_VERSION: u64 = 4;

/// The first app version with hub-block messages in flight: deposits of
/// later messages are signed before earlier ones are credited, held, and
/// credited in order (ADR 0024).
pub const PIPELINE_VERSION: u64 = 5;

/// The first app version that keeps report ids as side state, out of the
/// Merkle tree, committed to by one tree entry per bucket and block (ADR
/// 0025).
pub const SIDE_IDS_VERSION: u64 = 6;

/// The first app version that prunes the SLA records of windows older
/// than `sla_keep_windows` and answers code 28 for them (ADR 0026).
pub const PRUNE_VERSION: u64 = 7;

/// The kind of a hub call that pays its provider.
pub const CALL_PAY: u32 = 0;
/// The kind of a hub call that returns credits to its user (ADR 0020).
pub const CALL_WITHDRAW: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_status_converts_from_its_stored_numbers_only() {
        for (v, s) in [
            (0, BatchStatus::Pending),
            (1, BatchStatus::Signed),
            (2, BatchStatus::Settled),
        ] {
            assert_eq!(BatchStatus::try_from(v), Ok(s));
            assert_eq!(u32::from(s), v);
        }
        for v in [3, 7, u32::MAX] {
            assert_eq!(
                BatchStatus::try_from(v),
                Err(UnknownValue {
                    what: "batch status",
                    value: v
                })
            );
        }
    }

    #[test]
    fn window_info_round_trips_and_refuses_other_lengths() {
        let w = WindowInfo {
            totals: Counters {
                requests: 3,
                amount: 9,
                ..Counters::default()
            },
            routes: 2,
            closed: true,
        };
        assert_eq!(WindowInfo::decode(&w.encode()), Some(w));
        assert_eq!(WindowInfo::decode(&w.encode()[..88]), None);
    }
}

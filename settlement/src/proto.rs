//! Wire types, derived by hand with prost; `proto/tally/v1/tx.proto` is the
//! published schema of the same messages.

/// Every transaction in a Tally block.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Tx {
    /// What the transaction does.
    #[prost(oneof = "tx::Sum", tags = "1, 2, 3, 4, 5, 6")]
    pub sum: Option<tx::Sum>,
}

/// The kinds of [`Tx`].
pub mod tx {
    /// The transaction's payload.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Sum {
        /// A gateway's signed usage report.
        #[prost(message, tag = "1")]
        Report(super::SignedReport),
        /// System: start a settlement attempt (proposer only).
        #[prost(message, tag = "2")]
        SyncStart(super::SyncTxStart),
        /// System: partial signatures from the last commit's vote extensions.
        #[prost(message, tag = "3")]
        Partials(super::SubmitPartials),
        /// A user's signed allowance grant or revocation.
        #[prost(message, tag = "4")]
        Allowance(super::SignedAllowance),
        /// A current or incoming validator's DKG or governance message.
        #[prost(message, tag = "5")]
        Validator(super::SignedValidatorMsg),
        /// A user's signed key change or withdrawal (ADR 0020).
        #[prost(message, tag = "6")]
        User(super::SignedUserMsg),
    }
}

/// A usage report with its gateway signature.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SignedReport {
    /// Encoded [`ReportUsage`], exactly the signed bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    /// The gateway's ed25519 public key.
    #[prost(bytes = "vec", tag = "2")]
    pub gateway_key: Vec<u8>,
    /// ed25519 signature over [`REPORT_SIGN_DOMAIN`](crate::REPORT_SIGN_DOMAIN) `|| body`.
    #[prost(bytes = "vec", tag = "3")]
    pub signature: Vec<u8>,
}

/// A user's allowance change with the user's signature.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SignedAllowance {
    /// Encoded [`AllowanceChange`], exactly the signed bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    /// ed25519 signature by the user's registered key over
    /// [`ALLOWANCE_SIGN_DOMAIN`](crate::ALLOWANCE_SIGN_DOMAIN) `|| body`.
    #[prost(bytes = "vec", tag = "2")]
    pub signature: Vec<u8>,
}

/// What a user lets one gateway charge: at most `max_per_window` credits
/// per settlement window until `expires_at`. A revocation
/// (`max_per_window` 0, `expires_at` 0) removes the allowance.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct AllowanceChange {
    /// The chain the change is meant for.
    #[prost(string, tag = "1")]
    pub chain_id: String,
    /// The user giving the allowance (signs it).
    #[prost(string, tag = "2")]
    pub user: String,
    /// The gateway's registered name.
    #[prost(string, tag = "3")]
    pub gateway: String,
    /// Most credits the gateway may charge the user per settlement window.
    #[prost(uint64, tag = "4")]
    pub max_per_window: u64,
    /// Unix seconds (block time) from which the allowance no longer holds.
    #[prost(uint64, tag = "5")]
    pub expires_at: u64,
    /// Above every sequence this user used before: a replayed or reordered
    /// change is refused.
    #[prost(uint64, tag = "6")]
    pub sequence: u64,
}

/// One report: a batch of usage records from one gateway.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReportUsage {
    /// The chain the report is meant for.
    #[prost(string, tag = "1")]
    pub chain_id: String,
    /// 16 unique bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub report_id: Vec<u8>,
    /// Unix seconds after which the report is refused.
    #[prost(uint64, tag = "3")]
    pub expires_at: u64,
    /// The records, one message per call.
    #[prost(message, repeated, tag = "4")]
    pub records: Vec<UsageRecord>,
    /// The compact form: calls grouped by route, each route's strings
    /// written once. A report may use either form or both; its calls are
    /// `records` followed by every group's calls, in order, and they count
    /// exactly as the same calls written as `records` would.
    #[prost(message, repeated, tag = "5")]
    pub route_calls: Vec<RouteCalls>,
}

/// Calls on one route (user, provider, model, route), in the compact form:
/// call `i` is `(outcomes[i], units[i], amounts[i])`. The three lists have
/// the same length, at least 1.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RouteCalls {
    /// Who is charged.
    #[prost(string, tag = "1")]
    pub user: String,
    /// Who served the calls.
    #[prost(string, tag = "2")]
    pub provider: String,
    /// The model called.
    #[prost(string, tag = "3")]
    pub model: String,
    /// The route (endpoint) used.
    #[prost(string, tag = "4")]
    pub route: String,
    /// Each call's outcome class, see [`Outcome`] (packed).
    #[prost(enumeration = "Outcome", repeated, tag = "5")]
    pub outcomes: Vec<i32>,
    /// Each call's work units (packed).
    #[prost(uint64, repeated, tag = "6")]
    pub units: Vec<u64>,
    /// Each call's credits moved from the user to the provider (packed).
    #[prost(uint64, repeated, tag = "7")]
    pub amounts: Vec<u64>,
    /// Each call's latency bucket, one byte per call (0: not measured), or
    /// empty: none measured (app version 4, ADR 0021).
    #[prost(bytes = "vec", tag = "8")]
    pub latency: Vec<u8>,
    /// Each call's time-to-first-token bucket, like `latency`.
    #[prost(bytes = "vec", tag = "9")]
    pub ttft: Vec<u8>,
}

/// One upstream call.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct UsageRecord {
    /// Who is charged.
    #[prost(string, tag = "1")]
    pub user: String,
    /// Who served the call.
    #[prost(string, tag = "2")]
    pub provider: String,
    /// The model called.
    #[prost(string, tag = "3")]
    pub model: String,
    /// The route (endpoint) used.
    #[prost(string, tag = "4")]
    pub route: String,
    /// The outcome class, see [`Outcome`].
    #[prost(enumeration = "Outcome", tag = "5")]
    pub outcome: i32,
    /// Work units (tokens, images, ...).
    #[prost(uint64, tag = "6")]
    pub units: u64,
    /// Credits moved from the user to the provider.
    #[prost(uint64, tag = "7")]
    pub amount: u64,
    /// The latency bucket (1 to 31, 0: not measured; app version 4, ADR
    /// 0021).
    #[prost(uint32, tag = "8")]
    pub latency_bucket: u32,
    /// The time-to-first-token bucket, like `latency_bucket`.
    #[prost(uint32, tag = "9")]
    pub ttft_bucket: u32,
}

/// Outcome classes of an upstream call (which count in FailCount: the
/// module doc of `record`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Outcome {
    /// Not set: refused.
    Unspecified = 0,
    /// The call succeeded.
    Ok = 1,
    /// The client went away or its deadline passed.
    Cancel = 2,
    /// 429 or rate-limit text.
    RateLimit = 3,
    /// 401, 402, 403.
    Auth = 4,
    /// 5xx, connection and TLS failures, upstream timeouts.
    Transient = 5,
    /// Other 4xx: the sender's fault.
    Client = 6,
    /// Anything else.
    Unknown = 7,
}

impl Outcome {
    /// The lowercase name used in JSON, JSONL files and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Unspecified => "unspecified",
            Outcome::Ok => "ok",
            Outcome::Cancel => "cancel",
            Outcome::RateLimit => "rate_limit",
            Outcome::Auth => "auth",
            Outcome::Transient => "transient",
            Outcome::Client => "client",
            Outcome::Unknown => "unknown",
        }
    }

    /// Parses [`Outcome::name`]; `unspecified` is not accepted.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ok" => Outcome::Ok,
            "cancel" => Outcome::Cancel,
            "rate_limit" => Outcome::RateLimit,
            "auth" => Outcome::Auth,
            "transient" => Outcome::Transient,
            "client" => Outcome::Client,
            "unknown" => Outcome::Unknown,
            _ => return None,
        })
    }

    /// Whether a record of this class may move credits: `ok`, `cancel` and
    /// `client` may; the failure classes (`rate_limit`, `auth`,
    /// `transient`, `unknown`) carry amount 0, since a provider is not paid
    /// for a call that failed on its side.
    pub fn may_carry_amount(self) -> bool {
        matches!(self, Outcome::Ok | Outcome::Cancel | Outcome::Client)
    }

    /// Every class a record may carry.
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Cancel,
        Outcome::RateLimit,
        Outcome::Auth,
        Outcome::Transient,
        Outcome::Client,
        Outcome::Unknown,
    ];
}

/// System transaction: start an attempt to settle a batch on a hub chain.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SyncTxStart {
    /// Hub chain.
    #[prost(string, tag = "1")]
    pub chain: String,
    /// The batch's nonce on that hub chain.
    #[prost(uint64, tag = "2")]
    pub batch_nonce: u64,
    /// Hub call ids in the batch, ascending.
    #[prost(uint64, repeated, tag = "3")]
    pub call_ids: Vec<u64>,
    /// The batch digest (see `docs/signing.md`).
    #[prost(bytes = "vec", tag = "4")]
    pub digest: Vec<u8>,
}

/// System transaction: partial signatures taken from vote extensions, with
/// the body of each hub result and hub block they sign carried once.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SubmitPartials {
    /// The partials (at most `max_block_messages` distinct digests).
    #[prost(message, repeated, tag = "1")]
    pub partials: Vec<PartialSig>,
    /// Bodies of the hub results signed, each once; one the chain already
    /// holds as a pending message may be left out.
    #[prost(message, repeated, tag = "2")]
    pub hub_results: Vec<HubResult>,
    /// Bodies of the hub blocks signed, each once, same rule.
    #[prost(message, repeated, tag = "3")]
    pub hub_blocks: Vec<HubBlock>,
}

/// What a validator puts in its vote extension.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct VoteExtension {
    /// Partial signatures of messages the chain is waiting for.
    #[prost(message, repeated, tag = "1")]
    pub partials: Vec<PartialSig>,
}

/// One validator's BLS share signature of one message.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PartialSig {
    /// Signer's share index (1..=n).
    #[prost(uint32, tag = "1")]
    pub index: u32,
    /// Message kind: 1 batch, 2 hub result, 3 hub block.
    #[prost(uint32, tag = "2")]
    pub kind: u32,
    /// The 32-byte payload signed (a batch digest or a result digest).
    #[prost(bytes = "vec", tag = "3")]
    pub digest: Vec<u8>,
    /// 96-byte compressed G2 signature.
    #[prost(bytes = "vec", tag = "4")]
    pub signature: Vec<u8>,
    /// The key epoch of the share that signed; other epochs are ignored.
    #[prost(uint64, tag = "7")]
    pub epoch: u64,
}

/// The deposits of a fixed range of finalized hub heights.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct HubBlock {
    /// Hub chain.
    #[prost(string, tag = "1")]
    pub chain: String,
    /// First hub height covered (the chain's cursor).
    #[prost(uint64, tag = "2")]
    pub from_height: u64,
    /// Last hub height covered (from + hub_block_range - 1).
    #[prost(uint64, tag = "3")]
    pub to_height: u64,
    /// Deposits in those heights from the chain's next sequence number, by
    /// sequence number, at most `max_block_deposits`.
    #[prost(message, repeated, tag = "4")]
    pub deposits: Vec<HubDeposit>,
    /// The range holds more deposits after these: crediting this message
    /// moves the sequence cursor but not the height cursor.
    #[prost(bool, tag = "5")]
    pub more: bool,
    /// The hub's cumulative deposit count through `to_height`: how many
    /// deposits the hub ever made at heights up to and including it (the
    /// sequence number of the last one). The same in every message of a
    /// range; see `sync::deposits::check_count` for the rule.
    #[prost(uint64, tag = "6")]
    pub deposit_count: u64,
}

/// One deposit on the hub.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct HubDeposit {
    /// Gap-free sequence number on the hub.
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// User credited.
    #[prost(string, tag = "2")]
    pub user: String,
    /// Credits.
    #[prost(uint64, tag = "3")]
    pub amount: u64,
    /// Empty, or the ed25519 key the deposit that first funds `user`
    /// binds to it (ADR 0020).
    #[prost(bytes = "vec", tag = "4")]
    pub pubkey: Vec<u8>,
}

/// A hub's answer to one settlement attempt, as validators observed it.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct HubResult {
    /// Hub chain.
    #[prost(string, tag = "1")]
    pub chain: String,
    /// Batch nonce.
    #[prost(uint64, tag = "2")]
    pub nonce: u64,
    /// Attempt number the result is for.
    #[prost(uint32, tag = "3")]
    pub attempt: u32,
    /// True: the hub shows the nonce settled. False: this attempt failed.
    #[prost(bool, tag = "4")]
    pub settled: bool,
}

/// A payment the hub must make (state).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HubCall {
    /// Chain-unique id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Payer.
    #[prost(string, tag = "2")]
    pub user: String,
    /// Payee.
    #[prost(string, tag = "3")]
    pub provider: String,
    /// Credits.
    #[prost(uint64, tag = "4")]
    pub amount: u64,
    /// Settlement window the payment comes from (a withdrawal: the
    /// window it was made in).
    #[prost(uint64, tag = "5")]
    pub window: u64,
    /// 0 a payment to `provider`; 1 a withdrawal back to `user` (ADR
    /// 0020; `provider` empty).
    #[prost(uint32, tag = "6")]
    pub kind: u32,
}

/// A batch of hub calls (state).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct BatchRecord {
    /// Hub chain.
    #[prost(string, tag = "1")]
    pub chain: String,
    /// Nonce, strictly increasing per hub chain from 1.
    #[prost(uint64, tag = "2")]
    pub nonce: u64,
    /// Call ids, ascending.
    #[prost(uint64, repeated, tag = "3")]
    pub call_ids: Vec<u64>,
    /// Batch digest.
    #[prost(bytes = "vec", tag = "4")]
    pub digest: Vec<u8>,
    /// 0 pending signature, 1 signed, 2 settled.
    #[prost(uint32, tag = "5")]
    pub status: u32,
    /// Group signature once signed.
    #[prost(bytes = "vec", tag = "6")]
    pub signature: Vec<u8>,
    /// Height the batch was formed at.
    #[prost(uint64, tag = "7")]
    pub formed_height: u64,
    /// Total credits moved.
    #[prost(uint64, tag = "8")]
    pub total: u64,
}

/// Per hub chain settlement state (`AsyncBatchState` and counters).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SyncState {
    /// Block time the current attempt started, or was backdated to.
    #[prost(uint64, tag = "1")]
    pub last_sync: u64,
    /// Current attempt number for the current batch (0: none).
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
    /// Attempts ever started.
    #[prost(uint64, tag = "3")]
    pub attempts_total: u64,
    /// Attempts that ended in failure.
    #[prost(uint64, tag = "4")]
    pub failures: u64,
    /// The last error, empty if none.
    #[prost(string, tag = "5")]
    pub last_error: String,
    /// Nonce of the batch being settled (0: none).
    #[prost(uint64, tag = "6")]
    pub current_nonce: u64,
    /// Nonce the next batch gets (starts at 1).
    #[prost(uint64, tag = "7")]
    pub next_nonce: u64,
    /// Batches settled.
    #[prost(uint64, tag = "8")]
    pub settled_batches: u64,
    /// Block time of the last result (0: none).
    #[prost(uint64, tag = "9")]
    pub last_result_at: u64,
    /// The last attempt that ended in failure (its result is acted on once).
    #[prost(uint32, tag = "10")]
    pub failed_attempt: u32,
}

/// Bookkeeping of a message whose partials are being collected (state).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PendingMessage {
    /// Message kind.
    #[prost(uint32, tag = "1")]
    pub kind: u32,
    /// Height the first partial arrived.
    #[prost(uint64, tag = "2")]
    pub first_height: u64,
    /// For hub results, the result.
    #[prost(message, optional, tag = "3")]
    pub hub_result: Option<HubResult>,
    /// For hub blocks, the block.
    #[prost(message, optional, tag = "4")]
    pub hub_block: Option<HubBlock>,
}

/// The messages users sign besides allowance changes: a key change and a
/// withdrawal (ADR 0020). Message items only, as `validators`.
mod users;
/// Validator messages and the validator, ceremony and proposal records
/// (ADR 0015). The file holds message items only (no `use`, no inner
/// docs): tools/proto-check reads it after this one as one source.
mod validators;
pub use users::*;
pub use validators::*;

//! Wire types, derived by hand with prost; `proto/tally/v1/tx.proto` is the
//! published schema of the same messages.

/// Every transaction in a Tally block.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Tx {
    /// What the transaction does.
    #[prost(oneof = "tx::Sum", tags = "1")]
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
    /// The records.
    #[prost(message, repeated, tag = "4")]
    pub records: Vec<UsageRecord>,
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
}

/// Outcome classes of an upstream call (DESIGN section 2).
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

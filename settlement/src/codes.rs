//! Result codes of transactions and queries. Every rejection has its own
//! code; the numbers are part of the public interface (README "Result codes").

use serde::Serialize;

/// A transaction or query result code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[repr(u32)]
pub enum Code {
    /// Accepted.
    Ok = 0,
    /// The bytes are not a Tally transaction.
    MalformedTx = 1,
    /// The signing key is not a registered gateway.
    UnknownGateway = 2,
    /// The signature does not verify.
    BadSignature = 3,
    /// The report names another chain.
    WrongChain = 4,
    /// `expires_at` is not after the block time.
    ReportExpired = 5,
    /// `expires_at` is more than `max_report_expiry_secs` after the block time.
    ExpiryTooFar = 6,
    /// This `report_id` was already accepted and has not expired.
    DuplicateReport = 7,
    /// `report_id` is not 16 bytes.
    BadReportId = 8,
    /// The report has no records.
    EmptyReport = 9,
    /// The report has more than `max_report_records` records.
    TooManyRecords = 10,
    /// A user, provider, model or route is empty, too long or has a
    /// character outside `[A-Za-z0-9._:/-]`.
    BadIdentifier = 11,
    /// A record's outcome is unspecified or unknown.
    BadOutcome = 12,
    /// A user's balance would go negative.
    InsufficientBalance = 13,
    /// The transaction is larger than `max_tx_bytes`.
    TxTooLarge = 14,
    /// A counter or amount would overflow 64 bits.
    Overflow = 15,
    /// The node's store failed; the node must be restarted.
    Internal = 16,
    /// A system transaction that does not match committed state.
    BadSystemTx = 17,
    /// System transactions come from the block proposer, never the mempool.
    SystemTxFromMempool = 18,
    /// The transaction envelope or the report body is not in canonical
    /// protobuf encoding (decode then re-encode gives other bytes).
    NonCanonical = 19,
    /// Query: no such path.
    UnknownPath = 20,
    /// Query: an argument is malformed.
    BadArgument = 21,
    /// Query: nothing stored under that key.
    NotFound = 22,
    /// A record of a failure class (`rate_limit`, `auth`, `transient`,
    /// `unknown`) carries a non-zero amount.
    FailedCallBilled = 23,
    /// The report charges a user who has no unexpired allowance for this
    /// gateway.
    NoAllowance = 24,
    /// The report would take a user past the allowance given to this
    /// gateway for the current window.
    AllowanceExceeded = 25,
    /// CheckTx: another transaction with this gateway's report id is
    /// already waiting in the mempool.
    ReportPending = 26,
    /// An allowance change whose user has no registered key, whose
    /// signature does not verify, or whose sequence is not above the last.
    BadAllowance = 27,
    /// Query: the height asked for is not kept by this node (pruned,
    /// before its first version, or not committed yet).
    HeightUnavailable = 28,
    /// A validator message from a key that is not a current validator, or
    /// not a dealer or player of the running ceremony.
    NotValidator = 29,
    /// A DKG message outside its phase window, for another round, or with
    /// no ceremony running.
    DkgPhase = 30,
    /// A dealing or reveal that does not check out (points, lengths, a
    /// revealed share that does not match the commitment).
    BadDealing = 31,
    /// A dealing, ack, reveal or approval that is already recorded.
    DkgDuplicate = 32,
    /// A validator-set proposal or approval that cannot be accepted
    /// (including an approval of a proposal that does not exist).
    BadProposal = 33,
    /// CheckTx: a validator message of the same kind from the same sender,
    /// or an allowance change of the same user, is already waiting in the
    /// mempool (one of each per block).
    TxPending = 34,
    /// A report from a gateway that a proposal suspended or removed.
    GatewayInactive = 35,
    /// A report signed with a gateway key that a rotation replaced, after
    /// its grace (`max_report_expiry_secs` from the rotation).
    GatewayKeyRetired = 36,
    /// A user message (key change, withdrawal) whose user has no key,
    /// whose sequence is not above the last, or that asks for nothing
    /// (app version 3).
    BadUserMsg = 37,
    /// A call's latency or TTFT bucket outside 1 to 31, a bucket list whose
    /// length is not the group's call count, or latency before app version
    /// 4 (ADR 0021).
    BadLatency = 38,
    /// CheckTx: this node's mempool is full (CometBFT's `[mempool] size`
    /// or `max_txs_bytes`, counted by the app). Nothing was kept; send it
    /// again after the next block, or to another node.
    MempoolFull = 39,
}

impl Code {
    /// The numeric code sent to CometBFT.
    pub fn value(self) -> u32 {
        self as u32
    }

    /// A stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "ok",
            Code::MalformedTx => "malformed_tx",
            Code::UnknownGateway => "unknown_gateway",
            Code::BadSignature => "bad_signature",
            Code::WrongChain => "wrong_chain",
            Code::ReportExpired => "report_expired",
            Code::ExpiryTooFar => "expiry_too_far",
            Code::DuplicateReport => "duplicate_report",
            Code::BadReportId => "bad_report_id",
            Code::EmptyReport => "empty_report",
            Code::TooManyRecords => "too_many_records",
            Code::BadIdentifier => "bad_identifier",
            Code::BadOutcome => "bad_outcome",
            Code::InsufficientBalance => "insufficient_balance",
            Code::TxTooLarge => "tx_too_large",
            Code::Overflow => "overflow",
            Code::Internal => "internal",
            Code::BadSystemTx => "bad_system_tx",
            Code::SystemTxFromMempool => "system_tx_from_mempool",
            Code::UnknownPath => "unknown_path",
            Code::BadArgument => "bad_argument",
            Code::NotFound => "not_found",
            Code::FailedCallBilled => "failed_call_billed",
            Code::NoAllowance => "no_allowance",
            Code::AllowanceExceeded => "allowance_exceeded",
            Code::ReportPending => "report_pending",
            Code::BadAllowance => "bad_allowance",
            Code::HeightUnavailable => "height_unavailable",
            Code::NonCanonical => "non_canonical",
            Code::NotValidator => "not_validator",
            Code::DkgPhase => "dkg_phase",
            Code::BadDealing => "bad_dealing",
            Code::DkgDuplicate => "dkg_duplicate",
            Code::BadProposal => "bad_proposal",
            Code::TxPending => "tx_pending",
            Code::GatewayInactive => "gateway_inactive",
            Code::GatewayKeyRetired => "gateway_key_retired",
            Code::BadUserMsg => "bad_user_msg",
            Code::BadLatency => "bad_latency",
            Code::MempoolFull => "mempool_full",
        }
    }

    /// Every code, for documentation and tests.
    pub const ALL: [Code; 40] = [
        Code::Ok,
        Code::MalformedTx,
        Code::UnknownGateway,
        Code::BadSignature,
        Code::WrongChain,
        Code::ReportExpired,
        Code::ExpiryTooFar,
        Code::DuplicateReport,
        Code::BadReportId,
        Code::EmptyReport,
        Code::TooManyRecords,
        Code::BadIdentifier,
        Code::BadOutcome,
        Code::InsufficientBalance,
        Code::TxTooLarge,
        Code::Overflow,
        Code::Internal,
        Code::BadSystemTx,
        Code::SystemTxFromMempool,
        Code::NonCanonical,
        Code::UnknownPath,
        Code::BadArgument,
        Code::NotFound,
        Code::FailedCallBilled,
        Code::NoAllowance,
        Code::AllowanceExceeded,
        Code::ReportPending,
        Code::BadAllowance,
        Code::HeightUnavailable,
        Code::NotValidator,
        Code::DkgPhase,
        Code::BadDealing,
        Code::DkgDuplicate,
        Code::BadProposal,
        Code::TxPending,
        Code::GatewayInactive,
        Code::GatewayKeyRetired,
        Code::BadUserMsg,
        Code::BadLatency,
        Code::MempoolFull,
    ];

    /// The code with this number.
    pub fn from_value(v: u32) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.value() == v)
    }
}

// ok: unwraps and panics below are in unit tests only.
#[cfg(test)]
mod tests {
    use super::*;

    /// The README's "Result codes" table lists every code, by number and
    /// name, in order, and nothing else.
    #[test]
    fn the_readme_table_is_every_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
        let text = std::fs::read_to_string(path).expect("README.md"); // ok: unit test
        let rows: Vec<(u32, String)> = text
            .lines()
            .skip_while(|l| !l.starts_with("| code | name | meaning |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells[1].parse().expect("code number"), cells[2].to_string()) // ok: unit test
            })
            .collect();
        let want: Vec<(u32, String)> = Code::ALL
            .iter()
            .map(|c| (c.value(), c.name().to_string()))
            .collect();
        assert_eq!(rows, want);
        for (i, c) in Code::ALL.iter().enumerate() {
            assert_eq!(Code::from_value(c.value()), Some(*c), "{i}");
        }
    }
}

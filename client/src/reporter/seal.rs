//! Sealing: a batch of usage records becomes one signed report
//! transaction ([`Sealed`]), with a fresh report id and expiry.

use ed25519_dalek::SigningKey;
use prost::Message;
use sha2::{Digest, Sha256};
use tally_settlement::calls::group_records;
use tally_settlement::proto::{tx, ReportUsage, SignedReport, Tx, UsageRecord};
use tally_settlement::sign_report;

use super::{unix_now, ReporterConfig};

/// A signed report, ready to submit.
pub(super) struct Sealed {
    pub(super) id: String,
    pub(super) tx: Vec<u8>,
    /// SHA-256 of the signed report's body, as the chain hashes it.
    pub(super) body_hash: [u8; 32],
    pub(super) records: usize,
    pub(super) expires_at: u64,
}

/// SHA-256 of the `SignedReport.body` inside a report transaction.
fn body_hash(tx_bytes: &[u8]) -> [u8; 32] {
    let body = match Tx::decode(tx_bytes).ok().and_then(|t| t.sum) {
        Some(tx::Sum::Report(s)) => s.body,
        _ => Vec::new(),
    };
    Sha256::digest(&body).into()
}

pub(super) fn seal(cfg: &ReporterConfig, key: &SigningKey, records: Vec<UsageRecord>) -> Sealed {
    let report_id: [u8; 16] = rand::random();
    let expires_at = unix_now().saturating_add(cfg.ttl.as_secs());
    let n = records.len();
    let tx = sign_report(
        key,
        &ReportUsage {
            chain_id: cfg.chain_id.clone(),
            report_id: report_id.to_vec(),
            expires_at,
            // The compact form: each route's names once, ~5 bytes a call.
            records: Vec::new(),
            route_calls: group_records(records),
        },
    );
    Sealed {
        id: hex::encode(report_id),
        body_hash: body_hash(&tx),
        tx,
        records: n,
        expires_at,
    }
}

/// The report in `tx` signed again under the same report id with a new
/// expiry `now + ttl`: for a report whose old bytes can no longer land (a
/// block after its old `expires_at` did not hold it). `None` if `tx` is
/// not a report this reporter sealed.
pub(super) fn reseal(
    cfg: &ReporterConfig,
    key: &SigningKey,
    tx_bytes: &[u8],
    records: usize,
) -> Option<Sealed> {
    let Some(tx::Sum::Report(SignedReport { body, .. })) = Tx::decode(tx_bytes).ok()?.sum else {
        return None;
    };
    let mut usage = ReportUsage::decode(body.as_slice()).ok()?;
    usage.expires_at = unix_now().saturating_add(cfg.ttl.as_secs());
    let tx = sign_report(key, &usage);
    Some(Sealed {
        id: hex::encode(&usage.report_id),
        body_hash: body_hash(&tx),
        tx,
        records,
        expires_at: usage.expires_at,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::CallTimer;
    use tally_settlement::proto::Outcome;

    /// Timed records keep their buckets in the compact form: one latency
    /// and one TTFT byte per call, 0 for the call not measured.
    #[test]
    fn sealed_report_carries_the_buckets() {
        let t0 = tokio::time::Instant::now();
        let rec = |latency_ms: Option<u64>| {
            let mut r = UsageRecord {
                user: "alice".into(),
                provider: "acme-ai".into(),
                model: "m".into(),
                route: "/v1/chat".into(),
                outcome: Outcome::Ok as i32,
                ..Default::default()
            };
            if let Some(ms) = latency_ms {
                let timer = CallTimer::start_at(t0);
                timer.first_token_at(t0 + std::time::Duration::from_millis(100));
                timer
                    .finish_at(t0 + std::time::Duration::from_millis(ms))
                    .apply(&mut r);
            }
            r
        };
        let cfg = ReporterConfig::new(vec!["http://127.0.0.1:1".into()], "test-chain");
        let key = SigningKey::from_bytes(&[7; 32]);
        let sealed = seal(&cfg, &key, vec![rec(Some(700)), rec(None), rec(Some(130))]);
        let Some(tx::Sum::Report(signed)) =
            Tx::decode(sealed.tx.as_slice()).ok().and_then(|t| t.sum)
        else {
            panic!("not a report transaction");
        };
        let usage = ReportUsage::decode(signed.body.as_slice()).ok();
        let calls = usage.map(|u| u.route_calls).unwrap_or_default();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].latency, vec![19, 0, 15]);
        assert_eq!(calls[0].ttft, vec![14, 0, 14]);
    }
}

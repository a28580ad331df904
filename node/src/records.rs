//! Usage records from the command line or JSONL files, and report building.

use ed25519_dalek::SigningKey;
use serde::Deserialize;
use tally_settlement::proto::{Outcome, ReportUsage, UsageRecord};
use tally_settlement::{ident, sign_report};

/// One record as written in a JSONL file (one object per line).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordJson {
    /// Who is charged.
    pub user: String,
    /// Who served.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Route.
    pub route: String,
    /// One of ok, cancel, rate_limit, auth, transient, client, unknown.
    pub outcome: String,
    /// Work units.
    #[serde(default)]
    pub units: u64,
    /// Credits.
    #[serde(default)]
    pub amount: u64,
}

/// Builds and checks one record; the error says which field is wrong.
pub fn make_record(r: RecordJson) -> Result<UsageRecord, String> {
    ident::check_party("user", &r.user).map_err(|e| e.log)?;
    ident::check_party("provider", &r.provider).map_err(|e| e.log)?;
    ident::check_name("model", &r.model).map_err(|e| e.log)?;
    ident::check_name("route", &r.route).map_err(|e| e.log)?;
    let outcome = Outcome::parse(&r.outcome).ok_or_else(|| {
        format!(
            "outcome {:?} is not one of ok, cancel, rate_limit, auth, transient, client, unknown",
            r.outcome
        )
    })?;
    Ok(UsageRecord {
        user: r.user,
        provider: r.provider,
        model: r.model,
        route: r.route,
        outcome: outcome as i32,
        units: r.units,
        amount: r.amount,
        ..Default::default()
    })
}

/// Parses a JSONL file; blank lines and lines starting with `#` are skipped.
pub fn parse_jsonl(text: &str) -> Result<Vec<UsageRecord>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let r: RecordJson =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        out.push(make_record(r).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    Ok(out)
}

/// A signed report ready to broadcast.
#[derive(Debug, Clone)]
pub struct BuiltReport {
    /// The report id, hex.
    pub report_id: String,
    /// Transaction bytes.
    pub tx: Vec<u8>,
    /// Number of records.
    pub records: usize,
}

/// Signs `records` as one report with a fresh random id.
pub fn build_report(
    key: &SigningKey,
    chain_id: &str,
    records: Vec<UsageRecord>,
    expires_at: u64,
) -> BuiltReport {
    let report_id: [u8; 16] = rand::random();
    let n = records.len();
    let report = ReportUsage {
        chain_id: chain_id.into(),
        report_id: report_id.to_vec(),
        expires_at,
        records,
        route_calls: Vec::new(),
    };
    BuiltReport {
        report_id: hex::encode(report_id),
        tx: sign_report(key, &report),
        records: n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_errors_name_the_line() {
        let ok =
            r#"{"user":"u","provider":"p","model":"m","route":"r","outcome":"cancel","units":1}"#;
        assert_eq!(parse_jsonl(&format!("# c\n{ok}\n\n")).unwrap().len(), 1);
        let e = parse_jsonl(&format!("{ok}\n{{\"user\":\"u\"}}")).unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        let bad = ok.replace("cancel", "timeout");
        assert!(parse_jsonl(&bad).unwrap_err().contains("outcome"));
        let bad = ok.replace("\"u\"", "\"u u\"");
        assert!(parse_jsonl(&bad).unwrap_err().contains("user"));
    }
}

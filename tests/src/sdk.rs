//! Sending usage through the gateway SDK's reporter, the way end-to-end
//! tests bill users: every record must land, exactly once.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use tally_client::{HttpTransport, ReportOutcome, Reporter, ReporterConfig};
use tally_settlement::proto::UsageRecord;

/// Sends `records` through a reporter on `endpoints` signed by `key`
/// (flushing every `flush`, the SDK's default with `None`), waits at most
/// `within` for it to finish, and fails unless every record landed.
pub fn send_all(
    endpoints: Vec<String>,
    chain_id: &str,
    key: SigningKey,
    records: Vec<UsageRecord>,
    flush: Option<Duration>,
    within: Duration,
) -> Result<()> {
    let n = records.len();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcomes = runtime.block_on(async move {
        let mut cfg = ReporterConfig::new(endpoints, chain_id);
        if let Some(flush) = flush {
            cfg.flush_interval = flush;
        }
        let reporter = Reporter::start(cfg, key, HttpTransport::new(Duration::from_secs(5)))?;
        for r in records {
            reporter.record(r).await?;
        }
        anyhow::Ok(
            tokio::time::timeout(within, reporter.shutdown())
                .await
                .with_context(|| format!("the reporter did not finish in {within:?}"))?,
        )
    })?;
    let landed = landed(&outcomes);
    ensure!(landed == n, "{landed} of {n} records landed: {outcomes:?}");
    Ok(())
}

/// The records that landed, over a reporter's outcomes.
pub fn landed(outcomes: &[ReportOutcome]) -> usize {
    outcomes
        .iter()
        .map(|o| match o {
            ReportOutcome::Landed { records, .. } => *records,
            _ => 0,
        })
        .sum()
}

//! `tallyd tx report`: sign usage records as reports and send them through
//! the gateway SDK's reporter, the workspace's one reporting path.

use std::path::PathBuf;

use crate::rpc::Rpc;
use crate::{keyfile, records};
use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use tally_client::ReportOutcome;
use tally_settlement::{query_path, Code};

use super::args::{Output, QueryOpts};
use super::query::query_json;
use super::{Command, Context};

/// Send transactions.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum TxCommand {
    /// Report usage: one record from flags, or many from a JSONL file.
    Report(ReportCommand),
    /// Grant or revoke a gateway's allowance, signed with the user's key.
    #[command(subcommand)]
    Allowance(super::allowance::AllowanceCommand),
    /// Propose or approve a validator-set change, signed with this home's
    /// consensus key.
    #[command(subcommand)]
    Validator(super::validator::ValidatorCommand),
    /// Software upgrade plans: propose, approve, cancel.
    #[command(subcommand)]
    Upgrade(super::upgrade::UpgradeCommand),
    /// Parameter changes from a future settlement window (ADR 0020).
    #[command(subcommand)]
    Params(super::govern::ParamsCommand),
    /// Add, rotate, suspend, resume or remove a gateway (ADR 0020).
    #[command(subcommand)]
    Gateway(super::govern::GatewayCommand),
    /// Service-level objectives from a future settlement window (ADR
    /// 0021).
    #[command(subcommand)]
    Slo(super::slo::SloCommand),
    /// Take unspent credits back to the hub, signed with the user's key
    /// (ADR 0020).
    Withdraw(super::user::WithdrawCommand),
    /// Replace a user's key, signed with the key in force (ADR 0020).
    UserKey(super::user::UserKeyCommand),
}

impl Command for TxCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Report(c) => c.execute(ctx),
            Self::Allowance(c) => c.execute(ctx),
            Self::Validator(c) => c.execute(ctx),
            Self::Upgrade(c) => c.execute(ctx),
            Self::Params(c) => c.execute(ctx),
            Self::Gateway(c) => c.execute(ctx),
            Self::Slo(c) => c.execute(ctx),
            Self::Withdraw(c) => c.execute(ctx),
            Self::UserKey(c) => c.execute(ctx),
        }
    }
}

/// Longest `--expires-in`: the chain allows 600 s after its block time, 60 s
/// are kept for clock skew.
const MAX_EXPIRES_IN: u64 = 540;

/// `tx report --from KEY (--user .. --provider .. --model .. --route ..
/// --outcome .. | --file F.jsonl)`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ReportCommand {
    /// Gateway key: a name in <home>/keys or a key file path.
    #[arg(long)]
    pub from: String,
    /// JSONL file, one record per line ({"user","provider","model","route","outcome","units","amount"}).
    #[arg(long, conflicts_with_all = ["user", "provider", "model", "route", "outcome"])]
    pub file: Option<PathBuf>,
    /// Who is charged.
    #[arg(long)]
    pub user: Option<String>,
    /// Who served.
    #[arg(long)]
    pub provider: Option<String>,
    /// Model.
    #[arg(long)]
    pub model: Option<String>,
    /// Route.
    #[arg(long)]
    pub route: Option<String>,
    /// ok, cancel, rate_limit, auth, transient, client or unknown.
    #[arg(long)]
    pub outcome: Option<String>,
    /// Work units.
    #[arg(long, default_value_t = 0)]
    pub units: u64,
    /// Credits.
    #[arg(long, default_value_t = 0)]
    pub amount: u64,
    /// Seconds until the report expires, from this machine's clock (1-540:
    /// the chain allows 600 after its block time; the rest is clock margin).
    #[arg(long, default_value_t = 300)]
    pub expires_in: u64,
    /// Nodes and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

impl ReportCommand {
    /// The records to report: from `--file`, or the one the flags describe.
    fn records(&self) -> anyhow::Result<Vec<tally_settlement::proto::UsageRecord>> {
        if let Some(f) = &self.file {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            return records::parse_jsonl(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()));
        }
        let need = |v: &Option<String>, n: &str| {
            v.clone()
                .with_context(|| format!("--{n} is required (or use --file)"))
        };
        Ok(vec![records::make_record(records::RecordJson {
            user: need(&self.user, "user")?,
            provider: need(&self.provider, "provider")?,
            model: need(&self.model, "model")?,
            route: need(&self.route, "route")?,
            outcome: need(&self.outcome, "outcome")?,
            units: self.units,
            amount: self.amount,
        })
        .map_err(anyhow::Error::msg)?])
    }
}

impl Command for ReportCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let (_, key) = keyfile::load(&keyfile::resolve(ctx.home(), &self.from))?;
        let recs = self.records()?;
        if recs.is_empty() {
            bail!("no records to report");
        }
        if self.expires_in == 0 || self.expires_in > MAX_EXPIRES_IN {
            bail!("--expires-in must be 1..=540 seconds (the chain allows 600 s after block time; 60 s are kept for clock skew)");
        }
        let endpoints = self.node.node.endpoints();
        let rpc = endpoints
            .iter()
            .map(|e| Rpc::new(e))
            .find(|r| r.status().is_ok())
            .with_context(|| format!("no node answers at {}", self.node.node.display()))?;
        let chain_id = rpc.status()?.chain_id;
        let params = query_json(&rpc, &query_path::params().to_string())?;
        let max = params["max_report_records"].as_u64().unwrap_or(1000) as usize;
        let mut cfg = tally_client::ReporterConfig::new(endpoints, &chain_id);
        cfg.max_records = max.clamp(1, 1000);
        cfg.ttl = std::time::Duration::from_secs(self.expires_in);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let outcomes = runtime.block_on(async move {
            let transport = tally_client::HttpTransport::new(std::time::Duration::from_secs(15));
            let reporter = tally_client::Reporter::start(cfg, key, transport)?;
            for r in recs {
                reporter.record(r).await?;
            }
            Ok::<_, anyhow::Error>(reporter.shutdown().await)
        })?;
        let mut failed = 0;
        for o in outcomes {
            let line = OutcomeLine::from(o);
            if line.code != 0 {
                failed += 1;
            }
            println!("{}", line.render(self.node.format()));
        }
        if failed > 0 {
            bail!("{failed} report(s) not landed");
        }
        Ok(())
    }
}

/// One report's outcome as printed; `code` is [`EXPIRED`] for a report that
/// expired unconfirmed and [`FAILED`] for one whose submission stopped
/// abnormally.
#[derive(Debug, PartialEq, Eq)]
struct OutcomeLine {
    report_id: String,
    records: usize,
    code: u32,
    height: u64,
    log: String,
}

/// The printed code of a report that expired unconfirmed.
const EXPIRED: u32 = u32::MAX;
/// The printed code of a report whose submission stopped abnormally.
const FAILED: u32 = u32::MAX - 1;

impl From<ReportOutcome> for OutcomeLine {
    fn from(o: ReportOutcome) -> Self {
        match o {
            ReportOutcome::Landed {
                report_id,
                records,
                height,
            } => Self {
                report_id,
                records,
                code: 0,
                height,
                log: String::new(),
            },
            ReportOutcome::Rejected {
                report_id,
                records,
                code,
                log,
            } => Self {
                report_id,
                records,
                code,
                height: 0,
                log,
            },
            ReportOutcome::Expired {
                report_id,
                records,
                last_error,
            } => Self {
                report_id,
                records,
                code: EXPIRED,
                height: 0,
                log: format!("expired unconfirmed: {last_error}"),
            },
            ReportOutcome::Failed {
                report_id,
                records,
                error,
            } => Self {
                report_id,
                records,
                code: FAILED,
                height: 0,
                log: format!("submission failed: {error}"),
            },
        }
    }
}

impl OutcomeLine {
    fn code_name(&self) -> &'static str {
        if self.code == EXPIRED {
            "expired"
        } else if self.code == FAILED {
            "failed"
        } else {
            Code::from_value(self.code).map(Code::name).unwrap_or("?")
        }
    }

    fn render(&self, output: Output) -> String {
        let (id, n, code, height, log) = (
            &self.report_id,
            self.records,
            self.code,
            self.height,
            &self.log,
        );
        let name = self.code_name();
        match output {
            Output::Json => serde_json::json!({
                "report_id": id, "records": n, "code": code, "code_name": name, "log": log, "height": height
            })
            .to_string(),
            Output::Table => format!(
                "report {id} records {n} code {code} ({name}) height {height}{}",
                if log.is_empty() {
                    String::new()
                } else {
                    format!(" log: {log}")
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Commands};
    use clap::error::ErrorKind;

    fn report(args: &[&str]) -> Result<ReportCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Tx(TxCommand::Report(c)) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses_flags_and_files() {
        let c = report(&[
            "tx",
            "report",
            "--from",
            "gw.key",
            "--user",
            "alice",
            "--provider",
            "acme-ai",
            "--model",
            "llama/3-70b",
            "--route",
            "/v1/chat",
            "--outcome",
            "ok",
            "--units",
            "100",
            "--amount",
            "10",
            "--node",
            "http://127.0.0.1:26657",
        ])
        .unwrap();
        assert_eq!(c.from, "gw.key");
        assert_eq!(c.model.as_deref(), Some("llama/3-70b"));
        assert_eq!((c.units, c.amount, c.expires_in), (100, 10, 300));
        assert_eq!(c.node.format(), Output::Table);
        let r = c.records().unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].route, "/v1/chat");

        let c = report(&[
            "tx",
            "report",
            "--from",
            "k",
            "--file",
            "d.jsonl",
            "--node",
            "http://a:1,http://b:2",
            "--output",
            "json",
            "--expires-in",
            "60",
        ])
        .unwrap();
        assert_eq!(c.file, Some("d.jsonl".into()));
        assert_eq!(c.node.node.endpoints(), ["http://a:1", "http://b:2"]);
        assert_eq!(c.node.format(), Output::Json);
        assert_eq!(c.expires_in, 60);
    }

    #[test]
    fn refuses_bad_invocations() {
        for (bad, kind) in [
            (
                &["tx", "report", "--user", "a"][..],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["tx", "report", "--from", "k", "--file", "f", "--user", "a"],
                ErrorKind::ArgumentConflict,
            ),
            (
                &["tx", "report", "--from", "k", "--units", "1.5"],
                ErrorKind::ValueValidation,
            ),
            (
                &["tx", "report", "--from", "k", "--output", "csv"],
                ErrorKind::InvalidValue,
            ),
            (&["tx", "send"], ErrorKind::InvalidSubcommand),
        ] {
            assert_eq!(report(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
        // Missing record fields are named at run time, as before.
        let c = report(&["tx", "report", "--from", "k", "--user", "a"]).unwrap();
        assert_eq!(
            c.records().unwrap_err().to_string(),
            "--provider is required (or use --file)"
        );
    }

    #[test]
    fn outcome_lines_read_as_before() {
        let landed = OutcomeLine::from(ReportOutcome::Landed {
            report_id: "ab".into(),
            records: 2,
            height: 9,
        });
        assert_eq!(
            landed.render(Output::Table),
            "report ab records 2 code 0 (ok) height 9"
        );
        let expired = OutcomeLine::from(ReportOutcome::Expired {
            report_id: "cd".into(),
            records: 1,
            last_error: "timeout".into(),
        });
        assert_eq!(
            expired.render(Output::Table),
            "report cd records 1 code 4294967295 (expired) height 0 log: expired unconfirmed: timeout"
        );
        let v: serde_json::Value = serde_json::from_str(&expired.render(Output::Json)).unwrap();
        assert_eq!(v["code_name"], "expired");
        assert_eq!(v["log"], "expired unconfirmed: timeout");
    }
}

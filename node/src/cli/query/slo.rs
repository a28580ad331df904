//! `tallyd query slo policies|policy|verdicts|verdict|reputation` and
//! `tallyd query latency`: service-level objectives, their verdicts and
//! the latency percentiles they judge (ADR 0021).

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::Value;
use tally_settlement::query_path::{self, QueryPath};

use super::{query_json, Shape};
use crate::cli::args::{Output, QueryOpts};
use crate::cli::{Command, Context};
use crate::rpc::Rpc;

/// Service-level objectives and verdicts.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum SloQuery {
    /// Every provider's objectives in force, and the scheduled changes.
    Policies(Opts),
    /// One provider's objectives and its scheduled change.
    Policy(ProviderArgs),
    /// A provider's verdicts, one line per window.
    Verdicts(VerdictsArgs),
    /// A provider's verdict in one window, with every figure.
    Verdict(WindowArgs),
    /// A provider's reputation.
    Reputation(ProviderArgs),
}

/// Just node and output.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct Opts {
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

/// `--provider P`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ProviderArgs {
    /// The provider.
    #[arg(long)]
    pub provider: String,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

/// `--provider P [--from W]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct VerdictsArgs {
    /// The provider.
    #[arg(long)]
    pub provider: String,
    /// The first window (100 verdicts at most from it).
    #[arg(long)]
    pub from: Option<u64>,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

/// `--provider P --window W`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct WindowArgs {
    /// The provider.
    #[arg(long)]
    pub provider: String,
    /// The window.
    #[arg(long)]
    pub window: u64,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl SloQuery {
    /// The query path, and whether the answer is a list of verdicts.
    pub fn path(&self) -> (QueryPath, &QueryOpts, bool) {
        match self {
            Self::Policies(a) => (query_path::slo_policies(), &a.opts, false),
            Self::Policy(a) => (query_path::slo_policy(&a.provider), &a.opts, false),
            Self::Verdicts(a) => (query_path::slo_verdicts(&a.provider, a.from), &a.opts, true),
            Self::Verdict(a) => (
                query_path::slo_verdict(&a.provider, a.window),
                &a.opts,
                false,
            ),
            Self::Reputation(a) => (query_path::slo_reputation(&a.provider), &a.opts, false),
        }
    }
}

impl Command for SloQuery {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let (path, opts, list) = self.path();
        if !list {
            return super::show(opts, &path, Shape::Flat);
        }
        print_with(opts, &path, verdict_table)
    }
}

/// Asks for `path` and prints the answer as JSON or through `table`.
fn print_with(
    opts: &QueryOpts,
    path: &QueryPath,
    table: fn(&mut std::io::StdoutLock<'static>, &Value) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let v = query_json(&Rpc::new(&opts.node.primary()), &path.to_string())?;
    let mut out = std::io::stdout().lock();
    match opts.format() {
        Output::Json => writeln!(out, "{v}")?,
        Output::Table => table(&mut out, &v)?,
    }
    Ok(())
}

/// One line per verdict: window, status, reasons, the fail rate against
/// its ceiling, what was charged and credited, the reputation after it.
pub fn verdict_table(out: &mut impl Write, v: &Value) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:>10}  {:<10}  {:<16}  {:>8}  {:>10}  {:>10}  {:>10}  {:>10}  {:>11}",
        "WINDOW",
        "STATUS",
        "REASONS",
        "JUDGED",
        "FAIL_PPM",
        "CEILING",
        "CHARGED",
        "CREDITED",
        "REPUTATION"
    )?;
    for x in v["verdicts"].as_array().into_iter().flatten() {
        let reasons: Vec<&str> = x["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        writeln!(
            out,
            "{:>10}  {:<10}  {:<16}  {:>8}  {:>10}  {:>10}  {:>10}  {:>10}  {:>11}",
            x["window"],
            x["status"].as_str().unwrap_or("?"),
            if reasons.is_empty() {
                "-".to_string()
            } else {
                reasons.join(",")
            },
            x["judged"],
            x["fail_ppm"],
            x["policy"]["max_fail_ppm"],
            x["charged"],
            x["credited"],
            x["reputation_ppm"],
        )?;
    }
    if let Some(n) = v["next_from"].as_u64() {
        writeln!(out, "more: --from {n}")?;
    }
    Ok(())
}

/// `query latency --provider P --window W`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct LatencyQuery {
    /// The provider and window.
    #[command(flatten)]
    pub at: WindowArgs,
}

impl Command for LatencyQuery {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let path = query_path::latency(&self.at.provider, self.at.window);
        print_with(&self.at.opts, &path, latency_table)
    }
}

/// `[lo, hi)` ms of one estimate, `-` when nothing was measured.
fn range(e: &Value) -> String {
    match (e["lo_ms"].as_u64(), e["hi_ms"].as_u64()) {
        (Some(lo), Some(hi)) => format!("[{lo},{hi})"),
        (Some(lo), None) => format!("[{lo},inf)"),
        _ => "-".into(),
    }
}

/// One line for the provider and one per route: measured calls and the
/// bucket bounds of p50, p95 and p99, for latency and for TTFT.
pub fn latency_table(out: &mut impl Write, v: &Value) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<32}  {:<6}  {:>8}  {:>14}  {:>14}  {:>14}",
        "ROUTE", "WHAT", "MEASURED", "P50_MS", "P95_MS", "P99_MS"
    )?;
    let mut rows = vec![("(provider)".to_string(), v)];
    for r in v["routes"].as_array().into_iter().flatten() {
        let name = format!(
            "{} {}",
            r["model"].as_str().unwrap_or(""),
            r["route"].as_str().unwrap_or("")
        );
        rows.push((name, r));
    }
    for (name, r) in rows {
        for what in ["latency", "ttft"] {
            let p = &r[what];
            writeln!(
                out,
                "{:<32}  {:<6}  {:>8}  {:>14}  {:>14}  {:>14}",
                name,
                what,
                p["measured"].as_u64().unwrap_or(0),
                range(&p["p50"]),
                range(&p["p95"]),
                range(&p["p99"]),
            )?;
        }
    }
    Ok(())
}

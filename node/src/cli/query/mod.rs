//! `tallyd query ...`: read a node's committed state through `abci_query`
//! and print it as a table or JSON.
//!
//! Every command builds its path with [`tally_settlement::query_path`], the
//! module the server parses paths with, and prints the answer through one
//! [`Shape`]. Modules: [`sla`] (route records), [`state`] (balances,
//! parameters, windows, gateways), [`allowances`], [`validators`] (validator set,
//! proposals, threshold key and ceremonies), [`sync`] (hub sync state,
//! batches, pending hub calls), [`node`] (raw paths and node status).
//! [`verified`] answers from single state keys, checked by the light client
//! with `--verify`.

use std::io::Write;

use crate::rpc::Rpc;
use anyhow::{bail, Context as _};
use clap::Subcommand;
use serde_json::Value;
use tally_settlement::query_path::QueryPath;
use tally_settlement::{Code, RouteRecordView, WindowView};

use super::args::{Output, QueryOpts};
use super::{table, Command, Context};

pub mod allowances;
pub mod node;
pub mod sla;
pub mod slo;
pub mod state;
pub mod sync;
pub mod validators;
pub mod verified;

/// Query a node.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum QueryCommand {
    /// SLA route records.
    #[command(subcommand)]
    Sla(sla::SlaCommand),
    /// A user's balance.
    Balance(state::BalanceCommand),
    /// Chain parameters.
    Params(state::ParamsCommand),
    /// Settlement windows.
    Windows(state::WindowsCommand),
    /// Registered gateways.
    Gateways(state::GatewaysCommand),
    /// What a user lets each gateway charge.
    Allowances(allowances::AllowancesCommand),
    /// A user's withdrawals and whether each settled (ADR 0020).
    Withdrawals(allowances::WithdrawalsCommand),
    /// Service-level objectives, verdicts and reputations (ADR 0021).
    #[command(subcommand)]
    Slo(slo::SloQuery),
    /// Latency and TTFT percentiles of a provider and its routes in a
    /// window (ADR 0021).
    Latency(slo::LatencyQuery),
    /// A hub chain's settlement sync state.
    Sync(sync::SyncCommand),
    /// A settlement batch.
    Batch(sync::BatchCommand),
    /// Pending hub calls (not yet in a batch).
    Hubcalls(sync::HubcallsCommand),
    /// The validators' threshold key and its ceremonies.
    Dkg(validators::DkgCommand),
    /// The validator set (power, encryption key, share index).
    Validators(validators::ValidatorsCommand),
    /// Validator-set proposals and their approvals.
    Proposals(validators::ProposalsCommand),
    /// Key rotations: each new key and the old key's signature handing it
    /// to the hub.
    Rotations(validators::RotationsCommand),
    /// The app version and the pending upgrade plan (or, with
    /// `--applied NAME`, a plan carried out).
    Upgrade(state::UpgradeQuery),
    /// Any query path, printed as JSON.
    Raw(node::RawCommand),
    /// Node heights and app hash.
    Status(node::StatusCommand),
}

impl Command for QueryCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Sla(c) => c.execute(ctx),
            Self::Balance(c) => c.execute(ctx),
            Self::Params(c) => c.execute(ctx),
            Self::Windows(c) => c.execute(ctx),
            Self::Gateways(c) => c.execute(ctx),
            Self::Allowances(c) => c.execute(ctx),
            Self::Withdrawals(c) => c.execute(ctx),
            Self::Slo(c) => c.execute(ctx),
            Self::Latency(c) => c.execute(ctx),
            Self::Sync(c) => c.execute(ctx),
            Self::Batch(c) => c.execute(ctx),
            Self::Hubcalls(c) => c.execute(ctx),
            Self::Dkg(c) => c.execute(ctx),
            Self::Validators(c) => c.execute(ctx),
            Self::Proposals(c) => c.execute(ctx),
            Self::Rotations(c) => c.execute(ctx),
            Self::Upgrade(c) => c.execute(ctx),
            Self::Raw(c) => c.execute(ctx),
            Self::Status(c) => c.execute(ctx),
        }
    }
}

/// Asks `rpc` for `path`; a non-zero code is an error naming the code.
pub fn query_json(rpc: &Rpc, path: &str) -> anyhow::Result<Value> {
    let a = rpc.abci_query(path)?;
    if a.code != 0 {
        let name = Code::from_value(a.code).map(Code::name).unwrap_or("?");
        bail!("query {path} failed: code {} ({name}): {}", a.code, a.log);
    }
    serde_json::from_slice(&a.value).with_context(|| format!("query {path}: value is not JSON"))
}

/// What an answer holds, which decides its table.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One route record.
    Record,
    /// A page of route records.
    Records,
    /// A page of windows.
    Windows,
    /// `{"gateways": [...]}`.
    Gateways,
    /// A batch: `key: value` lines, then its calls.
    Batch,
    /// A page of hub calls.
    Calls,
    /// Any object, as `key: value` lines.
    Flat,
    /// A user's allowances: `key: value` lines, then one row per gateway.
    Allowances,
    /// `/validators`.
    Validators,
    /// `/proposals`.
    Proposals,
    /// `/rotations`.
    Rotations,
    /// `/dkg`.
    Dkg,
}

/// Queries `path` on the first node of `opts` and prints the answer in the
/// chosen format.
pub fn show(opts: &QueryOpts, path: &QueryPath, shape: Shape) -> anyhow::Result<()> {
    let rpc = Rpc::new(&opts.node.primary());
    let v = query_json(&rpc, &path.to_string())?;
    let mut out = std::io::stdout().lock();
    match opts.format() {
        Output::Json => writeln!(out, "{v}")?,
        Output::Table => render(&mut out, shape, v)?,
    }
    Ok(())
}

/// Writes `v` as the table for `shape`.
pub fn render(out: &mut impl Write, shape: Shape, v: Value) -> anyhow::Result<()> {
    match shape {
        Shape::Record => {
            let r: RouteRecordView = serde_json::from_value(v)?;
            table::records(out, &[r])?;
        }
        Shape::Records => {
            let rs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
            table::records(out, &rs)?;
            table::more(out, &v)?;
        }
        Shape::Windows => {
            let ws: Vec<WindowView> = serde_json::from_value(v["windows"].clone())?;
            table::windows(out, &ws)?;
            table::more(out, &v)?;
        }
        Shape::Gateways => {
            table::gateways(
                out,
                v["gateways"].as_array().map(Vec::as_slice).unwrap_or(&[]),
            )?;
        }
        Shape::Batch => {
            let calls = v["calls"].as_array().cloned().unwrap_or_default();
            let mut head = v;
            if let Some(o) = head.as_object_mut() {
                o.remove("calls");
            }
            table::flat(out, &head)?;
            table::calls(out, &calls)?;
        }
        Shape::Calls => {
            table::calls(out, v["calls"].as_array().map(Vec::as_slice).unwrap_or(&[]))?;
            table::more(out, &v)?;
        }
        Shape::Flat => table::flat(out, &v)?,
        Shape::Allowances => {
            let rows = v["allowances"].as_array().cloned().unwrap_or_default();
            let mut head = v;
            if let Some(o) = head.as_object_mut() {
                o.remove("allowances");
            }
            table::flat(out, &head)?;
            table::allowances(out, &rows)?;
        }
        Shape::Validators => validators::validators(out, &v)?,
        Shape::Proposals => validators::proposals(out, &v)?,
        Shape::Rotations => validators::rotations(out, &v)?,
        Shape::Dkg => validators::dkg(out, &v)?,
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cli::{parse, Commands};
    use serde_json::json;

    /// Parses a `tallyd query ...` command line.
    pub(crate) fn query(args: &[&str]) -> Result<QueryCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Query(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    fn text(shape: Shape, v: Value) -> String {
        let mut out = Vec::new();
        render(&mut out, shape, v).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn unknown_query_subcommands_are_clap_errors() {
        let e = query(&["query", "blocks"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidSubcommand);
    }

    #[test]
    fn batches_print_their_head_then_their_calls() {
        let v = json!({"chain": "hub", "nonce": 1, "status": "settled", "calls": [
            {"id": 3, "user": "al", "provider": "pr", "amount": 2, "window": 9, "settled": true},
            {"id": 4, "settled": true, "pruned": true}]});
        assert_eq!(
            text(Shape::Batch, v),
            "chain: hub\nnonce: 1\nstatus: settled\n    CALL USER             PROVIDER               AMOUNT     WINDOW\n\
             3 al               pr               2 9  settled\n\
             4 (settled, body pruned)\n"
        );
    }

    #[test]
    fn pages_end_with_their_cursor() {
        let v = json!({"calls": [], "next_cursor": "00ff"});
        assert!(text(Shape::Calls, v).ends_with("more: --cursor 00ff\n"));
        let v = json!({"windows": [], "next_cursor": null});
        assert!(text(Shape::Windows, v).starts_with("    WINDOW START"));
        let v = json!({"records": [], "next_cursor": null});
        assert!(text(Shape::Records, v).ends_with("(no records)\n"));
        assert!(text(Shape::Gateways, json!({})).starts_with("NAME"));
    }
}

//! `tallyd tx params propose` and `tallyd tx gateway propose`: parameter
//! and gateway changes after genesis (ADR 0020). Each is a validator-set
//! proposal (action `params` or `gateway`) signed with this home's
//! CometBFT consensus key and approved like any other (`tallyd tx
//! validator approve ID`): once approvers hold more than 2/3 of the voting
//! power it is carried out, or refused with its reason (`tallyd query
//! proposals`). A parameter change takes effect at the first block of its
//! window (`tallyd query params` shows it scheduled); a gateway change at
//! once.

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand, ValueEnum};
use tally_settlement::dkg::types::ProposalAction;
use tally_settlement::proto::{GatewayChange, ParamChange, ParamValue, ValidatorProposal};

use super::args::{Output, QueryOpts};
use super::genesis::KeySource;
use super::validator::{open_proposal, proposal_state};
use super::{Command, Context};

/// Parameter changes.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum ParamsCommand {
    /// Propose new values from a future settlement window (prints the
    /// proposal id; the proposer's approval is included).
    Propose(ProposeParams),
}

/// `tx params propose --from-window W --set NAME=VALUE...`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ProposeParams {
    /// The first settlement window the values govern: after the current
    /// one (`tallyd query windows` shows it).
    #[arg(long)]
    pub from_window: u64,
    /// A parameter and its new value, as in genesis `params`; repeat for
    /// several.
    #[arg(long = "set", value_name = "NAME=VALUE", required = true)]
    pub set: Vec<String>,
    /// Blocks from the node's latest height during which the proposal may
    /// still open (1-1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub valid_for: u64,
    /// Node and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

impl ProposeParams {
    /// The change the flags describe.
    pub fn change(&self) -> anyhow::Result<ParamChange> {
        let mut values = Vec::with_capacity(self.set.len());
        for s in &self.set {
            let Some((name, value)) = s.split_once('=') else {
                bail!("--set {s:?}: want NAME=VALUE");
            };
            values.push(ParamValue {
                name: name.trim().to_string(),
                value: value.trim().to_string(),
            });
        }
        Ok(ParamChange {
            from_window: self.from_window,
            values,
        })
    }
}

impl Command for ParamsCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let Self::Propose(c) = self;
        let p = ValidatorProposal {
            action: ProposalAction::Params.into(),
            params: Some(c.change()?),
            ..ValidatorProposal::default()
        };
        open(ctx, &c.node, c.valid_for, ProposalAction::Params, p)
    }
}

/// Gateway changes.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum GatewayCommand {
    /// Propose adding, rotating, suspending, resuming or removing a
    /// gateway (prints the proposal id).
    Propose(ProposeGateway),
}

/// What a gateway proposal does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GatewayOp {
    /// Register a new gateway (needs a key).
    Add,
    /// Replace its key (needs the new key); the old one reports until
    /// `max_report_expiry_secs` after the change.
    Rotate,
    /// Refuse its reports until resumed.
    Suspend,
    /// Accept its reports again.
    Resume,
    /// Refuse its reports for good.
    Remove,
}

impl GatewayOp {
    fn value(self) -> u32 {
        match self {
            GatewayOp::Add => 1,
            GatewayOp::Rotate => 2,
            GatewayOp::Suspend => 3,
            GatewayOp::Resume => 4,
            GatewayOp::Remove => 5,
        }
    }
}

/// `tx gateway propose OP --name N [--pubkey HEX | --key NAME|FILE]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ProposeGateway {
    /// What to do.
    #[arg(value_enum)]
    pub op: GatewayOp,
    /// The gateway's name.
    #[arg(long)]
    pub name: String,
    /// Add, rotate: the (new) key.
    #[command(flatten)]
    pub key: KeySource,
    /// Blocks from the node's latest height during which the proposal may
    /// still open (1-1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub valid_for: u64,
    /// Node and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

impl ProposeGateway {
    /// The change the flags describe; `home` resolves a key name.
    pub fn change(self, home: &std::path::Path) -> anyhow::Result<GatewayChange> {
        let takes_key = matches!(self.op, GatewayOp::Add | GatewayOp::Rotate);
        let has_key = self.key.pubkey.is_some() || self.key.key.is_some();
        let pubkey = match (takes_key, has_key) {
            (true, true) => {
                hex::decode(self.key.pubkey(home)?.trim()).context("the key is not hex")?
            }
            (true, false) => bail!("{:?} needs --pubkey HEX or --key NAME|FILE", self.op),
            (false, true) => bail!("{:?} takes no key", self.op),
            (false, false) => Vec::new(),
        };
        Ok(GatewayChange {
            op: self.op.value(),
            name: self.name,
            pubkey,
        })
    }
}

impl Command for GatewayCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let Self::Propose(c) = self;
        let (node, valid_for) = (c.node.clone(), c.valid_for);
        let p = ValidatorProposal {
            action: ProposalAction::Gateway.into(),
            gateway: Some(c.change(ctx.home())?),
            ..ValidatorProposal::default()
        };
        open(ctx, &node, valid_for, ProposalAction::Gateway, p)
    }
}

/// Opens governance proposal `p`; prints its id (and, as JSON, its
/// state; as a table, its status and any reason it was refused).
pub(super) fn open(
    ctx: &Context,
    node: &QueryOpts,
    valid_for: u64,
    action: ProposalAction,
    p: ValidatorProposal,
) -> anyhow::Result<()> {
    let (rpc, id, height) = open_proposal(ctx, node, valid_for, p)?;
    let state = proposal_state(&rpc, id);
    match node.format() {
        Output::Json => println!(
            "{}",
            serde_json::json!({"id": id, "height": height, "proposal": state})
        ),
        Output::Table => {
            println!("{id}");
            let status = state
                .map(|p| {
                    let reason = p["reason"].as_str().unwrap_or("");
                    let status = p["status"].as_str().unwrap_or("?");
                    if reason.is_empty() {
                        format!(" ({status})")
                    } else {
                        format!(" ({status}: {reason})")
                    }
                })
                .unwrap_or_default();
            eprintln!(
                "{} proposal {id} opened at height {height}{status}",
                action.name()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::tx::TxCommand;
    use crate::cli::{parse, Commands};

    #[test]
    fn a_params_proposal_takes_each_set_once_as_given() {
        let parsed = parse(&[
            "tx",
            "params",
            "propose",
            "--from-window",
            "42",
            "--set",
            "max_batch_calls=200",
            "--set",
            "sync_window_secs = 400",
        ])
        .unwrap();
        let Commands::Tx(TxCommand::Params(ParamsCommand::Propose(p))) = parsed.command else {
            panic!("parsed as {:?}", parsed.command);
        };
        let c = p.change().unwrap();
        assert_eq!(c.from_window, 42);
        assert_eq!(
            c.values,
            vec![
                ParamValue {
                    name: "max_batch_calls".into(),
                    value: "200".into()
                },
                ParamValue {
                    name: "sync_window_secs".into(),
                    value: "400".into()
                },
            ]
        );
        let bad = parse(&[
            "tx",
            "params",
            "propose",
            "--from-window",
            "1",
            "--set",
            "x",
        ])
        .unwrap();
        let Commands::Tx(TxCommand::Params(ParamsCommand::Propose(p))) = bad.command else {
            panic!()
        };
        assert!(p.change().unwrap_err().to_string().contains("NAME=VALUE"));
        assert!(parse(&["tx", "params", "propose", "--from-window", "1"]).is_err());
    }

    #[test]
    fn a_gateway_proposal_carries_a_key_only_to_add_or_rotate() {
        let hex = "11".repeat(32);
        let gw = |args: &[&str]| {
            let mut all = vec!["tx", "gateway", "propose"];
            all.extend_from_slice(args);
            match parse(&all).unwrap().command {
                Commands::Tx(TxCommand::Gateway(GatewayCommand::Propose(p))) => p,
                other => panic!("parsed as {other:?}"),
            }
        };
        let home = std::path::Path::new("/nonexistent");
        let c = gw(&["add", "--name", "gw-2", "--pubkey", &hex])
            .change(home)
            .unwrap();
        assert_eq!(
            (c.op, c.name.as_str(), c.pubkey),
            (1, "gw-2", vec![0x11; 32])
        );
        let c = gw(&["suspend", "--name", "gw-2"]).change(home).unwrap();
        assert_eq!((c.op, c.pubkey.len()), (3, 0));
        assert!(gw(&["rotate", "--name", "gw-2"]).change(home).is_err());
        assert!(gw(&["remove", "--name", "gw-2", "--pubkey", &hex])
            .change(home)
            .is_err());
    }
}

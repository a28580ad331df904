//! `tallyd tx upgrade propose|approve|cancel` and `tallyd query upgrade`:
//! software upgrade plans (ADR 0019). A plan is a validator-set proposal
//! of action `upgrade` (a cancellation: `cancel_upgrade`), signed with the
//! sender's CometBFT consensus key and approved like any other: once
//! approvers hold more than 2/3 of the voting power it becomes the pending
//! plan, and at its height every node switches to its app version (or,
//! lacking it, stops with exit code 4 and `data/upgrade-info.json`).

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use clap::{ArgGroup, Args, Subcommand};
use tally_settlement::dkg::types::ProposalAction;
use tally_settlement::proto::{UpgradePlan, ValidatorProposal};

use super::args::QueryOpts;
use super::{Command, Context};

/// Upgrade plans.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum UpgradeCommand {
    /// Propose an upgrade plan (prints the proposal id; the proposer's
    /// approval is included).
    Propose(ProposeUpgrade),
    /// Approve an open upgrade proposal (or its cancellation).
    Approve(super::validator::ApproveCommand),
    /// Propose cancelling the pending plan (more than 10 blocks before
    /// its height); approved like a plan.
    Cancel(CancelUpgrade),
}

impl Command for UpgradeCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Propose(c) => c.execute(ctx),
            Self::Approve(c) => c.execute(ctx),
            Self::Cancel(c) => c.execute(ctx),
        }
    }
}

/// `tx upgrade propose --name N --app-version V --height H
/// (--binary-sha256 HEX | --binary PATH) [--info TEXT]`.
#[derive(Args, Debug, PartialEq, Eq)]
#[command(group(ArgGroup::new("binary_id").required(true).args(["binary_sha256", "binary"])))]
pub struct ProposeUpgrade {
    /// The plan's name: 1 to 64 bytes of [a-z0-9._-], never used before.
    #[arg(long)]
    pub name: String,
    /// The app version it switches to: the chain's current one plus 1.
    #[arg(long)]
    pub app_version: u64,
    /// The first block run under the new version (at least 20 blocks
    /// ahead).
    #[arg(long)]
    pub height: u64,
    /// SHA-256 of the release binary that carries the version, 64 hex
    /// digits.
    #[arg(long)]
    pub binary_sha256: Option<String>,
    /// The release binary itself: its SHA-256 is computed here.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Free text for operators (at most 1024 bytes).
    #[arg(long, default_value = "")]
    pub info: String,
    /// Blocks from the node's latest height during which the proposal may
    /// still open (1-1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub valid_for: u64,
    /// Node and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

/// `tx upgrade cancel --name N`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct CancelUpgrade {
    /// The pending plan's name.
    #[arg(long)]
    pub name: String,
    /// Blocks from the node's latest height during which the proposal may
    /// still open (1-1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub valid_for: u64,
    /// Node and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

impl ProposeUpgrade {
    /// The plan, its digest read or computed here.
    pub fn plan(&self) -> anyhow::Result<UpgradePlan> {
        let binary_sha256 = match (&self.binary_sha256, &self.binary) {
            (Some(h), _) => {
                let b = hex::decode(h.trim()).context("--binary-sha256 is not hex")?;
                if b.len() != 32 {
                    bail!("--binary-sha256 is {} bytes, not 32", b.len());
                }
                b
            }
            (None, Some(path)) => {
                let bytes =
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                tally_store::snapshot::sha256(&bytes).to_vec()
            }
            (None, None) => bail!("give --binary-sha256 or --binary"),
        };
        Ok(UpgradePlan {
            name: self.name.clone(),
            app_version: self.app_version,
            height: self.height,
            binary_sha256,
            info: self.info.clone(),
        })
    }
}

/// Opens `action` with `plan`; prints the proposal id.
fn open(
    ctx: &Context,
    node: &QueryOpts,
    valid_for: u64,
    action: ProposalAction,
    plan: UpgradePlan,
) -> anyhow::Result<()> {
    let p = ValidatorProposal {
        action: action.into(),
        upgrade: Some(plan),
        ..ValidatorProposal::default()
    };
    super::govern::open(ctx, node, valid_for, action, p)
}

impl Command for ProposeUpgrade {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let plan = self.plan()?;
        open(
            ctx,
            &self.node,
            self.valid_for,
            ProposalAction::Upgrade,
            plan,
        )
    }
}

impl Command for CancelUpgrade {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let plan = UpgradePlan {
            name: self.name.clone(),
            ..UpgradePlan::default()
        };
        open(
            ctx,
            &self.node,
            self.valid_for,
            ProposalAction::CancelUpgrade,
            plan,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::tx::TxCommand;
    use crate::cli::{parse, Commands};

    fn propose(args: &[&str]) -> Result<ProposeUpgrade, clap::Error> {
        let mut all = vec!["tx", "upgrade", "propose"];
        all.extend_from_slice(args);
        match parse(&all)?.command {
            Commands::Tx(TxCommand::Upgrade(UpgradeCommand::Propose(p))) => Ok(p),
            other => panic!("parsed as {other:?}"),
        }
    }

    const BASE: [&str; 6] = ["--name", "v2", "--app-version", "2", "--height", "500"];

    #[test]
    fn a_plan_takes_the_digest_given_or_the_binarys() {
        let hex = "ab".repeat(32);
        let mut args = BASE.to_vec();
        args.extend(["--binary-sha256", &hex, "--info", "notes"]);
        let p = propose(&args).unwrap().plan().unwrap();
        assert_eq!(
            p,
            UpgradePlan {
                name: "v2".into(),
                app_version: 2,
                height: 500,
                binary_sha256: vec![0xab; 32],
                info: "notes".into(),
            }
        );
        // SHA-256("abc"), FIPS 180-2's example.
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("tallyd");
        std::fs::write(&bin, b"abc").unwrap();
        let mut args = BASE.to_vec();
        let path = bin.display().to_string();
        args.extend(["--binary", &path]);
        let p = propose(&args).unwrap().plan().unwrap();
        assert_eq!(
            hex::encode(p.binary_sha256),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_plan_needs_one_binary_digest_of_32_bytes() {
        assert!(propose(&BASE).is_err());
        let mut both = BASE.to_vec();
        both.extend(["--binary-sha256", "00", "--binary", "/x"]);
        assert!(propose(&both).is_err());
        let mut short = BASE.to_vec();
        short.extend(["--binary-sha256", "abcd"]);
        let err = propose(&short).unwrap().plan().unwrap_err();
        assert!(err.to_string().contains("2 bytes, not 32"), "{err}");
    }
}

//! `tallyd tx validator propose|approve`: a current validator proposes
//! adding or removing a validator, a re-key of the set, or a recovery
//! (ADR 0018), and the others approve; the change is accepted once
//! approvers hold more than 2/3 of the voting power, and carried out by the
//! re-key that follows. Both are signed with the sender's CometBFT
//! consensus key (`<home>/config/priv_validator_key.json`).

use std::path::PathBuf;

use crate::dkgkey;
use crate::rpc::Rpc;
use anyhow::{bail, Context as _};
use clap::{ArgGroup, Args, Subcommand};
use tally_settlement::dkg::types::ProposalAction;
use tally_settlement::proto::{
    validator_msg::Sum, ProposalApproval, ValidatorMsg, ValidatorProposal,
};
use tally_settlement::{dkg, query_path, Code};

use super::args::{Output, QueryOpts};
use super::query::query_json;
use super::{Command, Context};

/// Validator-set changes.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum ValidatorCommand {
    /// Propose adding or removing a validator, a re-key or a recovery
    /// (prints the proposal id; the proposer's approval is included).
    Propose(ProposeCommand),
    /// Approve an open proposal.
    Approve(ApproveCommand),
}

impl Command for ValidatorCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Propose(c) => c.execute(ctx),
            Self::Approve(c) => c.execute(ctx),
        }
    }
}

/// `tx validator propose (--add|--remove) (--pubkey K | --candidate-home
/// H) [--power N]`, or `tx validator propose (--rekey|--recover)`.
#[derive(Args, Debug, PartialEq, Eq)]
#[command(group(ArgGroup::new("action").required(true).args(["add", "remove", "rekey", "recover"])))]
pub struct ProposeCommand {
    /// Add a validator (needs --power: the common power of every
    /// validator).
    #[arg(long)]
    pub add: bool,
    /// Remove a validator.
    #[arg(long)]
    pub remove: bool,
    /// A fresh key for the same set, handed to the hub by the current key.
    #[arg(long, conflicts_with_all = ["pubkey", "candidate_home", "power"])]
    pub rekey: bool,
    /// A fresh key for the same set when fewer than t signers of the
    /// current key remain: it activates without the current key's
    /// signature, and the hub takes it only from its governors.
    #[arg(long, conflicts_with_all = ["pubkey", "candidate_home", "power"])]
    pub recover: bool,
    /// The validator's ed25519 consensus key, hex or base64.
    #[arg(long)]
    pub pubkey: Option<String>,
    /// Voting power (add): every validator has the same power, the one
    /// `query validators` shows.
    #[arg(long)]
    pub power: Option<u64>,
    /// Blocks from the node's latest height during which the proposal may
    /// still open (1-1000): a signed proposal cannot be replayed later.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub valid_for: u64,
    /// The validator's home: its consensus key is read from there.
    #[arg(long)]
    pub candidate_home: Option<PathBuf>,
    /// Node and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

/// `tx validator approve --id N`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ApproveCommand {
    /// The proposal.
    #[arg(long)]
    pub id: u64,
    /// Node and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

impl ProposeCommand {
    fn action(&self) -> ProposalAction {
        if self.add {
            ProposalAction::Add
        } else if self.remove {
            ProposalAction::Remove
        } else if self.rekey {
            ProposalAction::Rekey
        } else {
            ProposalAction::Recover
        }
    }

    /// The proposal, checked here as the chain would check its form, so a
    /// typo is named before anything is sent.
    pub fn proposal(&self) -> anyhow::Result<ValidatorProposal> {
        let action = self.action();
        if !action.has_target() {
            return Ok(ValidatorProposal {
                action: action.into(),
                ..ValidatorProposal::default()
            });
        }
        let from_home = match &self.candidate_home {
            Some(h) => Some(dkgkey::consensus_pubkey(h)?),
            None => None,
        };
        let given = match &self.pubkey {
            Some(p) => Some(dkgkey::parse_ed25519_pubkey(p).map_err(anyhow::Error::msg)?),
            None => None,
        };
        let pubkey = match (given, from_home) {
            (Some(g), Some(h)) if g != h => bail!(
                "--pubkey {} is not the consensus key of --candidate-home ({})",
                hex::encode(g),
                hex::encode(h)
            ),
            (Some(k), _) | (None, Some(k)) => k.to_vec(),
            (None, None) => bail!("give --pubkey or --candidate-home"),
        };
        let power = self.power.unwrap_or(0);
        match action {
            ProposalAction::Add if power == 0 => bail!("--power N (above 0) is required to add"),
            ProposalAction::Remove if self.power.is_some() => bail!("a removal takes no --power"),
            _ => {}
        }
        Ok(ValidatorProposal {
            action: action.into(),
            pubkey,
            power,
            ..ValidatorProposal::default()
        })
    }
}

/// Finds a node that answers, and its chain id.
fn connect(opts: &QueryOpts) -> anyhow::Result<(Rpc, String)> {
    let rpc = opts
        .node
        .endpoints()
        .iter()
        .map(|e| Rpc::new(e))
        .find(|r| r.status().is_ok())
        .with_context(|| format!("no node answers at {}", opts.node.display()))?;
    let chain_id = rpc.status()?.chain_id;
    Ok((rpc, chain_id))
}

/// Signs `sum` with the consensus key of `ctx`'s home, sends it and waits
/// for its block; returns the result data and height.
pub(super) fn send(
    ctx: &Context,
    rpc: &Rpc,
    chain_id: &str,
    sum: Sum,
) -> anyhow::Result<(Vec<u8>, u64)> {
    let key = dkgkey::load_consensus_key(ctx.home())?;
    let msg = ValidatorMsg {
        chain_id: chain_id.to_string(),
        sum: Some(sum),
    };
    let c = rpc.broadcast_tx_commit(&dkg::sign_validator_msg(&key, &msg))?;
    let code = c.final_code();
    if code != 0 {
        let name = Code::from_value(code).map(Code::name).unwrap_or("?");
        bail!("refused: code {code} ({name}): {}", c.final_log());
    }
    Ok((c.final_data().to_vec(), c.height))
}

/// Opens proposal `p`, valid for `valid_for` blocks from the node's latest
/// height, signed with `ctx`'s consensus key; the node, the proposal's id
/// and the height of its block.
pub(super) fn open_proposal(
    ctx: &Context,
    opts: &QueryOpts,
    valid_for: u64,
    mut p: ValidatorProposal,
) -> anyhow::Result<(Rpc, u64, u64)> {
    let (rpc, chain_id) = connect(opts)?;
    p.valid_until_height = rpc.status()?.height.saturating_add(valid_for);
    let (data, height) = send(ctx, &rpc, &chain_id, Sum::Propose(p))?;
    let id = data
        .as_slice()
        .try_into()
        .map(u64::from_be_bytes)
        .context("the chain accepted the proposal but returned no id")?;
    Ok((rpc, id, height))
}

/// The proposal's line in `/proposals`, if the node has it.
pub(super) fn proposal_state(rpc: &Rpc, id: u64) -> Option<serde_json::Value> {
    let v = query_json(rpc, &query_path::proposals(Some(id)).to_string()).ok()?;
    v["proposals"]
        .as_array()?
        .iter()
        .find(|p| p["id"] == id)
        .cloned()
}

impl Command for ProposeCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let (rpc, id, height) = open_proposal(ctx, &self.node, self.valid_for, self.proposal()?)?;
        match self.node.format() {
            Output::Json => println!("{}", serde_json::json!({"id": id, "height": height})),
            Output::Table => {
                println!("{id}");
                let status = proposal_state(&rpc, id)
                    .map(|p| format!(" ({})", p["status"].as_str().unwrap_or("?")))
                    .unwrap_or_default();
                eprintln!("proposal {id} opened at height {height}{status}");
            }
        }
        Ok(())
    }
}

impl Command for ApproveCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let (rpc, chain_id) = connect(&self.node)?;
        let sum = Sum::Approve(ProposalApproval { proposal: self.id });
        let (_, height) = send(ctx, &rpc, &chain_id, sum)?;
        let state = proposal_state(&rpc, self.id);
        match self.node.format() {
            Output::Json => println!(
                "{}",
                serde_json::json!({"id": self.id, "height": height, "proposal": state})
            ),
            Output::Table => {
                let more = state
                    .map(|p| {
                        format!(
                            ": {}, approving power {} of {}",
                            p["status"].as_str().unwrap_or("?"),
                            p["approving_power"],
                            p["total_power"]
                        )
                    })
                    .unwrap_or_default();
                println!("approved proposal {} at height {height}{more}", self.id);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::genesis::tests::write_consensus_key;
    use crate::cli::tx::TxCommand;
    use crate::cli::{parse, Commands};
    use clap::error::ErrorKind;

    fn validator(args: &[&str]) -> Result<ValidatorCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Tx(TxCommand::Validator(c)) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    fn propose(args: &[&str]) -> Result<ProposeCommand, clap::Error> {
        let mut all = vec!["tx", "validator", "propose"];
        all.extend_from_slice(args);
        match validator(&all)? {
            ValidatorCommand::Propose(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses_and_refuses_bad_invocations() {
        let pk = "ab".repeat(32);
        let c = propose(&["--remove", "--pubkey", &pk, "--node", "http://n:1"]).unwrap();
        assert!(c.remove && !c.add && !c.rekey && !c.recover);
        assert_eq!(c.node.node.primary(), "http://n:1");
        assert!(propose(&["--rekey"]).unwrap().rekey);
        assert!(propose(&["--recover"]).unwrap().recover);
        let ValidatorCommand::Approve(a) =
            validator(&["tx", "validator", "approve", "--id", "7", "--json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(a.id, 7);
        assert_eq!(a.node.format(), Output::Json);
        for (bad, kind) in [
            (
                &["--pubkey", pk.as_str()][..],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["--add", "--remove", "--pubkey", &pk],
                ErrorKind::ArgumentConflict,
            ),
            (&["--rekey", "--recover"], ErrorKind::ArgumentConflict),
            (&["--rekey", "--pubkey", &pk], ErrorKind::ArgumentConflict),
            (&["--recover", "--power", "3"], ErrorKind::ArgumentConflict),
            (
                &["--add", "--pubkey", &pk, "--enc-key", "ab"],
                ErrorKind::UnknownArgument,
            ),
            (
                &["--add", "--pubkey", &pk, "--power", "-1"],
                ErrorKind::UnknownArgument,
            ),
        ] {
            assert_eq!(propose(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
        assert_eq!(
            validator(&["tx", "validator", "approve", "--id", "x"])
                .unwrap_err()
                .kind(),
            ErrorKind::ValueValidation
        );
    }

    #[test]
    fn proposals_are_built_and_checked_before_sending() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("cand");
        let pk = write_consensus_key(&home, [8; 32]);
        let h = home.to_str().unwrap();
        // --candidate-home: the consensus key from the home.
        let p = propose(&["--add", "--candidate-home", h, "--power", "5"])
            .unwrap()
            .proposal()
            .unwrap();
        assert_eq!((p.action, p.power), (u32::from(ProposalAction::Add), 5));
        assert_eq!(p.pubkey, pk.to_vec());
        // The same by hand, the key in base64.
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(pk);
        let by_hand = propose(&["--add", "--pubkey", &b64, "--power", "5"])
            .unwrap()
            .proposal()
            .unwrap();
        assert_eq!(by_hand, p);
        // A missing power, a removal with power, no key at all, a --pubkey
        // that is not the home's: refused.
        for (args, want) in [
            (vec!["--add", "--candidate-home", h], "--power"),
            (
                vec!["--remove", "--pubkey", &b64, "--power", "5"],
                "no --power",
            ),
            (vec!["--remove"], "give --pubkey or --candidate-home"),
            (
                vec![
                    "--remove",
                    "--candidate-home",
                    h,
                    "--pubkey",
                    &"11".repeat(32),
                ],
                "not the consensus key",
            ),
        ] {
            let e = propose(&args).unwrap().proposal().unwrap_err().to_string();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        let r = propose(&["--remove", "--candidate-home", h])
            .unwrap()
            .proposal()
            .unwrap();
        assert_eq!((r.action, r.power), (u32::from(ProposalAction::Remove), 0));
        assert_eq!(r.pubkey, pk.to_vec());
        // A re-key and a recovery name no validator and carry no power.
        for (flag, action) in [
            ("--rekey", ProposalAction::Rekey),
            ("--recover", ProposalAction::Recover),
        ] {
            let r = propose(&[flag]).unwrap().proposal().unwrap();
            assert_eq!(
                r,
                ValidatorProposal {
                    action: action.into(),
                    ..ValidatorProposal::default()
                }
            );
        }
    }
}

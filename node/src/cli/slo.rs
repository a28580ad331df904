//! `tallyd tx slo propose`: set or remove a provider's service-level
//! objectives from a future settlement window (ADR 0021). Like every
//! governance change it is a validator-set proposal (action `slo`) signed
//! with this home's consensus key and approved with `tallyd tx validator
//! approve ID`; once accepted it waits for its window (`tallyd query slo
//! policy P` shows it scheduled) and judges that window and every later
//! one.

use anyhow::bail;
use clap::{Args, Subcommand};
use tally_settlement::dkg::types::ProposalAction;
use tally_settlement::proto::{SloChange, SloPolicy, ValidatorProposal};

use super::args::QueryOpts;
use super::govern::open;
use super::{Command, Context};

/// Service-level objectives.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum SloCommand {
    /// Propose a provider's objectives (or their removal) from a future
    /// settlement window (prints the proposal id; the proposer's approval
    /// is included).
    Propose(ProposeSlo),
}

/// `tx slo propose --from-window W --provider P ...`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ProposeSlo {
    /// The first settlement window judged by the new objectives: after the
    /// current one (`tallyd query windows` shows it).
    #[arg(long)]
    pub from_window: u64,
    /// The provider.
    #[arg(long)]
    pub provider: String,
    /// Fail-rate ceiling in parts per million of the judged calls
    /// (requests - cancel - client), e.g. 50000 for 5%.
    #[arg(long, default_value_t = 0)]
    pub max_fail_ppm: u32,
    /// Fewer judged calls in a window and it is not judged.
    #[arg(long, default_value_t = 0)]
    pub min_requests: u64,
    /// p95 latency ceiling in ms: a bucket bound (0: none).
    #[arg(long, default_value_t = 0)]
    pub p95_latency_ms: u64,
    /// p95 time-to-first-token ceiling in ms: a bucket bound (0: none).
    #[arg(long, default_value_t = 0)]
    pub p95_ttft_ms: u64,
    /// Share of a breached window's charges credited back to its users, in
    /// parts per million.
    #[arg(long, default_value_t = 0)]
    pub credit_ppm: u32,
    /// Remove the provider's objectives instead (no other objective flag).
    #[arg(long)]
    pub remove: bool,
    /// Blocks from the node's latest height during which the proposal may
    /// still open (1-1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub valid_for: u64,
    /// Node and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

impl ProposeSlo {
    /// The change the flags describe (range checks are the chain's: its
    /// refusal names the reason).
    pub fn change(&self) -> anyhow::Result<SloChange> {
        let policy = SloPolicy {
            provider: self.provider.clone(),
            max_fail_ppm: self.max_fail_ppm,
            min_requests: self.min_requests,
            p95_latency_ms: self.p95_latency_ms,
            p95_ttft_ms: self.p95_ttft_ms,
            credit_ppm: self.credit_ppm,
            remove: self.remove,
        };
        let objectives = SloPolicy {
            provider: policy.provider.clone(),
            remove: false,
            ..SloPolicy::default()
        } != SloPolicy {
            remove: false,
            ..policy.clone()
        };
        if self.remove && objectives {
            bail!("--remove takes no objective flags");
        }
        if !self.remove && self.min_requests == 0 {
            bail!("--min-requests must be at least 1 (a window with fewer judged calls is not judged)");
        }
        Ok(SloChange {
            from_window: self.from_window,
            policies: vec![policy],
        })
    }
}

impl Command for SloCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let Self::Propose(c) = self;
        let p = ValidatorProposal {
            action: ProposalAction::Slo.into(),
            slo: Some(c.change()?),
            ..ValidatorProposal::default()
        };
        open(ctx, &c.node, c.valid_for, ProposalAction::Slo, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::tx::TxCommand;
    use crate::cli::{parse, Commands};

    fn propose(args: &[&str]) -> ProposeSlo {
        let mut all = vec!["tx", "slo", "propose"];
        all.extend_from_slice(args);
        match parse(&all).unwrap().command {
            Commands::Tx(TxCommand::Slo(SloCommand::Propose(p))) => p,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn flags_become_one_policy_and_a_removal_carries_none() {
        let c = propose(&[
            "--from-window",
            "9",
            "--provider",
            "acme",
            "--max-fail-ppm",
            "50000",
            "--min-requests",
            "20",
            "--p95-latency-ms",
            "512",
            "--credit-ppm",
            "250000",
        ])
        .change()
        .unwrap();
        assert_eq!(c.from_window, 9);
        let p = &c.policies[0];
        assert_eq!(
            (
                p.provider.as_str(),
                p.max_fail_ppm,
                p.min_requests,
                p.p95_latency_ms,
                p.p95_ttft_ms,
                p.credit_ppm,
                p.remove
            ),
            ("acme", 50_000, 20, 512, 0, 250_000, false)
        );
        let r = propose(&["--from-window", "9", "--provider", "acme", "--remove"])
            .change()
            .unwrap();
        assert!(r.policies[0].remove);
        let both = propose(&[
            "--from-window",
            "9",
            "--provider",
            "acme",
            "--remove",
            "--credit-ppm",
            "1",
        ]);
        assert!(both.change().unwrap_err().to_string().contains("--remove"));
        let no_min = propose(&["--from-window", "9", "--provider", "acme"]);
        assert!(no_min
            .change()
            .unwrap_err()
            .to_string()
            .contains("--min-requests"));
    }
}

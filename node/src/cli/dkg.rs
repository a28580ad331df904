//! `tallyd dkg dealer`: for tests only, the trusted dealer of a
//! localnet's threshold key. A real network needs no DKG setup: each
//! ceremony's players make and register their keys for that round
//! themselves (ADR 0018).

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand};

use super::genesis::update_genesis;
use super::{Command, Context};

/// Threshold key setup.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum DkgCommand {
    /// For tests only: a trusted dealer makes a threshold key, writes each
    /// validator's share to <home>/config/bls_share.json and the group key
    /// and public shares into the genesis app_state. A real network makes its
    /// key on chain, in its first blocks.
    Dealer(DealerCommand),
}

impl Command for DkgCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Dealer(c) => c.execute(ctx),
        }
    }
}

/// `dkg dealer --validators N --threshold T (--homes ... | --testnet-dir D)`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct DealerCommand {
    /// Number of validators (shares).
    #[arg(long)]
    pub validators: u32,
    /// Shares needed to sign.
    #[arg(long)]
    pub threshold: u32,
    /// Validator homes, in share order; default <testnet-dir>/node0.. .
    #[arg(long, num_args = 1.., value_delimiter = ',')]
    pub homes: Vec<PathBuf>,
    /// Directory of `cometbft testnet` homes (node0, node1, ...).
    #[arg(long)]
    pub testnet_dir: Option<PathBuf>,
    /// Genesis file to update; default the first home's config/genesis.json.
    #[arg(long)]
    pub genesis: Option<PathBuf>,
}

impl DealerCommand {
    /// The validator homes in share order, from `--homes` or `--testnet-dir`.
    fn homes(&self) -> anyhow::Result<Vec<PathBuf>> {
        let homes = match (self.homes.is_empty(), &self.testnet_dir) {
            (false, None) => self.homes.clone(),
            (true, Some(d)) => (0..self.validators)
                .map(|i| d.join(format!("node{i}")))
                .collect(),
            _ => bail!("give either --homes H0,H1,... or --testnet-dir DIR"),
        };
        if homes.len() != self.validators as usize {
            bail!("--validators {} but {} homes", self.validators, homes.len());
        }
        Ok(homes)
    }
}

impl Command for DealerCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let homes = self.homes()?;
        let (validators, threshold) = (self.validators, self.threshold);
        let genesis = match (self.genesis, homes.first()) {
            (Some(g), _) => g,
            (None, Some(h)) => h.join("config").join("genesis.json"),
            (None, None) => bail!("--validators must be at least 1"),
        };
        let dkg = crate::dealer::deal(&homes, threshold)?;
        let group = dkg.group_key.clone();
        update_genesis(&genesis, |g| {
            g.dkg = Some(dkg);
            Ok(true)
        })?;
        println!("dealt a {threshold}-of-{validators} key; group key {group}");
        println!("genesis: {}", genesis.display());
        for h in &homes {
            println!("share:   {}", crate::dealer::share_path(h).display());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Commands};
    use clap::error::ErrorKind;

    fn dealer(args: &[&str]) -> Result<DealerCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Dkg(DkgCommand::Dealer(c)) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses() {
        let c = dealer(&[
            "dkg",
            "dealer",
            "--validators",
            "4",
            "--threshold",
            "3",
            "--testnet-dir",
            "/ln",
        ])
        .unwrap();
        assert_eq!(
            c,
            DealerCommand {
                validators: 4,
                threshold: 3,
                homes: vec![],
                testnet_dir: Some("/ln".into()),
                genesis: None,
            }
        );
        assert_eq!(
            c.homes().unwrap(),
            ["/ln/node0", "/ln/node1", "/ln/node2", "/ln/node3"].map(PathBuf::from)
        );
        let c = dealer(&[
            "dkg",
            "dealer",
            "--validators",
            "2",
            "--threshold",
            "2",
            "--homes",
            "a,b",
            "--genesis",
            "g.json",
        ])
        .unwrap();
        assert_eq!(c.homes, ["a", "b"].map(PathBuf::from));
        assert_eq!(c.genesis, Some("g.json".into()));
        for (bad, kind) in [
            (
                &["dkg", "dealer", "--threshold", "3"][..],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["dkg", "dealer", "--validators", "x", "--threshold", "3"],
                ErrorKind::ValueValidation,
            ),
            (
                &[
                    "dkg",
                    "dealer",
                    "--validators",
                    "4",
                    "--threshold",
                    "3",
                    "--homes",
                ],
                ErrorKind::InvalidValue,
            ),
            (&["dkg", "deal"], ErrorKind::InvalidSubcommand),
        ] {
            assert_eq!(dealer(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
    }

    #[test]
    fn homes_come_from_exactly_one_place_and_match_the_count() {
        let both = dealer(&[
            "dkg",
            "dealer",
            "--validators",
            "1",
            "--threshold",
            "1",
            "--homes",
            "a",
            "--testnet-dir",
            "d",
        ])
        .unwrap();
        assert!(both
            .homes()
            .unwrap_err()
            .to_string()
            .contains("give either"));
        let short = dealer(&[
            "dkg",
            "dealer",
            "--validators",
            "3",
            "--threshold",
            "2",
            "--homes",
            "a,b",
        ])
        .unwrap();
        assert_eq!(
            short.homes().unwrap_err().to_string(),
            "--validators 3 but 2 homes"
        );
    }
}

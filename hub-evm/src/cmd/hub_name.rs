//! `tally-evm hub-name --chain-id N (--deployer 0x.. | --deployer-key FILE)
//! --nonce K`: the hub name a contract deployed by that account's
//! transaction number K (a `CREATE`) will have, before it is deployed. A
//! genesis names its hub with it (`tallyd genesis set-param hub_chain`),
//! so the chain can sign for a contract that does not exist yet.

use tally_hub_evm::{create_address, Address, HubName};

use super::common::parse_address;

/// Arguments of `hub-name`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The EVM chain id the contract will live on.
    #[arg(long)]
    chain_id: u64,
    /// The deploying account's address.
    #[arg(long, value_parser = parse_address, conflicts_with = "deployer_key", required_unless_present = "deployer_key")]
    deployer: Option<Address>,
    /// The deploying account's key file (its address is used).
    #[arg(long)]
    deployer_key: Option<std::path::PathBuf>,
    /// The deploying transaction's nonce (0 for a fresh account).
    #[arg(long)]
    nonce: u64,
}

impl Args {
    /// The hub name these arguments give.
    pub(super) fn name(&self) -> anyhow::Result<HubName> {
        let deployer = match (self.deployer, &self.deployer_key) {
            (Some(a), _) => a,
            (None, Some(f)) => tally_hub_evm::RelayKey::load(f)?.address(),
            (None, None) => anyhow::bail!("give --deployer or --deployer-key"),
        };
        Ok(HubName::new(
            self.chain_id,
            create_address(deployer, self.nonce),
        ))
    }

    pub fn run(self) -> anyhow::Result<()> {
        println!("{}", self.name()?);
        Ok(())
    }
}

//! `tally-evm deploy`: deploys a hub contract for a Tally chain and prints
//! its address and hub name (the value of Tally's `hub_chain` parameter).

use tally_hub_evm::abi::DeployArgs;
use tally_hub_evm::{Address, EvmHub, U256};

use super::common::{parse_address, parse_group_key, Endpoint, HexBytes, Key, Sending};

/// Arguments of `deploy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    endpoint: Endpoint,
    #[command(flatten)]
    key: Key,
    /// The Tally chain id the signed messages name (e.g. tally-localnet).
    #[arg(long)]
    tally_chain_id: String,
    /// The Tally group key, 48 bytes compressed, hex (`tallyd query dkg`).
    #[arg(long, value_parser = parse_group_key)]
    group_key: HexBytes,
    /// The last key rotation the key is past (the next one the hub applies
    /// is this + 1).
    #[arg(long, default_value_t = 0)]
    last_rotation: u64,
    /// Wei per credit.
    #[arg(long, default_value_t = 1_000_000_000)]
    wei_per_credit: u128,
    /// Credits a key-binding deposit of a new user pays.
    #[arg(long, default_value_t = 0)]
    registration_fee: u64,
    /// A governor address (repeat for several).
    #[arg(long = "governor", value_parser = parse_address)]
    governors: Vec<Address>,
    /// Distinct governor approvals a governed rotation needs.
    #[arg(long, default_value_t = 0)]
    governor_threshold: u64,
    #[command(flatten)]
    sending: Sending,
}

impl Args {
    pub fn run(self) -> anyhow::Result<()> {
        if self.governor_threshold as usize > self.governors.len() {
            anyhow::bail!(
                "--governor-threshold {} is more than the {} --governor given",
                self.governor_threshold,
                self.governors.len()
            );
        }
        if !self.governors.is_empty() && self.governor_threshold == 0 {
            anyhow::bail!("governors need a --governor-threshold of at least 1");
        }
        if self.wei_per_credit == 0 {
            anyhow::bail!("--wei-per-credit must be positive");
        }
        let key = self.key.load()?;
        let args = DeployArgs {
            tally_chain_id: self.tally_chain_id,
            group_key: self.group_key.0,
            last_rotation: self.last_rotation,
            wei_per_credit: U256::from(self.wei_per_credit),
            registration_fee: self.registration_fee,
            governors: self.governors,
            governor_threshold: self.governor_threshold,
        };
        let (hub, sent) =
            EvmHub::deploy(self.endpoint.eth(), &key, &args, &self.sending.options())?;
        println!("contract {}", hub.address());
        println!("hub_name {}", hub.name());
        println!(
            "block {} tx {} gas_used {}",
            sent.receipt.block_number, sent.receipt.tx_hash, sent.receipt.gas_used
        );
        Ok(())
    }
}

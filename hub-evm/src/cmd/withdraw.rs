//! `tally-evm withdraw`: sends the key's account what withdrawals
//! credited to it (`withdraw()`), printing the wei taken.

use tally_hub_evm::At;

use super::common::{HubSender, Sending};

/// Arguments of `withdraw`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    to: HubSender,
    #[command(flatten)]
    sending: Sending,
}

impl Args {
    pub fn run(self) -> anyhow::Result<()> {
        let (key, hub) = self.to.open()?;
        let wei = hub
            .eth()
            .withdrawable(hub.address(), key.address(), At::Latest)?;
        let sent = hub.withdraw(&key, &self.sending.options())?;
        println!(
            "withdrew {wei} wei to {} in block {} (tx {})",
            key.address(),
            sent.receipt.block_number,
            sent.receipt.tx_hash
        );
        Ok(())
    }
}

//! `tally-evm govern-key`: a governor's approval of a governed rotation
//! (ADR 0018): the hub takes `--group-key` as rotation `--nonce` once
//! `governorThreshold` governors approved the same nonce, epoch and key.

use tally_hub_evm::At;

use super::common::{parse_group_key, HexBytes, HubSender, Sending};

/// Arguments of `govern-key`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    to: HubSender,
    /// The rotation's nonce (the hub's last rotation + 1).
    #[arg(long)]
    nonce: u64,
    /// The new key's epoch on the Tally chain.
    #[arg(long)]
    epoch: u64,
    /// The new group key, 48 bytes compressed, hex.
    #[arg(long, value_parser = parse_group_key)]
    group_key: HexBytes,
    #[command(flatten)]
    sending: Sending,
}

impl Args {
    pub fn run(self) -> anyhow::Result<()> {
        let (key, hub) = self.to.open()?;
        let sent = hub.govern_key(
            &key,
            self.nonce,
            self.epoch,
            &self.group_key.0,
            &self.sending.options(),
        )?;
        let last = hub.eth().last_rotation(hub.address(), At::Latest)?;
        println!(
            "approved rotation {} in block {} (tx {}); the hub's last rotation is {last}",
            self.nonce, sent.receipt.block_number, sent.receipt.tx_hash
        );
        Ok(())
    }
}

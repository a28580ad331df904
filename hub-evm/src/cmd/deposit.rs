//! `tally-evm deposit`: escrows `--amount` credits for `--user`, sending
//! `amount * weiPerCredit` wei; `--pubkey` binds an ed25519 key on the
//! deposit that first funds the user (it pays the registration fee).

use tally_hub_evm::At;

use super::common::{parse_pubkey, HexBytes, HubSender, Sending};

/// Arguments of `deposit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    to: HubSender,
    /// The Tally user credited.
    #[arg(long)]
    user: String,
    /// Credits.
    #[arg(long)]
    amount: u64,
    /// A 32-byte ed25519 key to bind to the user (hex).
    #[arg(long, value_parser = parse_pubkey)]
    pubkey: Option<HexBytes>,
    #[command(flatten)]
    sending: Sending,
}

impl Args {
    pub fn run(self) -> anyhow::Result<()> {
        let (key, hub) = self.to.open()?;
        let pubkey = self.pubkey.map(|k| k.0).unwrap_or_default();
        let sent = hub.deposit(
            &key,
            &self.user,
            self.amount,
            &pubkey,
            &self.sending.options(),
        )?;
        let block = sent.receipt.block_number;
        let count = hub.eth().deposit_count(hub.address(), At::Number(block))?;
        let escrow = hub
            .eth()
            .escrow(hub.address(), &self.user, At::Number(block))?;
        println!(
            "deposit {count} in block {block} (tx {}): {} now holds {escrow} credits",
            sent.receipt.tx_hash, self.user
        );
        Ok(())
    }
}

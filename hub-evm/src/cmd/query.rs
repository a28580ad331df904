//! `tally-evm query --rpc URL --contract ADDR [--at BLOCK] <what>`: reads
//! the hub's state at a block (default latest). `deposits FROM TO` prints
//! one JSON object per deposit (JSON lines); the others print one value.

use serde_json::json;
use tally_hub_evm::{At, EthRpc};

use super::common::{parse_address, parse_at, Endpoint};

/// Arguments of `query`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    endpoint: Endpoint,
    /// The hub contract's address.
    #[arg(long, value_parser = parse_address)]
    contract: tally_hub_evm::Address,
    /// The block: latest, safe, finalized, pending or a number.
    #[arg(long, default_value = "latest", value_parser = parse_at)]
    at: At,
    #[command(subcommand)]
    what: What,
}

/// What to read.
#[derive(Debug, clap::Subcommand)]
enum What {
    /// The last settled batch nonce.
    LastNonce,
    /// The block batch NONCE settled in (0: not settled).
    Settled { nonce: u64 },
    /// A user's escrow (credits).
    Escrow { user: String },
    /// A provider's payouts (credits).
    Payout { provider: String },
    /// Credits withdrawals returned to a user.
    Withdrawn { user: String },
    /// Deposits in blocks FROM..=TO, as JSON lines.
    Deposits { from: u64, to: u64 },
    /// The deposits made so far.
    DepositCount,
    /// The current group key (48 bytes compressed, hex).
    GroupKey,
    /// The last applied rotation nonce.
    LastRotation,
    /// The hub name digests use.
    HubName,
}

impl Args {
    pub fn run(self) -> anyhow::Result<()> {
        let eth = self.endpoint.eth();
        for line in read(&eth, self.contract, self.at, &self.what)? {
            println!("{line}");
        }
        Ok(())
    }
}

fn read(
    eth: &EthRpc,
    c: tally_hub_evm::Address,
    at: At,
    what: &What,
) -> anyhow::Result<Vec<String>> {
    let one = |s: String| Ok(vec![s]);
    match what {
        What::LastNonce => one(eth.last_nonce(c, at)?.to_string()),
        What::Settled { nonce } => one(eth.settled_at(c, *nonce, at)?.to_string()),
        What::Escrow { user } => one(eth.escrow(c, user, at)?.to_string()),
        What::Payout { provider } => one(eth.payout(c, provider, at)?.to_string()),
        What::Withdrawn { user } => one(eth.withdrawn(c, user, at)?.to_string()),
        What::DepositCount => one(eth.deposit_count(c, at)?.to_string()),
        What::GroupKey => one(hex::encode(eth.group_key(c, at)?)),
        What::LastRotation => one(eth.last_rotation(c, at)?.to_string()),
        What::HubName => one(eth.hub_name(c, at)?),
        What::Deposits { from, to } => {
            if from > to {
                anyhow::bail!("deposits: FROM {from} is above TO {to}");
            }
            Ok(eth
                .deposits(c, *from, *to)?
                .into_iter()
                .map(|d| {
                    json!({
                        "seq": d.deposit.seq,
                        "user": d.deposit.user,
                        "amount": d.deposit.amount,
                        "pubkey": hex::encode(&d.deposit.pubkey),
                        "fee": d.fee,
                        "from": d.from.to_string(),
                        "block": d.block_number,
                        "tx": d.tx_hash.to_string(),
                    })
                    .to_string()
                })
                .collect())
        }
    }
}

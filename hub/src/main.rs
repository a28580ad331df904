//! `tally-hub`: run the reference hub chain's app and talk to it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use prost::Message;
use serde_json::{json, Value};
use tally_client::rpc::RpcClient;
use tally_hub_types::{hub_tx, Deposit, HubTx};

#[derive(Parser, Debug)]
#[command(
    name = "tally-hub",
    version,
    about = "Tally's reference hub chain (ABCI app)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the ABCI app for the CometBFT node of --home.
    Start {
        #[arg(long)]
        home: PathBuf,
        #[arg(long, default_value = "127.0.0.1:26758")]
        abci_listen: String,
    },
    /// Write the hub's app_state into <home>/config/genesis.json.
    Genesis {
        #[arg(long)]
        home: PathBuf,
        /// The settlement chain's chain id.
        #[arg(long)]
        settlement_chain_id: String,
        /// Take the group key from the settlement chain's genesis.json (a
        /// dealer's key in `app_state.dkg`).
        #[arg(
            long,
            required_unless_present = "group_key",
            conflicts_with = "group_key"
        )]
        settlement_genesis: Option<PathBuf>,
        /// The settlement validators' group key (hex compressed G1, 48
        /// bytes), e.g. `group_key` of the chain's `/dkg` query once its
        /// on-chain DKG finished.
        #[arg(long)]
        group_key: Option<String>,
        /// The name the settlement chain gives this hub.
        #[arg(long, default_value = "hub")]
        name: String,
    },
    /// Escrow credits for a user (faucet).
    Deposit {
        #[arg(long)]
        user: String,
        #[arg(long)]
        amount: u64,
        #[arg(long, default_value = "http://127.0.0.1:26757")]
        node: String,
    },
    /// Query a path (JSON).
    Query {
        path: String,
        #[arg(long, default_value = "http://127.0.0.1:26757")]
        node: String,
    },
}

/// A client of the hub node's CometBFT RPC (the workspace's one client).
fn rpc(node: &str) -> RpcClient {
    RpcClient::new(node, Duration::from_secs(3), Duration::from_secs(30))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Start { home, abci_listen } => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .init();
            let db = home.join("data").join("hub.db");
            std::fs::create_dir_all(&db)?;
            let backend = tally_store::RocksBackend::open(&db)
                .with_context(|| format!("opening {}", db.display()))?;
            // The binary owns the halt: exit 2 (genesis) or 3 (store).
            let halt = tally_store::halt::Halt::new(|e| std::process::exit(e.reason.exit_code()));
            let app = tally_hub::HubApp::new(Arc::new(backend), halt)?;
            tracing::info!(height = app.last_commit().height, listen = %abci_listen, "tally-hub starting");
            tendermint_abci::ServerBuilder::default()
                .bind(abci_listen.as_str(), app)?
                .listen()?;
        }
        Cmd::Genesis {
            home,
            settlement_chain_id,
            settlement_genesis,
            group_key,
            name,
        } => {
            let group_key = match (group_key, settlement_genesis) {
                (Some(k), _) => k.trim().to_string(),
                (None, Some(path)) => {
                    let s: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
                    s["app_state"]["dkg"]["group_key"]
                        .as_str()
                        .context(
                            "the settlement genesis has no app_state.dkg.group_key (its key is made \
                             on chain: pass --group-key from the chain's /dkg query)",
                        )?
                        .to_string()
                }
                (None, None) => anyhow::bail!("--group-key or --settlement-genesis is required"),
            };
            let path = home.join("config").join("genesis.json");
            let mut g: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
            let state = json!({"settlement_chain_id": settlement_chain_id, "name": name, "group_key": group_key, "escrow": []});
            tally_hub::machine::parse_genesis(state.to_string().as_bytes())
                .map_err(anyhow::Error::msg)?;
            g["app_state"] = state;
            std::fs::write(&path, serde_json::to_string_pretty(&g)? + "\n")?;
        }
        Cmd::Deposit { user, amount, node } => {
            let tx = HubTx {
                sum: Some(hub_tx::Sum::Deposit(Deposit { user, amount })),
            }
            .encode_to_vec();
            let r = rpc(&node).broadcast_tx_commit(&tx)?;
            let code = u64::from(r.check_code) + u64::from(r.code);
            println!("code {code} height {} {}", r.height, r.log);
            if code != 0 {
                bail!("deposit refused");
            }
        }
        Cmd::Query { path, node } => {
            let a = rpc(&node).abci_query(&path)?;
            if a.code != 0 {
                bail!("{}", a.log);
            }
            println!("{}", String::from_utf8_lossy(&a.value));
        }
    }
    Ok(())
}

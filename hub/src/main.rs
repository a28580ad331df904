//! `tally-hub`: run the reference hub chain's app and talk to it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use prost::Message;
use serde_json::{json, Value};
use tally_client::rpc::RpcClient;
use tally_hub_types::{govern_message, hub_tx, Deposit, GovernKey, GovernorApproval, HubTx};

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
        /// A governor's ed25519 public key (hex; repeat for each): the
        /// governors may accept a key the settlement chain made by a
        /// recovery (ADR 0018).
        #[arg(long = "governor")]
        governors: Vec<String>,
        /// Governor approvals a recovered key needs (a majority).
        #[arg(long, default_value_t = 0)]
        governor_threshold: u32,
        /// Credits the deposit that binds a user's key pays the hub
        /// (ADR 0020).
        #[arg(long, default_value_t = 0)]
        registration_fee: u64,
    },
    /// A governor's key and approvals (ADR 0018).
    #[command(subcommand)]
    Governor(GovernorCmd),
    /// Send the governors' approvals of a recovered key.
    GovernKey {
        #[command(flatten)]
        rotation: RotationArgs,
        /// An approval as `PUBKEY:SIGNATURE` (hex; repeat for each), as
        /// `tally-hub governor sign` prints it.
        #[arg(long = "approval", required = true)]
        approvals: Vec<String>,
        #[arg(long, default_value = "http://127.0.0.1:26757")]
        node: String,
    },
    /// Escrow credits for a user (faucet). With `--pubkey`, the deposit
    /// that first funds the user also binds its ed25519 key (after the
    /// hub's registration fee), which the settlement chain registers as
    /// the user's key (ADR 0020).
    Deposit {
        #[arg(long)]
        user: String,
        #[arg(long)]
        amount: u64,
        /// Hex ed25519 public key to bind (32 bytes).
        #[arg(long)]
        pubkey: Option<String>,
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

/// A rotation as the settlement chain's `/rotations` lists it.
#[derive(clap::Args, Debug)]
struct RotationArgs {
    /// The name the settlement chain gives this hub (`hub` in
    /// `/rotations`).
    #[arg(long, default_value = "hub")]
    name: String,
    /// The rotation's nonce.
    #[arg(long)]
    nonce: u64,
    /// The new key's epoch.
    #[arg(long)]
    epoch: u64,
    /// The new group key (hex compressed G1, 48 bytes).
    #[arg(long)]
    group_key: String,
}

impl RotationArgs {
    fn group_key(&self) -> Result<Vec<u8>> {
        let k = hex::decode(self.group_key.trim()).context("--group-key is not hex")?;
        tally_settlement::bls::parse_public_key(&k)
            .map_err(|e| anyhow::anyhow!("--group-key: {e}"))?;
        Ok(k)
    }
}

#[derive(Subcommand, Debug)]
enum GovernorCmd {
    /// Make a governor key (0600 JSON file) and print its public key.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign the approval of a recovered key: check it against the
    /// settlement chain's `/rotations` first. Prints `PUBKEY:SIGNATURE`.
    Sign {
        #[arg(long)]
        key: PathBuf,
        /// The settlement chain's chain id.
        #[arg(long)]
        settlement_chain_id: String,
        #[command(flatten)]
        rotation: RotationArgs,
    },
}

/// A governor key file: hex secret seed and public key.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GovernorKeyFile {
    secret: String,
    public_key: String,
}

fn governor_keygen(out: &std::path::Path) -> Result<String> {
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let public = hex::encode(key.verifying_key().to_bytes());
    let file = GovernorKeyFile {
        secret: hex::encode(key.to_bytes()),
        public_key: public.clone(),
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(out).with_context(|| {
        format!(
            "creating {} (an existing key is never replaced)",
            out.display()
        )
    })?;
    std::io::Write::write_all(
        &mut f,
        (serde_json::to_string_pretty(&file)? + "\n").as_bytes(),
    )?;
    Ok(public)
}

fn governor_key(path: &std::path::Path) -> Result<ed25519_dalek::SigningKey> {
    let f: GovernorKeyFile = serde_json::from_str(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not a governor key file", path.display()))?;
    let seed: [u8; 32] = hex::decode(&f.secret)
        .ok()
        .and_then(|b| b.try_into().ok())
        .context("the key file's secret is not 32 bytes of hex")?;
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    if hex::encode(key.verifying_key().to_bytes()) != f.public_key.to_ascii_lowercase() {
        bail!("{}: public_key does not match secret", path.display());
    }
    Ok(key)
}

fn parse_approval(a: &str) -> Result<GovernorApproval> {
    let (pk, sig) = a
        .split_once(':')
        .with_context(|| format!("approval {a:?} is not PUBKEY:SIGNATURE"))?;
    let pubkey = hex::decode(pk.trim()).context("approval public key is not hex")?;
    let signature = hex::decode(sig.trim()).context("approval signature is not hex")?;
    if pubkey.len() != 32 || signature.len() != 64 {
        bail!("approval {a:?}: a 32-byte key and a 64-byte signature");
    }
    Ok(GovernorApproval { pubkey, signature })
}

/// Sends `tx` to the hub node at `node`, waits for its block and prints
/// its code, height and log; refused (`what` names it) unless code 0.
fn send(node: &str, tx: &[u8], what: &str) -> Result<()> {
    let r = rpc(node).broadcast_tx_commit(tx)?;
    let code = u64::from(r.check_code) + u64::from(r.code);
    println!("code {code} height {} {}", r.height, r.log);
    if code != 0 {
        bail!("{what} refused");
    }
    Ok(())
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
            governors,
            governor_threshold,
            registration_fee,
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
            let state = json!({
                "settlement_chain_id": settlement_chain_id, "name": name, "group_key": group_key,
                "escrow": [], "governors": governors, "governor_threshold": governor_threshold,
                "registration_fee": registration_fee,
            });
            tally_hub::machine::parse_genesis(state.to_string().as_bytes())
                .map_err(anyhow::Error::msg)?;
            g["app_state"] = state;
            std::fs::write(&path, serde_json::to_string_pretty(&g)? + "\n")?;
        }
        Cmd::Governor(GovernorCmd::Keygen { out }) => println!("{}", governor_keygen(&out)?),
        Cmd::Governor(GovernorCmd::Sign {
            key,
            settlement_chain_id,
            rotation,
        }) => {
            let key = governor_key(&key)?;
            let msg = govern_message(
                &settlement_chain_id,
                &rotation.name,
                rotation.nonce,
                rotation.epoch,
                &rotation.group_key()?,
            );
            let sig = ed25519_dalek::Signer::sign(&key, &msg);
            println!(
                "{}:{}",
                hex::encode(key.verifying_key().to_bytes()),
                hex::encode(sig.to_bytes())
            );
        }
        Cmd::GovernKey {
            rotation,
            approvals,
            node,
        } => {
            let tx = HubTx {
                sum: Some(hub_tx::Sum::GovernKey(GovernKey {
                    chain: rotation.name.clone(),
                    nonce: rotation.nonce,
                    epoch: rotation.epoch,
                    group_key: rotation.group_key()?,
                    approvals: approvals
                        .iter()
                        .map(|a| parse_approval(a))
                        .collect::<Result<_>>()?,
                })),
            }
            .encode_to_vec();
            send(&node, &tx, "governed key")?;
        }
        Cmd::Deposit {
            user,
            amount,
            pubkey,
            node,
        } => {
            let pubkey = match pubkey {
                Some(h) => hex::decode(h.trim()).context("--pubkey is not hex")?,
                None => Vec::new(),
            };
            let tx = HubTx {
                sum: Some(hub_tx::Sum::Deposit(Deposit {
                    user,
                    amount,
                    pubkey,
                })),
            }
            .encode_to_vec();
            send(&node, &tx, "deposit")?;
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

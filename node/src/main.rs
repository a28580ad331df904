//! `tallyd`: run a Tally node and talk to one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;
use tally_node::config::AppConfig;
use tally_node::rpc::Rpc;
use tally_node::{keyfile, records};
use tally_settlement::{BalanceEntry, Code, GatewayEntry, Genesis, RouteRecordView, WindowView};

#[derive(Parser, Debug)]
#[command(
    name = "tallyd",
    version,
    about = "Tally: SLA records and settlement for AI-inference gateways, on CometBFT"
)]
struct Cli {
    /// Node home directory (config/, data/, keys/).
    #[arg(long, global = true, env = "TALLY_HOME", default_value_os_t = default_home())]
    home: PathBuf,
    #[command(subcommand)]
    cmd: Command,
}

fn default_home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".tally")
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write config/app.toml (CometBFT's config.toml comes from `cometbft init`).
    Init {
        /// ABCI listen address.
        #[arg(long, default_value = "127.0.0.1:26658")]
        abci_listen: String,
        /// Overwrite an existing app.toml.
        #[arg(long)]
        force: bool,
    },
    /// Run the ABCI application for the CometBFT node of this home.
    Start {
        /// Override app.toml's log_format (text|json).
        #[arg(long)]
        log_format: Option<String>,
        /// Override app.toml's log_level.
        #[arg(long)]
        log_level: Option<String>,
    },
    /// Gateway signing keys.
    #[command(subcommand)]
    Keys(KeysCmd),
    /// Edit the app_state of config/genesis.json.
    #[command(subcommand)]
    Genesis(GenesisCmd),
    /// Send transactions.
    #[command(subcommand)]
    Tx(TxCmd),
    /// Query a node.
    #[command(subcommand)]
    Query(QueryCmd),
    /// Threshold key setup.
    #[command(subcommand)]
    Dkg(DkgCmd),
}

#[derive(Subcommand, Debug)]
enum DkgCmd {
    /// Localnet dealer: make a threshold key, write each validator's share to
    /// <home>/config/bls_share.json and the group key and public shares into
    /// the genesis app_state.
    Dealer {
        /// Number of validators (shares).
        #[arg(long)]
        validators: u32,
        /// Shares needed to sign.
        #[arg(long)]
        threshold: u32,
        /// Validator homes, in share order; default <testnet-dir>/node0.. .
        #[arg(long, num_args = 1.., value_delimiter = ',')]
        homes: Vec<PathBuf>,
        /// Directory of `cometbft testnet` homes (node0, node1, ...).
        #[arg(long)]
        testnet_dir: Option<PathBuf>,
        /// Genesis file to update; default the first home's config/genesis.json.
        #[arg(long)]
        genesis: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum KeysCmd {
    /// Create a new ed25519 key in <home>/keys/NAME.json (or --out FILE).
    Add {
        name: String,
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long)]
        force: bool,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Show a key's public key. Takes a key name or a key file path.
    Show {
        name: String,
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Subcommand, Debug)]
enum GenesisCmd {
    /// Register a gateway key.
    AddGateway {
        #[arg(long)]
        name: String,
        /// Hex ed25519 public key.
        #[arg(long, conflicts_with = "key")]
        pubkey: Option<String>,
        /// A key name or key file.
        #[arg(long)]
        key: Option<String>,
    },
    /// Give a user a starting balance.
    Fund {
        #[arg(long)]
        user: String,
        #[arg(long)]
        amount: u64,
    },
    /// Set a chain parameter (e.g. settlement_window_secs 60, hub_chain hub).
    SetParam { name: String, value: String },
    /// Check the app_state.
    Validate,
}

#[derive(Args, Debug, Clone)]
struct NodeOpts {
    /// CometBFT RPC endpoint.
    #[arg(long, env = "TALLY_NODE", default_value = "http://127.0.0.1:26657")]
    node: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum TxCmd {
    /// Report usage: one record from flags, or many from a JSONL file.
    Report(ReportArgs),
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Gateway key: a name in <home>/keys or a key file path.
    #[arg(long)]
    from: String,
    /// JSONL file, one record per line ({"user","provider","model","route","outcome","units","amount"}).
    #[arg(long, conflicts_with_all = ["user", "provider", "model", "route", "outcome"])]
    file: Option<PathBuf>,
    #[arg(long)]
    user: Option<String>,
    #[arg(long)]
    provider: Option<String>,
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    route: Option<String>,
    /// ok, cancel, rate_limit, auth, transient, client or unknown.
    #[arg(long)]
    outcome: Option<String>,
    #[arg(long, default_value_t = 0)]
    units: u64,
    #[arg(long, default_value_t = 0)]
    amount: u64,
    /// Seconds until the report expires, from this machine's clock (1-540:
    /// the chain allows 600 after its block time; the rest is clock margin).
    #[arg(long, default_value_t = 300)]
    expires_in: u64,
    #[command(flatten)]
    node: NodeOpts,
}

#[derive(Subcommand, Debug)]
enum QueryCmd {
    /// SLA route records.
    #[command(subcommand)]
    Sla(SlaCmd),
    /// A user's balance.
    Balance {
        #[arg(long)]
        user: String,
        #[command(flatten)]
        node: NodeOpts,
    },
    /// Chain parameters.
    Params {
        #[command(flatten)]
        node: NodeOpts,
    },
    /// Settlement windows.
    Windows {
        #[command(flatten)]
        page: PageOpts,
        #[command(flatten)]
        node: NodeOpts,
    },
    /// Registered gateways.
    Gateways {
        #[command(flatten)]
        node: NodeOpts,
    },
    /// A hub chain's settlement sync state.
    Sync {
        #[arg(long, default_value = "hub")]
        chain: String,
        #[command(flatten)]
        node: NodeOpts,
    },
    /// A settlement batch.
    Batch {
        #[arg(long, default_value = "hub")]
        chain: String,
        #[arg(long)]
        nonce: u64,
        #[command(flatten)]
        node: NodeOpts,
    },
    /// Pending hub calls (not yet in a batch).
    Hubcalls {
        #[arg(long, default_value = "hub")]
        chain: String,
        #[command(flatten)]
        page: PageOpts,
        #[command(flatten)]
        node: NodeOpts,
    },
    /// The validators' threshold key.
    Dkg {
        #[command(flatten)]
        node: NodeOpts,
    },
    /// Any query path, printed as JSON.
    Raw {
        path: String,
        #[command(flatten)]
        node: NodeOpts,
    },
    /// Node heights and app hash.
    Status {
        #[command(flatten)]
        node: NodeOpts,
    },
}

#[derive(Args, Debug, Clone)]
struct PageOpts {
    /// Page size (1-1000).
    #[arg(long)]
    limit: Option<usize>,
    /// Cursor from a previous page's next_cursor.
    #[arg(long)]
    cursor: Option<String>,
}

impl PageOpts {
    fn query_string(&self) -> String {
        let mut q = Vec::new();
        if let Some(l) = self.limit {
            q.push(format!("limit={l}"));
        }
        if let Some(c) = &self.cursor {
            q.push(format!("cursor={c}"));
        }
        if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        }
    }
}

#[derive(Subcommand, Debug)]
enum SlaCmd {
    /// One route's records (all windows, or one).
    Route {
        #[arg(long)]
        user: String,
        #[arg(long)]
        provider: String,
        #[arg(long)]
        model: String,
        #[arg(long)]
        route: String,
        #[arg(long)]
        window: Option<u64>,
        #[command(flatten)]
        page: PageOpts,
        #[command(flatten)]
        node: NodeOpts,
    },
    /// A provider's records.
    Provider {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        window: Option<u64>,
        #[command(flatten)]
        page: PageOpts,
        #[command(flatten)]
        node: NodeOpts,
    },
    /// A user's records.
    User {
        #[arg(long)]
        user: String,
        #[arg(long)]
        window: Option<u64>,
        #[command(flatten)]
        page: PageOpts,
        #[command(flatten)]
        node: NodeOpts,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let home = cli.home;
    match cli.cmd {
        Command::Init { abci_listen, force } => init(&home, abci_listen, force),
        Command::Start {
            log_format,
            log_level,
        } => start(&home, log_format, log_level),
        Command::Keys(k) => keys(&home, k),
        Command::Genesis(g) => genesis(&home, g),
        Command::Tx(TxCmd::Report(r)) => report(&home, r),
        Command::Query(q) => query(q),
        Command::Dkg(DkgCmd::Dealer {
            validators,
            threshold,
            homes,
            testnet_dir,
            genesis,
        }) => dealer(validators, threshold, homes, testnet_dir, genesis),
    }
}

fn init(home: &Path, abci_listen: String, force: bool) -> Result<()> {
    let path = AppConfig::path(home);
    if path.exists() && !force {
        bail!("{} exists; pass --force to overwrite", path.display());
    }
    let cfg = AppConfig {
        abci_listen,
        ..AppConfig::default()
    };
    cfg.save(home)?;
    std::fs::create_dir_all(home.join("data"))
        .with_context(|| format!("creating {}", home.join("data").display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn init_logging(format: &str, level: &str) -> Result<()> {
    use tracing_subscriber::EnvFilter;
    // tendermint-abci logs every request at debug: keep it at info unless asked.
    let filter = EnvFilter::try_new(format!("tendermint_abci=info,{level}"))
        .with_context(|| format!("bad log level {level:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        "json" => builder.json().init(),
        "text" => builder.init(),
        other => bail!("log format must be text or json, got {other:?}"),
    }
    Ok(())
}

fn start(home: &Path, log_format: Option<String>, log_level: Option<String>) -> Result<()> {
    let cfg = AppConfig::load(home)?;
    init_logging(
        log_format.as_deref().unwrap_or(&cfg.log_format),
        log_level.as_deref().unwrap_or(&cfg.log_level),
    )?;
    // Refuse a genesis we could not run before CometBFT ever asks.
    let genesis_path = home.join("config").join("genesis.json");
    if genesis_path.exists() {
        let app_state = read_app_state(&genesis_path)?;
        Genesis::parse(app_state.to_string().as_bytes())
            .with_context(|| format!("{}", genesis_path.display()))?;
    }
    let db_path = cfg.db_path(home);
    std::fs::create_dir_all(&db_path).with_context(|| format!("creating {}", db_path.display()))?;
    let backend = tally_store::RocksBackend::open(&db_path)
        .with_context(|| format!("opening {}", db_path.display()))?;
    let app = tally_abci::TallyApp::new(Arc::new(backend))?;
    let share_path = cfg.share_path(home);
    let mut rank = None;
    if share_path.exists() {
        let dkg = if genesis_path.exists() {
            Genesis::parse(read_app_state(&genesis_path)?.to_string().as_bytes())?.dkg
        } else {
            None
        };
        let share = tally_node::dealer::load_share(&share_path, dkg.as_ref())?;
        tracing::info!(index = share.index, file = %share_path.display(), "threshold signer enabled");
        rank = Some(share.index.saturating_sub(1));
        app.set_signer(share);
    } else {
        tracing::info!(file = %share_path.display(), "no threshold key share: this node does not sign");
    }
    // The relay runs on its own thread, never inside an ABCI call.
    let _relay = if cfg.hub_endpoints.is_empty() {
        None
    } else {
        let rc = cfg.relay_config(rank);
        Some(tally_relay::spawn(app.clone(), rc)?)
    };
    let last = app.last_commit();
    tracing::info!(
        home = %home.display(),
        db = %db_path.display(),
        height = last.height,
        app_hash = %hex::encode(last.app_hash),
        listen = %cfg.abci_listen,
        "tallyd starting"
    );
    let server = tendermint_abci::ServerBuilder::default()
        .bind(cfg.abci_listen.as_str(), app)
        .with_context(|| format!("binding ABCI server to {}", cfg.abci_listen))?;
    server.listen().context("ABCI server stopped")?;
    Ok(())
}

fn keys(home: &Path, cmd: KeysCmd) -> Result<()> {
    match cmd {
        KeysCmd::Add {
            name,
            out,
            force,
            output,
        } => {
            let path = out.unwrap_or_else(|| keyfile::keys_dir(home).join(format!("{name}.json")));
            let key = keyfile::create(&path, &name, force)?;
            print_key(
                &name,
                &hex::encode(key.verifying_key().to_bytes()),
                &path,
                output,
            );
        }
        KeysCmd::Show { name, output } => {
            let path = keyfile::resolve(home, &name);
            let (name, key) = keyfile::load(&path)?;
            print_key(
                &name,
                &hex::encode(key.verifying_key().to_bytes()),
                &path,
                output,
            );
        }
    }
    Ok(())
}

fn print_key(name: &str, pubkey: &str, path: &Path, output: Output) {
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({"name": name, "public_key": pubkey, "file": path.display().to_string()})
        ),
        Output::Table => {
            println!("name:       {name}");
            println!("public_key: {pubkey}");
            println!("file:       {}", path.display());
        }
    }
}

fn read_app_state(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    Ok(doc.get("app_state").cloned().unwrap_or(Value::Null))
}

/// Reads a genesis file's app_state, lets `f` change it, validates and
/// writes it back (unless `f` returns false).
fn update_genesis(path: &Path, f: impl FnOnce(&mut Genesis) -> Result<bool>) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (create it with `cometbft init`)",
            path.display()
        )
    })?;
    let mut doc: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let app_state = doc.get("app_state").cloned().unwrap_or(Value::Null);
    let mut g = Genesis::parse(app_state.to_string().as_bytes())
        .with_context(|| format!("{}", path.display()))?;
    if !f(&mut g)? {
        return Ok(());
    }
    g.validate()?;
    doc["app_state"] = serde_json::to_value(&g)?;
    std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

fn dealer(
    validators: u32,
    threshold: u32,
    homes: Vec<PathBuf>,
    testnet_dir: Option<PathBuf>,
    genesis: Option<PathBuf>,
) -> Result<()> {
    let homes = match (homes.is_empty(), testnet_dir) {
        (false, None) => homes,
        (true, Some(d)) => (0..validators)
            .map(|i| d.join(format!("node{i}")))
            .collect(),
        _ => bail!("give either --homes H0,H1,... or --testnet-dir DIR"),
    };
    if homes.len() != validators as usize {
        bail!("--validators {validators} but {} homes", homes.len());
    }
    let genesis = genesis.unwrap_or_else(|| homes[0].join("config").join("genesis.json"));
    let dkg = tally_node::dealer::deal(&homes, threshold)?;
    let group = dkg.group_key.clone();
    update_genesis(&genesis, |g| {
        g.dkg = Some(dkg);
        Ok(true)
    })?;
    println!("dealt a {threshold}-of-{validators} key; group key {group}");
    println!("genesis: {}", genesis.display());
    for h in &homes {
        println!("share:   {}", tally_node::dealer::share_path(h).display());
    }
    Ok(())
}

fn genesis(home: &Path, cmd: GenesisCmd) -> Result<()> {
    let path = home.join("config").join("genesis.json");
    update_genesis(&path, |g| genesis_edit(g, &path, home, cmd))
}

fn genesis_edit(g: &mut Genesis, path: &Path, home: &Path, cmd: GenesisCmd) -> Result<bool> {
    match cmd {
        GenesisCmd::AddGateway { name, pubkey, key } => {
            let pubkey = match (pubkey, key) {
                (Some(p), None) => p,
                (None, Some(k)) => {
                    let (_, key) = keyfile::load(&keyfile::resolve(home, &k))?;
                    hex::encode(key.verifying_key().to_bytes())
                }
                _ => bail!("give --pubkey HEX or --key NAME|FILE"),
            };
            g.gateways.retain(|gw| gw.pubkey != pubkey);
            g.gateways.push(GatewayEntry { name, pubkey });
        }
        GenesisCmd::Fund { user, amount } => {
            g.balances.retain(|b| b.user != user);
            g.balances.push(BalanceEntry { user, amount });
        }
        GenesisCmd::SetParam { name, value } => {
            let mut params = serde_json::to_value(&g.params)?;
            let slot = params.get_mut(&name).with_context(|| {
                format!(
                    "no parameter {name:?}; known: {}",
                    serde_json::to_value(&g.params)
                        .map(|v| v
                            .as_object()
                            .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
                            .unwrap_or_default())
                        .unwrap_or_default()
                )
            })?;
            *slot = match value.parse::<u64>() {
                Ok(n) if slot.is_number() => Value::from(n),
                _ if slot.is_string() => Value::from(value),
                _ => bail!("parameter {name:?} takes a number, got {value:?}"),
            };
            g.params = serde_json::from_value(params)?;
        }
        GenesisCmd::Validate => {
            g.validate()?;
            println!("{}: app_state is valid", path.display());
            return Ok(false);
        }
    }
    Ok(true)
}

fn report(home: &Path, a: ReportArgs) -> Result<()> {
    let (_, key) = keyfile::load(&keyfile::resolve(home, &a.from))?;
    let recs = match &a.file {
        Some(f) => {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            records::parse_jsonl(&text).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
        }
        None => {
            let need = |v: &Option<String>, n: &str| {
                v.clone()
                    .with_context(|| format!("--{n} is required (or use --file)"))
            };
            vec![records::make_record(records::RecordJson {
                user: need(&a.user, "user")?,
                provider: need(&a.provider, "provider")?,
                model: need(&a.model, "model")?,
                route: need(&a.route, "route")?,
                outcome: need(&a.outcome, "outcome")?,
                units: a.units,
                amount: a.amount,
            })
            .map_err(anyhow::Error::msg)?]
        }
    };
    if recs.is_empty() {
        bail!("no records to report");
    }
    if a.expires_in == 0 || a.expires_in > 540 {
        bail!("--expires-in must be 1..=540 seconds (the chain allows 600 s after block time; 60 s are kept for clock skew)");
    }
    // One reporting path in the workspace: the gateway SDK's reporter.
    let endpoints: Vec<String> = a
        .node
        .node
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let rpc = endpoints
        .iter()
        .map(|e| Rpc::new(e))
        .find(|r| r.status().is_ok())
        .with_context(|| format!("no node answers at {}", a.node.node))?;
    let chain_id = rpc.status()?.chain_id;
    let max = query_json(&rpc, "/params")?["max_report_records"]
        .as_u64()
        .unwrap_or(1000) as usize;
    let mut cfg = tally_client::ReporterConfig::new(endpoints, &chain_id);
    cfg.max_records = max.clamp(1, 1000);
    cfg.ttl = std::time::Duration::from_secs(a.expires_in);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcomes = runtime.block_on(async move {
        let transport = tally_client::HttpTransport::new(std::time::Duration::from_secs(15));
        let reporter = tally_client::Reporter::start(cfg, key, transport)?;
        for r in recs {
            reporter.record(r).await?;
        }
        Ok::<_, anyhow::Error>(reporter.shutdown().await)
    })?;
    let mut failed = 0;
    for o in outcomes {
        let (id, n, code, height, log) = match o {
            tally_client::ReportOutcome::Landed {
                report_id,
                records,
                height,
            } => (report_id, records, 0, height, String::new()),
            tally_client::ReportOutcome::Rejected {
                report_id,
                records,
                code,
                log,
            } => (report_id, records, code, 0, log),
            tally_client::ReportOutcome::Expired {
                report_id,
                records,
                last_error,
            } => (
                report_id,
                records,
                u32::MAX,
                0,
                format!("expired unconfirmed: {last_error}"),
            ),
        };
        if code != 0 {
            failed += 1;
        }
        let name = if code == u32::MAX {
            "expired"
        } else {
            Code::from_value(code).map(Code::name).unwrap_or("?")
        };
        match a.node.output {
            Output::Json => println!(
                "{}",
                serde_json::json!({
                    "report_id": id, "records": n, "code": code, "code_name": name, "log": log, "height": height
                })
            ),
            Output::Table => println!(
                "report {id} records {n} code {code} ({name}) height {height}{}",
                if log.is_empty() {
                    String::new()
                } else {
                    format!(" log: {log}")
                }
            ),
        }
    }
    if failed > 0 {
        bail!("{failed} report(s) not landed");
    }
    Ok(())
}

fn query_json(rpc: &Rpc, path: &str) -> Result<Value> {
    let a = rpc.abci_query(path)?;
    if a.code != 0 {
        let name = Code::from_value(a.code).map(Code::name).unwrap_or("?");
        bail!("query {path} failed: code {} ({name}): {}", a.code, a.log);
    }
    serde_json::from_slice(&a.value).with_context(|| format!("query {path}: value is not JSON"))
}

/// Percent-encodes one path segment (identifiers may hold `/`).
fn seg(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'/' => "%2F".to_string(),
            b'%' => "%25".to_string(),
            b'?' => "%3F".to_string(),
            _ => (b as char).to_string(),
        })
        .collect()
}

fn query(cmd: QueryCmd) -> Result<()> {
    let (path, node, kind) = match cmd {
        QueryCmd::Sla(SlaCmd::Route {
            user,
            provider,
            model,
            route,
            window,
            page,
            node,
        }) => {
            let base = format!(
                "/sla/route/{}/{}/{}/{}",
                seg(&user),
                seg(&provider),
                seg(&model),
                seg(&route)
            );
            match window {
                Some(w) => (format!("{base}/{w}"), node, Kind::Record),
                None => (
                    format!("{base}{}", page.query_string()),
                    node,
                    Kind::Records,
                ),
            }
        }
        QueryCmd::Sla(SlaCmd::Provider {
            provider,
            window,
            page,
            node,
        }) => (
            format!(
                "/sla/provider/{}{}{}",
                seg(&provider),
                window.map(|w| format!("/{w}")).unwrap_or_default(),
                page.query_string()
            ),
            node,
            Kind::Records,
        ),
        QueryCmd::Sla(SlaCmd::User {
            user,
            window,
            page,
            node,
        }) => (
            format!(
                "/sla/user/{}{}{}",
                seg(&user),
                window.map(|w| format!("/{w}")).unwrap_or_default(),
                page.query_string()
            ),
            node,
            Kind::Records,
        ),
        QueryCmd::Balance { user, node } => (format!("/balance/{}", seg(&user)), node, Kind::Flat),
        QueryCmd::Params { node } => ("/params".into(), node, Kind::Flat),
        QueryCmd::Windows { page, node } => (
            format!("/windows{}", page.query_string()),
            node,
            Kind::Windows,
        ),
        QueryCmd::Gateways { node } => ("/gateways".into(), node, Kind::Gateways),
        QueryCmd::Sync { chain, node } => (format!("/sync/{}", seg(&chain)), node, Kind::Flat),
        QueryCmd::Batch { chain, nonce, node } => {
            (format!("/batch/{}/{nonce}", seg(&chain)), node, Kind::Batch)
        }
        QueryCmd::Hubcalls { chain, page, node } => (
            format!("/hubcalls/{}{}", seg(&chain), page.query_string()),
            node,
            Kind::Calls,
        ),
        QueryCmd::Dkg { node } => ("/dkg".into(), node, Kind::Flat),
        QueryCmd::Raw { path, node } => (path, node, Kind::Raw),
        QueryCmd::Status { node } => {
            let s = Rpc::new(&node.node).status()?;
            let v = serde_json::json!({"chain_id": s.chain_id, "height": s.height, "app_hash": s.app_hash, "catching_up": s.catching_up});
            match node.output {
                Output::Json => println!("{v}"),
                Output::Table => print_flat(&v),
            }
            return Ok(());
        }
    };
    let rpc = Rpc::new(&node.node);
    let v = query_json(&rpc, &path)?;
    if node.output == Output::Json || kind == Kind::Raw {
        println!("{v}");
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    match kind {
        Kind::Record => {
            let r: RouteRecordView = serde_json::from_value(v)?;
            print_records(&mut out, &[r])?;
        }
        Kind::Records => {
            let rs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
            print_records(&mut out, &rs)?;
            if let Some(c) = v["next_cursor"].as_str() {
                writeln!(out, "more: --cursor {c}")?;
            }
        }
        Kind::Windows => {
            let ws: Vec<WindowView> = serde_json::from_value(v["windows"].clone())?;
            writeln!(
                out,
                "{:>10} {:<20} {:<6} {:>6} {:>8} {:>6} {:>6} {:>6} {:>10}",
                "WINDOW", "START", "CLOSED", "ROUTES", "REQ", "FAIL", "CANCEL", "CLIENT", "AMOUNT"
            )?;
            for w in ws {
                writeln!(
                    out,
                    "{:>10} {:<20} {:<6} {:>6} {:>8} {:>6} {:>6} {:>6} {:>10}",
                    w.window,
                    w.window_start,
                    w.closed,
                    w.routes,
                    w.requests,
                    w.fail_count,
                    w.cancel,
                    w.client,
                    w.amount
                )?;
            }
            if let Some(c) = v["next_cursor"].as_str() {
                writeln!(out, "more: --cursor {c}")?;
            }
        }
        Kind::Gateways => {
            writeln!(out, "{:<20} PUBKEY", "NAME")?;
            for g in v["gateways"].as_array().cloned().unwrap_or_default() {
                writeln!(
                    out,
                    "{:<20} {}",
                    g["name"].as_str().unwrap_or(""),
                    g["pubkey"].as_str().unwrap_or("")
                )?;
            }
        }
        Kind::Batch => {
            let calls = v["calls"].as_array().cloned().unwrap_or_default();
            let mut head = v.clone();
            if let Some(o) = head.as_object_mut() {
                o.remove("calls");
            }
            print_flat(&head);
            print_calls(&mut out, &calls)?;
        }
        Kind::Calls => {
            print_calls(
                &mut out,
                v["calls"].as_array().map(Vec::as_slice).unwrap_or(&[]),
            )?;
            if let Some(c) = v["next_cursor"].as_str() {
                writeln!(out, "more: --cursor {c}")?;
            }
        }
        Kind::Flat | Kind::Raw => print_flat(&v),
    }
    Ok(())
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Batch,
    Calls,
    Record,
    Records,
    Windows,
    Gateways,
    Flat,
    Raw,
}

fn print_calls(out: &mut impl Write, calls: &[Value]) -> Result<()> {
    writeln!(
        out,
        "{:>8} {:<16} {:<16} {:>12} {:>10}",
        "CALL", "USER", "PROVIDER", "AMOUNT", "WINDOW"
    )?;
    for c in calls {
        if c["settled"] == true {
            writeln!(out, "{:>8} (settled)", c["id"])?;
        } else {
            writeln!(
                out,
                "{:>8} {:<16} {:<16} {:>12} {:>10}",
                c["id"],
                c["user"].as_str().unwrap_or(""),
                c["provider"].as_str().unwrap_or(""),
                c["amount"],
                c["window"]
            )?;
        }
    }
    Ok(())
}

fn print_flat(v: &Value) {
    if let Some(o) = v.as_object() {
        for (k, v) in o {
            match v {
                Value::String(s) => println!("{k}: {s}"),
                other => println!("{k}: {other}"),
            }
        }
    } else {
        println!("{v}");
    }
}

fn print_records(out: &mut impl Write, rs: &[RouteRecordView]) -> Result<()> {
    writeln!(
        out,
        "{:>10} {:<20} {:<12} {:<12} {:<16} {:<16} {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>8} {:>8}",
        "WINDOW", "START", "USER", "PROVIDER", "MODEL", "ROUTE", "REQ", "OK", "FAIL", "RATE", "AUTH", "TRANS", "UNKN", "CLIENT", "CANCEL", "UNITS", "AMOUNT"
    )?;
    for r in rs {
        writeln!(
            out,
            "{:>10} {:<20} {:<12} {:<12} {:<16} {:<16} {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>8} {:>8}",
            r.window, r.window_start, r.user, r.provider, r.model, r.route, r.requests, r.ok, r.fail_count,
            r.rate_limit, r.auth, r.transient, r.unknown, r.client, r.cancel, r.units, r.amount
        )?;
    }
    if rs.is_empty() {
        writeln!(out, "(no records)")?;
    }
    Ok(())
}

//! `config/app.toml`: Tally's own settings, beside CometBFT's `config.toml`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tally_client::RetryPolicy;
use tally_relay::{BreakerConfig, EvmConfig, EvmTip, HubKind, HubTimeouts, RelayConfig};

use crate::fs::{FsOp, FsPathError};

/// Errors reading or writing the home directory.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read or written.
    #[error(transparent)]
    Io(#[from] FsPathError),
    /// app.toml is not valid.
    #[error("{path}: {msg}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

/// Where `tallyd init` puts the EVM relay key, under the home.
pub const DEFAULT_EVM_KEY_FILE: &str = "config/relay_evm_key.hex";

/// The contents of `config/app.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AppConfig {
    /// Where the ABCI server listens (CometBFT's `proxy_app` points here).
    pub abci_listen: String,
    /// The RocksDB directory, relative to the home dir unless absolute.
    pub db_dir: String,
    /// `text` or `json`.
    pub log_format: String,
    /// A tracing filter, e.g. `info` or `tally=debug,info`.
    pub log_level: String,
    /// This validator's threshold key share, relative to the home dir
    /// unless absolute; a node without it does not sign.
    pub bls_share: String,
    /// Hub RPC endpoints for the relay (empty: no relay): CometBFT RPC
    /// for the reference hub, an EVM chain's JSON-RPC for the EVM hub.
    pub hub_endpoints: Vec<String>,
    /// The kind of hub the relay talks to: `tally` (the reference hub
    /// chain) or `evm` (the hub contract on an EVM chain, named by the
    /// chain's `hub_chain` parameter).
    pub hub_kind: String,
    /// The EVM hub's tip: `latest` or `finalized`.
    pub evm_tip: String,
    /// The EVM relay's secp256k1 key (hex, 0600), relative to the home
    /// dir unless absolute: it signs and pays for this relay's
    /// transactions to the EVM hub.
    pub evm_key_file: String,
    /// Hub blocks a settlement must be under before the relay reports it.
    pub hub_confirmations: u64,
    /// Seconds between signer ranks when submitting a batch.
    pub relay_stagger_secs: u64,
    /// Where the relay serves Prometheus metrics (empty: not served).
    pub metrics_listen: String,
    /// Prefix of metric names.
    pub metrics_prefix: String,
    /// Heights whose state this node keeps provable (`abci_query` with a
    /// `height`); older versions of the Merkle tree are pruned a bounded
    /// amount per block. 0 keeps every height (an archive node).
    pub state_retain_versions: u64,
    /// Heights between state-sync snapshots (0: this node takes none).
    pub snapshot_interval: u64,
    /// How many of the newest snapshots are kept.
    pub snapshot_keep_recent: u32,
    /// Where snapshots are written, relative to the home dir unless absolute.
    pub snapshot_dir: String,
    /// This node's CometBFT RPC, where the DKG participant sends its
    /// messages (empty: `[rpc] laddr` of config.toml).
    pub cometbft_rpc: String,
    /// The `[relay]` section: the relay's tuning.
    pub relay: RelaySettings,
}

/// The `[relay]` section of app.toml: the relay's tuning knobs. Missing
/// keys take the values the relay ran with before they were settings;
/// [`RelaySettings::validate`] checks each against [`RelaySettings::RANGES`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelaySettings {
    /// Milliseconds between reads of the chain and the hub.
    pub poll_interval_ms: u64,
    /// Consecutive failed calls that open a hub endpoint's circuit breaker.
    pub breaker_failures: u32,
    /// Seconds an open breaker skips its endpoint before probing it.
    pub breaker_open_secs: u64,
    /// Probe calls a half-open breaker lets through.
    pub breaker_probes: u32,
    /// Seconds to connect to a hub endpoint (reads).
    pub hub_connect_timeout_secs: u64,
    /// Seconds one hub read (tip, deposits, settlement) may take.
    pub hub_read_timeout_secs: u64,
    /// Retries of one submission, shared by all hub endpoints.
    pub submit_retry_budget: u32,
    /// Seconds one submission try may take.
    pub submit_try_timeout_secs: u64,
    /// Seconds after a submission's first try when no new try starts.
    pub submit_max_elapsed_secs: u64,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Default for RelaySettings {
    fn default() -> Self {
        let r = RelayConfig::new(Vec::new());
        Self {
            poll_interval_ms: millis(r.poll),
            breaker_failures: r.breaker.failure_threshold,
            breaker_open_secs: r.breaker.open_for.as_secs(),
            breaker_probes: r.breaker.probes,
            hub_connect_timeout_secs: r.hub_timeouts.connect.as_secs(),
            hub_read_timeout_secs: r.hub_timeouts.read.as_secs(),
            submit_retry_budget: r.policy.budget,
            submit_try_timeout_secs: r.policy.per_try_timeout.as_secs(),
            submit_max_elapsed_secs: r.policy.max_elapsed.as_secs(),
        }
    }
}

impl RelaySettings {
    /// Each key of the section and its allowed range (inclusive).
    pub const RANGES: [(&'static str, u64, u64); 9] = [
        ("poll_interval_ms", 50, 60_000),
        ("breaker_failures", 1, 100),
        ("breaker_open_secs", 1, 3_600),
        ("breaker_probes", 1, 100),
        ("hub_connect_timeout_secs", 1, 60),
        ("hub_read_timeout_secs", 1, 300),
        ("submit_retry_budget", 0, 100),
        ("submit_try_timeout_secs", 1, 600),
        ("submit_max_elapsed_secs", 1, 3_600),
    ];

    /// The values, in the order of [`RelaySettings::RANGES`].
    fn values(&self) -> [u64; 9] {
        [
            self.poll_interval_ms,
            self.breaker_failures.into(),
            self.breaker_open_secs,
            self.breaker_probes.into(),
            self.hub_connect_timeout_secs,
            self.hub_read_timeout_secs,
            self.submit_retry_budget.into(),
            self.submit_try_timeout_secs,
            self.submit_max_elapsed_secs,
        ]
    }

    /// Checks every key against its range; the error names the first key
    /// out of range, its allowed range and the value found.
    pub fn validate(&self) -> Result<(), String> {
        for ((key, lo, hi), v) in Self::RANGES.into_iter().zip(self.values()) {
            if !(lo..=hi).contains(&v) {
                return Err(format!(
                    "relay.{key} must be between {lo} and {hi}, got {v}"
                ));
            }
        }
        Ok(())
    }
}

impl Default for AppConfig {
    fn default() -> Self {
        Self {
            abci_listen: "127.0.0.1:26658".into(),
            db_dir: "data/tally.db".into(),
            log_format: "text".into(),
            log_level: "info".into(),
            bls_share: "config/bls_share.json".into(),
            hub_endpoints: Vec::new(),
            hub_kind: "tally".into(),
            evm_tip: "latest".into(),
            evm_key_file: DEFAULT_EVM_KEY_FILE.into(),
            hub_confirmations: 1,
            relay_stagger_secs: 2,
            metrics_listen: String::new(),
            metrics_prefix: "tally".into(),
            state_retain_versions: tally_store::DEFAULT_RETAIN_VERSIONS,
            snapshot_interval: 1000,
            snapshot_keep_recent: 2,
            snapshot_dir: "data/snapshots".into(),
            cometbft_rpc: String::new(),
            relay: RelaySettings::default(),
        }
    }
}

impl AppConfig {
    /// `<home>/config/app.toml`.
    pub fn path(home: &Path) -> PathBuf {
        home.join("config").join("app.toml")
    }

    /// Reads app.toml; a missing file gives the defaults.
    pub fn load(home: &Path) -> Result<Self, ConfigError> {
        let path = Self::path(home);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => return Err(FsPathError::new(FsOp::Read, path, source).into()),
        };
        let cfg: AppConfig = toml::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        if !matches!(cfg.log_format.as_str(), "text" | "json") {
            return Err(ConfigError::Invalid {
                path,
                msg: format!(
                    "log_format must be \"text\" or \"json\", got {:?}",
                    cfg.log_format
                ),
            });
        }
        if let Err(msg) = cfg.check_hub() {
            return Err(ConfigError::Invalid { path, msg });
        }
        if !(1..=100).contains(&cfg.snapshot_keep_recent) {
            return Err(ConfigError::Invalid {
                path,
                msg: format!(
                    "snapshot_keep_recent must be between 1 and 100, got {}",
                    cfg.snapshot_keep_recent
                ),
            });
        }
        cfg.relay
            .validate()
            .map_err(|msg| ConfigError::Invalid { path, msg })?;
        Ok(cfg)
    }

    /// Writes app.toml with comments.
    pub fn save(&self, home: &Path) -> Result<(), ConfigError> {
        let path = Self::path(home);
        let body = format!(
            "# Tally application settings (CometBFT's own are in config.toml).\n\
             \n\
             # ABCI server address; CometBFT's proxy_app must point here.\n\
             abci_listen = {:?}\n\
             # RocksDB directory, relative to the home directory unless absolute.\n\
             db_dir = {:?}\n\
             # Log output: \"text\" or \"json\".\n\
             log_format = {:?}\n\
             # Log filter (tracing EnvFilter syntax), e.g. \"info\" or \"tally_abci=debug,info\".\n\
             log_level = {:?}\n\
             # This validator's threshold BLS key share (from `tallyd dkg dealer`).\n\
             bls_share = {:?}\n\
             # Relay: hub RPC endpoints (failover order); empty disables the relay.\n\
             hub_endpoints = {:?}\n\
             # The hub: \"tally\" (the reference hub chain; CometBFT RPC endpoints) or \"evm\"\n\
             # (the hub contract the chain's hub_chain names; EVM JSON-RPC endpoints).\n\
             hub_kind = {:?}\n\
             # EVM hub: the block that is its tip, \"latest\" or \"finalized\".\n\
             evm_tip = {:?}\n\
             # EVM hub: this relay's secp256k1 key (hex, mode 0600; `tallyd init` makes it);\n\
             # fund its address (`tallyd keys relay-address`): the relay pays its own gas.\n\
             evm_key_file = {:?}\n\
             # Hub blocks a settlement must be under before it is reported.\n\
             hub_confirmations = {}\n\
             # Seconds between signer ranks when submitting a batch to the hub.\n\
             relay_stagger_secs = {}\n\
             # Prometheus metrics of the relay (empty: off), and the name prefix.\n\
             metrics_listen = {:?}\n\
             metrics_prefix = {:?}\n\
             # Heights of Merkle-tree history kept provable (0: all, an archive node).\n\
             state_retain_versions = {}\n\
             # State sync: heights between snapshots this node takes and serves (0: none),\n\
             # how many of the newest it keeps, and where (relative to the home directory).\n\
             snapshot_interval = {}\n\
             snapshot_keep_recent = {}\n\
             snapshot_dir = {:?}\n\
             # This node's CometBFT RPC, where the DKG participant sends its messages\n\
             # (empty: [rpc] laddr of config.toml).\n\
             cometbft_rpc = {:?}\n\
             \n\
             # Relay tuning; each value is checked at start (allowed range in brackets).\n\
             [relay]\n\
             # Milliseconds between reads of the chain and the hub [50, 60000].\n\
             poll_interval_ms = {}\n\
             # Consecutive failed calls that open a hub endpoint's circuit breaker [1, 100].\n\
             breaker_failures = {}\n\
             # Seconds an open breaker skips its endpoint before probing it [1, 3600].\n\
             breaker_open_secs = {}\n\
             # Probe calls a half-open breaker lets through [1, 100].\n\
             breaker_probes = {}\n\
             # Seconds to connect to a hub endpoint for a read [1, 60].\n\
             hub_connect_timeout_secs = {}\n\
             # Seconds one hub read (tip, deposits, settlement) may take [1, 300].\n\
             hub_read_timeout_secs = {}\n\
             # Retries of one batch submission, shared by all hub endpoints [0, 100].\n\
             submit_retry_budget = {}\n\
             # Seconds one submission try may take [1, 600].\n\
             submit_try_timeout_secs = {}\n\
             # Seconds after a submission's first try when no new try starts [1, 3600].\n\
             submit_max_elapsed_secs = {}\n",
            self.abci_listen,
            self.db_dir,
            self.log_format,
            self.log_level,
            self.bls_share,
            self.hub_endpoints,
            self.hub_kind,
            self.evm_tip,
            self.evm_key_file,
            self.hub_confirmations,
            self.relay_stagger_secs,
            self.metrics_listen,
            self.metrics_prefix,
            self.state_retain_versions,
            self.snapshot_interval,
            self.snapshot_keep_recent,
            self.snapshot_dir,
            self.cometbft_rpc,
            self.relay.poll_interval_ms,
            self.relay.breaker_failures,
            self.relay.breaker_open_secs,
            self.relay.breaker_probes,
            self.relay.hub_connect_timeout_secs,
            self.relay.hub_read_timeout_secs,
            self.relay.submit_retry_budget,
            self.relay.submit_try_timeout_secs,
            self.relay.submit_max_elapsed_secs,
        );
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(FsPathError::of(FsOp::CreateDir, dir))?;
        }
        // Hub endpoint URLs often carry API keys: the file is a secret (0600,
        // written atomically).
        crate::secret::write_secret(&path, body.as_bytes(), crate::secret::Existing::Replace)
            .map_err(|source| FsPathError::new(FsOp::Write, path, source).into())
    }

    /// Checks `hub_kind` and `evm_tip`; the message names the key.
    fn check_hub(&self) -> Result<(), String> {
        if !matches!(self.hub_kind.as_str(), "tally" | "evm") {
            return Err(format!(
                "hub_kind must be \"tally\" or \"evm\", got {:?}",
                self.hub_kind
            ));
        }
        if !matches!(self.evm_tip.as_str(), "latest" | "finalized") {
            return Err(format!(
                "evm_tip must be \"latest\" or \"finalized\", got {:?}",
                self.evm_tip
            ));
        }
        if self.evm_key_file.is_empty() {
            return Err("evm_key_file must name a file".into());
        }
        Ok(())
    }

    /// The EVM relay key file, resolved against `home`.
    pub fn evm_key_path(&self, home: &Path) -> PathBuf {
        let p = Path::new(&self.evm_key_file);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            home.join(p)
        }
    }

    /// The share file, resolved against `home`.
    pub fn share_path(&self, home: &Path) -> PathBuf {
        let p = Path::new(&self.bls_share);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            home.join(p)
        }
    }

    /// The relay's configuration for a validator of signer `rank` (`None`:
    /// no key share, never submits) whose home is `home`.
    pub fn relay_config(&self, home: &Path, rank: Option<u32>) -> RelayConfig {
        let r = &self.relay;
        let mut c = RelayConfig::new(self.hub_endpoints.clone());
        if self.hub_kind == "evm" {
            c.hub = HubKind::Evm(EvmConfig {
                tip: match self.evm_tip.as_str() {
                    "finalized" => EvmTip::Finalized,
                    _ => EvmTip::Latest,
                },
                key_file: self.evm_key_path(home),
            });
        }
        c.confirmations = self.hub_confirmations;
        c.rank = rank;
        c.stagger = Duration::from_secs(self.relay_stagger_secs);
        c.poll = Duration::from_millis(r.poll_interval_ms);
        c.policy = RetryPolicy {
            budget: r.submit_retry_budget,
            per_try_timeout: Duration::from_secs(r.submit_try_timeout_secs),
            max_elapsed: Duration::from_secs(r.submit_max_elapsed_secs),
            ..RetryPolicy::default()
        };
        c.breaker = BreakerConfig {
            failure_threshold: r.breaker_failures,
            open_for: Duration::from_secs(r.breaker_open_secs),
            probes: r.breaker_probes,
        };
        c.hub_timeouts = HubTimeouts {
            connect: Duration::from_secs(r.hub_connect_timeout_secs),
            read: Duration::from_secs(r.hub_read_timeout_secs),
        };
        c
    }

    /// The snapshot directory, resolved against `home`.
    pub fn snapshot_path(&self, home: &Path) -> PathBuf {
        let p = Path::new(&self.snapshot_dir);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            home.join(p)
        }
    }

    /// The database directory, resolved against `home`.
    pub fn db_path(&self, home: &Path) -> PathBuf {
        let p = Path::new(&self.db_dir);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            home.join(p)
        }
    }
}

#[cfg(test)]
mod tests;

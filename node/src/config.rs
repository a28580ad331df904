//! `config/app.toml`: Tally's own settings, beside CometBFT's `config.toml`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors reading or writing the home directory.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// app.toml is not valid.
    #[error("{path}: {msg}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

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
    /// Hub CometBFT RPC endpoints for the relay (empty: no relay).
    pub hub_endpoints: Vec<String>,
    /// Hub blocks a settlement must be under before the relay reports it.
    pub hub_confirmations: u64,
    /// Seconds between signer ranks when submitting a batch.
    pub relay_stagger_secs: u64,
    /// Where the relay serves Prometheus metrics (empty: not served).
    pub metrics_listen: String,
    /// Prefix of metric names.
    pub metrics_prefix: String,
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
            hub_confirmations: 1,
            relay_stagger_secs: 2,
            metrics_listen: String::new(),
            metrics_prefix: "tally".into(),
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
            Err(source) => return Err(ConfigError::Io { path, source }),
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
             # Relay: hub CometBFT RPC endpoints (failover order); empty disables the relay.\n\
             hub_endpoints = {:?}\n\
             # Hub blocks a settlement must be under before it is reported.\n\
             hub_confirmations = {}\n\
             # Seconds between signer ranks when submitting a batch to the hub.\n\
             relay_stagger_secs = {}\n\
             # Prometheus metrics of the relay (empty: off), and the name prefix.\n\
             metrics_listen = {:?}\n\
             metrics_prefix = {:?}\n",
            self.abci_listen,
            self.db_dir,
            self.log_format,
            self.log_level,
            self.bls_share,
            self.hub_endpoints,
            self.hub_confirmations,
            self.relay_stagger_secs,
            self.metrics_listen,
            self.metrics_prefix
        );
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ConfigError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&path, body).map_err(|source| ConfigError::Io { path, source })
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
mod tests {
    use super::*;

    #[test]
    fn save_then_load_roundtrips_and_bad_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = AppConfig {
            abci_listen: "127.0.0.1:1".into(),
            ..AppConfig::default()
        };
        cfg.save(dir.path()).unwrap();
        assert_eq!(AppConfig::load(dir.path()).unwrap(), cfg);
        std::fs::write(AppConfig::path(dir.path()), "log_format = \"xml\"\n").unwrap();
        let e = AppConfig::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("log_format"), "{e}");
        std::fs::write(AppConfig::path(dir.path()), "nope = 1\n").unwrap();
        assert!(AppConfig::load(dir.path()).is_err());
    }
}

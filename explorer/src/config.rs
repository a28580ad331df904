//! The explorer's settings ([`Config`]), checked before anything is served.

use tally_settlement::ident;

/// Longest refresh period, in seconds.
pub const MAX_REFRESH_SECS: u64 = 3600;

/// What `tallyd explorer` was started with, for the page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// The node's RPC URL, credentials hidden (shown on the page).
    pub node: String,
    /// Providers the page shows when its URL names none.
    pub providers: Vec<String>,
    /// The hub chain whose pipeline is shown (`None`: the chain's
    /// `hub_chain` parameter).
    pub chain: Option<String>,
    /// Seconds between the page's refreshes (0: never).
    pub refresh_secs: u64,
}

/// A setting the explorer refuses, named by its `tallyd explorer` flag.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A provider or chain that is not a valid name.
    #[error("--{flag}: {log}")]
    Name {
        /// `provider` or `chain`.
        flag: &'static str,
        /// Why.
        log: String,
    },
    /// A refresh period over [`MAX_REFRESH_SECS`].
    #[error("--refresh-secs must be 0..={MAX_REFRESH_SECS}, got {0}")]
    Refresh(u64),
    /// A node URL that is not HTTP(S) (shown with its credentials hidden).
    #[error("--node must be an http:// or https:// URL, got {0:?}")]
    NodeUrl(String),
}

impl Config {
    /// The settings for `node`'s page, checked; the node's credentials are
    /// hidden in what the page shows.
    pub fn new(
        node: &str,
        providers: Vec<String>,
        chain: Option<String>,
        refresh_secs: u64,
    ) -> Result<Self, ConfigError> {
        for p in &providers {
            ident::check_party("provider", p).map_err(|r| ConfigError::Name {
                flag: "provider",
                log: r.log,
            })?;
        }
        if let Some(c) = &chain {
            ident::check_party("chain", c).map_err(|r| ConfigError::Name {
                flag: "chain",
                log: r.log,
            })?;
        }
        if refresh_secs > MAX_REFRESH_SECS {
            return Err(ConfigError::Refresh(refresh_secs));
        }
        if !(node.starts_with("http://") || node.starts_with("https://")) {
            return Err(ConfigError::NodeUrl(tally_client::redact_url(node)));
        }
        Ok(Config {
            node: tally_client::redact_url(node),
            providers,
            chain,
            refresh_secs,
        })
    }
}

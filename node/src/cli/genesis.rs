//! `tallyd genesis ...`: edit the `app_state` of `config/genesis.json`, and
//! the read-modify-validate-write helper `dkg dealer` shares.

use std::path::Path;

use crate::keyfile;
use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use serde_json::Value;
use tally_settlement::{AllowanceEntry, BalanceEntry, GatewayEntry, Genesis, UserEntry};

use super::{Command, Context};

/// Edit the app_state of config/genesis.json.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum GenesisCommand {
    /// Register a gateway key.
    AddGateway(AddGatewayCommand),
    /// Give a user a starting balance (refused when the genesis has a
    /// threshold key: then balances come only from hub deposits).
    Fund(FundCommand),
    /// Register a user's key (the user signs its allowance changes with it).
    AddUser(AddUserCommand),
    /// Give a gateway an allowance from a user, in force from genesis.
    Allow(AllowCommand),
    /// Set a chain parameter (e.g. settlement_window_secs 60, hub_chain hub).
    SetParam(SetParamCommand),
    /// Set the app version the chain starts at (CometBFT's
    /// `consensus_params.version.app`; 1 to the newest this binary
    /// carries). New features come with new versions (ADR 0019, 0020).
    SetAppVersion(SetAppVersionCommand),
    /// Check the app_state.
    Validate,
}

/// `genesis set-app-version [N]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct SetAppVersionCommand {
    /// The version (default: the newest this binary carries).
    pub version: Option<u64>,
}

/// Writes `version` as the app version `path`'s chain starts at.
fn set_app_version(path: &Path, version: u64) -> anyhow::Result<()> {
    let max = tally_settlement::upgrade::LATEST_APP_VERSION;
    if !(1..=max).contains(&version) {
        bail!("app version {version}: this binary carries versions 1 to {max}");
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut doc: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    // CometBFT writes 64-bit integers in genesis as strings.
    doc["consensus_params"]["version"]["app"] = Value::from(version.to_string());
    std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

impl Command for GenesisCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let path = ctx.genesis_path();
        if let Self::SetAppVersion(c) = self {
            return set_app_version(
                &path,
                c.version
                    .unwrap_or(tally_settlement::upgrade::LATEST_APP_VERSION),
            );
        }
        update_genesis(&path, |g| match self {
            Self::AddGateway(c) => c.apply(g, ctx.home()),
            Self::Fund(c) => c.apply(g),
            Self::AddUser(c) => c.apply(g, ctx.home()),
            Self::Allow(c) => c.apply(g),
            Self::SetParam(c) => c.apply(g),
            Self::SetAppVersion(_) => Ok(false),
            Self::Validate => {
                g.validate()?;
                g.check_hub_funding()?;
                println!("{}: app_state is valid", path.display());
                Ok(false)
            }
        })
    }
}

/// A public key given as hex or read from a key file.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct KeySource {
    /// Hex ed25519 public key.
    #[arg(long, conflicts_with = "key")]
    pub pubkey: Option<String>,
    /// A key name or key file.
    #[arg(long)]
    pub key: Option<String>,
}

impl KeySource {
    /// The hex public key.
    pub(crate) fn pubkey(self, home: &Path) -> anyhow::Result<String> {
        match (self.pubkey, self.key) {
            (Some(p), None) => Ok(p),
            (None, Some(k)) => {
                let (_, key) = keyfile::load(&keyfile::resolve(home, &k))?;
                Ok(hex::encode(key.verifying_key().to_bytes()))
            }
            _ => bail!("give --pubkey HEX or --key NAME|FILE"),
        }
    }
}

/// `genesis add-gateway --name N (--pubkey HEX | --key NAME|FILE)`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct AddGatewayCommand {
    /// The gateway's name.
    #[arg(long)]
    pub name: String,
    /// Its key.
    #[command(flatten)]
    pub key: KeySource,
}

impl AddGatewayCommand {
    /// Registers the key (replacing an entry with the same key).
    fn apply(self, g: &mut Genesis, home: &Path) -> anyhow::Result<bool> {
        let pubkey = self.key.pubkey(home)?;
        g.gateways.retain(|gw| gw.pubkey != pubkey);
        g.gateways.push(GatewayEntry {
            name: self.name,
            pubkey,
        });
        Ok(true)
    }
}

/// `genesis fund --user U --amount N`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct FundCommand {
    /// The user.
    #[arg(long)]
    pub user: String,
    /// Starting balance in credits.
    #[arg(long)]
    pub amount: u64,
}

impl FundCommand {
    /// Sets the user's balance (replacing an earlier entry).
    fn apply(self, g: &mut Genesis) -> anyhow::Result<bool> {
        g.balances.retain(|b| b.user != self.user);
        g.balances.push(BalanceEntry {
            user: self.user,
            amount: self.amount,
        });
        Ok(true)
    }
}

/// `genesis add-user --name U (--pubkey HEX | --key NAME|FILE)`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct AddUserCommand {
    /// The user's name (as in usage records).
    #[arg(long)]
    pub name: String,
    /// Its key.
    #[command(flatten)]
    pub key: KeySource,
}

impl AddUserCommand {
    /// Registers the key (replacing the user's earlier entry).
    fn apply(self, g: &mut Genesis, home: &Path) -> anyhow::Result<bool> {
        let pubkey = self.key.pubkey(home)?;
        g.users.retain(|u| u.name != self.name);
        g.users.push(UserEntry {
            name: self.name,
            pubkey,
        });
        Ok(true)
    }
}

/// `genesis allow --user U --gateway G --max-per-window N --expires-at T`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct AllowCommand {
    /// The user.
    #[arg(long)]
    pub user: String,
    /// The gateway's name (as given to add-gateway).
    #[arg(long)]
    pub gateway: String,
    /// Most credits per settlement window.
    #[arg(long)]
    pub max_per_window: u64,
    /// Unix seconds (block time) from which it lapses.
    #[arg(long)]
    pub expires_at: u64,
}

impl AllowCommand {
    /// Sets the allowance (replacing an earlier one for the same pair).
    fn apply(self, g: &mut Genesis) -> anyhow::Result<bool> {
        g.allowances
            .retain(|a| !(a.user == self.user && a.gateway == self.gateway));
        g.allowances.push(AllowanceEntry {
            user: self.user,
            gateway: self.gateway,
            max_per_window: self.max_per_window,
            expires_at: self.expires_at,
        });
        Ok(true)
    }
}

/// `genesis set-param NAME VALUE`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct SetParamCommand {
    /// Parameter name, as in the app_state's `params`.
    pub name: String,
    /// New value: a number or a string, as the parameter takes.
    pub value: String,
}

impl SetParamCommand {
    /// Replaces one parameter, keeping its JSON type.
    fn apply(self, g: &mut Genesis) -> anyhow::Result<bool> {
        let Self { name, value } = self;
        let mut params = g.params.to_json();
        let slot = params.get_mut(&name).with_context(|| {
            format!(
                "no parameter {name:?}; known: {}",
                g.params
                    .to_json()
                    .as_object()
                    .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            )
        })?;
        *slot = match value.parse::<u64>() {
            Ok(n) if slot.is_number() => Value::from(n),
            _ if slot.is_string() => Value::from(value),
            _ => bail!("parameter {name:?} takes a number, got {value:?}"),
        };
        g.params = serde_json::from_value(params)?;
        Ok(true)
    }
}

/// A genesis file's `app_state` (`null` when it has none).
pub fn read_app_state(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    Ok(doc.get("app_state").cloned().unwrap_or(Value::Null))
}

/// Reads a genesis file's app_state, lets `f` change it, validates and
/// writes it back (unless `f` returns false).
pub fn update_genesis(
    path: &Path,
    f: impl FnOnce(&mut Genesis) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
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
    g.check_hub_funding()?;
    doc["app_state"] = serde_json::to_value(&g)?;
    std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cli::{parse, Commands};
    use clap::error::ErrorKind;

    fn genesis(args: &[&str]) -> Result<GenesisCommand, clap::Error> {
        match parse(args)?.command {
            Commands::Genesis(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses() {
        assert_eq!(
            genesis(&["genesis", "add-gateway", "--name", "gw", "--key", "gw.key"]).unwrap(),
            GenesisCommand::AddGateway(AddGatewayCommand {
                name: "gw".into(),
                key: KeySource {
                    pubkey: None,
                    key: Some("gw.key".into()),
                },
            })
        );
        assert_eq!(
            genesis(&["genesis", "fund", "--user", "alice", "--amount", "1000000"]).unwrap(),
            GenesisCommand::Fund(FundCommand {
                user: "alice".into(),
                amount: 1_000_000,
            })
        );
        assert_eq!(
            genesis(&["genesis", "set-param", "settlement_window_secs", "60"]).unwrap(),
            GenesisCommand::SetParam(SetParamCommand {
                name: "settlement_window_secs".into(),
                value: "60".into(),
            })
        );
        assert_eq!(
            genesis(&["genesis", "validate"]).unwrap(),
            GenesisCommand::Validate
        );
        for (bad, kind) in [
            (
                &[
                    "genesis",
                    "add-gateway",
                    "--name",
                    "g",
                    "--pubkey",
                    "ab",
                    "--key",
                    "k",
                ][..],
                ErrorKind::ArgumentConflict,
            ),
            (
                &["genesis", "add-gateway", "--key", "k"],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["genesis", "fund", "--user", "a"],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["genesis", "fund", "--user", "a", "--amount", "-5"],
                ErrorKind::UnknownArgument,
            ),
            (
                &["genesis", "fund", "--user", "a", "--amount", "lots"],
                ErrorKind::ValueValidation,
            ),
            (
                &["genesis", "set-param", "x"],
                ErrorKind::MissingRequiredArgument,
            ),
        ] {
            assert_eq!(genesis(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
    }

    #[test]
    fn edits_keep_the_rest_of_the_file_and_validate() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context {
            home: dir.path().to_path_buf(),
        };
        std::fs::create_dir_all(dir.path().join("config")).unwrap();
        std::fs::write(
            ctx.genesis_path(),
            r#"{"chain_id": "c", "app_state": null}"#,
        )
        .unwrap();
        let run = |args: &[&str]| genesis(args).unwrap().execute(&ctx);
        run(&["genesis", "fund", "--user", "alice", "--amount", "5"]).unwrap();
        run(&["genesis", "fund", "--user", "alice", "--amount", "7"]).unwrap();
        run(&["genesis", "set-param", "settlement_window_secs", "60"]).unwrap();
        let e = run(&["genesis", "set-param", "nope", "1"]).unwrap_err();
        assert!(e.to_string().contains("no parameter \"nope\""), "{e}");
        let e = run(&["genesis", "add-gateway", "--name", "g"]).unwrap_err();
        assert!(e.to_string().contains("--pubkey HEX"), "{e}");
        run(&["genesis", "validate"]).unwrap();
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(ctx.genesis_path()).unwrap()).unwrap();
        assert_eq!(doc["chain_id"], "c");
        assert_eq!(
            doc["app_state"]["balances"],
            serde_json::json!([{"user": "alice", "amount": 7}])
        );
        assert_eq!(doc["app_state"]["params"]["settlement_window_secs"], 60);
    }

    /// Writes a CometBFT-style priv_validator_key.json for `seed` into
    /// `home` and returns the public key.
    pub(crate) fn write_consensus_key(home: &Path, seed: [u8; 32]) -> [u8; 32] {
        use base64::Engine as _;
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        let pk = key.verifying_key().to_bytes();
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut private = seed.to_vec();
        private.extend_from_slice(&pk);
        std::fs::create_dir_all(home.join("config")).unwrap();
        std::fs::write(
            home.join("config").join("priv_validator_key.json"),
            serde_json::json!({
                "address": hex::encode_upper(tally_settlement::dkg::address_of(&pk)),
                "pub_key": {"type": "tendermint/PubKeyEd25519", "value": b64(&pk)},
                "priv_key": {"type": "tendermint/PrivKeyEd25519", "value": b64(&private)},
            })
            .to_string(),
        )
        .unwrap();
        pk
    }
}

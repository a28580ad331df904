//! `tallyd tx allowance grant|revoke`: a user lets a gateway charge it (at
//! most so much per settlement window, until an expiry) or takes that back,
//! signing with its own key (`tallyd query allowances` reads what a user
//! allowed: [`super::query::allowances`]).

use crate::keyfile;
use crate::rpc::Rpc;
use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use tally_settlement::proto::AllowanceChange;
use tally_settlement::{query_path, sign_allowance, Code};

use super::args::QueryOpts;
use super::query::query_json;
use super::{Command, Context};

/// A user's allowances for gateways.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum AllowanceCommand {
    /// Let a gateway charge the user up to --max-per-window credits per
    /// settlement window until the expiry (replaces an earlier allowance).
    Grant(GrantCommand),
    /// Take a gateway's allowance back: its reports for this user are
    /// refused from the next block on.
    Revoke(RevokeCommand),
}

impl Command for AllowanceCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Grant(c) => c.execute(ctx),
            Self::Revoke(c) => c.execute(ctx),
        }
    }
}

/// Who signs, for which gateway, where to send.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct Signer {
    /// The user's key: a name in <home>/keys or a key file path. Its
    /// public key must be the one registered for --user.
    #[arg(long)]
    pub from: String,
    /// The user (as in usage records).
    #[arg(long)]
    pub user: String,
    /// The gateway's registered name (`tallyd query gateways`).
    #[arg(long)]
    pub gateway: String,
    /// Sequence of this change; by default one above the user's last
    /// (read from the node).
    #[arg(long)]
    pub sequence: Option<u64>,
    /// Nodes and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

/// `tx allowance grant --from KEY --user U --gateway G --max-per-window N
/// (--expires-in SECS | --expires-at UNIX)`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct GrantCommand {
    /// Who signs, for which gateway.
    #[command(flatten)]
    pub signer: Signer,
    /// Most credits per settlement window (above 0).
    #[arg(long)]
    pub max_per_window: u64,
    /// Seconds from now (this machine's clock) until it lapses.
    #[arg(long, conflicts_with = "expires_at")]
    pub expires_in: Option<u64>,
    /// Unix seconds (block time) from which it lapses.
    #[arg(long)]
    pub expires_at: Option<u64>,
}

impl Command for GrantCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        if self.max_per_window == 0 {
            bail!("--max-per-window must be above 0 (use `tx allowance revoke` to take an allowance back)");
        }
        let expires_at = match (self.expires_in, self.expires_at) {
            (Some(secs), None) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .context("the clock is before 1970")?
                    .as_secs();
                now.checked_add(secs).context("--expires-in is too large")?
            }
            (None, Some(at)) => at,
            _ => bail!("give --expires-in SECS or --expires-at UNIX_SECONDS"),
        };
        send(ctx, &self.signer, self.max_per_window, expires_at)
    }
}

/// `tx allowance revoke --from KEY --user U --gateway G`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct RevokeCommand {
    /// Who signs, for which gateway.
    #[command(flatten)]
    pub signer: Signer,
}

impl Command for RevokeCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        send(ctx, &self.signer, 0, 0)
    }
}

/// A user about to sign: a node that answers, the chain id, the user's
/// key (checked against the one the chain holds) and the sequence to sign.
pub(super) struct UserSession {
    /// The node.
    pub rpc: Rpc,
    /// Its chain id.
    pub chain_id: String,
    /// The user's key.
    pub key: ed25519_dalek::SigningKey,
    /// `sequence`, or the chain's last for the user + 1.
    pub sequence: u64,
}

/// Loads `from` (a key name in `home` or a file), finds a node of `node`
/// that answers and checks that `user`'s key on the chain is that key.
pub(super) fn user_session(
    home: &std::path::Path,
    from: &str,
    user: &str,
    sequence: Option<u64>,
    node: &QueryOpts,
) -> anyhow::Result<UserSession> {
    let (_, key) = keyfile::load(&keyfile::resolve(home, from))?;
    let rpc = node
        .node
        .endpoints()
        .iter()
        .map(|e| Rpc::new(e))
        .find(|r| r.status().is_ok())
        .with_context(|| format!("no node answers at {}", node.node.display()))?;
    let chain_id = rpc.status()?.chain_id;
    let state = query_json(&rpc, &query_path::allowances(user).to_string())?;
    let mine = hex::encode(key.verifying_key().to_bytes());
    match state["key"].as_str() {
        None => bail!(
            "user {user} has no key on this chain (genesis `users`, or the hub deposit that first funds it, binds one)"
        ),
        Some(k) if k != mine => bail!("{from} holds key {mine}, but user {user} has key {k}"),
        Some(_) => {}
    }
    let sequence = match sequence {
        Some(n) => n,
        None => state["sequence"]
            .as_u64()
            .context("the node's answer has no sequence")?
            .checked_add(1)
            .context("sequence overflow")?,
    };
    Ok(UserSession {
        rpc,
        chain_id,
        key,
        sequence,
    })
}

/// Signs the change and sends it, waiting for its block.
fn send(ctx: &Context, s: &Signer, max_per_window: u64, expires_at: u64) -> anyhow::Result<()> {
    let UserSession {
        rpc,
        chain_id,
        key,
        sequence,
    } = user_session(ctx.home(), &s.from, &s.user, s.sequence, &s.node)?;
    let change = AllowanceChange {
        chain_id,
        user: s.user.clone(),
        gateway: s.gateway.clone(),
        max_per_window,
        expires_at,
        sequence,
    };
    let c = rpc.broadcast_tx_commit(&sign_allowance(&key, &change))?;
    let code = c.final_code();
    if code != 0 {
        let name = Code::from_value(code).map(Code::name).unwrap_or("?");
        bail!("refused: code {code} ({name}): {}", c.final_log());
    }
    let what = if max_per_window == 0 {
        format!("revoked the allowance of gateway {}", s.gateway)
    } else {
        format!(
            "gateway {} may charge up to {max_per_window} credits per window until {expires_at}",
            s.gateway
        )
    };
    println!("{}: {what} (sequence {sequence})", s.user);
    Ok(())
}

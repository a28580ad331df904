//! `tallyd tx withdraw` and `tallyd tx user-key`: what a user signs with
//! its own key besides allowances (ADR 0020, app version 3). A withdrawal
//! takes unspent credits back: the chain escrows them as a hub call that
//! the validators threshold-sign in a batch and the relay settles, paying
//! them to the user's hub account once (`tallyd query withdrawals USER`,
//! or the hub's `/withdrawn/{user}`). A key change replaces the user's key
//! with a new one, signed by the key in force.

use std::path::Path;

use crate::keyfile;
use anyhow::bail;
use clap::Args;
use tally_settlement::proto::{user_msg, UserKeyChange, UserMsg, Withdrawal};
use tally_settlement::user::sign_user_msg;
use tally_settlement::Code;

use super::allowance::{user_session, UserSession};
use super::args::QueryOpts;
use super::{Command, Context};

/// Who signs: the user and its key.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct UserSigner {
    /// The user's key in force: a name in <home>/keys or a key file path.
    #[arg(long)]
    pub from: String,
    /// The user.
    #[arg(long)]
    pub user: String,
    /// The sequence to sign (default: the chain's last for the user + 1).
    #[arg(long)]
    pub sequence: Option<u64>,
    /// Node and output format.
    #[command(flatten)]
    pub node: QueryOpts,
}

/// `tx withdraw --from KEY --user U --amount N`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct WithdrawCommand {
    /// Who signs.
    #[command(flatten)]
    pub signer: UserSigner,
    /// Credits to take back (at most the user's balance).
    #[arg(long)]
    pub amount: u64,
}

/// `tx user-key --from OLD --user U --new-key NEW`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct UserKeyCommand {
    /// Who signs (with the key in force).
    #[command(flatten)]
    pub signer: UserSigner,
    /// The new key: a name in <home>/keys or a key file path.
    #[arg(long)]
    pub new_key: String,
}

impl Command for WithdrawCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        if self.amount == 0 {
            bail!("--amount must be above 0");
        }
        let sum = user_msg::Sum::Withdraw(Withdrawal {
            amount: self.amount,
        });
        let (data, sequence) = send(ctx.home(), &self.signer, sum)?;
        let call = <[u8; 8]>::try_from(data.as_slice())
            .map(u64::from_be_bytes)
            .ok();
        println!(
            "{}: withdrawing {} credits as hub call {} (sequence {sequence}); `tallyd query withdrawals {}` shows when it settles",
            self.signer.user,
            self.amount,
            call.map_or("?".into(), |c| c.to_string()),
            self.signer.user
        );
        Ok(())
    }
}

impl Command for UserKeyCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let (_, new) = keyfile::load(&keyfile::resolve(ctx.home(), &self.new_key))?;
        let pubkey = new.verifying_key().to_bytes().to_vec();
        let sum = user_msg::Sum::Key(UserKeyChange {
            pubkey: pubkey.clone(),
        });
        let (_, sequence) = send(ctx.home(), &self.signer, sum)?;
        println!(
            "{}: key {} in force from now on (sequence {sequence})",
            self.signer.user,
            hex::encode(pubkey)
        );
        Ok(())
    }
}

/// Signs `sum` as `s.user` with `s.from` and sends it; the result's data
/// and the sequence it was signed with.
fn send(home: &Path, s: &UserSigner, sum: user_msg::Sum) -> anyhow::Result<(Vec<u8>, u64)> {
    let UserSession {
        rpc,
        chain_id,
        key,
        sequence,
    } = user_session(home, &s.from, &s.user, s.sequence, &s.node)?;
    let m = UserMsg {
        chain_id,
        user: s.user.clone(),
        sequence,
        sum: Some(sum),
    };
    let c = rpc.broadcast_tx_commit(&sign_user_msg(&key, &m))?;
    let code = c.final_code();
    if code != 0 {
        let name = Code::from_value(code).map(Code::name).unwrap_or("?");
        bail!("refused: code {code} ({name}): {}", c.final_log());
    }
    Ok((c.final_data().to_vec(), sequence))
}

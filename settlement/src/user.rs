//! Users after genesis (ADR 0020): what a user signs besides allowance
//! changes, from app version 3.
//!
//! A user's key is bound by genesis `users` or, for a user unknown at
//! genesis, by the hub deposit that first funds it ([`crate::sync::deposits`]).
//! With that key the user signs a [`UserMsg`] (domain `tally/user/v1\0`),
//! opened like every signed envelope by [`crate::envelope`]; its sequence
//! must be above the user's last one, a counter shared with allowance
//! changes, so no signed message can be replayed or reordered:
//!
//! - **key change**: the new key replaces the one that signed (a key
//!   never bound to this user before is not required; any valid ed25519
//!   key is taken). Event `user_key_changed`.
//! - **withdrawal** of `amount` credits: at most the user's balance (what
//!   reports charged is already taken from it, so nothing owed in an open
//!   window can leave). The balance drops at once and the credits become a
//!   pending hub call of kind 1 (`provider` empty, `window` the current
//!   one) with the next call id, escrowed like a payment: batched, signed
//!   and settled by the same path, retried through the same cooldown, and
//!   paid to the user's hub account exactly once (its batch nonce is paid
//!   once). The call id is also recorded under the user
//!   (`wd/<user>\0<call id>`, [`crate::state::withdrawal`]) and marked with
//!   its batch nonce when that batch settles. Event `withdrawal`.

use prost::Message;
use tally_store::{Kv, KvRead};

use crate::codes::Code;
use crate::envelope::{self, Envelope, Opened};
use crate::error::{reject, ExecError};
use crate::ident;
use crate::proto::{tx, user_msg, HubCall, SignedUserMsg, Tx, UserMsg};
use crate::state::allowance::{put_user_key, put_user_seq, user_key, user_seq};
use crate::state::chain::{app_version, balance, cur_window, params, put_balance};
use crate::state::sync::{next_call_id, put_next_call_id, put_pending_call};
use crate::state::withdrawal::{put_withdrawal, WithdrawalRecord};
use crate::types::GROWTH_VERSION;
use crate::types::{Event, TxResult};

/// Domain prefix of a user's message signature: the signed message is
/// `USER_SIGN_DOMAIN || body`.
pub const USER_SIGN_DOMAIN: &[u8] = b"tally/user/v1\0";

pub use crate::types::{CALL_PAY, CALL_WITHDRAW};

/// A checked user message, ready to write.
#[derive(Debug)]
pub enum UserMsgPlan {
    /// Replace the user's key.
    Key {
        /// The user.
        user: String,
        /// Its sequence.
        sequence: u64,
        /// The new key.
        key: [u8; 32],
    },
    /// Withdraw credits.
    Withdraw {
        /// The user.
        user: String,
        /// Its sequence.
        sequence: u64,
        /// Credits.
        amount: u64,
        /// The balance after it.
        balance: u64,
    },
}

impl UserMsgPlan {
    /// A one-line description for CheckTx.
    pub fn describe(&self) -> String {
        match self {
            UserMsgPlan::Key { user, .. } => format!("key change of user {user}"),
            UserMsgPlan::Withdraw { user, amount, .. } => {
                format!("withdrawal of {amount} credits by user {user}")
            }
        }
    }

    /// Writes the change and returns the accepted result; `height` is the
    /// block's.
    pub fn apply(self, kv: &mut impl Kv, height: u64) -> Result<TxResult, ExecError> {
        match self {
            UserMsgPlan::Key {
                user,
                sequence,
                key,
            } => {
                put_user_key(kv, &user, &key);
                put_user_seq(kv, &user, sequence);
                let ev = Event::new(
                    "user_key_changed",
                    [
                        ("user", user.clone()),
                        ("pubkey", hex::encode(key)),
                        ("sequence", sequence.to_string()),
                    ],
                );
                Ok(TxResult::ok(format!("user {user} has a new key"), vec![ev]))
            }
            UserMsgPlan::Withdraw {
                user,
                sequence,
                amount,
                balance,
            } => {
                let p = params(kv)?;
                let window = cur_window(kv)?.unwrap_or(0);
                let id = next_call_id(kv)?;
                put_next_call_id(kv, id.saturating_add(1));
                let call = HubCall {
                    id,
                    user: user.clone(),
                    provider: String::new(),
                    amount,
                    window,
                    kind: CALL_WITHDRAW,
                };
                put_pending_call(kv, &p.hub_chain, &call);
                put_balance(kv, &user, balance);
                put_user_seq(kv, &user, sequence);
                put_withdrawal(
                    kv,
                    &user,
                    id,
                    &WithdrawalRecord {
                        amount,
                        sequence,
                        window,
                        height,
                        settled_nonce: 0,
                    },
                );
                let ev = Event::new(
                    "withdrawal",
                    [
                        ("user", user.clone()),
                        ("amount", amount.to_string()),
                        ("call_id", id.to_string()),
                        ("balance", balance.to_string()),
                        ("sequence", sequence.to_string()),
                    ],
                );
                let mut r = TxResult::ok(
                    format!("user {user} withdraws {amount} credits as hub call {id}"),
                    vec![ev],
                );
                r.data = id.to_be_bytes().to_vec();
                Ok(r)
            }
        }
    }
}

impl Envelope for SignedUserMsg {
    type Body = UserMsg;
    /// The user's name.
    type Signer = String;
    const DOMAIN: &'static [u8] = USER_SIGN_DOMAIN;
    const WHAT: &'static str = "user message";
    const UNKNOWN_SIGNER: Code = Code::BadUserMsg;

    fn body(&self) -> &[u8] {
        &self.body
    }
    fn signature(&self) -> &[u8] {
        &self.signature
    }
    fn chain_id(body: &UserMsg) -> &str {
        &body.chain_id
    }
    /// The key bound to the body's user.
    fn signer(&self, kv: &impl KvRead, m: &UserMsg) -> Result<(String, [u8; 32]), ExecError> {
        ident::check_party("user", &m.user)?;
        let key = user_key(kv, &m.user)?.ok_or_else(|| {
            reject(
                Code::BadUserMsg,
                format!(
                    "user {} has no key (genesis, or the deposit that first funds it, binds one)",
                    m.user
                ),
            )
        })?;
        Ok((m.user.clone(), key))
    }
    fn who(user: &String) -> String {
        format!("user {user}")
    }
}

/// Checks an opened user message from reads only.
pub fn plan_user_msg(
    kv: &impl KvRead,
    opened: Opened<UserMsg, String>,
) -> Result<UserMsgPlan, ExecError> {
    let bad = |m: String| reject(Code::BadUserMsg, m);
    let version = app_version(kv)?;
    if version < GROWTH_VERSION {
        return Err(bad(format!(
            "user messages need app version {GROWTH_VERSION}; the chain runs version {version}"
        )));
    }
    let m = opened.body;
    let last = user_seq(kv, &m.user)?;
    if m.sequence <= last {
        return Err(bad(format!(
            "sequence {} is not above user {}'s last sequence {last}",
            m.sequence, m.user
        )));
    }
    match m.sum {
        Some(user_msg::Sum::Key(k)) => {
            let key = <[u8; 32]>::try_from(k.pubkey.as_slice())
                .ok()
                .filter(|k| ed25519_dalek::VerifyingKey::from_bytes(k).is_ok())
                .ok_or_else(|| bad("the new key is not a 32-byte ed25519 key".into()))?;
            if key == opened.key {
                return Err(bad("the new key is the key in force".into()));
            }
            Ok(UserMsgPlan::Key {
                user: m.user,
                sequence: m.sequence,
                key,
            })
        }
        Some(user_msg::Sum::Withdraw(w)) => {
            if w.amount == 0 {
                return Err(bad("a withdrawal of 0 credits".into()));
            }
            let have = balance(kv, &m.user)?;
            let Some(left) = have.checked_sub(w.amount) else {
                return Err(reject(
                    Code::InsufficientBalance,
                    format!(
                        "user {} withdraws {} credits with a balance of {have} (what reports charged has left it already)",
                        m.user, w.amount
                    ),
                ));
            };
            Ok(UserMsgPlan::Withdraw {
                user: m.user,
                sequence: m.sequence,
                amount: w.amount,
                balance: left,
            })
        }
        None => Err(reject(
            Code::MalformedTx,
            "a user message without an action",
        )),
    }
}

/// Encodes and signs a user message as a transaction, the way a user's
/// wallet (or `tallyd tx withdraw`, `tallyd tx user-key`) does.
pub fn sign_user_msg(key: &ed25519_dalek::SigningKey, m: &UserMsg) -> Vec<u8> {
    let body = m.encode_to_vec();
    let signature = envelope::sign(key, USER_SIGN_DOMAIN, &body);
    Tx {
        sum: Some(tx::Sum::User(SignedUserMsg { body, signature })),
    }
    .encode_to_vec()
}

//! Allowances: a user lets one gateway charge it at most so many credits
//! per settlement window, until an expiry. Reports are checked against
//! them, so a leaked gateway key reaches only the users who authorised
//! that gateway, and only up to what they allowed (see
//! `docs/adr/0011-money-at-the-edges.md`).
//!
//! A user changes its allowances with a transaction signed by its own
//! ed25519 key (registered in genesis `users`), opened like every signed
//! envelope by [`crate::envelope`]. Each change carries a
//! sequence above the user's last one, so a replayed or reordered change
//! is refused. A revocation is a change with `max_per_window` 0 and
//! `expires_at` 0.

use std::collections::BTreeMap;

use prost::Message;
use tally_store::{Kv, KvRead};

use crate::codes::Code;
use crate::envelope::{self, Envelope, Opened};
use crate::error::{reject, ExecError};
use crate::ident;
use crate::proto::{tx, AllowanceChange, SignedAllowance, Tx};
use crate::state::allowance::{
    allowance, gateway_key_by_name, put_allowance, put_spent, put_user_seq, spent, user_key,
    user_seq, Allowance,
};
use crate::types::{Event, TxResult};

/// Domain prefix of a user's allowance signature: the signed message is
/// `ALLOWANCE_SIGN_DOMAIN || body`.
pub const ALLOWANCE_SIGN_DOMAIN: &[u8] = b"tally/allowance/v1\0";

/// A checked allowance change, ready to write.
#[derive(Debug)]
pub struct AllowancePlan {
    change: AllowanceChange,
}

impl AllowancePlan {
    /// Writes the change and returns the accepted result.
    pub fn apply(self, kv: &mut impl Kv) -> TxResult {
        let c = self.change;
        let revoke = is_revocation(&c);
        put_allowance(
            kv,
            &c.user,
            &c.gateway,
            (!revoke).then_some(Allowance {
                max_per_window: c.max_per_window,
                expires_at: c.expires_at,
            }),
        );
        put_user_seq(kv, &c.user, c.sequence);
        let (kind, log) = if revoke {
            (
                "allowance_revoked",
                format!("{} revoked the allowance of gateway {}", c.user, c.gateway),
            )
        } else {
            (
                "allowance_granted",
                format!(
                    "{} lets gateway {} charge up to {} credits per window until {}",
                    c.user, c.gateway, c.max_per_window, c.expires_at
                ),
            )
        };
        TxResult::ok(
            log,
            vec![Event::new(
                kind,
                [
                    ("user", c.user),
                    ("gateway", c.gateway),
                    ("max_per_window", c.max_per_window.to_string()),
                    ("expires_at", c.expires_at.to_string()),
                    ("sequence", c.sequence.to_string()),
                ],
            )],
        )
    }
}

/// Whether a change revokes (both limits 0).
fn is_revocation(c: &AllowanceChange) -> bool {
    c.max_per_window == 0 && c.expires_at == 0
}

impl Envelope for SignedAllowance {
    type Body = AllowanceChange;
    /// The user's name.
    type Signer = String;
    const DOMAIN: &'static [u8] = ALLOWANCE_SIGN_DOMAIN;
    const WHAT: &'static str = "allowance";
    const UNKNOWN_SIGNER: Code = Code::BadAllowance;

    fn body(&self) -> &[u8] {
        &self.body
    }
    fn signature(&self) -> &[u8] {
        &self.signature
    }
    fn chain_id(body: &AllowanceChange) -> &str {
        &body.chain_id
    }
    /// The key genesis registered for the body's user.
    fn signer(
        &self,
        kv: &impl KvRead,
        change: &AllowanceChange,
    ) -> Result<(String, [u8; 32]), ExecError> {
        ident::check_party("user", &change.user)?;
        let key = user_key(kv, &change.user)?.ok_or_else(|| {
            reject(
                Code::BadAllowance,
                format!(
                    "user {} has no registered key, so it cannot sign allowances",
                    change.user
                ),
            )
        })?;
        Ok((change.user.clone(), key))
    }
    fn who(user: &String) -> String {
        format!("user {user}")
    }
}

/// Checks an opened allowance change at block time `now` from reads only:
/// the gateway named, the sequence, the limits.
pub fn plan_allowance(
    kv: &impl KvRead,
    now: u64,
    opened: Opened<AllowanceChange, String>,
) -> Result<AllowancePlan, ExecError> {
    let bad = |m: String| reject(Code::BadAllowance, m);
    let change = opened.body;
    ident::check_party("gateway", &change.gateway)?;
    let last = user_seq(kv, &change.user)?;
    if change.sequence <= last {
        return Err(bad(format!(
            "sequence {} is not above user {}'s last sequence {last}",
            change.sequence, change.user
        )));
    }
    if gateway_key_by_name(kv, &change.gateway)?.is_none() {
        return Err(reject(
            Code::UnknownGateway,
            format!("no gateway is registered as {:?}", change.gateway),
        ));
    }
    if !is_revocation(&change) {
        if change.expires_at <= now {
            return Err(bad(format!(
                "allowance expires at {}, not after block time {now}",
                change.expires_at
            )));
        }
        if change.max_per_window == 0 {
            return Err(bad(
                "max_per_window 0 grants nothing: revoke with max_per_window 0 and expires_at 0"
                    .into(),
            ));
        }
    }
    Ok(AllowancePlan { change })
}

/// What a report will record against allowances: per user, the window's
/// use after the report.
#[derive(Debug, Default)]
pub struct Spend {
    gateway: String,
    window: u64,
    users: Vec<(String, u64)>,
}

impl Spend {
    /// Writes the new use of each allowance.
    pub fn apply(&self, kv: &mut impl Kv) {
        for (user, used) in &self.users {
            put_spent(kv, user, &self.gateway, self.window, *used);
        }
    }
}

/// Checks that `gateway` may charge each user of a report what the report
/// charges it (`debits`, every user of the report, 0 for a user it only
/// reports failures for) at block time `now` in `window`: each user gave
/// it an unexpired allowance, and this window's use stays within it.
pub fn check_spend(
    kv: &impl KvRead,
    gateway: &str,
    now: u64,
    window: u64,
    debits: &BTreeMap<&str, u64>,
) -> Result<Spend, ExecError> {
    let mut users = Vec::with_capacity(debits.len());
    for (user, debit) in debits {
        let a = allowance(kv, user, gateway)?
            .filter(|a| a.expires_at > now)
            .ok_or_else(|| {
                reject(
                    Code::NoAllowance,
                    format!("user {user} gave gateway {gateway} no allowance that holds at block time {now}"),
                )
            })?;
        let before = spent(kv, user, gateway, window)?;
        let after = before
            .checked_add(*debit)
            .filter(|t| *t <= a.max_per_window);
        let Some(after) = after else {
            return Err(reject(
                Code::AllowanceExceeded,
                format!(
                    "gateway {gateway} charged user {user} {before} of {} allowed in window {window}; this report adds {debit}",
                    a.max_per_window
                ),
            ));
        };
        if *debit > 0 {
            users.push((user.to_string(), after));
        }
    }
    Ok(Spend {
        gateway: gateway.to_string(),
        window,
        users,
    })
}

/// Encodes and signs an allowance change as a transaction, the way a
/// user's wallet (or `tallyd tx allowance`) does.
pub fn sign_allowance(key: &ed25519_dalek::SigningKey, change: &AllowanceChange) -> Vec<u8> {
    let body = change.encode_to_vec();
    let signature = envelope::sign(key, ALLOWANCE_SIGN_DOMAIN, &body);
    Tx {
        sum: Some(tx::Sum::Allowance(SignedAllowance { body, signature })),
    }
    .encode_to_vec()
}

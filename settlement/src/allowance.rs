//! Allowances: a user lets one gateway charge it at most so many credits
//! per settlement window, until an expiry. Reports are checked against
//! them, so a leaked gateway key reaches only the users who authorised
//! that gateway, and only up to what they allowed (see
//! `docs/adr/0011-allowances-and-money-at-the-edges.md`).
//!
//! A user changes its allowances with a transaction signed by its own
//! ed25519 key (registered in genesis `users`). Each change carries a
//! sequence above the user's last one, so a replayed or reordered change
//! is refused. A revocation is a change with `max_per_window` 0 and
//! `expires_at` 0.

use std::collections::BTreeMap;

use ed25519_dalek::{Signature, VerifyingKey};
use prost::Message;
use tally_store::{Kv, KvRead};

use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::ident;
use crate::proto::{tx, AllowanceChange, SignedAllowance, Tx};
use crate::state::allowance::{
    allowance, gateway_key_by_name, put_allowance, put_spent, put_user_seq, spent, user_key,
    user_seq, Allowance,
};
use crate::state::chain::chain_id;
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

/// Checks a signed allowance change at block time `now` from reads only.
pub fn plan_allowance(
    kv: &impl KvRead,
    now: u64,
    signed: &SignedAllowance,
) -> Result<AllowancePlan, ExecError> {
    let bad = |m: String| reject(Code::BadAllowance, m);
    let change = AllowanceChange::decode(signed.body.as_slice()).map_err(|e| {
        reject(
            Code::MalformedTx,
            format!("allowance body does not decode: {e}"),
        )
    })?;
    if change.encode_to_vec() != signed.body {
        return Err(reject(
            Code::NonCanonical,
            "allowance body is not in canonical protobuf encoding",
        ));
    }
    let chain = chain_id(kv)?;
    if change.chain_id != chain {
        return Err(reject(
            Code::WrongChain,
            format!(
                "allowance is for chain {:?}, this is {chain:?}",
                change.chain_id
            ),
        ));
    }
    ident::check_party("user", &change.user)?;
    ident::check_party("gateway", &change.gateway)?;
    let key = user_key(kv, &change.user)?.ok_or_else(|| {
        bad(format!(
            "user {} has no registered key, so it cannot sign allowances",
            change.user
        ))
    })?;
    let sig: [u8; 64] = signed.signature.as_slice().try_into().map_err(|_| {
        bad(format!(
            "signature is {} bytes, want 64",
            signed.signature.len()
        ))
    })?;
    let vk = VerifyingKey::from_bytes(&key)
        .map_err(|_| ExecError::Fatal(crate::Fatal::Corrupt("user key")))?;
    let mut msg = ALLOWANCE_SIGN_DOMAIN.to_vec();
    msg.extend_from_slice(&signed.body);
    vk.verify_strict(&msg, &Signature::from_bytes(&sig))
        .map_err(|_| {
            bad(format!(
                "signature does not verify for user {}",
                change.user
            ))
        })?;
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
    use ed25519_dalek::Signer;
    let body = change.encode_to_vec();
    let mut msg = ALLOWANCE_SIGN_DOMAIN.to_vec();
    msg.extend_from_slice(&body);
    Tx {
        sum: Some(tx::Sum::Allowance(SignedAllowance {
            body,
            signature: key.sign(&msg).to_bytes().to_vec(),
        })),
    }
    .encode_to_vec()
}

//! Users' keys and the allowances users give gateways: what a gateway may
//! charge a user per settlement window, and what it charged in the current
//! one.
//!
//! The rules these records serve (ADR 0011, `docs/adr/0011-money-at-the-edges.md`):
//! every user named in a report must have given the reporting gateway an
//! allowance that holds at the block's time, whatever the record's amount
//! (code 24 `no_allowance`), and the report's charges plus what the gateway
//! already charged that user in the current window must stay within
//! `max_per_window` (code 25 `allowance_exceeded`). A user's ed25519 key
//! (`ukey/`) comes from genesis `users`; with it the user signs
//! `AllowanceChange {chain_id, user, gateway, max_per_window, expires_at,
//! sequence}` (transaction payload field 4, domain `tally/allowance/v1\0`);
//! a sequence not above the user's last (`useq/`) or a user without a key
//! gives code 27 `bad_allowance` (a signature fault gets the code the
//! transaction's signature check gives, see `crate::codes`). Both limits 0
//! revoke.
//! Genesis `allowances` are in force from the first block.

use tally_store::{prefix_end, Kv, KvRead};

use super::{get_u64, put_u64};
use crate::error::Fatal;
use crate::keys;

/// An allowance: a gateway may charge the user at most `max_per_window`
/// credits per settlement window while block time is before `expires_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowance {
    /// Most credits per settlement window.
    pub max_per_window: u64,
    /// Unix seconds from which it no longer holds.
    pub expires_at: u64,
}

impl Allowance {
    /// 16 bytes: `max_per_window`, `expires_at` (big-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.max_per_window.to_be_bytes().to_vec();
        v.extend_from_slice(&self.expires_at.to_be_bytes());
        v
    }

    /// Inverse of [`Allowance::encode`].
    pub fn decode(b: &[u8]) -> Option<Self> {
        let (max_per_window, expires_at) = pair(b)?;
        Some(Self {
            max_per_window,
            expires_at,
        })
    }
}

/// Two big-endian u64s.
fn pair(b: &[u8]) -> Option<(u64, u64)> {
    if b.len() != 16 {
        return None;
    }
    let a = u64::from_be_bytes(b.get(..8)?.try_into().ok()?);
    let c = u64::from_be_bytes(b.get(8..)?.try_into().ok()?);
    Some((a, c))
}

/// The ed25519 key of the gateway registered under `name`.
pub fn gateway_key_by_name(kv: &impl KvRead, name: &str) -> Result<Option<[u8; 32]>, Fatal> {
    match kv.get(&keys::gateway_name(name))? {
        None => Ok(None),
        Some(b) => <[u8; 32]>::try_from(b.as_slice())
            .map(Some)
            .map_err(|_| Fatal::Corrupt("gateway key")),
    }
}

/// Indexes a gateway's key by its name.
pub fn put_gateway_name(kv: &mut impl Kv, name: &str, key: &[u8; 32]) {
    kv.put(keys::gateway_name(name), key.to_vec());
}

/// A user's registered ed25519 key.
pub fn user_key(kv: &impl KvRead, user: &str) -> Result<Option<[u8; 32]>, Fatal> {
    match kv.get(&keys::user_key(user))? {
        None => Ok(None),
        Some(b) => <[u8; 32]>::try_from(b.as_slice())
            .map(Some)
            .map_err(|_| Fatal::Corrupt("user key")),
    }
}

/// Registers a user's key.
pub fn put_user_key(kv: &mut impl Kv, user: &str, key: &[u8; 32]) {
    kv.put(keys::user_key(user), key.to_vec());
}

/// The last sequence of a user's allowance changes (0: none yet).
pub fn user_seq(kv: &impl KvRead, user: &str) -> Result<u64, Fatal> {
    Ok(get_u64(kv, &keys::user_seq(user))?.unwrap_or(0))
}

/// Records the sequence of a user's last allowance change.
pub fn put_user_seq(kv: &mut impl Kv, user: &str, seq: u64) {
    put_u64(kv, keys::user_seq(user), seq);
}

/// The allowance `user` gave `gateway`, expired or not.
pub fn allowance(kv: &impl KvRead, user: &str, gateway: &str) -> Result<Option<Allowance>, Fatal> {
    match kv.get(&keys::allowance(user, gateway))? {
        None => Ok(None),
        Some(b) => Allowance::decode(&b)
            .map(Some)
            .ok_or(Fatal::Corrupt("allowance")),
    }
}

/// Sets (or, with `None`, removes) the allowance `user` gave `gateway`;
/// removing it also forgets what the gateway charged this window.
pub fn put_allowance(kv: &mut impl Kv, user: &str, gateway: &str, a: Option<Allowance>) {
    match a {
        Some(a) => kv.put(keys::allowance(user, gateway), a.encode()),
        None => {
            kv.delete(keys::allowance(user, gateway));
            kv.delete(keys::allowance_spent(user, gateway));
        }
    }
}

/// Every allowance `user` gave, by gateway name, at most `limit` of them
/// starting at gateway `after` (exclusive).
pub fn allowances_of(
    kv: &impl KvRead,
    user: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, Allowance)>, Fatal> {
    let prefix = keys::allowance_prefix(user);
    let start = match after {
        Some(g) => {
            let mut k = keys::allowance(user, g);
            k.push(0);
            k
        }
        None => prefix.clone(),
    };
    let end = prefix_end(&prefix);
    let mut out = Vec::new();
    let mut bad = false;
    kv.for_each(&start, &end, &mut |k, v| {
        let name = k.get(prefix.len()..).map(|n| String::from_utf8_lossy(n));
        match (name, Allowance::decode(v)) {
            (Some(n), Some(a)) => out.push((n.into_owned(), a)),
            _ => bad = true,
        }
        !bad && out.len() < limit
    })?;
    if bad {
        return Err(Fatal::Corrupt("allowance"));
    }
    Ok(out)
}

/// What `gateway` charged `user` in `window` (0 when it last charged in
/// another window).
pub fn spent(kv: &impl KvRead, user: &str, gateway: &str, window: u64) -> Result<u64, Fatal> {
    match kv.get(&keys::allowance_spent(user, gateway))? {
        None => Ok(0),
        Some(b) => {
            let (w, amount) = pair(&b).ok_or(Fatal::Corrupt("allowance use"))?;
            Ok(if w == window { amount } else { 0 })
        }
    }
}

/// Records that `gateway` has charged `user` `amount` in `window` so far.
pub fn put_spent(kv: &mut impl Kv, user: &str, gateway: &str, window: u64, amount: u64) {
    let mut v = window.to_be_bytes().to_vec();
    v.extend_from_slice(&amount.to_be_bytes());
    kv.put(keys::allowance_spent(user, gateway), v);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_store::{MemBackend, Pending};

    use super::*;

    #[test]
    fn allowances_round_trip_and_list_in_gateway_order() {
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        let a = |m, e| Allowance {
            max_per_window: m,
            expires_at: e,
        };
        put_allowance(&mut kv, "alice", "gw-b", Some(a(5, 9)));
        put_allowance(&mut kv, "alice", "gw-a", Some(a(7, 3)));
        put_allowance(&mut kv, "alicex", "gw-c", Some(a(1, 1)));
        let all = allowances_of(&kv, "alice", None, 10).unwrap();
        assert_eq!(
            all,
            vec![("gw-a".to_string(), a(7, 3)), ("gw-b".to_string(), a(5, 9))]
        );
        assert_eq!(
            allowances_of(&kv, "alice", Some("gw-a"), 10).unwrap(),
            vec![("gw-b".to_string(), a(5, 9))]
        );
        assert_eq!(allowances_of(&kv, "alice", None, 1).unwrap().len(), 1);
        put_spent(&mut kv, "alice", "gw-a", 4, 6);
        assert_eq!(spent(&kv, "alice", "gw-a", 4).unwrap(), 6);
        assert_eq!(spent(&kv, "alice", "gw-a", 5).unwrap(), 0);
        put_allowance(&mut kv, "alice", "gw-a", None);
        assert_eq!(allowance(&kv, "alice", "gw-a").unwrap(), None);
        assert_eq!(spent(&kv, "alice", "gw-a", 4).unwrap(), 0);
    }
}

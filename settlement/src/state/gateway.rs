//! Registered gateways and the standing of each key (ADR 0020).
//!
//! `gw/<pubkey>` holds, for a key registered in genesis or added by a
//! proposal and never changed since, the gateway's name alone (the layout
//! since genesis). Any other standing is written as `name 0x00 flags
//! identity(32) until(8, big-endian)` (names never contain 0x00): `flags`
//! bit 0 suspended, bit 1 removed, bit 2 retired by a rotation; `identity`
//! is the key the gateway first registered with (its report ids are
//! remembered under it, so a rotation cannot land a report twice); `until`
//! the block time from which a retired key is refused.
//!
//! `gwn/<name>` holds the current key, followed while a rotation's grace
//! may run by the key it replaced.

use tally_store::{Kv, KvRead};

use crate::error::Fatal;
use crate::keys;

const SUSPENDED: u8 = 1;
const REMOVED: u8 = 2;
const RETIRED: u8 = 4;

/// One gateway key's standing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayKey {
    /// The gateway's name.
    pub name: String,
    /// The key its report ids are remembered under (its first key).
    pub identity: [u8; 32],
    /// Suspended by a proposal (until resumed).
    pub suspended: bool,
    /// Removed by a proposal (for good).
    pub removed: bool,
    /// Replaced by a rotation: refused from this block time on.
    pub retired_until: Option<u64>,
}

impl GatewayKey {
    /// A key in good standing that is its gateway's identity.
    pub fn fresh(name: &str, key: &[u8; 32]) -> Self {
        Self {
            name: name.to_string(),
            identity: *key,
            suspended: false,
            removed: false,
            retired_until: None,
        }
    }

    /// Its standing in one word: `active`, `suspended`, `removed` or
    /// `retired`.
    pub fn status(&self) -> &'static str {
        if self.removed {
            "removed"
        } else if self.suspended {
            "suspended"
        } else if self.retired_until.is_some() {
            "retired"
        } else {
            "active"
        }
    }

    fn encode(&self, key: &[u8; 32]) -> Vec<u8> {
        if *self == Self::fresh(&self.name, key) {
            return self.name.as_bytes().to_vec();
        }
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        let flags = flag(self.suspended, SUSPENDED)
            | flag(self.removed, REMOVED)
            | flag(self.retired_until.is_some(), RETIRED);
        let mut v = Vec::with_capacity(self.name.len() + 42);
        v.extend_from_slice(self.name.as_bytes());
        v.push(0);
        v.push(flags);
        v.extend_from_slice(&self.identity);
        v.extend_from_slice(&self.retired_until.unwrap_or(0).to_be_bytes());
        v
    }

    /// Decodes the value stored for `key`.
    pub fn decode(key: &[u8; 32], v: &[u8]) -> Option<Self> {
        let Some(nul) = v.iter().position(|b| *b == 0) else {
            return Some(Self::fresh(std::str::from_utf8(v).ok()?, key));
        };
        let name = std::str::from_utf8(&v[..nul]).ok()?.to_string();
        let rest = &v[nul + 1..];
        if rest.len() != 41 {
            return None;
        }
        let flags = rest[0];
        let until = u64::from_be_bytes(rest[33..41].try_into().ok()?);
        Some(Self {
            name,
            identity: rest[1..33].try_into().ok()?,
            suspended: flags & SUSPENDED != 0,
            removed: flags & REMOVED != 0,
            retired_until: (flags & RETIRED != 0).then_some(until),
        })
    }
}

/// The standing of gateway key `pubkey`, if it was ever registered.
pub fn gateway_key(kv: &impl KvRead, pubkey: &[u8; 32]) -> Result<Option<GatewayKey>, Fatal> {
    match kv.get(&keys::gateway(pubkey))? {
        None => Ok(None),
        Some(v) => GatewayKey::decode(pubkey, &v)
            .map(Some)
            .ok_or(Fatal::Corrupt("gateway key record")),
    }
}

/// Stores the standing of gateway key `pubkey`.
pub fn put_gateway_key(kv: &mut impl Kv, pubkey: &[u8; 32], g: &GatewayKey) {
    kv.put(keys::gateway(pubkey), g.encode(pubkey));
}

/// The keys of the gateway named `name`: the current one and, while a
/// rotation's grace may run, the one it replaced.
pub fn gateway_keys(kv: &impl KvRead, name: &str) -> Result<Option<GatewayKeys>, Fatal> {
    let Some(v) = kv.get(&keys::gateway_name(name))? else {
        return Ok(None);
    };
    let current = v.get(..32).and_then(|b| <[u8; 32]>::try_from(b).ok());
    let previous = match v.len() {
        32 => None,
        64 => v[32..].try_into().ok(),
        _ => return Err(Fatal::Corrupt("gateway keys")),
    };
    Ok(current.map(|current| GatewayKeys { current, previous }))
}

/// A gateway's keys by name (`gwn/<name>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayKeys {
    /// The key it reports with.
    pub current: [u8; 32],
    /// The key a rotation replaced, while its grace may run.
    pub previous: Option<[u8; 32]>,
}

/// Stores a gateway's keys by name.
pub fn put_gateway_keys(kv: &mut impl Kv, name: &str, k: &GatewayKeys) {
    let mut v = k.current.to_vec();
    if let Some(p) = k.previous {
        v.extend_from_slice(&p);
    }
    kv.put(keys::gateway_name(name), v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_key_keeps_the_genesis_layout_and_others_round_trip() {
        let k = [7u8; 32];
        let fresh = GatewayKey::fresh("gw-1", &k);
        assert_eq!(fresh.encode(&k), b"gw-1".to_vec());
        assert_eq!(GatewayKey::decode(&k, b"gw-1"), Some(fresh.clone()));
        let other = GatewayKey {
            identity: [9; 32],
            retired_until: Some(1_700_000_600),
            suspended: true,
            ..fresh
        };
        let bytes = other.encode(&k);
        assert_eq!(bytes.len(), 4 + 1 + 1 + 32 + 8);
        assert_eq!(bytes[5], SUSPENDED | RETIRED);
        assert_eq!(GatewayKey::decode(&k, &bytes), Some(other.clone()));
        assert_eq!(other.status(), "suspended");
        assert_eq!(GatewayKey::decode(&k, &bytes[..bytes.len() - 1]), None);
    }
}

//! The threshold key: [`KeyEpoch`] (the stored record of one key epoch,
//! hex strings as in genesis), [`ThresholdKey`] (that record with its
//! points parsed and checked) and [`KeyCache`] (the last parsed key, kept
//! by the caller: parsing n public keys costs milliseconds and the key is
//! read on every proposal, vote extension and SubmitPartials). A leaf of
//! [`crate::dkg`]: it imports only [`crate::bls`] and [`crate::error`].

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::bls::PublicShares;
use crate::error::Fatal;

/// Why a key record does not hold a usable key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidKey(pub String);

/// The stored record of one key epoch of the validators' threshold key:
/// the `dkg` entry of genesis (a dealer's key, epoch 0), the active key in
/// state (`dkg`, [`crate::dkg::keys::ACTIVE_KEY`]) and a reshared key
/// waiting to activate (`NextKey.key`), all as this JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEpoch {
    /// Partials needed to sign.
    pub threshold: u32,
    /// Hex compressed G1 group public key (48 bytes).
    pub group_key: String,
    /// Hex compressed G1 public key of share i at position i - 1.
    pub public_shares: Vec<String>,
    /// Hex CometBFT consensus address (20 bytes) of the validator that
    /// holds share i, at position i - 1: a vote extension may only carry
    /// partials under its sender's own index.
    pub signers: Vec<String>,
    /// The key's epoch: 0 for a dealer's genesis key, then one more for
    /// every key a ceremony makes. Partials carry it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl KeyEpoch {
    /// Parses and checks the keys (subgroup, not infinity) and threshold.
    pub fn public_shares(&self) -> Result<crate::bls::PublicShares, InvalidKey> {
        let key = |what: &str, h: &str| {
            let b = hex::decode(h).map_err(|_| InvalidKey(format!("dkg {what} is not hex")))?;
            crate::bls::parse_public_key(&b).map_err(|e| InvalidKey(format!("dkg {what}: {e}")))
        };
        let n = self.public_shares.len();
        if self.threshold == 0 || self.threshold as usize > n {
            return Err(InvalidKey(format!(
                "dkg threshold {} must be 1..={n}",
                self.threshold
            )));
        }
        let shares = self
            .public_shares
            .iter()
            .enumerate()
            .map(|(i, h)| key(&format!("public share {}", i + 1), h))
            .collect::<Result<Vec<_>, _>>()?;
        self.signer_addresses()?;
        Ok(crate::bls::PublicShares {
            threshold: self.threshold,
            group: key("group key", &self.group_key)?,
            shares,
        })
    }

    /// The compressed public key of share `index` (from 1), if the key
    /// has that share. A stored key's shares were checked when it was
    /// made, so one that does not parse now is corruption.
    pub fn public_share(&self, index: u32) -> Result<Option<[u8; 48]>, Fatal> {
        let Some(h) = index
            .checked_sub(1)
            .and_then(|i| self.public_shares.get(i as usize))
        else {
            return Ok(None);
        };
        hex::decode(h)
            .ok()
            .and_then(|b| crate::bls::parse_public_key(&b).ok())
            .map(|p| Some(p.compress()))
            .ok_or(Fatal::Corrupt("dkg keys"))
    }

    /// The share index (from 1) of the validator with consensus `address`,
    /// if it holds one (and the signer list is well-formed).
    pub fn index_of(&self, address: &[u8]) -> Option<u32> {
        let signers = self.signer_addresses().ok()?;
        let i = signers.iter().position(|a| a.as_slice() == address)?;
        u32::try_from(i + 1).ok()
    }

    /// The signers' consensus addresses in index order: one per public
    /// share, 20 bytes each, all distinct.
    pub fn signer_addresses(&self) -> Result<Vec<[u8; 20]>, InvalidKey> {
        if self.signers.len() != self.public_shares.len() {
            return Err(InvalidKey(format!(
                "dkg lists {} signers for {} public shares",
                self.signers.len(),
                self.public_shares.len()
            )));
        }
        let mut out: Vec<[u8; 20]> = Vec::with_capacity(self.signers.len());
        for (i, h) in self.signers.iter().enumerate() {
            let a: [u8; 20] = hex::decode(h.trim())
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| {
                    InvalidKey(format!(
                        "dkg signer {} ({h:?}) is not a 20-byte hex address",
                        i + 1
                    ))
                })?;
            if out.contains(&a) {
                return Err(InvalidKey(format!(
                    "dkg signer address {h} holds two shares"
                )));
            }
            out.push(a);
        }
        Ok(out)
    }
}

/// The active threshold key: its record and the record's keys parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThresholdKey {
    /// The stored record (hex keys, threshold, epoch).
    pub record: KeyEpoch,
    /// The parsed keys.
    pub shares: PublicShares,
    /// Consensus address of the validator holding share `i`, at `i - 1`.
    pub signers: Vec<[u8; 20]>,
}

impl ThresholdKey {
    /// Parses a stored record (JSON); bytes that are not a well-formed key
    /// are corrupt state.
    pub fn parse(bytes: &[u8]) -> Result<ThresholdKey, Fatal> {
        let record: KeyEpoch = serde_json::from_slice(bytes).map_err(|_| Fatal::Corrupt("dkg"))?;
        let shares = record
            .public_shares()
            .map_err(|_| Fatal::Corrupt("dkg keys"))?;
        let signers = record
            .signer_addresses()
            .map_err(|_| Fatal::Corrupt("dkg signers"))?;
        Ok(ThresholdKey {
            record,
            shares,
            signers,
        })
    }

    /// The share index bound to the validator with consensus `address`.
    pub fn index_of(&self, address: &[u8]) -> Option<u32> {
        self.signers
            .iter()
            .position(|a| a.as_slice() == address)
            .and_then(|i| u32::try_from(i + 1).ok())
    }
}

/// The last threshold key parsed and the stored bytes it came from. The
/// ABCI adapter owns one and passes it to every call that reads the active
/// key ([`crate::dkg::state::active_key`]); a key whose stored bytes
/// changed (a ceremony finished, a reshared key activated) is parsed again.
/// A pure memo of the stored bytes: every node derives the same key from
/// the same state, with or without it.
#[derive(Debug, Default)]
pub struct KeyCache {
    last: Mutex<Option<(Vec<u8>, ThresholdKey)>>,
}

impl KeyCache {
    /// An empty cache.
    pub fn new() -> KeyCache {
        KeyCache::default()
    }

    /// The key stored as `bytes`, parsed once per distinct bytes. Corrupt
    /// bytes are refused and leave the cache as it was.
    pub fn parse(&self, bytes: &[u8]) -> Result<ThresholdKey, Fatal> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((b, key)) = last.as_ref() {
            if b.as_slice() == bytes {
                return Ok(key.clone());
            }
        }
        let key = ThresholdKey::parse(bytes)?;
        *last = Some((bytes.to_vec(), key.clone()));
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2-of-3 key dealt from `seed`, as stored, and its public shares.
    fn stored(seed: u8, epoch: u64) -> (Vec<u8>, PublicShares) {
        let randomness: Vec<[u8; 64]> = (0..2).map(|i| [seed.wrapping_add(i); 64]).collect();
        let (pubs, _) = crate::bls::deal(3, 2, &randomness).unwrap();
        let k = KeyEpoch {
            epoch,
            threshold: 2,
            group_key: hex::encode(pubs.group.compress()),
            public_shares: pubs
                .shares
                .iter()
                .map(|k| hex::encode(k.compress()))
                .collect(),
            signers: (0..3u8).map(|i| hex::encode([i; 20])).collect(),
        };
        (serde_json::to_vec(&k).unwrap(), pubs)
    }

    #[test]
    fn the_cache_follows_the_stored_bytes() {
        // The oracle is the dealer's own public shares, not a parse.
        let cache = KeyCache::new();
        let (a, pubs_a) = stored(1, 1);
        let (b, pubs_b) = stored(2, 2);
        assert_ne!(pubs_a, pubs_b);
        assert_eq!(cache.parse(&a).unwrap().shares, pubs_a);
        // The key changed (a reshare activated): the new one, not the
        // cached one.
        let k = cache.parse(&b).unwrap();
        assert_eq!((k.shares, k.record.epoch), (pubs_b, 2));
        let k = cache.parse(&a).unwrap();
        assert_eq!((k.shares, k.record.epoch), (pubs_a.clone(), 1));
        // Same bytes again: the same key.
        assert_eq!(cache.parse(&a).unwrap().shares, pubs_a);
        // Corrupt bytes are refused and do not poison the cache.
        assert!(cache.parse(b"{}").is_err());
        let mut bad = a.clone();
        let at = bad.len() / 2;
        bad[at] ^= 1;
        assert!(cache.parse(&bad).map_or(true, |k| k.shares != pubs_a));
        assert_eq!(cache.parse(&a).unwrap().shares, pubs_a);
        // Two caches are independent: no process-wide state.
        assert_eq!(KeyCache::new().parse(&b).unwrap().record.epoch, 2);
    }

    #[test]
    fn index_of_is_the_signer_position_from_one() {
        let (a, _) = stored(1, 0);
        let k = ThresholdKey::parse(&a).unwrap();
        assert_eq!(k.index_of(&[0; 20]), Some(1));
        assert_eq!(k.index_of(&[2; 20]), Some(3));
        assert_eq!(k.index_of(&[3; 20]), None);
    }
}

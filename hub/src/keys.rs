//! The settlement chain's group keys as the hub holds them (ADR 0017).
//!
//! Genesis names the first key. Each `RotateKey {chain, nonce, epoch,
//! group_key, signature}` replaces the key the hub holds now, once: the
//! chain name (code 6), a nonce at or below the last applied (code 4,
//! nothing changes), a nonce other than the next (3), a new key that is
//! not a valid compressed G1 point (9), the signature of the key held now
//! over `tally/key-rotation/v1` (Tally's kind 4 message for
//! `settlement_chain_id`, code 2), checked in that order. From then on a
//! batch verifies only against the new key. Every key is kept with the
//! hub height it took effect: `keys/<chain>/<nonce>` (nonce 0 is
//! genesis's, never stored), and `/keys/{chain}` lists them.

use serde_json::json;
use tally_settlement::bls::{self, Kind, PublicShares};
use tally_settlement::sync::rotation_digest;
use tally_store::{Kv, KvRead, StoreError};

use tally_hub_types::{HubCode, RotateKey};

use crate::kv::get_u64;

/// A refused rotation: its code and why.
pub type Refusal = (HubCode, String);

const KEY: &[u8] = b"keys/";
const LAST_ROTATION: &[u8] = b"last_rotation/";

fn key_of(chain: &str, nonce: u64) -> Vec<u8> {
    [KEY, chain.as_bytes(), b"/", &nonce.to_be_bytes()].concat()
}

fn last_key(chain: &str) -> Vec<u8> {
    [LAST_ROTATION, chain.as_bytes()].concat()
}

/// The nonce of the last rotation applied for `chain` (0: none).
pub fn last_rotation(kv: &impl KvRead, chain: &str) -> Result<u64, StoreError> {
    get_u64(kv, &last_key(chain))
}

/// The group key `chain`'s batches verify against now: the last rotation's
/// key, or genesis's.
pub fn current(
    kv: &impl KvRead,
    chain: &str,
    genesis_key: PublicShares,
) -> Result<PublicShares, StoreError> {
    let n = last_rotation(kv, chain)?;
    if n == 0 {
        return Ok(genesis_key);
    }
    let group = {
        let v = kv
            .get(&key_of(chain, n))?
            .ok_or_else(|| StoreError::Corrupt(format!("key {n} of {chain} missing")))?;
        let rec: serde_json::Value = serde_json::from_slice(&v)
            .map_err(|_| StoreError::Corrupt("stored key record".into()))?;
        let hex_key = rec["group_key"].as_str().unwrap_or_default();
        hex::decode(hex_key)
            .ok()
            .and_then(|b| bls::parse_public_key(&b).ok())
            .ok_or_else(|| StoreError::Corrupt("stored group key".into()))?
    };
    Ok(PublicShares {
        group,
        ..genesis_key
    })
}

fn reject<T>(code: HubCode, log: impl Into<String>) -> Result<Result<T, Refusal>, StoreError> {
    Ok(Err((code, log.into())))
}

/// Executes a rotation at hub `height` for the hub named `name`, whose
/// settlement chain is `settlement_chain_id` (see the module doc); the new
/// key's record, or why it was refused.
pub fn rotate(
    kv: &mut impl Kv,
    height: u64,
    (name, settlement_chain_id): (&str, &str),
    genesis_key: PublicShares,
    r: &RotateKey,
) -> Result<Result<serde_json::Value, Refusal>, StoreError> {
    if r.chain != name {
        return reject(
            HubCode::WrongChain,
            format!("rotation is for hub {:?}, this is {name:?}", r.chain),
        );
    }
    let last = last_rotation(kv, &r.chain)?;
    if r.nonce <= last {
        return reject(
            HubCode::AlreadySettled,
            format!("rotation {} is already applied (last {last})", r.nonce),
        );
    }
    if r.nonce != last + 1 {
        return reject(
            HubCode::BadNonce,
            format!("rotation {} is not the next one ({})", r.nonce, last + 1),
        );
    }
    if bls::parse_public_key(&r.group_key).is_err() {
        return reject(HubCode::BadKey, "the new group key is not a valid G1 point");
    }
    let held = current(kv, name, genesis_key)?;
    let digest = rotation_digest(&r.chain, r.nonce, r.epoch, &r.group_key);
    let msg = bls::message(settlement_chain_id, Kind::KeyRotation, &digest);
    let ok = bls::parse_signature(&r.signature).is_ok_and(|s| held.verify_group(&msg, &s));
    if !ok {
        return reject(
            HubCode::BadSignature,
            format!(
                "rotation {} is not signed by the group key the hub holds",
                r.nonce
            ),
        );
    }
    let rec = json!({
        "nonce": r.nonce,
        "epoch": r.epoch,
        "group_key": hex::encode(&r.group_key),
        "height": height,
    });
    kv.put(key_of(&r.chain, r.nonce), rec.to_string().into_bytes());
    kv.put(last_key(&r.chain), r.nonce.to_be_bytes().to_vec());
    Ok(Ok(rec))
}

/// `/keys/{chain}`: genesis's key (nonce 0, height 0) and every rotation,
/// in order, with `last_rotation`.
pub fn list(
    kv: &impl KvRead,
    genesis_key_hex: &str,
    chain: &str,
) -> Result<serde_json::Value, StoreError> {
    let mut keys =
        vec![json!({"nonce": 0, "epoch": null, "group_key": genesis_key_hex, "height": 0})];
    let last = last_rotation(kv, chain)?;
    for n in 1..=last {
        if let Some(v) = kv.get(&key_of(chain, n))? {
            if let Ok(rec) = serde_json::from_slice::<serde_json::Value>(&v) {
                keys.push(rec);
            }
        }
    }
    Ok(json!({"chain": chain, "keys": keys, "last_rotation": last}))
}

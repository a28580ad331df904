//! The settlement chain's group keys as the hub holds them (ADRs 0017 and
//! 0018).
//!
//! Genesis names the first key. Each `RotateKey {chain, nonce, epoch,
//! group_key, signature}` replaces the key the hub holds now, once: the
//! chain name (code 6), a nonce at or below the last applied (code 4,
//! nothing changes), a nonce other than the next (3), a new key that is
//! not a valid compressed G1 point (9), the signature of the key held now
//! over `tally/key-rotation/v1` (Tally's kind 4 message for
//! `settlement_chain_id`, code 2), checked in that order. From then on a
//! batch verifies only against the new key.
//!
//! **Governed keys** (ADR 0018). When fewer than `t` signers of the key the
//! hub holds remain, the settlement chain makes its next key by a
//! *recovery* that nobody can sign. Its rotation reaches the hub as
//! `GovernKey {chain, nonce, epoch, group_key, approvals}`, checked like a
//! `RotateKey` up to the key, and then: a hub without governors refuses it
//! (code 10); more approvals than governors are malformed (1); fewer than
//! `governor_threshold` distinct governors (genesis lists their ed25519
//! keys and a majority threshold) with a valid signature over
//! [`govern_message`] is code 10. Approvals by non-governors, repeats and
//! bad signatures do not count and do not spoil the rest.
//!
//! Every key is kept with the hub height it took effect and who vouched
//! for it (`by`: `genesis`, `key` or `governors`): `keys/<chain>/<nonce>`
//! (nonce 0 is genesis's, never stored), and `/keys/{chain}` lists them.

use serde_json::json;
use tally_settlement::bls::{self, Kind, PublicShares};
use tally_settlement::sync::rotation_digest;
use tally_store::{Kv, KvRead, StoreError};

use tally_hub_types::{govern_message, GovernKey, GovernorApproval, HubCode, RotateKey};

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

/// A key change as both kinds of transaction carry it.
#[derive(Debug)]
pub struct Change<'a> {
    /// The hub's name as the chain gives it.
    pub chain: &'a str,
    /// Rotation nonce.
    pub nonce: u64,
    /// The new key's epoch.
    pub epoch: u64,
    /// The new compressed group key.
    pub group_key: &'a [u8],
}

impl<'a> Change<'a> {
    /// The change a `RotateKey` asks for.
    pub fn of_rotation(r: &'a RotateKey) -> Self {
        Change {
            chain: &r.chain,
            nonce: r.nonce,
            epoch: r.epoch,
            group_key: &r.group_key,
        }
    }

    /// The change a `GovernKey` asks for.
    pub fn of_governed(r: &'a GovernKey) -> Self {
        Change {
            chain: &r.chain,
            nonce: r.nonce,
            epoch: r.epoch,
            group_key: &r.group_key,
        }
    }
}

/// Who vouches for a key change.
#[derive(Debug)]
pub enum By<'a> {
    /// The group key the hub holds (genesis's key given; the held one is
    /// read), with its signature.
    Key(PublicShares, &'a [u8]),
    /// The governors (their keys and threshold, from genesis) with their
    /// approvals.
    Governors(&'a [[u8; 32]], u32, &'a [GovernorApproval]),
}

/// Why `approvals` do not make `threshold` distinct governors' valid
/// signatures over `msg`, if they do not.
fn check_governors(
    governors: &[[u8; 32]],
    threshold: u32,
    approvals: &[GovernorApproval],
    msg: &[u8],
) -> Result<(), Refusal> {
    if governors.is_empty() {
        return Err((HubCode::NotGoverned, "this hub has no governors".into()));
    }
    if approvals.len() > governors.len() {
        return Err((
            HubCode::Malformed,
            format!(
                "{} approvals for {} governors",
                approvals.len(),
                governors.len()
            ),
        ));
    }
    let mut signed: Vec<[u8; 32]> = Vec::with_capacity(approvals.len());
    for a in approvals {
        let Ok(pk) = <[u8; 32]>::try_from(a.pubkey.as_slice()) else {
            continue;
        };
        if !governors.contains(&pk) || signed.contains(&pk) {
            continue;
        }
        let (Ok(key), Ok(sig)) = (
            ed25519_dalek::VerifyingKey::from_bytes(&pk),
            ed25519_dalek::Signature::from_slice(&a.signature),
        ) else {
            continue;
        };
        if key.verify_strict(msg, &sig).is_ok() {
            signed.push(pk);
        }
    }
    if (signed.len() as u32) < threshold {
        return Err((
            HubCode::NotGoverned,
            format!(
                "{} valid governor approval(s), {threshold} needed",
                signed.len()
            ),
        ));
    }
    Ok(())
}

/// Executes a key change at hub `height` for the hub named `name`, whose
/// settlement chain is `settlement_chain_id` (see the module doc); the new
/// key's record, or why it was refused.
pub fn rotate(
    kv: &mut impl Kv,
    height: u64,
    (name, settlement_chain_id): (&str, &str),
    r: &Change,
    by: By,
) -> Result<Result<serde_json::Value, Refusal>, StoreError> {
    if r.chain != name {
        return reject(
            HubCode::WrongChain,
            format!("rotation is for hub {:?}, this is {name:?}", r.chain),
        );
    }
    let last = last_rotation(kv, r.chain)?;
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
    if bls::parse_public_key(r.group_key).is_err() {
        return reject(HubCode::BadKey, "the new group key is not a valid G1 point");
    }
    let by_name = match by {
        By::Key(genesis_key, signature) => {
            let held = current(kv, name, genesis_key)?;
            let digest = rotation_digest(r.chain, r.nonce, r.epoch, r.group_key);
            let msg = bls::message(settlement_chain_id, Kind::KeyRotation, &digest);
            let ok = bls::parse_signature(signature).is_ok_and(|s| held.verify_group(&msg, &s));
            if !ok {
                return reject(
                    HubCode::BadSignature,
                    format!(
                        "rotation {} is not signed by the group key the hub holds",
                        r.nonce
                    ),
                );
            }
            "key"
        }
        By::Governors(governors, threshold, approvals) => {
            let msg = govern_message(settlement_chain_id, r.chain, r.nonce, r.epoch, r.group_key);
            if let Err(refusal) = check_governors(governors, threshold, approvals, &msg) {
                return Ok(Err(refusal));
            }
            "governors"
        }
    };
    let rec = json!({
        "nonce": r.nonce,
        "epoch": r.epoch,
        "group_key": hex::encode(r.group_key),
        "height": height,
        "by": by_name,
    });
    kv.put(key_of(r.chain, r.nonce), rec.to_string().into_bytes());
    kv.put(last_key(r.chain), r.nonce.to_be_bytes().to_vec());
    Ok(Ok(rec))
}

/// `/keys/{chain}`: genesis's key (nonce 0, height 0) and every rotation,
/// in order, with `last_rotation`.
pub fn list(
    kv: &impl KvRead,
    genesis_key_hex: &str,
    chain: &str,
) -> Result<serde_json::Value, StoreError> {
    let mut keys = vec![
        json!({"nonce": 0, "epoch": null, "group_key": genesis_key_hex, "height": 0, "by": "genesis"}),
    ];
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

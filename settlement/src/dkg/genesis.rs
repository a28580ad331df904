//! The genesis validator set: CometBFT's validators with the DKG
//! encryption keys genesis lists for them, each proof of possession
//! checked. Every validator has the same power, and either every one
//! has an encryption key or none does (the first key then waits until
//! update proposals have registered one for each).

use tally_store::Kv;

use super::crypto::verify_pop;
use super::msg::{address_of, pop_context};
use super::rules::MAX_POWER;
use super::state::{put_validator, MAX_VALIDATORS};
use crate::genesis::{parse_pubkey, Genesis, GenesisError};
use crate::proto::ValidatorRecord;

/// Stores the genesis validators (CometBFT's ed25519 keys and powers) with
/// the encryption keys genesis lists for them, each proof checked. An
/// encryption key for a key CometBFT does not list is refused.
pub fn init_validators(
    kv: &mut impl Kv,
    chain_id: &str,
    genesis: &Genesis,
    validators: &[([u8; 32], u64)],
) -> Result<(), GenesisError> {
    if validators.len() > MAX_VALIDATORS {
        return Err(GenesisError::Invalid(format!(
            "{} validators, at most {}",
            validators.len(),
            MAX_VALIDATORS
        )));
    }
    check_powers(validators)?;
    let bad = |m: String| GenesisError::Invalid(m);
    let mut enc: Vec<([u8; 32], Vec<u8>)> = Vec::new();
    for e in &genesis.encryption_keys {
        let v = parse_pubkey(&e.validator).map_err(bad)?;
        if !validators.iter().any(|(k, _)| *k == v) {
            return Err(bad(format!(
                "encryption key for {}, which is not a genesis validator",
                e.validator
            )));
        }
        let key = hex::decode(&e.key).map_err(|_| bad("encryption key is not hex".into()))?;
        let pk = crate::bls::parse_public_key(&key)
            .map_err(|err| bad(format!("encryption key of {}: {err}", e.validator)))?;
        let pop = hex::decode(&e.pop).map_err(|_| bad("encryption key proof is not hex".into()))?;
        if !verify_pop(&pk, &pop_context(chain_id, &v), &pop) {
            return Err(bad(format!(
                "the encryption key proof of {} does not verify",
                e.validator
            )));
        }
        if enc.iter().any(|(k, _)| *k == v) {
            return Err(bad(format!("two encryption keys for {}", e.validator)));
        }
        enc.push((v, key));
    }
    // All or none: a set where only some validators have encryption keys
    // could never start its first ceremony.
    if !enc.is_empty() && enc.len() != validators.len() {
        let missing: Vec<String> = validators
            .iter()
            .filter(|(k, _)| !enc.iter().any(|(v, _)| v == k))
            .map(|(k, _)| hex::encode(k))
            .collect();
        return Err(bad(format!(
            "encryption_keys must list every genesis validator or none; missing: {}",
            missing.join(", ")
        )));
    }
    for (k, power) in validators {
        let enc_key = enc
            .iter()
            .find(|(v, _)| v == k)
            .map(|(_, e)| e.clone())
            .unwrap_or_default();
        put_validator(
            kv,
            &address_of(k),
            &ValidatorRecord {
                pubkey: k.to_vec(),
                power: *power,
                enc_key,
            },
        );
    }
    Ok(())
}

/// Every validator has the same power (ADR 0017), within the cap that keeps
/// a full set under CometBFT's total.
fn check_powers(validators: &[([u8; 32], u64)]) -> Result<(), GenesisError> {
    let bad = |m: String| GenesisError::Invalid(m);
    if let Some((_, p)) = validators.first() {
        if validators.iter().any(|(_, q)| q != p) {
            return Err(bad(
                "genesis validators have unequal powers: Tally keeps one common power (ADR 0017)"
                    .into(),
            ));
        }
        if *p == 0 || *p > MAX_POWER {
            return Err(bad(format!(
                "validator power must be 1..={MAX_POWER}, not {p}"
            )));
        }
    }
    Ok(())
}

//! The validators' threshold key and validator set, made and changed on
//! chain (ADR 0015).
//!
//! **Key.** A Joint-Feldman DKG with encrypted shares and the ack-or-reveal
//! rule. Every validator registers a BLS12-381 encryption key with a proof
//! of possession (in genesis, or in the proposal that adds it). A ceremony
//! is a fixed window of blocks in three phases of `dkg_phase_blocks` each:
//!
//! 1. *dealings*: each dealer posts a commitment to a random polynomial of
//!    degree `t - 1` (t points of G1) and, for each player, its share
//!    encrypted to that player's key;
//! 2. *acks*: each player decrypts its shares and acks every dealing whose
//!    share matches the commitment;
//! 3. *reveals*: each dealer publishes, in the clear, the share of every
//!    player that did not ack; the chain checks each against the
//!    commitment;
//!
//! then, at the start of block `end`, the chain finalises ([`ceremony`]):
//! the qualified dealings make the group polynomial's commitment, the
//! public share of every player and the key record, and each player
//! derives its secret share from the chain and its own key
//! ([`participant::derive_share`]). A failed round runs again as the next.
//!
//! **Set.** A current validator proposes adding, removing or updating a
//! validator; the proposal is accepted once approvers holding more than
//! 2/3 of the voting power signed approvals ([`tx`]). An accepted change
//! runs a *reshare*: the current share holders deal polynomials whose
//! constant terms are their shares, to the next set; combined with
//! Lagrange weights they give new shares of the same group secret, so the
//! group key never changes. When it finalises at height `h`, FinalizeBlock
//! returns the validator update (CometBFT applies it from `h + 2`) and the
//! new key becomes active at `h + 2` too; stored partials of the old key
//! are dropped then, since partials of different epochs never combine.
//!
//! Modules: [`crypto`] (the arithmetic), [`msg`] (signed messages),
//! [`state`] (accessors), [`tx`] (validator transactions), [`ceremony`]
//! (begin-block work), [`participant`] (what an honest validator sends,
//! share derivation).

pub mod ceremony;
pub mod crypto;
pub mod msg;
pub mod participant;
pub mod state;
pub mod tx;

use tally_store::Kv;

use crate::genesis::{parse_pubkey, Genesis, GenesisError};
use crate::proto::ValidatorRecord;

/// Ceremony kind: a fresh key.
pub const FRESH: u32 = 1;
/// Ceremony kind: a reshare of the current key.
pub const RESHARE: u32 = 2;

pub use ceremony::begin_block;
pub use msg::{address_of, sign_validator_msg};
pub use participant::{derive_share, next_messages, Me};
pub use state::validator_updates;

/// Stores the genesis validators (CometBFT's ed25519 keys and powers) with
/// the encryption keys genesis lists for them, each proof checked. An
/// encryption key for a key CometBFT does not list is refused.
pub fn init_validators(
    kv: &mut impl Kv,
    chain_id: &str,
    genesis: &Genesis,
    validators: &[([u8; 32], u64)],
) -> Result<(), GenesisError> {
    if validators.len() > state::MAX_VALIDATORS {
        return Err(GenesisError::Invalid(format!(
            "{} validators, at most {}",
            validators.len(),
            state::MAX_VALIDATORS
        )));
    }
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
        if !crypto::verify_pop(&pk, &msg::pop_context(chain_id, &v), &pop) {
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
    for (k, power) in validators {
        let enc_key = enc
            .iter()
            .find(|(v, _)| v == k)
            .map(|(_, e)| e.clone())
            .unwrap_or_default();
        state::put_validator(
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

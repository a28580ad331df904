//! Validator messages on the wire: signing (for nodes and the CLI) and
//! opening (for the chain). A message is a `SignedValidatorMsg` whose body
//! is a canonical `ValidatorMsg`, signed with the sender's CometBFT ed25519
//! consensus key over `"tally/validator/v1" || 0x00 || body`. The sender is
//! named by its key; its consensus address is the first 20 bytes of the
//! key's SHA-256, as in CometBFT.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::proto::{tx, SignedValidatorMsg, Tx, ValidatorMsg};

/// Domain prefix of a validator message signature.
pub const VALIDATOR_SIGN_DOMAIN: &[u8] = b"tally/validator/v1\0";

/// The CometBFT consensus address of an ed25519 key.
pub fn address_of(pubkey: &[u8]) -> [u8; 20] {
    let d = Sha256::digest(pubkey);
    let mut a = [0u8; 20];
    a.copy_from_slice(&d[..20]);
    a
}

/// Encodes and signs `msg` as a transaction with the consensus key `key`.
pub fn sign_validator_msg(key: &SigningKey, msg: &ValidatorMsg) -> Vec<u8> {
    let body = msg.encode_to_vec();
    let mut m = VALIDATOR_SIGN_DOMAIN.to_vec();
    m.extend_from_slice(&body);
    Tx {
        sum: Some(tx::Sum::Validator(SignedValidatorMsg {
            body,
            pubkey: key.verifying_key().to_bytes().to_vec(),
            signature: key.sign(&m).to_bytes().to_vec(),
        })),
    }
    .encode_to_vec()
}

/// A message whose signature verified.
#[derive(Clone, Debug)]
pub struct Opened {
    /// The sender's consensus address.
    pub address: [u8; 20],
    /// The sender's consensus key.
    pub pubkey: [u8; 32],
    /// The body.
    pub msg: ValidatorMsg,
}

/// Checks the body's encoding, chain id and signature. Who may send what
/// is the caller's concern.
pub fn open(chain_id: &str, signed: &SignedValidatorMsg) -> Result<Opened, ExecError> {
    let msg = ValidatorMsg::decode(signed.body.as_slice())
        .map_err(|e| reject(Code::MalformedTx, format!("validator message body: {e}")))?;
    if msg.encode_to_vec() != signed.body {
        return Err(reject(
            Code::NonCanonical,
            "validator message body is not in canonical protobuf encoding",
        ));
    }
    if msg.chain_id != chain_id {
        return Err(reject(
            Code::WrongChain,
            format!(
                "message is for chain {:?}, this is {chain_id:?}",
                msg.chain_id
            ),
        ));
    }
    if msg.sum.is_none() {
        return Err(reject(
            Code::MalformedTx,
            "validator message has no payload",
        ));
    }
    let pubkey: [u8; 32] = signed.pubkey.as_slice().try_into().map_err(|_| {
        reject(
            Code::BadSignature,
            format!("consensus key is {} bytes, want 32", signed.pubkey.len()),
        )
    })?;
    let sig: [u8; 64] = signed.signature.as_slice().try_into().map_err(|_| {
        reject(
            Code::BadSignature,
            format!("signature is {} bytes, want 64", signed.signature.len()),
        )
    })?;
    let vk = VerifyingKey::from_bytes(&pubkey).map_err(|_| {
        reject(
            Code::BadSignature,
            "consensus key is not a valid ed25519 key",
        )
    })?;
    let mut m = VALIDATOR_SIGN_DOMAIN.to_vec();
    m.extend_from_slice(&signed.body);
    vk.verify_strict(&m, &Signature::from_bytes(&sig))
        .map_err(|_| {
            reject(
                Code::BadSignature,
                "validator message signature does not verify",
            )
        })?;
    Ok(Opened {
        address: address_of(&pubkey),
        pubkey,
        msg,
    })
}

/// What a proof of possession of an encryption key signs: the chain and
/// the consensus key it is registered for, so a proof cannot be replayed
/// for another validator or chain.
pub fn pop_context(chain_id: &str, consensus_key: &[u8]) -> Vec<u8> {
    let mut c = b"tally/dkg-pop/v1".to_vec();
    c.push(chain_id.len().min(255) as u8);
    c.extend_from_slice(&chain_id.as_bytes()[..chain_id.len().min(255)]);
    c.extend_from_slice(consensus_key);
    c
}

/// What the encryption of one share is bound to: chain, round, dealer and
/// player positions.
pub fn share_context(chain_id: &str, round: u64, dealer: u32, player: u32) -> Vec<u8> {
    let mut c = b"tally/dkg-share/v1".to_vec();
    c.push(chain_id.len().min(255) as u8);
    c.extend_from_slice(&chain_id.as_bytes()[..chain_id.len().min(255)]);
    c.extend_from_slice(&round.to_be_bytes());
    c.extend_from_slice(&dealer.to_be_bytes());
    c.extend_from_slice(&player.to_be_bytes());
    c
}

//! Validator messages on the wire: signing (for nodes and the CLI) and
//! opening (for the chain, through the one envelope opener
//! [`crate::envelope`]). A message is a `SignedValidatorMsg` whose body
//! is a canonical `ValidatorMsg`, signed with the sender's CometBFT ed25519
//! consensus key over `"tally/validator/v1" || 0x00 || body`. The sender is
//! named by its key; its consensus address is the first 20 bytes of the
//! key's SHA-256, as in CometBFT.

use ed25519_dalek::SigningKey;
use prost::Message;
use sha2::{Digest, Sha256};
use tally_store::KvRead;

use crate::codes::Code;
use crate::envelope::{self, key32, Envelope, VerifiedSignatures};
use crate::error::ExecError;
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
    let signature = envelope::sign(key, VALIDATOR_SIGN_DOMAIN, &body);
    Tx {
        sum: Some(tx::Sum::Validator(SignedValidatorMsg {
            body,
            pubkey: key.verifying_key().to_bytes().to_vec(),
            signature,
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

impl Envelope for SignedValidatorMsg {
    type Body = ValidatorMsg;
    /// The sender's consensus address.
    type Signer = [u8; 20];
    const DOMAIN: &'static [u8] = VALIDATOR_SIGN_DOMAIN;
    const WHAT: &'static str = "validator message";
    const UNKNOWN_SIGNER: Code = Code::NotValidator;

    fn body(&self) -> &[u8] {
        &self.body
    }
    fn signature(&self) -> &[u8] {
        &self.signature
    }
    fn chain_id(body: &ValidatorMsg) -> &str {
        &body.chain_id
    }
    /// The envelope's consensus key; whether it may send this message is
    /// the planner's concern ([`super::tx`]).
    fn signer(&self, _: &impl KvRead, _: &ValidatorMsg) -> Result<([u8; 20], [u8; 32]), ExecError> {
        let key = key32(&self.pubkey, Code::NotValidator, "consensus key")?;
        Ok((address_of(&key), key))
    }
    fn who(address: &[u8; 20]) -> String {
        format!("validator {}", hex::encode(address))
    }
}

/// Opens a validator message with the one envelope opener
/// ([`crate::envelope::open`]: body encoding, chain id, key, signature).
/// Who may send what is the caller's concern.
pub fn open(
    kv: &impl KvRead,
    signed: &SignedValidatorMsg,
    sigs: &dyn VerifiedSignatures,
) -> Result<Opened, ExecError> {
    let o = envelope::open(kv, signed, sigs)?;
    Ok(Opened {
        address: o.signer,
        pubkey: o.key,
        msg: o.body,
    })
}

/// What a proof of possession of a ceremony key signs: the chain, the
/// round and the player's consensus address, so a proof cannot be
/// replayed for another player, round or chain (copying another player's
/// key would need its secret).
pub fn key_context(chain_id: &str, round: u64, address: &[u8; 20]) -> Vec<u8> {
    let mut c = b"tally/dkg-key/v1".to_vec();
    c.push(chain_id.len().min(255) as u8);
    c.extend_from_slice(&chain_id.as_bytes()[..chain_id.len().min(255)]);
    c.extend_from_slice(&round.to_be_bytes());
    c.extend_from_slice(address);
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

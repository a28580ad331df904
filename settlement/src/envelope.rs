//! The one opener of signed envelopes: every user transaction kind that
//! carries an ed25519 signature (a gateway's `SignedReport`, a user's
//! `SignedAllowance` or `SignedUserMsg`, a validator's `SignedValidatorMsg`) is opened by
//! [`open`], so the checks, their order and their result codes are the same
//! for every kind. A kind describes itself by implementing [`Envelope`].
//!
//! What is signed is `DOMAIN || body`, where `body` is the exact bytes of
//! the encoded body message carried in the envelope and `DOMAIN` the kind's
//! NUL-terminated domain (`tally/report/v1\0`, ...). [`open`] checks, in
//! this order, and refuses with:
//!
//! | # | check | code |
//! |---|---|---|
//! | 1 | the body decodes | 1 `malformed_tx` |
//! | 2 | the body is in canonical encoding | 19 `non_canonical` |
//! | 3 | the body names this chain | 4 `wrong_chain` |
//! | 4 | the signer's key: 32 bytes, known to the kind | the kind's own "who are you" code: 2 `unknown_gateway` (reports), 27 `bad_allowance` (allowances), 29 `not_validator` (validator messages), 37 `bad_user_msg` (user messages) |
//! | 5 | the signature is 64 bytes | 3 `bad_signature` |
//! | 6 | the key is an ed25519 point | the kind's "who are you" code, as in 4 |
//! | 7 | the signature verifies (`verify_strict`) | 3 `bad_signature` |
//!
//! Step 4 may also refuse with a code of the kind's own (an allowance's
//! user name that is not an identifier: 11 `bad_identifier`). Steps 6 and 7
//! are skipped for a signature the node's [`VerifiedSignatures`] knows
//! (step 5 has passed, so the id below is well formed); everything after
//! [`open`] (the kind's own checks) runs every time.

use blst::min_pk::PublicKey;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use prost::Message;
use sha2::{Digest, Sha256};
use tally_store::KvRead;

use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::state::chain::chain_id;

/// A kind of signed envelope: what [`open`] needs to know about it.
pub trait Envelope {
    /// The signed body message.
    type Body: Message + Default;
    /// Who signed, as the kind names it (a gateway's or user's name, ...).
    type Signer;
    /// The signature's domain: the signed message is `DOMAIN || body`.
    const DOMAIN: &'static [u8];
    /// The kind in logs: "report", "allowance", "validator message".
    const WHAT: &'static str;
    /// The code for a signer key the kind does not know, that is not 32
    /// bytes or not an ed25519 point.
    const UNKNOWN_SIGNER: Code;

    /// The body's bytes exactly as signed.
    fn body(&self) -> &[u8];
    /// The signature's bytes.
    fn signature(&self) -> &[u8];
    /// The chain the body names.
    fn chain_id(body: &Self::Body) -> &str;
    /// The signer and the key that must have signed: from the envelope or,
    /// for a body that names its signer, from state. A key the kind does
    /// not know is refused with [`Envelope::UNKNOWN_SIGNER`] (see
    /// [`key32`]).
    fn signer(
        &self,
        kv: &impl KvRead,
        body: &Self::Body,
    ) -> Result<(Self::Signer, [u8; 32]), ExecError>;
    /// The signer in a log line.
    fn who(signer: &Self::Signer) -> String;
}

/// An envelope whose signature verified.
#[derive(Clone, Debug)]
pub struct Opened<B, S> {
    /// The decoded body.
    pub body: B,
    /// Who signed it.
    pub signer: S,
    /// The key that signed it.
    pub key: [u8; 32],
    /// SHA-256 of the body's bytes.
    pub body_hash: [u8; 32],
}

/// Signatures this node has already verified, by [`signature_id`]: an
/// envelope whose signature is known opens without the ed25519 check. The
/// answer cannot differ (the id commits to the domain, the key, the
/// signature and the signed body), so a node with a cache and one without
/// reach the same result; the cache only saves the work when the same
/// transaction is checked again (mempool recheck after every block, then
/// FinalizeBlock). Only signatures that verified are ever inserted.
///
/// The same memory may also keep the G1 points this node validated
/// (compressed BLS12-381 points that [`crate::bls::parse_public_key`]
/// accepted: on the curve, not the identity, in the prime-order subgroup),
/// so a DKG dealing's commitment and ephemeral keys are parsed and
/// subgroup-checked once per node, at CheckTx, rather than again at every
/// recheck and in FinalizeBlock (see [`parse_public_key_with`]).
/// Validity is a function of the bytes alone, so this cannot change a
/// result either, as long as an implementation keeps its one promise:
/// [`VerifiedSignatures::valid_point`] answers only for the exact bytes
/// [`VerifiedSignatures::insert_valid_point`] was given, with the point it
/// was given. Both default to remembering nothing.
pub trait VerifiedSignatures {
    /// Whether the signature with this id verified before.
    fn contains(&self, id: &[u8; 32]) -> bool;
    /// Remembers that the signature with this id verified.
    fn insert(&self, id: [u8; 32]);
    /// The point `bytes` were validated as before, if remembered.
    fn valid_point(&self, _bytes: &[u8]) -> Option<PublicKey> {
        None
    }
    /// Remembers that `bytes` parsed to the valid point `point` (called
    /// only after [`crate::bls::parse_public_key`] accepted exactly these
    /// bytes).
    fn insert_valid_point(&self, _bytes: &[u8], _point: &PublicKey) {}
}

/// [`crate::bls::parse_public_key`], answered from `memo` when this node
/// validated exactly these bytes before, and remembered there when they
/// validate now. The answer is the same either way (validity is a function
/// of the bytes); only the decompression and the subgroup check are saved.
/// Bytes that fail are never remembered: they are checked again each time
/// and fail with the same error. It lives here, beside the memory, rather
/// than in `bls`, so that `bls` depends on no memory.
pub fn parse_public_key_with(
    bytes: &[u8],
    memo: &dyn VerifiedSignatures,
) -> Result<PublicKey, crate::bls::BlsError> {
    if let Some(pk) = memo.valid_point(bytes) {
        return Ok(pk);
    }
    let pk = crate::bls::parse_public_key(bytes)?;
    memo.insert_valid_point(bytes, &pk);
    Ok(pk)
}

/// No memory: every signature is verified.
#[derive(Clone, Copy, Debug, Default)]
pub struct VerifyAll;

impl VerifiedSignatures for VerifyAll {
    fn contains(&self, _: &[u8; 32]) -> bool {
        false
    }
    fn insert(&self, _: [u8; 32]) {}
}

/// The id of a signature: SHA-256 of the domain's length (one byte), the
/// domain, the 32-byte key, the 64-byte signature and SHA-256 of the signed
/// body. Every part has a fixed length or is length-prefixed, so two
/// different (domain, key, signature, body) never share an id short of a
/// SHA-256 collision.
pub fn signature_id(
    domain: &[u8],
    key: &[u8; 32],
    signature: &[u8; 64],
    body_hash: &[u8; 32],
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([domain.len().min(255) as u8]);
    h.update(domain);
    h.update(key);
    h.update(signature);
    h.update(body_hash);
    h.finalize().into()
}

/// The key bytes `key` as 32 bytes, or a refusal with `who` (the kind's
/// [`Envelope::UNKNOWN_SIGNER`]) naming it `what`.
pub fn key32(key: &[u8], who: Code, what: &str) -> Result<[u8; 32], ExecError> {
    key.try_into()
        .map_err(|_| reject(who, format!("{what} is {} bytes, want 32", key.len())))
}

/// Opens `signed` against state `kv`: checks and refuses in the order and
/// with the codes of the module's table, consulting `sigs` for the
/// signature and remembering it there once it verified.
pub fn open<E: Envelope>(
    kv: &impl KvRead,
    signed: &E,
    sigs: &dyn VerifiedSignatures,
) -> Result<Opened<E::Body, E::Signer>, ExecError> {
    let bytes = signed.body();
    let body = E::Body::decode(bytes).map_err(|e| {
        reject(
            Code::MalformedTx,
            format!("{} body does not decode: {e}", E::WHAT),
        )
    })?;
    if body.encoded_len() != bytes.len() || body.encode_to_vec() != bytes {
        return Err(reject(
            Code::NonCanonical,
            format!(
                "{} body is not in canonical protobuf encoding (fields in order, no unknown or repeated fields)",
                E::WHAT
            ),
        ));
    }
    let chain = chain_id(kv)?;
    if E::chain_id(&body) != chain {
        return Err(reject(
            Code::WrongChain,
            format!(
                "{} is for chain {:?}, this is {chain:?}",
                E::WHAT,
                E::chain_id(&body)
            ),
        ));
    }
    let (signer, key) = signed.signer(kv, &body)?;
    let sig: [u8; 64] = signed.signature().try_into().map_err(|_| {
        reject(
            Code::BadSignature,
            format!("signature is {} bytes, want 64", signed.signature().len()),
        )
    })?;
    let body_hash: [u8; 32] = Sha256::digest(bytes).into();
    let id = signature_id(E::DOMAIN, &key, &sig, &body_hash);
    if !sigs.contains(&id) {
        let vk = VerifyingKey::from_bytes(&key).map_err(|_| {
            reject(
                E::UNKNOWN_SIGNER,
                format!("{} key is not an ed25519 point", E::WHAT),
            )
        })?;
        let mut msg = Vec::with_capacity(E::DOMAIN.len() + bytes.len());
        msg.extend_from_slice(E::DOMAIN);
        msg.extend_from_slice(bytes);
        vk.verify_strict(&msg, &Signature::from_bytes(&sig))
            .map_err(|_| {
                reject(
                    Code::BadSignature,
                    format!(
                        "{} signature does not verify for {}",
                        E::WHAT,
                        E::who(&signer)
                    ),
                )
            })?;
        sigs.insert(id);
    }
    Ok(Opened {
        body,
        signer,
        key,
        body_hash,
    })
}

/// The signature of `key` over `domain || body`, as every signer of an
/// envelope makes it.
pub fn sign(key: &SigningKey, domain: &[u8], body: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(domain.len() + body.len());
    msg.extend_from_slice(domain);
    msg.extend_from_slice(body);
    key.sign(&msg).to_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    //! The cache's id must commit to the body, the key and the domain: a
    //! signature remembered for one never opens another.

    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use ed25519_dalek::SigningKey;
    use tally_store::{MemBackend, Pending};

    use super::*;
    use crate::proto::ReportUsage;
    use crate::state::chain::put_chain_id;

    /// A remembering cache, as the node's.
    #[derive(Default)]
    struct Memory(RefCell<BTreeSet<[u8; 32]>>);

    impl VerifiedSignatures for Memory {
        fn contains(&self, id: &[u8; 32]) -> bool {
            self.0.borrow().contains(id)
        }
        fn insert(&self, id: [u8; 32]) {
            self.0.borrow_mut().insert(id);
        }
    }

    /// An envelope whose key travels in it; two kinds differ only by domain.
    struct Env<const B: bool> {
        body: Vec<u8>,
        key: Vec<u8>,
        signature: Vec<u8>,
    }

    impl<const B: bool> Envelope for Env<B> {
        type Body = ReportUsage;
        type Signer = ();
        const DOMAIN: &'static [u8] = if B { b"test/b\0" } else { b"test/a\0" };
        const WHAT: &'static str = "test";
        const UNKNOWN_SIGNER: Code = Code::UnknownGateway;
        fn body(&self) -> &[u8] {
            &self.body
        }
        fn signature(&self) -> &[u8] {
            &self.signature
        }
        fn chain_id(body: &ReportUsage) -> &str {
            &body.chain_id
        }
        fn signer(&self, _: &impl KvRead, _: &ReportUsage) -> Result<((), [u8; 32]), ExecError> {
            Ok(((), key32(&self.key, Self::UNKNOWN_SIGNER, "key")?))
        }
        fn who(_: &()) -> String {
            "tester".into()
        }
    }

    fn body(id: u8) -> Vec<u8> {
        ReportUsage {
            chain_id: "c".into(),
            report_id: vec![id; 16],
            ..ReportUsage::default()
        }
        .encode_to_vec()
    }

    fn code<E: Envelope>(kv: &Pending, e: &E, sigs: &Memory) -> Code {
        match open(kv, e, sigs) {
            Ok(_) => Code::Ok,
            Err(ExecError::Rejected(r)) => r.code,
            Err(ExecError::Fatal(f)) => panic!("{f}"),
        }
    }

    #[test]
    fn a_remembered_signature_vouches_for_nothing_else() {
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        put_chain_id(&mut kv, "c");
        let (k1, k2) = (
            SigningKey::from_bytes(&[1; 32]),
            SigningKey::from_bytes(&[2; 32]),
        );
        let pk = |k: &SigningKey| k.verifying_key().to_bytes().to_vec();
        let signature = sign(&k1, b"test/a\0", &body(1));
        let good = Env::<false> {
            body: body(1),
            key: pk(&k1),
            signature: signature.clone(),
        };
        let sigs = Memory::default();
        assert_eq!(code(&kv, &good, &sigs), Code::Ok);
        assert_eq!(
            sigs.0.borrow().len(),
            1,
            "a verified signature is remembered"
        );
        assert_eq!(code(&kv, &good, &sigs), Code::Ok);
        // The same signature bytes with a changed body, another (valid)
        // key, or presented as the other kind: each must miss the memory
        // and fail the curve check.
        let changed_body = Env::<false> {
            body: body(2),
            ..good
        };
        assert_eq!(code(&kv, &changed_body, &sigs), Code::BadSignature);
        let other_key = Env::<false> {
            body: body(1),
            key: pk(&k2),
            signature: signature.clone(),
        };
        assert_eq!(code(&kv, &other_key, &sigs), Code::BadSignature);
        let other_kind = Env::<true> {
            body: body(1),
            key: pk(&k1),
            signature,
        };
        assert_eq!(code(&kv, &other_kind, &sigs), Code::BadSignature);
        assert_eq!(sigs.0.borrow().len(), 1, "nothing else was remembered");
    }
}

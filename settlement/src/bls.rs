//! Threshold BLS over BLS12-381 with blst, min_pk: public keys in G1
//! (48 bytes compressed), signatures in G2 (96 bytes compressed).
//!
//! Shares are Shamir shares of the group secret at indices 1..=n. A partial
//! signature is an ordinary BLS signature with a share; t of them combine
//! by Lagrange interpolation at 0 (a multi-scalar multiplication) into the
//! group signature, which verifies against the group key.
//!
//! Scalar arithmetic for the Lagrange coefficients is done in safe Rust
//! with `num-bigint` modulo the group order r.

/// A G1 point (a public key, a commitment coefficient, an ephemeral
/// key): blst's affine `min_pk` public key, re-exported for crates that
/// keep parsed points without depending on blst themselves.
pub use blst::min_pk::PublicKey;
use blst::min_pk::{SecretKey, Signature};
use blst::{MultiPoint, BLST_ERROR};
use num_bigint::BigUint;
use sha2::{Digest, Sha256};

/// The RFC 9380 domain separation tag of every Tally signature (hash to
/// G2 with SHA-256, SSWU, random oracle; proof-of-possession scheme tag).
pub const DST: &[u8] = b"BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_TALLY_V1_";

/// BLS12-381 group order r (big-endian hex).
const R_HEX: &str = "73eda753299d7d483339d80809a1d80553bda402fffe5bfeffffffff00000001";

pub(crate) fn order() -> BigUint {
    BigUint::parse_bytes(R_HEX.as_bytes(), 16).unwrap_or_default()
}

/// Errors of threshold signing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlsError {
    /// Bytes are not a valid point, or the point is at infinity or outside
    /// the prime-order subgroup.
    #[error("invalid {what}: {reason}")]
    InvalidPoint { what: &'static str, reason: String },
    /// A signer index is 0 or repeated.
    #[error("signer index {0} is zero or repeated")]
    BadIndex(u32),
    /// Fewer partials than the threshold.
    #[error("{have} partial signatures, {need} needed")]
    NotEnough { have: usize, need: usize },
    /// The combined signature does not verify against the group key.
    #[error("combined signature does not verify against the group key")]
    CombineFailed,
    /// A secret scalar is zero or not below the group order.
    #[error("invalid secret share")]
    BadSecret,
}

/// What a threshold signature is over. The signed message is
/// `"tally/v1" || len(chain_id) as u8 || chain_id || kind || payload`,
/// hashed to G2 with [`DST`]. See `docs/signing.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A settlement batch: payload is the batch digest.
    Batch = 1,
    /// A hub result for one attempt: payload is its digest.
    HubResult = 2,
    /// Finalized hub blocks' events: payload is their digest.
    HubBlock = 3,
    /// A key rotation the hub applies: payload is its digest, signed by
    /// the key being replaced.
    KeyRotation = 4,
}

impl Kind {
    /// Every kind, in signing-order (batches first).
    pub const ALL: [Kind; 4] = [
        Kind::Batch,
        Kind::HubResult,
        Kind::HubBlock,
        Kind::KeyRotation,
    ];

    /// The number on the wire (`PartialSig.kind`, `PendingMessage.kind`)
    /// and in the signed message.
    pub fn value(self) -> u32 {
        self as u32
    }

    /// The name metrics and logs show.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Batch => "batch",
            Kind::HubResult => "hub_result",
            Kind::HubBlock => "hub_block",
            Kind::KeyRotation => "key_rotation",
        }
    }
}

impl From<Kind> for u32 {
    fn from(k: Kind) -> u32 {
        k.value()
    }
}

impl TryFrom<u32> for Kind {
    type Error = crate::error::UnknownValue;

    fn try_from(v: u32) -> Result<Self, Self::Error> {
        Kind::ALL
            .into_iter()
            .find(|k| k.value() == v)
            .ok_or(crate::error::UnknownValue {
                what: "message kind",
                value: v,
            })
    }
}

/// The exact bytes signed for `kind` and a 32-byte `payload` on `chain_id`.
pub fn message(chain_id: &str, kind: Kind, payload: &[u8; 32]) -> Vec<u8> {
    let id = chain_id.as_bytes();
    let mut m = Vec::with_capacity(8 + 1 + id.len() + 1 + 32);
    m.extend_from_slice(b"tally/v1");
    m.push(id.len().min(255) as u8);
    m.extend_from_slice(&id[..id.len().min(255)]);
    m.push(kind as u8);
    m.extend_from_slice(payload);
    m
}

/// One validator's share of the group secret.
#[derive(Clone)]
pub struct SecretShare {
    /// Share index, 1..=n.
    pub index: u32,
    key: SecretKey,
}

impl std::fmt::Debug for SecretShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretShare {{ index: {}, .. }}", self.index)
    }
}

impl SecretShare {
    /// A share from its index and 32-byte big-endian scalar.
    pub fn from_bytes(index: u32, bytes: &[u8]) -> Result<Self, BlsError> {
        if index == 0 {
            return Err(BlsError::BadIndex(0));
        }
        let key = SecretKey::from_bytes(bytes).map_err(|_| BlsError::BadSecret)?;
        Ok(Self { index, key })
    }

    /// The 32-byte big-endian scalar.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// This share's public key.
    pub fn public(&self) -> PublicKey {
        self.key.sk_to_pk()
    }

    /// The partial signature of `msg` (see [`message`]).
    pub fn sign(&self, msg: &[u8]) -> Partial {
        Partial {
            index: self.index,
            sig: self.key.sign(msg, DST, &[]),
        }
    }
}

/// A partial signature: a signature with the share of `index`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partial {
    /// Signer's share index, 1..=n.
    pub index: u32,
    /// The signature (G2).
    pub sig: Signature,
}

impl Partial {
    /// Parses a compressed signature, refusing points at infinity and points
    /// outside the subgroup, and index 0.
    pub fn from_bytes(index: u32, bytes: &[u8]) -> Result<Self, BlsError> {
        if index == 0 {
            return Err(BlsError::BadIndex(0));
        }
        Ok(Self {
            index,
            sig: parse_signature(bytes)?,
        })
    }

    /// The 96-byte compressed signature.
    pub fn sig_bytes(&self) -> [u8; 96] {
        self.sig.compress()
    }
}

/// Parses a compressed G2 signature with the infinity and subgroup checks.
pub fn parse_signature(bytes: &[u8]) -> Result<Signature, BlsError> {
    Signature::sig_validate(bytes, true).map_err(|e| BlsError::InvalidPoint {
        what: "signature",
        reason: format!("{e:?}"),
    })
}

/// Parses a compressed G1 public key with the infinity and subgroup checks.
pub fn parse_public_key(bytes: &[u8]) -> Result<PublicKey, BlsError> {
    PublicKey::key_validate(bytes).map_err(|e| BlsError::InvalidPoint {
        what: "public key",
        reason: format!("{e:?}"),
    })
}

/// The public side of a sharing: threshold, group key, every share's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicShares {
    /// Shares needed to sign.
    pub threshold: u32,
    /// The group public key.
    pub group: PublicKey,
    /// Public key of share `i` at position `i - 1`.
    pub shares: Vec<PublicKey>,
}

impl PublicShares {
    /// The public key of share `index`, if it exists.
    pub fn share(&self, index: u32) -> Option<&PublicKey> {
        index
            .checked_sub(1)
            .and_then(|i| self.shares.get(i as usize))
    }

    /// Whether `partial` is a valid signature of `msg` by its share.
    pub fn verify_partial(&self, msg: &[u8], partial: &Partial) -> bool {
        match self.share(partial.index) {
            Some(pk) => {
                partial.sig.verify(true, msg, DST, &[], pk, false) == BLST_ERROR::BLST_SUCCESS
            }
            None => false,
        }
    }

    /// Verifies many partials of one message at once with random linear
    /// weights; on failure, bisects to find the bad ones. Returns the
    /// positions (in `partials`) of the invalid partials. The weights are
    /// derived by hashing every input, so the result is deterministic and
    /// an attacker cannot pick signatures that cancel out.
    pub fn invalid_partials(&self, msg: &[u8], partials: &[Partial]) -> Vec<usize> {
        let mut bad = Vec::new();
        let all: Vec<usize> = (0..partials.len()).collect();
        self.bisect(msg, partials, &all, &mut bad);
        bad.sort_unstable();
        bad
    }

    /// Whether every one of `partials` is a valid signature of `msg`: one
    /// batched check (two pairings) however many there are, no bisection.
    /// For a proposal, where a single bad partial refuses the block.
    pub fn all_valid(&self, msg: &[u8], partials: &[Partial]) -> bool {
        match partials {
            [] => true,
            [one] => self.verify_partial(msg, one),
            _ => {
                let all: Vec<usize> = (0..partials.len()).collect();
                self.batch_ok(msg, partials, &all)
            }
        }
    }

    fn bisect(&self, msg: &[u8], partials: &[Partial], idx: &[usize], bad: &mut Vec<usize>) {
        match idx.len() {
            0 => {}
            1 => {
                if !self.verify_partial(msg, &partials[idx[0]]) {
                    bad.push(idx[0]);
                }
            }
            _ => {
                if !self.batch_ok(msg, partials, idx) {
                    let (a, b) = idx.split_at(idx.len() / 2);
                    self.bisect(msg, partials, a, bad);
                    self.bisect(msg, partials, b, bad);
                }
            }
        }
    }

    /// One check for many partials of the same message:
    /// `e(Σ rᵢσᵢ, g1) = e(H(m), Σ rᵢpkᵢ)` with 64-bit weights `rᵢ`: one
    /// hash to curve, two multi-scalar multiplications, two pairings.
    /// Signatures and keys were subgroup-checked when parsed.
    fn batch_ok(&self, msg: &[u8], partials: &[Partial], idx: &[usize]) -> bool {
        let mut pks = Vec::with_capacity(idx.len());
        let mut sigs = Vec::with_capacity(idx.len());
        for &i in idx {
            match self.share(partials[i].index) {
                Some(pk) => pks.push(*pk),
                None => return false,
            }
            sigs.push(partials[i].sig);
        }
        // Weights: 64-bit, from a hash of everything being verified.
        let mut h = Sha256::new();
        h.update(b"tally/bls-batch/v1");
        h.update(msg);
        for &i in idx {
            h.update(partials[i].index.to_be_bytes());
            h.update(partials[i].sig.compress());
        }
        let seed = h.finalize();
        let mut weights = Vec::with_capacity(8 * idx.len());
        for k in 0..idx.len() {
            let mut hk = Sha256::new();
            hk.update(seed);
            hk.update((k as u64).to_be_bytes());
            let d = hk.finalize();
            let mut w = [0u8; 8];
            w.copy_from_slice(&d[..8]);
            if w == [0; 8] {
                w[0] = 1;
            }
            weights.extend_from_slice(&w);
        }
        let sig = sigs.as_slice().mult(&weights, 64).to_signature();
        let pk = pks.as_slice().mult(&weights, 64).to_public_key();
        sig.verify(false, msg, DST, &[], &pk, false) == BLST_ERROR::BLST_SUCCESS
    }

    /// Combines `partials` (already verified) into the group signature of
    /// `msg`: the first `threshold` by index, Lagrange at 0 by multi-scalar
    /// multiplication, then verified against the group key.
    pub fn combine(&self, msg: &[u8], partials: &[Partial]) -> Result<Signature, BlsError> {
        let t = self.threshold as usize;
        let mut chosen: Vec<&Partial> = partials.iter().collect();
        chosen.sort_by_key(|p| p.index);
        for w in chosen.windows(2) {
            if w[0].index == w[1].index {
                return Err(BlsError::BadIndex(w[0].index));
            }
        }
        if let Some(p) = chosen.iter().find(|p| self.share(p.index).is_none()) {
            return Err(BlsError::BadIndex(p.index));
        }
        if chosen.len() < t || t == 0 {
            return Err(BlsError::NotEnough {
                have: chosen.len(),
                need: t,
            });
        }
        chosen.truncate(t);
        let xs: Vec<u32> = chosen.iter().map(|p| p.index).collect();
        let lambdas = lagrange_at_zero(&xs)?;
        let mut scalars = Vec::with_capacity(32 * t);
        for l in &lambdas {
            let mut le = l.to_bytes_le();
            le.resize(32, 0);
            scalars.extend_from_slice(&le);
        }
        let sigs: Vec<Signature> = chosen.iter().map(|p| p.sig).collect();
        let combined = sigs.as_slice().mult(&scalars, 255).to_signature();
        if combined.verify(true, msg, DST, &[], &self.group, false) != BLST_ERROR::BLST_SUCCESS {
            return Err(BlsError::CombineFailed);
        }
        Ok(combined)
    }

    /// Verifies a group signature of `msg`.
    pub fn verify_group(&self, msg: &[u8], sig: &Signature) -> bool {
        sig.verify(true, msg, DST, &[], &self.group, false) == BLST_ERROR::BLST_SUCCESS
    }
}

/// Lagrange coefficients at x = 0 for the distinct, non-zero points `xs`:
/// `λ_i = Π_{j≠i} x_j / (x_j − x_i) mod r`.
pub fn lagrange_at_zero(xs: &[u32]) -> Result<Vec<BigUint>, BlsError> {
    let r = order();
    let mut seen = std::collections::BTreeSet::new();
    for &x in xs {
        if x == 0 || !seen.insert(x) {
            return Err(BlsError::BadIndex(x));
        }
    }
    let two = BigUint::from(2u32);
    let mut out = Vec::with_capacity(xs.len());
    for (i, &xi) in xs.iter().enumerate() {
        let mut num = BigUint::from(1u32);
        let mut den = BigUint::from(1u32);
        for (j, &xj) in xs.iter().enumerate() {
            if i == j {
                continue;
            }
            num = (num * BigUint::from(xj)) % &r;
            let diff = (BigUint::from(xj) + &r - BigUint::from(xi)) % &r;
            den = (den * diff) % &r;
        }
        // r is prime: den^(r-2) is den's inverse (den != 0: points distinct).
        let inv = den.modpow(&(&r - &two), &r);
        out.push((num * inv) % &r);
    }
    Ok(out)
}

/// A dealer's sharing of a fresh group secret: `n` shares, any `t` of
/// which sign. `randomness` holds `t` 64-byte strings (the polynomial's
/// coefficients, reduced mod r); the caller draws them from a CSPRNG. This
/// is the localnet dealer; an on-chain DKG replaces it later.
pub fn deal(
    n: u32,
    t: u32,
    randomness: &[[u8; 64]],
) -> Result<(PublicShares, Vec<SecretShare>), BlsError> {
    if t == 0 || t > n || randomness.len() != t as usize {
        return Err(BlsError::NotEnough {
            have: randomness.len(),
            need: t as usize,
        });
    }
    let r = order();
    let coeffs: Vec<BigUint> = randomness
        .iter()
        .map(|b| BigUint::from_bytes_be(b) % &r)
        .collect();
    let to_key = |v: &BigUint| -> Result<SecretKey, BlsError> {
        let mut be = v.to_bytes_be();
        if be.len() > 32 {
            return Err(BlsError::BadSecret);
        }
        let mut buf = vec![0u8; 32 - be.len()];
        buf.append(&mut be);
        SecretKey::from_bytes(&buf).map_err(|_| BlsError::BadSecret)
    };
    let group = to_key(&coeffs[0])?.sk_to_pk();
    let mut secrets = Vec::with_capacity(n as usize);
    let mut publics = Vec::with_capacity(n as usize);
    for i in 1..=n {
        // Horner: f(i) = c0 + c1 i + ... + c_{t-1} i^{t-1} mod r.
        let x = BigUint::from(i);
        let mut acc = BigUint::from(0u32);
        for c in coeffs.iter().rev() {
            acc = (acc * &x + c) % &r;
        }
        let key = to_key(&acc)?;
        publics.push(key.sk_to_pk());
        secrets.push(SecretShare { index: i, key });
    }
    Ok((
        PublicShares {
            threshold: t,
            group,
            shares: publics,
        },
        secrets,
    ))
}

#[cfg(test)]
mod tests;

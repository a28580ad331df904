//! The arithmetic of a Joint-Feldman DKG with resharing over BLS12-381
//! (blst `min_pk`: points in G1 are keys, G2 holds signatures).
//!
//! Everything here is pure and deterministic: no I/O, no clock, no
//! randomness except what the caller passes in as seeds, and no panic
//! reachable from inputs. Scalars are [`BigUint`]s below the group order
//! r; every point multiplication or sum goes through blst's safe
//! [`MultiPoint`] interface, as in [`crate::bls`].
//!
//! # The scheme
//!
//! *Dealing.* Each dealer i picks a secret polynomial
//! `f_i(x) = c_0 + c_1 x + … + c_{t-1} x^{t-1}` over Z_r ([`Poly`]),
//! publishes the Feldman commitment `C_i = (c_0·G, …, c_{t-1}·G)`
//! ([`Poly::commit`]) and sends player j the share `f_i(j)`, encrypted to
//! j's registered key ([`encrypt`]). Because commitments are linear, anyone
//! can compute `f_i(j)·G = Σ_k C_ik j^k` ([`eval_commitment`]), so player j
//! checks its decrypted share against the public commitment
//! ([`verify_share`]) and a dealer cannot hand out shares that lie off its
//! polynomial without being caught.
//!
//! *Combining.* With Q the set of dealers whose dealings survived, player
//! j's share of the new key is `s_j = Σ_{i∈Q} f_i(j)` ([`combine_shares`]),
//! and the public sharing is the coefficient-wise sum of the commitments
//! ([`combine_commitments`]): its constant term is the group key, its
//! evaluation at j is `s_j·G`. No one learns `Σ c_i0` unless t players
//! pool their shares.
//!
//! *Resharing.* To hand the same group secret s to a new committee, each
//! old holder i in a qualified set Q (|Q| = old threshold) deals a
//! polynomial whose constant is its old share `s_i` (`constant` in
//! [`Poly::from_seed`]); its `C_i0 = s_i·G` must equal its known public
//! share. New shares and commitments are then combined with the Lagrange
//! weights `λ_i` of Q at zero: `s'_j = Σ λ_i f_i(j)` interpolates to
//! `Σ λ_i s_i = s`, so the group key is unchanged while the new shares
//! are on a fresh polynomial of the new degree.
//!
//! *Share encryption.* Shares travel on chain, so they are encrypted with a
//! hashed ElGamal (ECIES-like) scheme in G1 to an encryption key each
//! player registers for the round with a proof of possession
//! ([`EncKey::prove`], [`verify_pop`]). The ciphertext is not authenticated on purpose: the
//! commitment already authenticates the plaintext, since any share other
//! than `f_i(j)` fails [`verify_share`].
//!
//! # Caller's duties
//!
//! Points passed in as [`PublicKey`] are assumed valid: parsed with
//! [`crate::bls::parse_public_key`] (which refuses the identity and points
//! outside the prime-order subgroup) or produced by this module. Wire bytes
//! parsed here ([`decrypt`]'s ephemeral point, [`verify_pop`]'s signature)
//! get those checks. An ephemeral seed given to [`encrypt`] must never be
//! reused for a different share to the same key (the two pads would be
//! equal); [`EncKey::seed`] with a distinct label per dealing does this.
//! The single-point multiplications with secret scalars use blst's MSM
//! entry point, which is not promised to be constant-time.

use blst::min_pk::{AggregatePublicKey, PublicKey, SecretKey, Signature};
use blst::{MultiPoint, BLST_ERROR};
use num_bigint::BigUint;
use sha2::{Digest, Sha256, Sha512};

use crate::bls::{order, parse_public_key, parse_signature};

/// Domain separation tag of an encryption key's proof of possession
/// (distinct from [`crate::bls::DST`], so neither signature can stand in
/// for the other).
pub const POP_DST: &[u8] = b"BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_TALLY_DKG_ENC_V1_";

/// Largest polynomial degree + 1 accepted, so that a hostile `t` cannot
/// make [`Poly::from_seed`] or a commitment allocate without bound.
pub const MAX_THRESHOLD: u32 = 1 << 16;

const POLY_TAG: &[u8] = b"tally/dkg-poly/v1";
const SEED_TAG: &[u8] = b"tally/dkg-seed/v1";
const ENC_TAG: &[u8] = b"tally/dkg-enc/v1";

/// Errors of DKG arithmetic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DkgCryptoError {
    /// Bytes that should be a point are not a valid, non-identity point of
    /// the prime-order subgroup.
    #[error("invalid point: {0}")]
    BadPoint(&'static str),
    /// A scalar is not below the group order (or is zero where a secret
    /// key is needed).
    #[error("scalar out of range")]
    BadScalar,
    /// An input has the wrong length (or is empty, or lengths disagree).
    #[error("bad length: {0}")]
    BadLength(&'static str),
    /// A result is the point at infinity, which is never a valid key.
    #[error("result is the point at infinity")]
    Identity,
    /// A decrypted value is not a scalar below r: wrong key, wrong context
    /// or a tampered ciphertext.
    #[error("decryption gave no valid share")]
    Decrypt,
}

/// The threshold of an `n`-player sharing: `n - ⌊(n-1)/3⌋`, the smallest
/// count that is more than two thirds of `n` (3 of 4, 67 of 100). So any t
/// shares include an honest one when at most ⌊(n-1)/3⌋ are faulty, and
/// the honest players alone reach t. `threshold_for(0)` is 0.
pub fn threshold_for(n: u32) -> u32 {
    n - n.saturating_sub(1) / 3
}

/// A 32-byte big-endian scalar, if the length is 32 and the value is below
/// r (no silent reduction: an encoding has exactly one meaning).
pub fn scalar_from_bytes(b: &[u8]) -> Option<BigUint> {
    if b.len() != 32 {
        return None;
    }
    let s = BigUint::from_bytes_be(b);
    (s < order()).then_some(s)
}

/// The 32-byte big-endian encoding of `s mod r`.
pub fn scalar_to_bytes(s: &BigUint) -> [u8; 32] {
    let be = (s % order()).to_bytes_be();
    let mut out = [0u8; 32];
    out[32 - be.len()..].copy_from_slice(&be);
    out
}

/// `s mod r` as 32 little-endian bytes, the form blst's MSM reads.
fn scalar_le(s: &BigUint, r: &BigUint) -> [u8; 32] {
    let mut out = scalar_to_bytes(&(s % r));
    out.reverse();
    out
}

/// `Σ scalars[i]·points[i]` in one multi-scalar multiplication. The slices
/// must be non-empty and of equal length (blst panics otherwise).
fn msm(points: &[PublicKey], scalars: &[BigUint]) -> Result<AggregatePublicKey, DkgCryptoError> {
    if points.is_empty() || points.len() != scalars.len() {
        return Err(DkgCryptoError::BadLength("points and scalars"));
    }
    let r = order();
    let mut bytes = Vec::with_capacity(32 * scalars.len());
    for s in scalars {
        bytes.extend_from_slice(&scalar_le(s, &r));
    }
    Ok(points.mult(&bytes, 255))
}

/// A sum as a key; the identity (infinity flag set in its compressed
/// form) is [`DkgCryptoError::Identity`].
fn to_key(sum: &AggregatePublicKey) -> Result<PublicKey, DkgCryptoError> {
    let pk = sum.to_public_key();
    if pk.compress()[0] & 0x40 != 0 {
        return Err(DkgCryptoError::Identity);
    }
    Ok(pk)
}

/// `s·G1` for a non-zero scalar `s < r` (blst's fixed-base path).
fn times_generator(s: &BigUint) -> Result<PublicKey, DkgCryptoError> {
    if *s >= order() {
        return Err(DkgCryptoError::BadScalar);
    }
    // blst refuses a zero secret key; zero·G is the identity.
    SecretKey::from_bytes(&scalar_to_bytes(s))
        .map(|sk| sk.sk_to_pk())
        .map_err(|_| DkgCryptoError::Identity)
}

/// A secret polynomial of degree `t - 1` over Z_r, coefficient 0 first.
/// Its `Debug` shows only the threshold.
#[derive(Clone, PartialEq, Eq)]
pub struct Poly {
    coeffs: Vec<BigUint>,
}

impl std::fmt::Debug for Poly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Poly {{ threshold: {}, .. }}", self.coeffs.len())
    }
}

impl Poly {
    /// The polynomial with `t` coefficients derived from `seed`:
    /// `c_k = SHA-512(seed || "tally/dkg-poly/v1" || k as u32 big-endian)`
    /// read big-endian and reduced mod r (512 bits reduced mod a 255-bit
    /// r: bias below 2^-256). With `constant`, `c_0` is that scalar
    /// instead (resharing: the dealer's old share). Deterministic, so a
    /// dealer that restarts re-deals the same polynomial rather than two
    /// different ones. Fails on `t = 0`, `t >` [`MAX_THRESHOLD`], or a
    /// constant not below r.
    pub fn from_seed(
        t: u32,
        seed: &[u8; 32],
        constant: Option<&BigUint>,
    ) -> Result<Poly, DkgCryptoError> {
        if t == 0 || t > MAX_THRESHOLD {
            return Err(DkgCryptoError::BadLength("threshold"));
        }
        let r = order();
        if constant.is_some_and(|c| *c >= r) {
            return Err(DkgCryptoError::BadScalar);
        }
        let mut coeffs = Vec::with_capacity(t as usize);
        for k in 0..t {
            match (k, constant) {
                (0, Some(c)) => coeffs.push(c.clone()),
                _ => {
                    let mut h = Sha512::new();
                    h.update(seed);
                    h.update(POLY_TAG);
                    h.update(k.to_be_bytes());
                    coeffs.push(BigUint::from_bytes_be(&h.finalize()) % &r);
                }
            }
        }
        Ok(Poly { coeffs })
    }

    /// The number of coefficients t: any t evaluations determine the
    /// polynomial, t - 1 reveal nothing about `f(0)`.
    pub fn threshold(&self) -> u32 {
        self.coeffs.len() as u32
    }

    /// `f(x) mod r` by Horner's rule. `eval(0)` is the secret constant.
    pub fn eval(&self, x: u32) -> BigUint {
        let r = order();
        let x = BigUint::from(x);
        self.coeffs
            .iter()
            .rev()
            .fold(BigUint::default(), |acc, c| (acc * &x + c) % &r)
    }

    /// The Feldman commitment `(c_0·G1, …, c_{t-1}·G1)`. A zero
    /// coefficient (probability t/r for seeded ones, or a zero constant)
    /// is [`DkgCryptoError::Identity`]: the identity is no valid key.
    pub fn commit(&self) -> Result<Vec<PublicKey>, DkgCryptoError> {
        self.coeffs.iter().map(times_generator).collect()
    }
}

/// `Σ_k C_k·x^k`: the commitment's polynomial evaluated "in the exponent"
/// at `x`, i.e. `f(x)·G1`, in one MSM with the scalars `x^k mod r`. At
/// `x = 0` it is `C_0`. An empty commitment is a length error, an
/// identity result [`DkgCryptoError::Identity`].
pub fn eval_commitment(commitment: &[PublicKey], x: u32) -> Result<PublicKey, DkgCryptoError> {
    let r = order();
    let x = BigUint::from(x);
    let mut powers = Vec::with_capacity(commitment.len());
    let mut p = BigUint::from(1u32);
    for _ in commitment {
        powers.push(p.clone());
        p = (p * &x) % &r;
    }
    to_key(&msm(commitment, &powers)?)
}

/// Whether `share` is the dealer's `f(x)` for the committed polynomial:
/// `share·G1 == eval_commitment(commitment, x)`. By the binding of
/// discrete-log commitments, a dealer cannot find another value passing
/// this check. False (never an error) for any malformed input.
pub fn verify_share(commitment: &[PublicKey], x: u32, share: &BigUint) -> bool {
    match (times_generator(share), eval_commitment(commitment, x)) {
        (Ok(lhs), Ok(rhs)) => lhs == rhs,
        _ => false,
    }
}

/// The coefficient-wise weighted sum `Σ_i w_i·C_i` of equal-length
/// commitments (`w_i = 1` when `weights` is `None`): the commitment of
/// `Σ_i w_i f_i`. Unweighted for a fresh key, Lagrange weights for a
/// reshare. Errors on no commitments, differing lengths, a weight count
/// other than the commitment count, a weight not below r, or an identity
/// coefficient.
pub fn combine_commitments(
    commitments: &[&[PublicKey]],
    weights: Option<&[BigUint]>,
) -> Result<Vec<PublicKey>, DkgCryptoError> {
    let len = match commitments.first() {
        Some(c) if !c.is_empty() => c.len(),
        _ => return Err(DkgCryptoError::BadLength("no commitments")),
    };
    if commitments.iter().any(|c| c.len() != len) {
        return Err(DkgCryptoError::BadLength("commitment lengths differ"));
    }
    if let Some(w) = weights {
        if w.len() != commitments.len() {
            return Err(DkgCryptoError::BadLength("weights"));
        }
        let r = order();
        if w.iter().any(|w| *w >= r) {
            return Err(DkgCryptoError::BadScalar);
        }
    }
    let mut out = Vec::with_capacity(len);
    for k in 0..len {
        let column: Vec<PublicKey> = commitments.iter().map(|c| c[k]).collect();
        let sum = match weights {
            Some(w) => msm(&column, w)?,
            None => column.as_slice().add(),
        };
        out.push(to_key(&sum)?);
    }
    Ok(out)
}

/// `Σ_i w_i·s_i mod r` (`w_i = 1` when `weights` is `None`): a player's
/// combined share, matching [`combine_commitments`] with the same weights.
/// Inputs are reduced mod r. With weights, shares and weights are paired
/// in order and any surplus on the longer side is ignored, so the caller
/// passes slices of equal length.
pub fn combine_shares(shares: &[BigUint], weights: Option<&[BigUint]>) -> BigUint {
    let r = order();
    match weights {
        None => shares.iter().fold(BigUint::default(), |a, s| (a + s) % &r),
        Some(w) => shares.iter().zip(w).fold(BigUint::default(), |a, (s, w)| {
            (a + (s % &r) * (w % &r)) % &r
        }),
    }
}

/// A validator's share-encryption key pair: a scalar `d` and `D = d·G1`.
/// Separate from its consensus and signing keys. `Debug` shows only the
/// public half.
#[derive(Clone)]
pub struct EncKey {
    sk: SecretKey,
}

impl std::fmt::Debug for EncKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EncKey {{ public: {}, .. }}",
            hex::encode(self.public().compress())
        )
    }
}

impl EncKey {
    /// The key blst's `key_gen` (the IETF BLS KeyGen, HKDF-based) derives
    /// from `ikm`, which must hold at least 32 bytes of secret entropy.
    pub fn from_ikm(ikm: &[u8]) -> Result<EncKey, DkgCryptoError> {
        if ikm.len() < 32 {
            return Err(DkgCryptoError::BadLength("ikm"));
        }
        SecretKey::key_gen(ikm, &[])
            .map(|sk| EncKey { sk })
            .map_err(|_| DkgCryptoError::BadLength("ikm"))
    }

    /// The key from its 32-byte big-endian scalar (non-zero, below r).
    pub fn from_bytes(b: &[u8]) -> Result<EncKey, DkgCryptoError> {
        if b.len() != 32 {
            return Err(DkgCryptoError::BadLength("encryption key"));
        }
        SecretKey::from_bytes(b)
            .map(|sk| EncKey { sk })
            .map_err(|_| DkgCryptoError::BadScalar)
    }

    /// The 32-byte big-endian secret scalar.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.sk.to_bytes()
    }

    /// The public encryption key `D = d·G1`.
    pub fn public(&self) -> PublicKey {
        self.sk.sk_to_pk()
    }

    /// Proof of possession: a BLS signature (G2) with `d` over `context`
    /// under [`POP_DST`]. `context` should name the chain and the
    /// registering validator, so a proof cannot be replayed by another
    /// validator or on another chain; a key one cannot sign with is one
    /// whose shares one could not decrypt.
    pub fn prove(&self, context: &[u8]) -> Signature {
        self.sk.sign(context, POP_DST, &[])
    }

    /// A 32-byte seed for a dealing by this key's owner:
    /// `SHA-256("tally/dkg-seed/v1" || d || label)`. Secret (it depends on
    /// `d`), deterministic (a restarted node re-derives it rather than
    /// dealing twice), and different for every distinct `label`.
    pub fn seed(&self, label: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(SEED_TAG);
        h.update(self.sk.to_bytes());
        h.update(label);
        h.finalize().into()
    }

    /// Recovers the share [`encrypt`] sealed to this key: `S = d·R`, the
    /// same pad, XOR. Fails on a malformed `ephemeral` (not a valid
    /// subgroup point), a `ciphertext` that is not 32 bytes, or a result
    /// not below r ([`DkgCryptoError::Decrypt`]). A wrong key or context
    /// usually gives an unrelated value; [`verify_share`] tells.
    pub fn decrypt(
        &self,
        ephemeral: &[u8],
        ciphertext: &[u8],
        context: &[u8],
    ) -> Result<BigUint, DkgCryptoError> {
        let eph = parse_public_key(ephemeral).map_err(|_| DkgCryptoError::BadPoint("ephemeral"))?;
        let ct: &[u8; 32] = ciphertext
            .try_into()
            .map_err(|_| DkgCryptoError::BadLength("ciphertext"))?;
        let shared = mul_secret(&eph, &self.sk)?;
        let pad = pad(&eph, &self.public(), &shared, context);
        let mut plain = [0u8; 32];
        for (o, (c, p)) in plain.iter_mut().zip(ct.iter().zip(pad)) {
            *o = c ^ p;
        }
        scalar_from_bytes(&plain).ok_or(DkgCryptoError::Decrypt)
    }
}

/// Whether `pop` (96-byte compressed G2) is [`EncKey::prove`]'s proof for
/// `public` over `context`. The signature is subgroup-checked, the key is
/// validated too.
pub fn verify_pop(public: &PublicKey, context: &[u8], pop: &[u8]) -> bool {
    match parse_signature(pop) {
        Ok(sig) => {
            sig.verify(true, context, POP_DST, &[], public, true) == BLST_ERROR::BLST_SUCCESS
        }
        Err(_) => false,
    }
}

/// `sk·point` through the MSM interface (one point).
fn mul_secret(point: &PublicKey, sk: &SecretKey) -> Result<PublicKey, DkgCryptoError> {
    let mut le = sk.to_bytes();
    le.reverse();
    to_key(&std::slice::from_ref(point).mult(&le, 255))
}

/// The one-time pad `SHA-256("tally/dkg-enc/v1" || R || D || S || context)`
/// (points compressed): bound to the ephemeral point, the recipient and
/// the context, so a ciphertext moved to another dealing, recipient or
/// round decrypts to garbage.
fn pad(eph: &PublicKey, recipient: &PublicKey, shared: &PublicKey, context: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(ENC_TAG);
    h.update(eph.compress());
    h.update(recipient.compress());
    h.update(shared.compress());
    h.update(context);
    h.finalize().into()
}

/// Encrypts `share` to `recipient` (hashed ElGamal in G1): the ephemeral
/// scalar `e` is blst `key_gen(eph_seed)`, `R = e·G1`, the shared point
/// `S = e·D`, and the ciphertext is `share_be32 XOR pad(R, D, S, context)`.
/// Only the holder of `d` can form `S = d·R` (computational Diffie-Hellman
/// in G1; the pad is a hash of it), so the share stays hidden.
/// Returns `(R compressed, ciphertext)`. Fails on a share not below r.
pub fn encrypt(
    recipient: &PublicKey,
    share: &BigUint,
    context: &[u8],
    eph_seed: &[u8; 32],
) -> Result<([u8; 48], [u8; 32]), DkgCryptoError> {
    if *share >= order() {
        return Err(DkgCryptoError::BadScalar);
    }
    let e = SecretKey::key_gen(eph_seed, &[]).map_err(|_| DkgCryptoError::BadScalar)?;
    let eph = e.sk_to_pk();
    let shared = mul_secret(recipient, &e)?;
    let pad = pad(&eph, recipient, &shared, context);
    let mut ct = scalar_to_bytes(share);
    for (c, p) in ct.iter_mut().zip(pad) {
        *c ^= p;
    }
    Ok((eph.compress(), ct))
}

#[cfg(test)]
mod tests;

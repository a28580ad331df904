//! Tests of the DKG arithmetic (`dkg::crypto`) against oracles outside it:
//! the trusted dealer `bls::deal`, `bls::lagrange_at_zero`, BLS signing and
//! `PublicShares::combine`, blst's fixed-base `sk_to_pk`, and the spec's
//! derivations (polynomial coefficients, ciphertext) recomputed here with
//! sha2 and plain big-integer arithmetic.

use blst::min_pk::{PublicKey, SecretKey};
use num_bigint::BigUint;
use proptest::prelude::*;
use sha2::{Digest, Sha256, Sha512};
use std::time::Instant;
use tally_settlement::bls::{deal, lagrange_at_zero, message, Kind, PublicShares, SecretShare};
use tally_settlement::dkg::crypto::*;

/// The BLS12-381 group order, written out here independently of the code.
fn r() -> BigUint {
    BigUint::parse_bytes(
        b"73eda753299d7d483339d80809a1d80553bda402fffe5bfeffffffff00000001",
        16,
    )
    .unwrap()
}

fn be32(s: &BigUint) -> [u8; 32] {
    let b = s.to_bytes_be();
    let mut out = [0u8; 32];
    out[32 - b.len()..].copy_from_slice(&b);
    out
}

/// `s·G1` by blst's key derivation.
fn g(s: &BigUint) -> PublicKey {
    SecretKey::from_bytes(&be32(s)).unwrap().sk_to_pk()
}

fn share_scalar(s: &SecretShare) -> BigUint {
    BigUint::from_bytes_be(&s.to_bytes())
}

fn randomness(t: u32, seed: u8) -> Vec<[u8; 64]> {
    (0..t)
        .map(|i| {
            let mut b = [0u8; 64];
            b[..32].copy_from_slice(&Sha256::digest([seed, i as u8, 1]));
            b[32..].copy_from_slice(&Sha256::digest([seed, i as u8, 2]));
            b
        })
        .collect()
}

fn seed(tag: u8, i: u32) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([tag]);
    h.update(i.to_be_bytes());
    h.finalize().into()
}

/// The spec's coefficients: SHA-512(seed || "tally/dkg-poly/v1" || k_be32) mod r.
fn spec_coeffs(t: u32, seed: &[u8; 32], constant: Option<&BigUint>) -> Vec<BigUint> {
    (0..t)
        .map(|k| match (k, constant) {
            (0, Some(c)) => c.clone(),
            _ => {
                let mut h = Sha512::new();
                h.update(seed);
                h.update(b"tally/dkg-poly/v1");
                h.update(k.to_be_bytes());
                BigUint::from_bytes_be(&h.finalize()) % r()
            }
        })
        .collect()
}

/// Σ c_k x^k with explicit powers (not Horner).
fn naive_eval(coeffs: &[BigUint], x: u32) -> BigUint {
    let mut sum = BigUint::default();
    for (k, c) in coeffs.iter().enumerate() {
        sum += c * BigUint::from(x).modpow(&BigUint::from(k), &r());
    }
    sum % r()
}

/// The value at 0 of the polynomial through `(xs[i], ys[i])`.
fn interpolate(xs: &[u32], ys: &[BigUint]) -> BigUint {
    let l = lagrange_at_zero(xs).unwrap();
    l.iter().zip(ys).map(|(l, y)| l * y).sum::<BigUint>() % r()
}

#[test]
fn shares_of_a_dealt_share_interpolate_to_it() {
    let (_, old) = deal(4, 3, &randomness(3, 1)).unwrap();
    let s = share_scalar(&old[1]);
    let f = Poly::from_seed(5, &seed(1, 2), Some(&s)).unwrap();
    for start in 1..=4u32 {
        let xs: Vec<u32> = (start..start + 5).collect();
        let ys: Vec<BigUint> = xs.iter().map(|&x| f.eval(x)).collect();
        assert_eq!(interpolate(&xs, &ys), s, "points {xs:?}");
        assert_ne!(
            interpolate(&xs[..4], &ys[..4]),
            s,
            "t-1 points must not suffice"
        );
    }
}

#[test]
fn seeded_poly_follows_the_spec_and_matches_its_commitment() {
    let t = 4;
    let sd = seed(2, 0);
    let f = Poly::from_seed(t, &sd, None).unwrap();
    let c = spec_coeffs(t, &sd, None);
    assert_eq!(f.threshold(), t);
    assert_eq!(f.eval(0), c[0]);
    for x in 1..=8 {
        assert_eq!(f.eval(x), naive_eval(&c, x), "x = {x}");
    }
    for start in 1..=5u32 {
        let xs: Vec<u32> = (start..start + t).collect();
        let ys: Vec<BigUint> = xs.iter().map(|&x| f.eval(x)).collect();
        assert_eq!(interpolate(&xs, &ys), c[0]);
    }
    let commitment = f.commit().unwrap();
    assert_eq!(commitment.len(), t as usize);
    for (ck, pk) in c.iter().zip(&commitment) {
        assert_eq!(g(ck), *pk);
    }
    let other = Poly::from_seed(t, &seed(2, 1), None).unwrap();
    assert_ne!(other.eval(0), c[0]);
}

#[test]
fn verify_share_accepts_exactly_f_of_x() {
    let sd = seed(3, 0);
    let f = Poly::from_seed(3, &sd, None).unwrap();
    let c = spec_coeffs(3, &sd, None);
    let commitment = f.commit().unwrap();
    for x in 1..=6u32 {
        let share = naive_eval(&c, x);
        assert_eq!(eval_commitment(&commitment, x).unwrap(), g(&share));
        assert!(verify_share(&commitment, x, &share));
        assert!(!verify_share(&commitment, x, &((&share + 1u32) % r())));
        assert!(!verify_share(&commitment, x + 1, &share));
        assert!(!verify_share(&commitment, x, &(&share + r())));
    }
    assert_eq!(eval_commitment(&commitment, 0).unwrap(), commitment[0]);
}

#[test]
fn fresh_dkg_shares_sign_for_the_summed_key() {
    let (n, t) = (5u32, threshold_for(5));
    let polys: Vec<Poly> = (0..n)
        .map(|i| Poly::from_seed(t, &seed(4, i), None).unwrap())
        .collect();
    let commits: Vec<Vec<PublicKey>> = polys.iter().map(|p| p.commit().unwrap()).collect();
    let refs: Vec<&[PublicKey]> = commits.iter().map(Vec::as_slice).collect();
    let combined = combine_commitments(&refs, None).unwrap();
    let secret: BigUint = (0..n)
        .map(|i| spec_coeffs(t, &seed(4, i), None).remove(0))
        .sum();
    assert_eq!(combined[0], g(&(secret % r())));
    let mut shares = Vec::new();
    for j in 1..=n {
        let mine: Vec<BigUint> = polys.iter().map(|p| p.eval(j)).collect();
        let s = combine_shares(&mine, None);
        assert_eq!(s, mine.iter().sum::<BigUint>() % r());
        assert_eq!(eval_commitment(&combined, j).unwrap(), g(&s));
        shares.push(SecretShare::from_bytes(j, &be32(&s)).unwrap());
    }
    let pubs = PublicShares {
        threshold: t,
        group: combined[0],
        shares: shares.iter().map(SecretShare::public).collect(),
    };
    let msg = message("dkg", Kind::Batch, &[1; 32]);
    let parts: Vec<_> = shares.iter().map(|s| s.sign(&msg)).collect();
    assert!(pubs.combine(&msg, &parts[1..]).is_ok());
}

/// Reshares the old sharing from the holders `q` (1-based) to `n2` new
/// players with threshold `t2`. Returns the combined commitment and the new
/// shares, after checking each new share against the test's own sum.
fn reshare(
    old: &[SecretShare],
    old_pubs: &PublicShares,
    q: &[u32],
    n2: u32,
    t2: u32,
    tag: u8,
) -> (Vec<PublicKey>, Vec<BigUint>) {
    let lambdas = lagrange_at_zero(q).unwrap();
    let polys: Vec<Poly> = q
        .iter()
        .map(|&i| {
            let s = share_scalar(&old[i as usize - 1]);
            Poly::from_seed(t2, &seed(tag, i), Some(&s)).unwrap()
        })
        .collect();
    let commits: Vec<Vec<PublicKey>> = polys.iter().map(|p| p.commit().unwrap()).collect();
    for (&i, c) in q.iter().zip(&commits) {
        assert_eq!(
            Some(&c[0]),
            old_pubs.share(i),
            "C_i0 is the old public share"
        );
    }
    let refs: Vec<&[PublicKey]> = commits.iter().map(Vec::as_slice).collect();
    let combined = combine_commitments(&refs, Some(&lambdas)).unwrap();
    let new: Vec<BigUint> = (1..=n2)
        .map(|j| {
            let evals: Vec<BigUint> = polys.iter().map(|p| p.eval(j)).collect();
            let s = combine_shares(&evals, Some(&lambdas));
            let oracle = lambdas
                .iter()
                .zip(&evals)
                .map(|(l, e)| l * e)
                .sum::<BigUint>()
                % r();
            assert_eq!(s, oracle);
            s
        })
        .collect();
    (combined, new)
}

#[test]
fn resharing_keeps_the_group_key() {
    let (old_pubs, old) = deal(4, 3, &randomness(3, 5)).unwrap();
    let (n2, t2) = (5u32, threshold_for(5));
    let (combined, new) = reshare(&old, &old_pubs, &[1, 2, 4], n2, t2, 5);
    assert_eq!(combined[0], old_pubs.group);
    let mut publics = Vec::new();
    for (j, s) in (1..=n2).zip(&new) {
        let pk = eval_commitment(&combined, j).unwrap();
        assert_eq!(pk, g(s));
        publics.push(pk);
    }
    let shares: Vec<SecretShare> = (1..=n2)
        .zip(&new)
        .map(|(j, s)| SecretShare::from_bytes(j, &be32(s)).unwrap())
        .collect();
    let msg = message("dkg", Kind::HubResult, &[9; 32]);
    let parts: Vec<_> = shares.iter().map(|s| s.sign(&msg)).collect();
    let new_pubs = PublicShares {
        threshold: t2,
        group: old_pubs.group,
        shares: publics,
    };
    assert!(parts.iter().all(|p| new_pubs.verify_partial(&msg, p)));
    let sig = new_pubs.combine(&msg, &parts[..t2 as usize]).unwrap();
    assert!(old_pubs.verify_group(&msg, &sig));
    assert_eq!(new_pubs.combine(&msg, &parts[1..]).unwrap(), sig);
    // The new polynomial has degree t2 - 1: t2 - 1 shares do not sign.
    let short = PublicShares {
        threshold: t2 - 1,
        ..new_pubs
    };
    assert!(short.combine(&msg, &parts[..t2 as usize - 1]).is_err());
}

#[test]
fn encryption_round_trips_and_binds_key_and_context() {
    let key = EncKey::from_ikm(&[7; 32]).unwrap();
    let other = EncKey::from_ikm(&[8; 32]).unwrap();
    assert_eq!(
        EncKey::from_bytes(&key.to_bytes()).unwrap().public(),
        key.public()
    );
    let share = naive_eval(&spec_coeffs(3, &seed(6, 0), None), 2);
    let eph_seed = key.seed(b"dealing 1");
    let (eph, ct) = encrypt(&key.public(), &share, b"ctx", &eph_seed).unwrap();
    // The spec's format, recomputed: R = e·G1, S = (e·d)·G1.
    let e = BigUint::from_bytes_be(&SecretKey::key_gen(&eph_seed, &[]).unwrap().to_bytes());
    let d = BigUint::from_bytes_be(&key.to_bytes());
    assert_eq!(eph, g(&e).compress());
    let mut h = Sha256::new();
    h.update(b"tally/dkg-enc/v1");
    h.update(eph);
    h.update(key.public().compress());
    h.update(g(&(e * d % r())).compress());
    h.update(b"ctx");
    let pad: [u8; 32] = h.finalize().into();
    let expected: Vec<u8> = be32(&share).iter().zip(pad).map(|(a, b)| a ^ b).collect();
    assert_eq!(ct.to_vec(), expected);

    assert_eq!(key.decrypt(&eph, &ct, b"ctx"), Ok(share.clone()));
    assert_ne!(key.decrypt(&eph, &ct, b"ctx2"), Ok(share.clone()));
    assert_ne!(other.decrypt(&eph, &ct, b"ctx"), Ok(share.clone()));
    let mut flipped = ct;
    flipped[31] ^= 1;
    assert_ne!(key.decrypt(&eph, &flipped, b"ctx"), Ok(share.clone()));
    // A ciphertext of r itself (not a scalar) is a Decrypt error.
    let r_ct: Vec<u8> = ct
        .iter()
        .zip(be32(&share))
        .zip(be32(&r()))
        .map(|((c, s), v)| c ^ s ^ v)
        .collect();
    assert_eq!(
        key.decrypt(&eph, &r_ct, b"ctx"),
        Err(DkgCryptoError::Decrypt)
    );
    let mut inf = [0u8; 48];
    inf[0] = 0xc0;
    assert!(matches!(
        key.decrypt(&inf, &ct, b"ctx"),
        Err(DkgCryptoError::BadPoint(_))
    ));
    assert!(matches!(
        key.decrypt(&eph, &ct[..31], b"ctx"),
        Err(DkgCryptoError::BadLength(_))
    ));
    assert_eq!(
        encrypt(&key.public(), &r(), b"ctx", &eph_seed),
        Err(DkgCryptoError::BadScalar)
    );
    assert_ne!(key.seed(b"dealing 1"), key.seed(b"dealing 2"));
    assert_ne!(key.seed(b"dealing 1"), other.seed(b"dealing 1"));
}

#[test]
fn proof_of_possession_binds_key_context_and_domain() {
    let key = EncKey::from_ikm(&[11; 32]).unwrap();
    let other = EncKey::from_ikm(&[12; 32]).unwrap();
    let pop = key.prove(b"chain/validator-1").compress();
    assert!(verify_pop(&key.public(), b"chain/validator-1", &pop));
    assert!(!verify_pop(&key.public(), b"chain/validator-2", &pop));
    assert!(!verify_pop(&other.public(), b"chain/validator-1", &pop));
    assert!(!verify_pop(&key.public(), b"chain/validator-1", &pop[..95]));
    // The same key signing the same bytes under Tally's signing DST is no proof.
    let sk = SecretKey::from_bytes(&key.to_bytes()).unwrap();
    let tally_sig = sk.sign(b"chain/validator-1", tally_settlement::bls::DST, &[]);
    assert!(!verify_pop(
        &key.public(),
        b"chain/validator-1",
        &tally_sig.compress()
    ));
}

/// A subset of `1..=n` of size `k`, from `picks`.
fn subset(n: u32, k: u32, picks: &[u32]) -> Vec<u32> {
    let mut all: Vec<u32> = (1..=n).collect();
    picks
        .iter()
        .take(k as usize)
        .map(|p| all.remove(*p as usize % all.len()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_reshare_preserves_the_secret(
        n1 in 1u32..=6, t1_pick in any::<u32>(), n2 in 1u32..=6, t2_pick in any::<u32>(),
        q_picks in proptest::collection::vec(any::<u32>(), 6),
        new_picks in proptest::collection::vec(any::<u32>(), 6),
        tag in any::<u8>(),
    ) {
        let t1 = 1 + t1_pick % n1;
        let t2 = 1 + t2_pick % n2;
        let (old_pubs, old) = deal(n1, t1, &randomness(t1, tag)).unwrap();
        let first: Vec<u32> = (1..=t1).collect();
        let old_ys: Vec<BigUint> = old[..t1 as usize].iter().map(share_scalar).collect();
        let secret = interpolate(&first, &old_ys);
        let q = subset(n1, t1, &q_picks);
        let (combined, new) = reshare(&old, &old_pubs, &q, n2, t2, tag);
        prop_assert_eq!(combined[0], old_pubs.group);
        for (j, s) in (1..=n2).zip(&new) {
            prop_assert_eq!(eval_commitment(&combined, j).unwrap(), g(s));
        }
        let xs = subset(n2, t2, &new_picks);
        let ys: Vec<BigUint> = xs.iter().map(|&x| new[x as usize - 1].clone()).collect();
        prop_assert_eq!(interpolate(&xs, &ys), secret);
    }
}

/// One player's work per DKG at n = 100, t = 67: decrypt and verify 100
/// dealings. Prints the time (run with --nocapture); asserts only results.
#[test]
fn player_verifies_a_hundred_dealings() {
    let (n, t) = (100u32, threshold_for(100));
    assert_eq!(t, 67);
    let player = EncKey::from_ikm(&[42; 32]).unwrap();
    let j = 17;
    let dealings: Vec<_> = (0..n)
        .map(|i| {
            let p = Poly::from_seed(t, &seed(7, i), None).unwrap();
            let (eph, ct) = encrypt(&player.public(), &p.eval(j), b"round", &seed(8, i)).unwrap();
            (p.commit().unwrap(), eph, ct)
        })
        .collect();
    let start = Instant::now();
    let mut ok = 0;
    for (commitment, eph, ct) in &dealings {
        let share = player.decrypt(eph, ct, b"round").unwrap();
        ok += usize::from(verify_share(commitment, j, &share));
    }
    let elapsed = start.elapsed();
    assert_eq!(ok, n as usize);
    let dec = Instant::now();
    for (_, eph, ct) in &dealings {
        player.decrypt(eph, ct, b"round").unwrap();
    }
    let dec = dec.elapsed();
    println!(
        "n={n} t={t}: 100 decrypt+verify_share in {elapsed:?} ({:?} per dealing; decrypts alone {dec:?})",
        elapsed / n
    );
}

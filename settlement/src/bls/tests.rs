//! Unit tests of the threshold BLS helpers in `bls.rs`.

use super::*;

#[test]
fn kinds_convert_from_their_wire_numbers_only() {
    for (v, k) in [
        (1, Kind::Batch),
        (2, Kind::HubResult),
        (3, Kind::HubBlock),
        (4, Kind::KeyRotation),
    ] {
        assert_eq!(Kind::try_from(v), Ok(k));
        assert_eq!(u32::from(k), v);
    }
    for v in [0, 5, u32::MAX] {
        assert_eq!(
            Kind::try_from(v).unwrap_err().to_string(),
            format!("{v} is not a known message kind")
        );
    }
}

fn randomness(t: u32, seed: u8) -> Vec<[u8; 64]> {
    (0..t)
        .map(|i| {
            let mut b = [0u8; 64];
            let d = Sha256::digest([seed, i as u8]);
            b[..32].copy_from_slice(&d);
            b[32..].copy_from_slice(&Sha256::digest(d));
            b
        })
        .collect()
}

#[test]
fn lagrange_refuses_zero_and_duplicates() {
    assert_eq!(lagrange_at_zero(&[1, 0]), Err(BlsError::BadIndex(0)));
    assert_eq!(lagrange_at_zero(&[2, 3, 2]), Err(BlsError::BadIndex(2)));
    // Two points 1, 2: λ1 = 2, λ2 = -1.
    let l = lagrange_at_zero(&[1, 2]).unwrap();
    assert_eq!(l[0], BigUint::from(2u32));
    assert_eq!(l[1], order() - BigUint::from(1u32));
}

#[test]
fn t_of_n_sign_and_combine() {
    let (pubs, secrets) = deal(4, 3, &randomness(3, 1)).unwrap();
    let msg = message("c", Kind::Batch, &[7; 32]);
    let parts: Vec<_> = secrets.iter().map(|s| s.sign(&msg)).collect();
    assert!(parts.iter().all(|p| pubs.verify_partial(&msg, p)));
    let a = pubs.combine(&msg, &parts[..3]).unwrap();
    let b = pubs.combine(&msg, &parts[1..]).unwrap();
    assert_eq!(a, b);
    assert!(pubs.verify_group(&msg, &a));
    assert!(matches!(
        pubs.combine(&msg, &parts[..2]),
        Err(BlsError::NotEnough { .. })
    ));
    let dup = vec![parts[0].clone(), parts[0].clone(), parts[1].clone()];
    assert_eq!(pubs.combine(&msg, &dup), Err(BlsError::BadIndex(1)));
}

#[test]
fn bisection_finds_bad_partials() {
    let (pubs, secrets) = deal(7, 5, &randomness(5, 2)).unwrap();
    let msg = message("c", Kind::HubResult, &[1; 32]);
    let other = message("c", Kind::HubResult, &[2; 32]);
    let mut parts: Vec<_> = secrets.iter().map(|s| s.sign(&msg)).collect();
    parts[2] = secrets[2].sign(&other);
    parts[5].index = 7; // valid signature, wrong share
    assert_eq!(pubs.invalid_partials(&msg, &parts), vec![2, 5]);
    assert!(pubs.invalid_partials(&msg, &parts[..2]).is_empty());
}

#[test]
fn points_at_infinity_and_garbage_are_refused() {
    let mut inf = [0u8; 96];
    inf[0] = 0xc0;
    assert!(parse_signature(&inf).is_err());
    assert!(parse_signature(&[1u8; 96]).is_err());
    let mut inf_pk = [0u8; 48];
    inf_pk[0] = 0xc0;
    assert!(parse_public_key(&inf_pk).is_err());
    assert!(Partial::from_bytes(0, &[0; 96]).is_err());
}

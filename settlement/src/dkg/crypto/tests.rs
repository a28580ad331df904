//! Tests of the DKG arithmetic: scalar encoding, thresholds, malformed
//! inputs and secret-hiding `Debug`.

use super::*;

#[test]
fn scalar_encoding_is_canonical() {
    let r = order();
    let top = &r - BigUint::from(1u32);
    assert_eq!(scalar_from_bytes(&scalar_to_bytes(&top)), Some(top));
    let mut r_be = [0u8; 32];
    r_be.copy_from_slice(&r.to_bytes_be());
    assert_eq!(scalar_from_bytes(&r_be), None);
    assert_eq!(scalar_from_bytes(&[1u8; 31]), None);
    assert_eq!(scalar_to_bytes(&(&r + BigUint::from(5u32)))[31], 5);
}

#[test]
fn thresholds_are_more_than_two_thirds() {
    let got: Vec<u32> = [0, 1, 2, 3, 4, 5, 7, 10, 100].map(threshold_for).to_vec();
    assert_eq!(got, vec![0, 1, 2, 3, 3, 4, 5, 7, 67]);
}

#[test]
fn malformed_inputs_are_errors_not_panics() {
    let seed = [3u8; 32];
    assert!(Poly::from_seed(0, &seed, None).is_err());
    assert!(Poly::from_seed(MAX_THRESHOLD + 1, &seed, None).is_err());
    assert_eq!(
        Poly::from_seed(2, &seed, Some(&order())),
        Err(DkgCryptoError::BadScalar)
    );
    let zero = Poly::from_seed(2, &seed, Some(&BigUint::default())).unwrap();
    assert_eq!(zero.commit(), Err(DkgCryptoError::Identity));
    assert_eq!(
        eval_commitment(&[], 1),
        Err(DkgCryptoError::BadLength("points and scalars"))
    );
    assert!(!verify_share(&[], 1, &BigUint::from(1u32)));
    let c = Poly::from_seed(2, &seed, None).unwrap().commit().unwrap();
    // C + (r-1)·C is the identity in every coefficient.
    let w = [BigUint::from(1u32), order() - BigUint::from(1u32)];
    assert_eq!(
        combine_commitments(&[&c, &c], Some(&w)),
        Err(DkgCryptoError::Identity)
    );
    assert!(combine_commitments(&[&c, &c[..1]], None).is_err());
    assert!(combine_commitments(&[&c, &c], Some(&w[..1])).is_err());
    assert!(combine_commitments(&[], None).is_err());
    assert!(EncKey::from_ikm(&[1; 31]).is_err());
    assert!(EncKey::from_bytes(&[0; 32]).is_err());
}

#[test]
fn debug_hides_secrets() {
    let p = Poly::from_seed(2, &[9; 32], Some(&BigUint::from(123_456_789u32))).unwrap();
    assert_eq!(format!("{p:?}"), "Poly { threshold: 2, .. }");
    let k = EncKey::from_ikm(&[5; 32]).unwrap();
    let shown = format!("{k:?}");
    assert!(!shown.contains(&hex::encode(k.to_bytes())));
    assert!(shown.contains(&hex::encode(k.public().compress())));
}

//! Property tests of threshold BLS: any t of n shares give the same valid
//! group signature, t - 1 never do, bad partials are found by bisection,
//! duplicate and zero indices are refused.

use proptest::prelude::*;
use tally_settlement::bls::{self, deal, message, BlsError, Kind, PublicShares};

fn randomness(t: u32, seed: u64) -> Vec<[u8; 64]> {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..t)
        .map(|_| {
            let mut b = [0u8; 64];
            rng.fill_bytes(&mut b);
            b
        })
        .collect()
}

/// A subset of `0..n` of size `k`, from `picks`.
fn subset(n: usize, k: usize, picks: &[usize]) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    let mut out = Vec::with_capacity(k);
    for p in picks.iter().take(k) {
        let i = p % all.len();
        out.push(all.remove(i));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_t_of_n_combine_to_the_same_signature(
        n in 1u32..12, tf in 0.0f64..1.0, seed in any::<u64>(),
        picks_a in proptest::collection::vec(any::<usize>(), 12),
        picks_b in proptest::collection::vec(any::<usize>(), 12),
    ) {
        let t = 1 + ((n - 1) as f64 * tf) as u32;
        let (pubs, secrets) = deal(n, t, &randomness(t, seed)).unwrap();
        let msg = message("tally-prop", Kind::Batch, &[3; 32]);
        let parts: Vec<_> = secrets.iter().map(|s| s.sign(&msg)).collect();
        let pick = |ix: Vec<usize>| ix.into_iter().map(|i| parts[i].clone()).collect::<Vec<_>>();
        let a = pubs.combine(&msg, &pick(subset(n as usize, t as usize, &picks_a))).unwrap();
        let b = pubs.combine(&msg, &pick(subset(n as usize, t as usize, &picks_b))).unwrap();
        prop_assert_eq!(a, b);
        prop_assert!(pubs.verify_group(&msg, &a));
        // t - 1 shares: refused, and interpolating them anyway never gives a
        // signature the group key accepts.
        if t > 1 {
            let fewer = pick(subset(n as usize, t as usize - 1, &picks_a));
            let refused = matches!(pubs.combine(&msg, &fewer), Err(BlsError::NotEnough { .. }));
            prop_assert!(refused);
            let pretend = PublicShares { threshold: t - 1, ..pubs.clone() };
            prop_assert_eq!(pretend.combine(&msg, &fewer), Err(BlsError::CombineFailed));
        }
    }

    #[test]
    fn a_bad_partial_is_found_and_excluded(
        n in 2u32..10, seed in any::<u64>(), bad in any::<usize>(), wrong_key in any::<bool>(),
    ) {
        let t = n / 2 + 1;
        let (pubs, secrets) = deal(n, t, &randomness(t, seed)).unwrap();
        let msg = message("tally-prop", Kind::HubResult, &[9; 32]);
        let mut parts: Vec<_> = secrets.iter().map(|s| s.sign(&msg)).collect();
        let b = bad % n as usize;
        if wrong_key {
            parts[b] = secrets[(b + 1) % n as usize].sign(&msg);
            parts[b].index = b as u32 + 1;
        } else {
            parts[b] = secrets[b].sign(&message("tally-prop", Kind::HubResult, &[8; 32]));
        }
        prop_assert_eq!(pubs.invalid_partials(&msg, &parts), vec![b]);
        let good: Vec<_> = parts.iter().enumerate().filter(|(i, _)| *i != b).map(|(_, p)| p.clone()).collect();
        if good.len() >= t as usize {
            prop_assert!(pubs.combine(&msg, &good).is_ok());
        }
    }

    #[test]
    fn duplicate_and_zero_indices_are_refused(n in 2u32..8, seed in any::<u64>()) {
        let (pubs, secrets) = deal(n, 2, &randomness(2, seed)).unwrap();
        let msg = message("tally-prop", Kind::HubBlock, &[1; 32]);
        let p = secrets[0].sign(&msg);
        prop_assert_eq!(pubs.combine(&msg, &[p.clone(), p.clone()]), Err(BlsError::BadIndex(p.index)));
        let mut zero = p.clone();
        zero.index = 0;
        prop_assert_eq!(pubs.combine(&msg, &[zero, secrets[1].sign(&msg)]), Err(BlsError::BadIndex(0)));
        prop_assert!(bls::lagrange_at_zero(&[1, 1]).is_err());
    }
}

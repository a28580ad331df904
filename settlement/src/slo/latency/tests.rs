use proptest::prelude::*;

use super::*;

#[test]
fn buckets_match_the_table_by_hand() {
    assert_eq!(bucket_of(0), 1);
    assert_eq!(bucket_of(1), 2);
    assert_eq!(bucket_of(5), 5); // [4, 6)
    assert_eq!(bucket_of(6), 6);
    assert_eq!(bucket_of(1023), 20); // [724, 1024)
    assert_eq!(bucket_of(1024), 21);
    assert_eq!(bucket_of(65_535), 30);
    assert_eq!(bucket_of(65_536), 31);
    assert_eq!(bucket_of(u64::MAX), 31);
    assert_eq!(bounds(1), Some((0, Some(1))));
    assert_eq!(bounds(21), Some((1024, Some(1448))));
    assert_eq!(bounds(31), Some((65_536, None)));
    assert_eq!(bounds(0), None);
    assert_eq!(bounds(32), None);
}

#[test]
fn at_or_over_counts_whole_buckets_from_a_bound() {
    let mut c = Counts::default();
    for ms in [10, 500, 511, 512, 900, 70_000] {
        assert!(c.add(bucket_of(ms), 1));
    }
    assert_eq!(c.at_or_over(512), 3);
    assert_eq!(c.at_or_over(11), 5);
    assert_eq!(c.at_or_over(65_536), 1);
}

#[test]
fn encoding_is_canonical() {
    let mut h = Histogram::default();
    assert!(h.latency.add(3, 7));
    assert!(h.ttft.add(31, 1));
    let bytes = h.encode();
    assert_eq!(
        bytes,
        [1, 3, 0, 0, 0, 0, 0, 0, 0, 7, 1, 31, 0, 0, 0, 0, 0, 0, 0, 1]
    );
    assert_eq!(Histogram::decode(&bytes), Some(h));
    assert_eq!(Histogram::decode(&[0, 0]), Some(Histogram::default()));
    // A zero count, a bucket out of order or out of range, trailing bytes.
    assert_eq!(Histogram::decode(&[1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0]), None);
    assert_eq!(Histogram::decode(&[1, 32, 0, 0, 0, 0, 0, 0, 0, 1, 0]), None);
    let twice = [2, 3, 0, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(Histogram::decode(&twice), None);
    assert_eq!(Histogram::decode(&[0, 0, 0]), None);
}

#[test]
fn overflow_leaves_the_histogram_unchanged() {
    let mut h = Histogram::default();
    assert!(h.latency.add(2, u64::MAX));
    let mut one = Histogram::default();
    assert!(one.ttft.add(1, 1));
    assert!(one.latency.add(2, 1));
    let before = h.clone();
    assert!(!h.add(&one));
    assert_eq!(h, before);
}

/// The nearest-rank percentile of the raw values, computed by sorting:
/// the oracle the bucketed estimate must bracket.
fn nearest_rank(values: &mut [u64], p: u64) -> u64 {
    values.sort_unstable();
    let n = values.len() as u64;
    let rank = (p * n).div_ceil(100).max(1);
    values[(rank - 1) as usize]
}

proptest! {
    #[test]
    fn percentile_buckets_hold_the_true_percentile(
        mut values in proptest::collection::vec(
            prop_oneof![0u64..100, 0u64..5_000, 0u64..200_000], 1..400),
        p in 1u64..=100,
    ) {
        let mut c = Counts::default();
        for &v in &values {
            prop_assert!(c.add(bucket_of(v), 1));
        }
        let truth = nearest_rank(&mut values, p);
        let e = c.percentile(p).unwrap();
        prop_assert!(e.lo_ms <= truth, "{truth} below bucket {e:?}");
        prop_assert!(e.hi_ms.is_none_or(|hi| truth < hi), "{truth} above bucket {e:?}");
        prop_assert_eq!(e.bucket, bucket_of(truth));
    }

    #[test]
    fn every_duration_falls_in_its_own_bucket(ms in any::<u64>()) {
        let (lo, hi) = bounds(bucket_of(ms)).unwrap();
        prop_assert!(lo <= ms && hi.is_none_or(|h| ms < h));
    }

    #[test]
    fn histograms_roundtrip(
        lat in proptest::collection::vec((1u8..=BUCKETS, 1u64..1_000_000), 0..40),
        ttft in proptest::collection::vec((1u8..=BUCKETS, 1u64..1_000_000), 0..40),
    ) {
        let mut h = Histogram::default();
        for (b, n) in lat { prop_assert!(h.latency.add(b, n)); }
        for (b, n) in ttft { prop_assert!(h.ttft.add(b, n)); }
        prop_assert_eq!(Histogram::decode(&h.encode()), Some(h));
    }
}

//! Tests of call timing: exact buckets from injected instants, and the
//! retry policy's timed run on tokio's paused clock.

use proptest::prelude::*;
use rand::SeedableRng;
use tokio::sync::watch;

use super::*;
use crate::retry::{Failure, RetryPolicy};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A call started at `t0`, first token after `first` ms (if any), ended
/// after `total` ms.
fn timed(first: Option<u64>, total: u64) -> CallTiming {
    let t0 = Instant::now();
    let timer = CallTimer::start_at(t0);
    if let Some(f) = first {
        timer.first_token_at(t0 + ms(f));
    }
    timer.finish_at(t0 + ms(total))
}

#[test]
fn buckets_by_hand() {
    // Bucket b holds [BOUNDS_MS[b-2], BOUNDS_MS[b-1]): 0 ms is in bucket
    // 1 [0,1), 1 ms in bucket 2 [1,2), 700 ms in bucket 19 [512,724),
    // 724 ms in bucket 20 [724,1024), 65535 ms in bucket 30
    // [32768,65536) and anything from 65536 ms on in bucket 31.
    for (total, bucket) in [
        (0, 1),
        (1, 2),
        (511, 18),
        (512, 19),
        (700, 19),
        (723, 19),
        (724, 20),
        (65_535, 30),
        (65_536, 31),
        (86_400_000, 31),
    ] {
        assert_eq!(timed(None, total).latency_bucket(), bucket, "{total} ms");
    }
}

#[test]
fn rounds_down_to_whole_milliseconds() {
    // 723.999 ms is still below the bound 724: bucket 19, not 20.
    let t0 = Instant::now();
    let timer = CallTimer::start_at(t0);
    let t = timer.finish_at(t0 + Duration::from_micros(723_999));
    assert_eq!(t.latency_bucket(), 19);
    assert_eq!(duration_bucket(Duration::from_nanos(999_999)), 1);
    assert_eq!(duration_bucket(Duration::MAX), 31);
}

#[test]
fn first_token_counts_once_and_ttft_is_zero_unmarked() {
    let t0 = Instant::now();
    let timer = CallTimer::start_at(t0);
    let clone = timer.clone();
    assert!(clone.first_token_at(t0 + ms(100)));
    // A second mark, on the timer or any clone, changes nothing.
    assert!(!timer.first_token_at(t0 + ms(5)));
    assert!(!clone.first_token_at(t0 + ms(600)));
    assert_eq!(timer.first_token_mark(), Some(t0 + ms(100)));
    let t = timer.finish_at(t0 + ms(700));
    assert_eq!(t.ttft, Some(ms(100)));
    // 100 ms: bucket 14 [91,128).
    assert_eq!((t.latency_bucket(), t.ttft_bucket()), (19, 14));

    let unmarked = timed(None, 700);
    assert_eq!(unmarked.ttft, None);
    assert_eq!((unmarked.latency_bucket(), unmarked.ttft_bucket()), (19, 0));
}

#[test]
fn apply_sets_both_buckets() {
    let mut r = UsageRecord {
        latency_bucket: 7,
        ttft_bucket: 7,
        ..Default::default()
    };
    timed(Some(0), 3).apply(&mut r);
    assert_eq!((r.latency_bucket, r.ttft_bucket), (4, 1));
    // Not marked: the TTFT bucket goes back to 0 (not measured).
    timed(None, 45).apply(&mut r);
    assert_eq!((r.latency_bucket, r.ttft_bucket), (12, 0));
}

#[test]
fn out_of_order_instants_are_clamped() {
    let t0 = Instant::now() + ms(1000);
    let timer = CallTimer::start_at(t0);
    // A mark before the start is 0 ms; an end before the start is 0 ms.
    timer.first_token_at(t0 - ms(10));
    let t = timer.finish_at(t0 - ms(20));
    assert_eq!((t.latency, t.ttft), (Duration::ZERO, Some(Duration::ZERO)));
    // A mark after the end counts as the end.
    let late = CallTimer::start_at(t0);
    late.first_token_at(t0 + ms(900));
    let t = late.finish_at(t0 + ms(300));
    assert_eq!(t.ttft, Some(ms(300)));
    assert_eq!(t.ttft_bucket(), t.latency_bucket());
}

#[tokio::test(start_paused = true)]
async fn clock_methods_read_tokio_time() {
    let timer = CallTimer::start();
    tokio::time::sleep(ms(100)).await;
    assert!(timer.first_token());
    tokio::time::sleep(ms(600)).await;
    assert!(!timer.first_token());
    let t = timer.finish();
    assert_eq!((t.latency, t.ttft), (ms(700), Some(ms(100))));
}

/// One endpoint, no backoff: the first try fails after 400 ms, the second
/// marks its first token 100 ms in and ends 300 ms later.
#[tokio::test(start_paused = true)]
async fn run_timed_counts_retries() {
    let policy = RetryPolicy {
        base: Duration::ZERO,
        cap: Duration::ZERO,
        ..RetryPolicy::default()
    };
    let (_tx, mut shutdown) = watch::channel(false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (result, timer) = policy
        .run_timed(
            &["upstream"],
            &mut shutdown,
            &mut rng,
            |_, n, timer| async move {
                if n == 1 {
                    tokio::time::sleep(ms(400)).await;
                    return Err(Failure::Transport("connection reset by peer".into()));
                }
                tokio::time::sleep(ms(100)).await;
                timer.first_token();
                tokio::time::sleep(ms(300)).await;
                Ok(n)
            },
        )
        .await;
    assert_eq!(result, Ok(2));
    let t = timer.finish();
    // 800 ms in all, bucket 20 [724,1024); the first token at 500 ms,
    // bucket 18 [362,512). Without the failed try they would be 400 ms
    // (18) and 100 ms (14).
    assert_eq!((t.latency, t.ttft), (ms(800), Some(ms(500))));
    assert_eq!((t.latency_bucket(), t.ttft_bucket()), (20, 18));
}

#[tokio::test(start_paused = true)]
async fn run_timed_times_a_failed_call() {
    let policy = RetryPolicy {
        budget: 0,
        ..RetryPolicy::default()
    };
    let (_tx, mut shutdown) = watch::channel(false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (result, timer) = policy
        .run_timed(&["a", "b"], &mut shutdown, &mut rng, |_, _, _| async {
            tokio::time::sleep(ms(30)).await;
            Err::<(), _>(Failure::Timeout)
        })
        .await;
    assert!(result.is_err());
    // Both endpoints' tries, 60 ms: bucket 12 [45,64); no answer, no TTFT.
    let t = timer.finish();
    assert_eq!((t.latency_bucket(), t.ttft_bucket()), (12, 0));
}

/// Nanoseconds up to 10^14 (about 28 hours): every bucket, the last one's
/// open end included, and durations between whole milliseconds.
fn nanos() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..100_000_000, 0u64..100_000_000_000_000]
}

proptest! {
    #[test]
    fn buckets_contain_the_durations(total in nanos(), first in nanos(), marked: bool) {
        let t0 = Instant::now();
        let timer = CallTimer::start_at(t0);
        let first = first.min(total);
        if marked {
            timer.first_token_at(t0 + Duration::from_nanos(first));
        }
        let t = timer.finish_at(t0 + Duration::from_nanos(total));
        let contains = |bucket: u32, d: u64| {
            bounds(bucket as u8).is_some_and(|(lo, hi)| {
                lo * 1_000_000 <= d && hi.is_none_or(|hi| d < hi * 1_000_000)
            })
        };
        prop_assert!(contains(t.latency_bucket(), total));
        if marked {
            prop_assert!(contains(t.ttft_bucket(), first));
            prop_assert!(t.ttft_bucket() <= t.latency_bucket());
        } else {
            prop_assert_eq!(t.ttft_bucket(), 0);
        }
    }
}

//! Tests of the retry policy on a virtual clock.

use std::sync::{Arc, Mutex};

use rand::SeedableRng;

use super::*;

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(7)
}

fn status(code: u16, retry_after: Option<&str>, body: &str) -> Failure {
    Failure::Status {
        code,
        retry_after: retry_after.map(str::to_string),
        body: body.into(),
    }
}

#[test]
fn retryable_set() {
    for c in [429, 500, 502, 503, 504, 529] {
        assert!(status(c, None, "").retryable(), "{c}");
    }
    for c in [400, 401, 403, 404, 413, 422, 501] {
        assert!(!status(c, None, "").retryable(), "{c}");
    }
    assert!(Failure::Transport("reset".into()).retryable());
    assert!(Failure::Timeout.retryable());
    assert!(!Failure::Rejected("bad signature".into()).retryable());
    assert!(!Failure::TooLarge.retryable());
}

#[test]
fn retry_after_sources_longer_wins_and_zero_does_not_mask() {
    let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
    assert_eq!(
        parse_retry_after("120", now),
        Some(Duration::from_secs(120))
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
        Some(Duration::from_secs(10))
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
        Some(Duration::ZERO)
    );
    assert_eq!(parse_retry_after("soon", now), None);
    // The obsolete forms a recipient must accept, and what is no date.
    assert_eq!(
        parse_retry_after("Sunday, 06-Nov-94 08:49:47 GMT", now),
        Some(Duration::from_secs(10))
    );
    assert_eq!(
        parse_retry_after("Sun Nov  6 08:49:47 1994", now),
        Some(Duration::from_secs(10))
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 25:49:47 GMT", now),
        None
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:49:47 CET", now),
        None
    );
    assert_eq!(parse_retry_after("-5", now), None);
    let body = r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"7.5s"}]}}"#;
    assert_eq!(
        parse_body_retry_delay(body),
        Some(Duration::from_millis(7500))
    );
    assert_eq!(
        status(429, Some("0"), body).requested_delay(now),
        Some(Duration::from_millis(7500))
    );
    assert_eq!(
        status(429, Some("9"), body).requested_delay(now),
        Some(Duration::from_secs(9))
    );
    assert_eq!(
        status(429, None, body).requested_delay(now),
        Some(Duration::from_millis(7500))
    );
    assert_eq!(
        status(503, Some("3"), "not json").requested_delay(now),
        Some(Duration::from_secs(3))
    );
}

#[test]
fn full_jitter_stays_in_bounds_and_honours_the_floor() {
    let p = RetryPolicy {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(1),
        ..RetryPolicy::default()
    };
    let mut r = rng();
    for n in 0..10 {
        let ceil = Duration::from_millis(100 * (1u64 << n)).min(Duration::from_secs(1));
        assert_eq!(p.ceiling(n), ceil);
        for _ in 0..200 {
            assert!(p.backoff(n, None, &mut r) <= ceil);
            assert!(p.backoff(n, Some(Duration::from_secs(5)), &mut r) >= Duration::from_secs(5));
        }
    }
    // Not all the same: it is jitter, not a fixed ceiling.
    let xs: std::collections::BTreeSet<_> = (0..50).map(|_| p.backoff(3, None, &mut r)).collect();
    assert!(xs.len() > 10);
}

type Log = Arc<Mutex<Vec<(String, u32, Duration)>>>;

async fn run_with(
    p: &RetryPolicy,
    endpoints: &[&str],
    fail: impl Fn(&str, u32) -> Option<Failure>,
) -> (Result<u32, RetryError>, Log) {
    let log: Log = Arc::default();
    let start = Instant::now();
    let (_tx, mut rx) = watch::channel(false);
    let l = log.clone();
    let r = p
        .run(endpoints, &mut rx, &mut rng(), |e: &&str, n| {
            l.lock().unwrap().push((e.to_string(), n, start.elapsed()));
            let f = fail(e, n);
            async move { f.map_or(Ok(n), Err) }
        })
        .await;
    (r, log)
}

#[tokio::test(start_paused = true)]
async fn worst_case_is_endpoints_plus_budget() {
    let p = RetryPolicy {
        budget: 3,
        ..RetryPolicy::default()
    };
    let (r, log) = run_with(&p, &["a", "b", "c"], |_, _| Some(status(503, None, ""))).await;
    assert!(
        matches!(r, Err(RetryError::Exhausted { tries: 6, .. })),
        "{r:?}"
    );
    let calls: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(e, ..)| e.clone())
        .collect();
    assert_eq!(calls, ["a", "b", "c", "a", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn auth_and_validation_are_not_retried() {
    let p = RetryPolicy::default();
    let (r, log) = run_with(&p, &["a", "b"], |_, _| Some(status(401, None, "bad key"))).await;
    assert!(matches!(r, Err(RetryError::Fatal(_))));
    assert_eq!(log.lock().unwrap().len(), 1);
    let (r, log) = run_with(&p, &["a"], |_, _| Some(Failure::Rejected("invalid".into()))).await;
    assert!(matches!(r, Err(RetryError::Fatal(_))));
    assert_eq!(log.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn waits_at_least_the_requested_delay_and_fails_over() {
    let p = RetryPolicy::default();
    let body = r#"{"retryDelay": "4s"}"#;
    // "a" answers 429 with a body delay; "b" is dead; then "a" succeeds.
    let (r, log) = run_with(&p, &["a", "b"], |e, n| match (e, n) {
        ("a", 1) => Some(status(429, Some("0"), body)),
        ("b", _) => Some(Failure::Transport("connection refused".into())),
        _ => None,
    })
    .await;
    assert_eq!(r, Ok(3));
    let log = log.lock().unwrap();
    assert_eq!(log[1].0, "b", "failed over at once");
    assert!(log[2].2 >= Duration::from_secs(4), "waited {:?}", log[2].2);
}

#[tokio::test(start_paused = true)]
async fn per_try_timeout_is_rearmed_on_every_try() {
    let p = RetryPolicy {
        per_try_timeout: Duration::from_secs(10),
        budget: 2,
        ..RetryPolicy::default()
    };
    let (_tx, mut rx) = watch::channel(false);
    let start = Instant::now();
    let starts: Log = Arc::default();
    let s = starts.clone();
    let r = p
        .run(&["a"], &mut rx, &mut rng(), |_: &&str, n| {
            s.lock().unwrap().push(("a".into(), n, start.elapsed()));
            async move {
                // Each try takes 8 s: under a re-armed 10 s timeout every
                // try completes; a shared 10 s would cut the second.
                tokio::time::sleep(Duration::from_secs(8)).await;
                if n < 3 {
                    Err(Failure::Transport("reset".into()))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
    assert_eq!(r, Ok(3));
    // A try that hangs is cut at exactly the per-try timeout.
    let (r, log) = {
        let log: Log = Arc::default();
        let l = log.clone();
        let t0 = Instant::now();
        let r = p
            .run(&["a"], &mut rx, &mut rng(), |_: &&str, n| {
                l.lock().unwrap().push(("a".into(), n, t0.elapsed()));
                async move {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok::<u32, Failure>(n)
                }
            })
            .await;
        (r, log)
    };
    assert!(
        matches!(
            r,
            Err(RetryError::Exhausted {
                tries: 3,
                last: Failure::Timeout
            })
        ),
        "{r:?}"
    );
    let log = log.lock().unwrap();
    for w in log.windows(2) {
        let gap = w[1].2 - w[0].2;
        assert!(
            gap >= Duration::from_secs(10) && gap <= Duration::from_secs(10) + p.cap,
            "{gap:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn elapsed_bound_and_shutdown_end_waits() {
    let p = RetryPolicy {
        budget: 100,
        max_elapsed: Duration::from_secs(30),
        ..RetryPolicy::default()
    };
    let (r, log) = run_with(&p, &["a"], |_, _| Some(status(503, Some("20"), ""))).await;
    assert!(matches!(r, Err(RetryError::Exhausted { .. })));
    assert_eq!(
        log.lock().unwrap().len(),
        2,
        "a third try would start after 40 s"
    );

    let (tx, mut rx) = watch::channel(false);
    let p = RetryPolicy {
        budget: 5,
        max_elapsed: Duration::from_secs(7200),
        ..RetryPolicy::default()
    };
    let h = tokio::spawn(async move {
        p.run(&["a"], &mut rx, &mut rng(), |_: &&str, _| async {
            Err::<(), _>(status(503, Some("600"), ""))
        })
        .await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    tx.send(true).unwrap();
    assert_eq!(h.await.unwrap(), Err(RetryError::Shutdown));
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_a_try_stops_failover_and_lets_a_success_through() {
    // Cancelled while the first try is on the wire: a failure does not
    // fail over to the next endpoint...
    let (tx, mut rx) = watch::channel(false);
    let tries = Arc::new(Mutex::new(0));
    let t = tries.clone();
    let r = RetryPolicy::default()
        .run(&["a", "b"], &mut rx, &mut rng(), |_: &&str, _| {
            *t.lock().unwrap() += 1;
            let _ = tx.send(true);
            async { Err::<(), _>(Failure::Transport("reset".into())) }
        })
        .await;
    assert_eq!(r, Err(RetryError::Shutdown));
    assert_eq!(*tries.lock().unwrap(), 1);
    // ...and a success still counts.
    let (tx, mut rx) = watch::channel(false);
    let r = RetryPolicy::default()
        .run(&["a", "b"], &mut rx, &mut rng(), |_: &&str, n| {
            let _ = tx.send(true);
            async move { Ok::<_, Failure>(n) }
        })
        .await;
    assert_eq!(r, Ok(1));
}

//! Tests of the retry policy on a virtual clock.

use std::sync::{Arc, Mutex};

use std::time::UNIX_EPOCH;

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
fn full_jitter_stays_in_bounds_and_a_requested_delay_gets_additive_jitter() {
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
            assert!(p.backoff(n, Some(Duration::ZERO), &mut r) <= ceil);
            let w = p.backoff(n, Some(Duration::from_secs(5)), &mut r);
            assert!(
                w >= Duration::from_secs(5) && w <= Duration::from_millis(6250),
                "{w:?}"
            );
        }
    }
    // Not all the same: it is jitter, not a fixed ceiling or a fixed floor.
    let xs: std::collections::BTreeSet<_> = (0..50).map(|_| p.backoff(3, None, &mut r)).collect();
    assert!(xs.len() > 10);
    let xs: std::collections::BTreeSet<_> = (0..50)
        .map(|_| p.backoff(0, Some(Duration::from_secs(7)), &mut r))
        .collect();
    assert!(xs.len() > 10, "everyone told 7 s must not retry at once");
}

proptest::proptest! {
    /// Whatever a server asks for, the wait is in `[r, 1.25 r]` with `r`
    /// the request cut to the cap, and computing it never panics.
    #[test]
    fn a_requested_delay_is_a_floor_with_at_most_a_quarter_on_top(
        secs in proptest::prop_oneof![0u64..10, 0u64..100_000, proptest::num::u64::ANY],
        nanos in 0u32..1_000_000_000,
        n in 0u32..64,
        seed: u64,
    ) {
        let p = RetryPolicy::default();
        let asked = Duration::new(secs, nanos);
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let w = p.backoff(n, Some(asked), &mut r);
        let floor = asked.min(MAX_REQUESTED_DELAY);
        if floor.is_zero() {
            proptest::prop_assert!(w <= p.ceiling(n));
        } else {
            proptest::prop_assert!(w >= floor, "{w:?} < {floor:?}");
            proptest::prop_assert!(w <= floor + floor / 4, "{w:?} > 1.25 x {floor:?}");
        }
    }
}

#[test]
fn huge_requested_delays_are_capped_and_never_panic() {
    let now = SystemTime::now();
    for v in [
        "99999999999",
        "18446744073709551615",
        "99999999999999999999999999999999",
    ] {
        assert_eq!(parse_retry_after(v, now), Some(MAX_REQUESTED_DELAY), "{v}");
    }
    assert_eq!(
        parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now),
        Some(MAX_REQUESTED_DELAY)
    );
    assert_eq!(
        parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", UNIX_EPOCH),
        Some(MAX_REQUESTED_DELAY)
    );
    for body in [
        r#"{"retryDelay": "1e300s"}"#,
        r#"{"retryDelay": "99999999999999999999999s"}"#,
    ] {
        assert_eq!(
            parse_body_retry_delay(body),
            Some(MAX_REQUESTED_DELAY),
            "{body}"
        );
    }
    assert_eq!(parse_body_retry_delay(r#"{"retryDelay": "-1s"}"#), None);
    assert_eq!(
        status(
            429,
            Some("18446744073709551615"),
            "Please retry after 99999999999999 seconds."
        )
        .requested_delay(now),
        Some(MAX_REQUESTED_DELAY)
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_any_instant_gives_up_or_waits_the_cap() {
    // Each try takes a moment, so the elapsed time is not zero when the
    // wait is added to it (unchecked, `u64::MAX` seconds overflowed here).
    async fn huge(p: &RetryPolicy, fail_tries: u32) -> (Result<u32, RetryError>, Vec<Duration>) {
        let (_tx, mut rx) = watch::channel(false);
        let start = Instant::now();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let s = starts.clone();
        let r = p
            .run(&["a"], &mut rx, &mut rng(), |_: &&str, n| {
                s.lock().unwrap().push(start.elapsed());
                async move {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    if n <= fail_tries {
                        Err(status(503, Some("18446744073709551615"), ""))
                    } else {
                        Ok(n)
                    }
                }
            })
            .await;
        let starts = starts.lock().unwrap().clone();
        (r, starts)
    }
    // Within the default 60 s bound: given up at once, no panic.
    let (r, starts) = huge(&RetryPolicy::default(), u32::MAX).await;
    assert!(
        matches!(r, Err(RetryError::Exhausted { tries: 1, .. })),
        "{r:?}"
    );
    assert_eq!(starts.len(), 1);
    // With no time bound at all: waits the capped delay (plus jitter).
    let p = RetryPolicy {
        max_elapsed: Duration::MAX,
        ..RetryPolicy::default()
    };
    let (r, starts) = huge(&p, 1).await;
    assert_eq!(r, Ok(2));
    let waited = starts[1] - Duration::from_millis(10);
    assert!(
        waited >= MAX_REQUESTED_DELAY && waited <= MAX_REQUESTED_DELAY + MAX_REQUESTED_DELAY / 4,
        "{waited:?}"
    );
}

#[test]
fn delays_stated_in_prose_are_read() {
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    let cases: &[(&str, Option<Duration>)] = &[
        // Google Gemini API, 429 RESOURCE_EXHAUSTED message.
        (
            "* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 0\nPlease retry in 11.665902715s.",
            Some(Duration::new(11, 665_902_715)),
        ),
        ("Please retry in 7s", Some(s(7))),
        // OpenAI rate-limit messages.
        (
            "Rate limit reached for gpt-4 in organization org-x on tokens per min (TPM): Limit 10000, Used 8554, Requested 3082. Please try again in 9.816s. Visit https://platform.openai.com/account/rate-limits to learn more.",
            Some(ms(9816)),
        ),
        ("Limit: 10000 / min. Please try again in 6ms. Contact us", Some(ms(6))),
        ("Please try again in 1.5s", Some(ms(1500))),
        ("rate limit reached for requests per day: try again in 2m0s", Some(s(120))),
        ("Please try again in 7m12.864s.", Some(ms(432_864))),
        ("Try again in 500ms", Some(ms(500))),
        // Azure OpenAI.
        (
            "Requests to the ChatCompletions_Create Operation have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 20 seconds.",
            Some(s(20)),
        ),
        ("Rate limit is exceeded. Try again in 30 seconds.", Some(s(30))),
        ("retry after 1 minute", Some(s(60))),
        ("RETRY AFTER 2 MINUTES", Some(s(120))),
        // Absurd numbers are capped.
        ("Please retry after 86400 seconds.", Some(MAX_REQUESTED_DELAY)),
        ("try again in 99999999999999999999999999999h", Some(MAX_REQUESTED_DELAY)),
        // The longest stated delay wins.
        ("retry in 2s; if that fails, try again in 3s", Some(s(3))),
        // Nothing to read.
        ("Resource exhausted. Please try again later.", None),
        ("please retry inside 5s", None),
        ("try again in 5 servers", None),
        ("try again in -5s", None),
        ("try again in s", None),
        ("retry in 1.2.3s", None),
        ("wait 5s", None),
        ("", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_prose_delay(text), *want, "{text}");
    }
    // Read from a status body (JSON or not) and from a transport error,
    // and the longest of all sources wins.
    let now = SystemTime::now();
    let body = r#"{"error":{"message":"Please try again in 1.574s.","type":"tokens","code":"rate_limit_exceeded"}}"#;
    assert_eq!(status(429, None, body).requested_delay(now), Some(ms(1574)));
    assert_eq!(
        status(429, Some("1"), body).requested_delay(now),
        Some(ms(1574))
    );
    assert_eq!(
        status(429, Some("3"), body).requested_delay(now),
        Some(s(3))
    );
    assert_eq!(
        Failure::Transport("mempool is full, retry in 2s".into()).requested_delay(now),
        Some(s(2))
    );
    assert_eq!(
        Failure::Rejected("retry in 2s".into()).requested_delay(now),
        None
    );
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

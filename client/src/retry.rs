//! Transport retry, the one implementation in the workspace (described in
//! `docs/ARCHITECTURE.md`, "Relay"): retryable failures, one retry budget shared across every
//! endpoint of an attempt (worst case `endpoints + budget` calls), full
//! jitter, a provider-requested delay as a floor (`Retry-After` in seconds
//! or as an HTTP date, and a body `RetryInfo.retryDelay`, the longer wins),
//! a per-try timeout re-armed on every try, a bound on total elapsed time,
//! and waits that end early on shutdown.
//!
//! Time is tokio's clock, so tests run it paused (virtual time).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

/// The policy's knobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Backoff base: the n-th retry waits up to `base * 2^n`.
    pub base: Duration,
    /// Backoff cap.
    pub cap: Duration,
    /// Retries shared by all endpoints of one attempt.
    pub budget: u32,
    /// Timeout of one try, re-armed in full on every try.
    pub per_try_timeout: Duration,
    /// No new try starts after this much time since the first.
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
            budget: 4,
            per_try_timeout: Duration::from_secs(15),
            max_elapsed: Duration::from_secs(60),
        }
    }
}

/// Why one try failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Connection refused or reset, DNS, I/O: retryable.
    Transport(String),
    /// The per-try timeout (ours) elapsed: retryable.
    Timeout,
    /// An HTTP status with its `Retry-After` header and body.
    Status {
        /// The status.
        code: u16,
        /// The `Retry-After` header, if any.
        retry_after: Option<String>,
        /// The response body (may hold `RetryInfo.retryDelay`).
        body: String,
    },
    /// An answer that will not change on retry (auth, validation, a
    /// refused signature): never retried.
    Rejected(String),
    /// The response was larger than allowed: never retried.
    TooLarge,
}

impl Failure {
    /// Whether another try may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            Failure::Transport(_) | Failure::Timeout => true,
            Failure::Status { code, .. } => matches!(code, 429 | 500 | 502 | 503 | 504 | 529),
            Failure::Rejected(_) | Failure::TooLarge => false,
        }
    }

    /// The delay the server asked for, the longer of `Retry-After` and the
    /// body's `retryDelay`.
    pub fn requested_delay(&self, now: SystemTime) -> Option<Duration> {
        match self {
            Failure::Status {
                retry_after, body, ..
            } => {
                let header = retry_after
                    .as_deref()
                    .and_then(|v| parse_retry_after(v, now));
                let body = parse_body_retry_delay(body);
                match (header, body) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                }
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Transport(e) => write!(f, "transport error: {e}"),
            Failure::Timeout => write!(f, "try timed out"),
            Failure::Status { code, body, .. } => write!(
                f,
                "HTTP {code}: {}",
                body.chars().take(200).collect::<String>()
            ),
            Failure::Rejected(e) => write!(f, "rejected: {e}"),
            Failure::TooLarge => write!(f, "response too large"),
        }
    }
}

/// Why a retried operation gave up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RetryError {
    /// A failure that is not retried.
    #[error("not retryable: {0}")]
    Fatal(Failure),
    /// Every try failed and the budget or the time bound is spent.
    #[error("gave up after {tries} tries: {last}")]
    Exhausted {
        /// Tries made.
        tries: u32,
        /// The last failure.
        last: Failure,
    },
    /// Shutdown was requested during a wait.
    #[error("shut down while retrying")]
    Shutdown,
    /// No endpoint was given.
    #[error("no endpoints")]
    NoEndpoints,
}

/// `Retry-After`: delta seconds or an HTTP date (`Sun, 06 Nov 1994
/// 08:49:37 GMT`; the obsolete RFC 850 and asctime forms too, as RFC 9110
/// asks of recipients), in whole seconds from `now`. A date in the past is
/// zero.
pub fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let at = at.duration_since(UNIX_EPOCH).ok()?.as_secs();
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// A `RetryInfo.retryDelay` anywhere in a JSON body (Google APIs style:
/// `"retryDelay": "1.5s"`).
pub fn parse_body_retry_delay(body: &str) -> Option<Duration> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    find_retry_delay(&v)
}

fn find_retry_delay(v: &serde_json::Value) -> Option<Duration> {
    match v {
        serde_json::Value::Object(o) => {
            if let Some(d) = o.get("retryDelay").and_then(|d| d.as_str()) {
                let secs: f64 = d.trim().strip_suffix('s')?.parse().ok()?;
                if secs.is_finite() && secs >= 0.0 {
                    return Some(Duration::from_secs_f64(secs.min(3600.0)));
                }
            }
            o.values().find_map(find_retry_delay)
        }
        serde_json::Value::Array(a) => a.iter().find_map(find_retry_delay),
        _ => None,
    }
}

impl RetryPolicy {
    /// The full-jitter ceiling before retry `n` (0-based): `min(base * 2^n, cap)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        self.base
            .saturating_mul(1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX))
            .min(self.cap)
    }

    /// The wait before retry `n`: uniform in `[0, ceiling(n)]`, raised to
    /// `requested` (the server's delay is a floor).
    pub fn backoff(&self, n: u32, requested: Option<Duration>, rng: &mut impl Rng) -> Duration {
        let ceil = self.ceiling(n);
        let jitter = if ceil.is_zero() {
            Duration::ZERO
        } else {
            rng.gen_range(Duration::ZERO..=ceil)
        };
        jitter.max(requested.unwrap_or(Duration::ZERO))
    }

    /// Runs `op` against `endpoints`: each endpoint's first try is free and
    /// a retryable failure moves to the next endpoint not yet tried; after
    /// that, retries draw from the shared budget (round robin) after a
    /// backoff. Every wait ends early when `shutdown` turns true.
    pub async fn run<E, T, F, Fut>(
        &self,
        endpoints: &[E],
        shutdown: &mut watch::Receiver<bool>,
        rng: &mut impl Rng,
        mut op: F,
    ) -> Result<T, RetryError>
    where
        F: FnMut(&E, u32) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        if endpoints.is_empty() {
            return Err(RetryError::NoEndpoints);
        }
        let start = Instant::now();
        let mut tries = 0u32;
        let mut retries = 0u32;
        let mut next = 0usize;
        // The longest delay any server asked for since the last wait: a
        // failover does not discard it.
        let mut floor: Option<Duration> = None;
        loop {
            let e = &endpoints[next % endpoints.len()];
            tries += 1;
            let result = match tokio::time::timeout(self.per_try_timeout, op(e, tries)).await {
                Ok(r) => r,
                Err(_) => Err(Failure::Timeout),
            };
            let failure = match result {
                Ok(v) => return Ok(v),
                Err(f) if !f.retryable() => return Err(RetryError::Fatal(f)),
                Err(f) => f,
            };
            if let Some(d) = failure.requested_delay(SystemTime::now()) {
                floor = Some(floor.map_or(d, |f| f.max(d)));
            }
            next += 1;
            if next < endpoints.len() {
                // Failover: another endpoint's first try, no budget spent
                // (unless shutdown was asked for meanwhile).
                if *shutdown.borrow() {
                    return Err(RetryError::Shutdown);
                }
                continue;
            }
            if retries >= self.budget {
                return Err(RetryError::Exhausted {
                    tries,
                    last: failure,
                });
            }
            let wait = self.backoff(retries, floor.take(), rng);
            if start.elapsed() + wait > self.max_elapsed {
                return Err(RetryError::Exhausted {
                    tries,
                    last: failure,
                });
            }
            retries += 1;
            if wait >= Duration::from_secs(2) {
                tracing::info!(layer = "transport", wait_ms = wait.as_millis() as u64, tries, error = %failure, "waiting before retry");
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = wait_shutdown(shutdown) => return Err(RetryError::Shutdown),
            }
        }
    }
}

async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    if *rx.borrow() {
        return;
    }
    while rx.changed().await.is_ok() {
        if *rx.borrow() {
            return;
        }
    }
    // Sender gone: never shut down from here.
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
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
                assert!(
                    p.backoff(n, Some(Duration::from_secs(5)), &mut r) >= Duration::from_secs(5)
                );
            }
        }
        // Not all the same: it is jitter, not a fixed ceiling.
        let xs: std::collections::BTreeSet<_> =
            (0..50).map(|_| p.backoff(3, None, &mut r)).collect();
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
}

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
mod tests;

//! Transport retry, the one implementation in the workspace (its use by the
//! relay: `docs/relay.md`): retryable failures, one retry budget shared across every
//! endpoint of an attempt (worst case `endpoints + budget` calls), full
//! jitter, a provider-requested delay as a floor (`Retry-After` in seconds
//! or as an HTTP date, a body `RetryInfo.retryDelay`, or a delay stated in
//! the error message's prose; the longest wins, capped at
//! [`MAX_REQUESTED_DELAY`]) with up to 25 % of additive jitter on top, a
//! per-try timeout re-armed on every try, a bound on total elapsed time,
//! and waits that end early on shutdown. [`RetryPolicy::run_timed`] also
//! times the whole call, retries included, for its usage record's latency
//! and TTFT buckets ([`crate::timing`]).
//!
//! Time is tokio's clock, so tests run it paused (virtual time).

use std::future::Future;
use std::time::{Duration, SystemTime};

use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::timing::CallTimer;

mod delay;
pub use delay::{
    parse_body_retry_delay, parse_prose_delay, parse_retry_after, MAX_REQUESTED_DELAY,
};

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

    /// The delay the server asked for: the longest of `Retry-After`, the
    /// body's `retryDelay` and a delay stated in the body's or the error's
    /// prose ("Please try again in 1.5s"), so none masks another (a
    /// `Retry-After: 0` does not discard a body delay). Capped at
    /// [`MAX_REQUESTED_DELAY`].
    pub fn requested_delay(&self, now: SystemTime) -> Option<Duration> {
        let found = match self {
            Failure::Status {
                retry_after, body, ..
            } => [
                retry_after
                    .as_deref()
                    .and_then(|v| parse_retry_after(v, now)),
                parse_body_retry_delay(body),
                parse_prose_delay(body),
            ]
            .into_iter()
            .flatten()
            .max(),
            Failure::Transport(msg) => parse_prose_delay(msg),
            _ => None,
        };
        found.map(|d| d.min(MAX_REQUESTED_DELAY))
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

impl RetryPolicy {
    /// The full-jitter ceiling before retry `n` (0-based): `min(base * 2^n, cap)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        self.base
            .saturating_mul(1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX))
            .min(self.cap)
    }

    /// The wait before retry `n`.
    ///
    /// Without a requested delay (or with a zero one): full jitter, uniform
    /// in `[0, ceiling(n)]`. With a requested delay `r` (first cut to
    /// [`MAX_REQUESTED_DELAY`]): `r` plus additive jitter uniform in
    /// `[0, r / 4]`, so the wait is never shorter than asked, never more
    /// than 25 % longer, and clients told the same delay do not all come
    /// back at the same instant.
    pub fn backoff(&self, n: u32, requested: Option<Duration>, rng: &mut impl Rng) -> Duration {
        match requested.map(|r| r.min(MAX_REQUESTED_DELAY)) {
            Some(r) if !r.is_zero() => {
                let extra = rng.gen_range(Duration::ZERO..=r / 4);
                r.saturating_add(extra)
            }
            _ => {
                let ceil = self.ceiling(n);
                if ceil.is_zero() {
                    Duration::ZERO
                } else {
                    rng.gen_range(Duration::ZERO..=ceil)
                }
            }
        }
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
            let too_late = start
                .elapsed()
                .checked_add(wait)
                .is_none_or(|at| at > self.max_elapsed);
            if too_late {
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

impl RetryPolicy {
    /// [`run`](Self::run), timed as the end user feels it: a [`CallTimer`]
    /// starts just before the first try, so failed tries, failovers and
    /// the waits between tries all count in the latency. `op` gets a clone
    /// of the timer to mark the answer's first byte or token
    /// ([`CallTimer::first_token`]; only the first mark counts, so mark it
    /// only for the answer the user gets, not for an error body).
    ///
    /// The timer comes back unfinished: call [`CallTimer::finish`] when the
    /// answer's last byte is in (at once if `op` read the whole body; after
    /// draining it if `op` returned a stream), or on the error.
    pub async fn run_timed<E, T, F, Fut>(
        &self,
        endpoints: &[E],
        shutdown: &mut watch::Receiver<bool>,
        rng: &mut impl Rng,
        mut op: F,
    ) -> (Result<T, RetryError>, CallTimer)
    where
        F: FnMut(&E, u32, CallTimer) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let timer = CallTimer::start();
        let result = self
            .run(endpoints, shutdown, rng, |e, n| op(e, n, timer.clone()))
            .await;
        (result, timer)
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

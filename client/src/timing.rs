//! Measuring an upstream call's latency and time to first token (TTFT),
//! for the `latency_bucket` and `ttft_bucket` of its
//! [`UsageRecord`](crate::proto::UsageRecord) (app version 4, ADR 0021).
//!
//! What to time, the same way in every gateway (`docs/gateway-sdk.md`,
//! "Measuring latency and time to first token"):
//!
//! - start a [`CallTimer`] just before the gateway sends the upstream
//!   request: after it has read the client's request and after any wait
//!   for a slot of its own (rate limiter, connection pool of its own
//!   making), so neither the client's upload nor the gateway's queueing
//!   counts;
//! - mark [`CallTimer::first_token`] when the first byte of the answer's
//!   body arrives (streaming: the first event that carries a token; not
//!   the headers, not a keep-alive). Only the first mark counts; an error
//!   answer is no answer and is not marked;
//! - [`CallTimer::finish`] when the answer's last byte has arrived, the
//!   call failed for good, or the client left.
//!
//! Retries, endpoint failovers and the waits between them are part of the
//! call: latency is what the end user felt. [`RetryPolicy::run_timed`]
//! starts the timer before the first try for that reason.
//!
//! Durations go to buckets by whole milliseconds, rounded down (bucket `b`
//! holds `lo(b) <= ms < hi(b)` with integer bounds, so rounding down never
//! moves a duration to another bucket): [`bucket_of`] and [`BOUNDS_MS`].
//!
//! Time is tokio's monotonic clock ([`tokio::time::Instant`], the retry
//! policy's clock; outside a paused test runtime it is
//! [`std::time::Instant`]). Every method that reads the clock has an `_at`
//! twin taking the instant, so tests (and gateways that already hold
//! instants: [`Instant::from_std`]) get exact buckets without sleeping.
//!
//! [`RetryPolicy::run_timed`]: crate::RetryPolicy::run_timed

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::proto::UsageRecord;

pub use tally_settlement::slo::latency::{bounds, bucket_of, BOUNDS_MS, BUCKETS};

/// The bucket (1 to [`BUCKETS`]) of a duration: its whole milliseconds,
/// rounded down, through [`bucket_of`].
pub fn duration_bucket(d: Duration) -> u8 {
    bucket_of(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Times one upstream call as the end user feels it.
///
/// Cheap to clone: clones share the start and the first-token mark, so a
/// task that reads a stream can mark the first token while another one
/// finishes the call.
///
/// ```
/// use tally_client::timing::CallTimer;
/// use tally_client::proto::UsageRecord;
/// # use std::time::Duration;
/// # let t0 = tokio::time::Instant::now();
/// let timer = CallTimer::start_at(t0); // CallTimer::start() in a gateway
/// // ... send the request; the first token arrives:
/// timer.first_token_at(t0 + Duration::from_millis(120));
/// timer.first_token_at(t0 + Duration::from_millis(300)); // ignored
/// // ... the last byte arrives:
/// let timing = timer.finish_at(t0 + Duration::from_millis(700));
/// let mut record = UsageRecord::default();
/// timing.apply(&mut record);
/// assert_eq!((record.latency_bucket, record.ttft_bucket), (19, 14));
/// ```
#[derive(Clone, Debug)]
pub struct CallTimer {
    start: Instant,
    first: Arc<OnceLock<Instant>>,
}

impl CallTimer {
    /// Starts timing now: call it just before sending the upstream request.
    pub fn start() -> Self {
        Self::start_at(Instant::now())
    }

    /// Starts timing at `at`.
    pub fn start_at(at: Instant) -> Self {
        Self {
            start: at,
            first: Arc::new(OnceLock::new()),
        }
    }

    /// When timing started.
    pub fn started_at(&self) -> Instant {
        self.start
    }

    /// Marks the first byte or token of the answer as arriving now. Only
    /// the first mark counts (of this timer and all its clones): `true`
    /// if this one did.
    pub fn first_token(&self) -> bool {
        self.first_token_at(Instant::now())
    }

    /// Marks the first byte or token as arriving at `at`; `true` if no
    /// earlier mark was made (calls made later are ignored, whatever
    /// instant they name).
    pub fn first_token_at(&self, at: Instant) -> bool {
        self.first.set(at).is_ok()
    }

    /// When the first byte or token was marked, if it was.
    pub fn first_token_mark(&self) -> Option<Instant> {
        self.first.get().copied()
    }

    /// The durations so far: the call ended now. May be called more than
    /// once; each call reads the clock again.
    pub fn finish(&self) -> CallTiming {
        self.finish_at(Instant::now())
    }

    /// The durations of a call that ended at `at`. An instant before the
    /// start counts as the start; a first-token mark after `at` counts as
    /// `at` (TTFT never exceeds the latency).
    pub fn finish_at(&self, at: Instant) -> CallTiming {
        let latency = at.saturating_duration_since(self.start);
        let ttft = self
            .first
            .get()
            .map(|&f| f.saturating_duration_since(self.start).min(latency));
        CallTiming { latency, ttft }
    }
}

/// The measured durations of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTiming {
    /// From sending the request to the answer's last byte (or the end).
    pub latency: Duration,
    /// From sending the request to the answer's first byte or token;
    /// `None` when none was marked.
    pub ttft: Option<Duration>,
}

impl CallTiming {
    /// The latency bucket, 1 to [`BUCKETS`].
    pub fn latency_bucket(&self) -> u32 {
        u32::from(duration_bucket(self.latency))
    }

    /// The TTFT bucket, 1 to [`BUCKETS`], or 0 when no first token was
    /// marked (not measured).
    pub fn ttft_bucket(&self) -> u32 {
        self.ttft.map_or(0, |d| u32::from(duration_bucket(d)))
    }

    /// Sets `record.latency_bucket` and `record.ttft_bucket`. Only for a
    /// chain at app version 4 or later: an older one refuses a report
    /// with any bucket in it (code 38 `bad_latency`).
    pub fn apply(&self, record: &mut UsageRecord) {
        record.latency_bucket = self.latency_bucket();
        record.ttft_bucket = self.ttft_bucket();
    }
}

#[cfg(test)]
mod tests;

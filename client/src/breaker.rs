//! A circuit breaker per endpoint: closed (calls flow), open (calls are
//! skipped for `open_for` after `failure_threshold` consecutive failures),
//! half-open (a few probes; `probes` successes close it, one failure opens
//! it again). Time is tokio's clock, so tests run it paused.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The breaker's state, as metrics report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls flow.
    Closed,
    /// Calls are skipped.
    Open,
    /// A few probe calls are let through.
    HalfOpen,
}

impl BreakerState {
    /// 0 closed, 1 half-open, 2 open (for a gauge).
    pub fn gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

#[derive(Debug)]
enum Inner {
    Closed {
        failures: u32,
    },
    /// Opened at `since`; half-open once `open_for` has passed (compared,
    /// never added, so no `open_for` can overflow an `Instant`).
    Open {
        since: Instant,
    },
    HalfOpen {
        in_flight: u32,
        successes: u32,
    },
}

/// One endpoint's circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    failure_threshold: u32,
    open_for: Duration,
    probes: u32,
    inner: Mutex<Inner>,
}

impl Breaker {
    /// Opens after `failure_threshold` consecutive failures, for
    /// `open_for`; then lets `probes` calls through.
    pub fn new(failure_threshold: u32, open_for: Duration, probes: u32) -> Self {
        Self {
            failure_threshold: failure_threshold.max(1),
            open_for,
            probes: probes.max(1),
            inner: Mutex::new(Inner::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a call may go now (a half-open probe counts as in flight
    /// until [`Breaker::record`]).
    pub fn allow(&self) -> bool {
        let mut s = self.lock();
        match &mut *s {
            Inner::Closed { .. } => true,
            Inner::Open { since } => {
                if Instant::now().saturating_duration_since(*since) >= self.open_for {
                    *s = Inner::HalfOpen {
                        in_flight: 1,
                        successes: 0,
                    };
                    true
                } else {
                    false
                }
            }
            Inner::HalfOpen { in_flight, .. } => {
                if *in_flight < self.probes {
                    *in_flight += 1;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Records a call's outcome.
    pub fn record(&self, ok: bool) {
        let mut s = self.lock();
        let next = match &*s {
            Inner::Closed { failures } => {
                if ok {
                    Inner::Closed { failures: 0 }
                } else if failures + 1 >= self.failure_threshold {
                    Inner::Open {
                        since: Instant::now(),
                    }
                } else {
                    Inner::Closed {
                        failures: failures + 1,
                    }
                }
            }
            Inner::Open { since } => Inner::Open { since: *since },
            Inner::HalfOpen {
                in_flight,
                successes,
            } => {
                if !ok {
                    Inner::Open {
                        since: Instant::now(),
                    }
                } else if successes + 1 >= self.probes {
                    Inner::Closed { failures: 0 }
                } else {
                    Inner::HalfOpen {
                        in_flight: in_flight.saturating_sub(1),
                        successes: successes + 1,
                    }
                }
            }
        };
        *s = next;
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        match &*self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { since }
                if Instant::now().saturating_duration_since(*since) < self.open_for =>
            {
                BreakerState::Open
            }
            Inner::Open { .. } | Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn closed_open_half_open_closed() {
        let b = Breaker::new(3, Duration::from_secs(10), 2);
        for _ in 0..2 {
            assert!(b.allow());
            b.record(false);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow());
        b.record(false);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allow(), "open: calls skipped");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(b.allow(), "first probe");
        assert!(b.allow(), "second probe");
        assert!(!b.allow(), "no more than two probes at once");
        b.record(true);
        b.record(true);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_for_beyond_any_instant_does_not_panic() {
        let b = Breaker::new(1, Duration::MAX, 1);
        b.record(false);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allow());
        tokio::time::sleep(Duration::from_secs(86_400)).await;
        assert!(!b.allow(), "still open a day later");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_opens_again_and_success_resets_the_count() {
        let b = Breaker::new(2, Duration::from_secs(5), 1);
        b.record(false);
        b.record(true);
        b.record(false);
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "failures must be consecutive"
        );
        b.record(false);
        assert_eq!(b.state(), BreakerState::Open);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(b.allow());
        b.record(false);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allow());
    }
}

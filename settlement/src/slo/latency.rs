//! Latency and time-to-first-token histograms (ADR 0021).
//!
//! A call's latency (or its time to first token) travels as one byte: the
//! index of a fixed log-scale bucket, `0` when the gateway did not measure
//! it. Bucket `b` (1 to [`BUCKETS`]) holds the durations `lo(b) <= d <
//! hi(b)` milliseconds, where `hi(b)` is [`BOUNDS_MS`]`[b - 1]` and `lo(b)`
//! the bound before it (0 for bucket 1); the last bucket has no upper
//! bound. The bounds grow by about sqrt(2), so a bucket's width is at most
//! ~41% of its lower bound above 2 ms: an estimate is never further than
//! one bucket from the true value.
//!
//! A [`Histogram`] counts calls per bucket, for latency and for TTFT. The
//! chain keeps one per route (provider, model, route) and window and one per
//! provider and window. Percentiles use the nearest rank: the `p`-th
//! percentile of `n` measured calls is the `ceil(p * n / 100)`-th smallest,
//! and the estimate is the bucket that holds it, given as its bounds.

use serde::Serialize;

/// Upper bounds (exclusive) of buckets 1 to 30, in milliseconds; bucket
/// 31 holds everything from the last bound up.
pub const BOUNDS_MS: [u64; 30] = [
    1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 256, 362, 512, 724, 1024, 1448, 2048,
    2896, 4096, 5793, 8192, 11585, 16384, 32768, 65536,
];

/// The number of buckets (the largest index a call may carry).
pub const BUCKETS: u8 = 31;

/// The bucket of a duration of `ms` milliseconds.
pub fn bucket_of(ms: u64) -> u8 {
    let below = BOUNDS_MS.iter().take_while(|&&b| b <= ms).count();
    (below + 1) as u8
}

/// Bucket `b`'s bounds in milliseconds: `(lo, hi)`, `hi` `None` for the
/// last bucket. `None` for an index outside 1 to [`BUCKETS`].
pub fn bounds(b: u8) -> Option<(u64, Option<u64>)> {
    if b == 0 || b > BUCKETS {
        return None;
    }
    let i = usize::from(b - 1);
    let lo = if i == 0 { 0 } else { BOUNDS_MS[i - 1] };
    Some((lo, BOUNDS_MS.get(i).copied()))
}

/// Whether `ms` is a bucket bound (objectives name one: ADR 0021).
pub fn is_bound(ms: u64) -> bool {
    BOUNDS_MS.contains(&ms)
}

/// One percentile estimate: the bucket holding the ranked call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Estimate {
    /// The bucket index.
    pub bucket: u8,
    /// Its lower bound (ms, inclusive).
    pub lo_ms: u64,
    /// Its upper bound (ms, exclusive); `None` for the last bucket.
    pub hi_ms: Option<u64>,
}

/// Percentile estimates of one histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    /// Calls measured.
    pub measured: u64,
    /// Median.
    pub p50: Estimate,
    /// 95th percentile.
    pub p95: Estimate,
    /// 99th percentile.
    pub p99: Estimate,
}

/// Calls per bucket (index 0 is bucket 1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts(pub [u64; BUCKETS as usize]);

impl Counts {
    /// Calls counted.
    pub fn total(&self) -> u64 {
        self.0.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// Adds `n` calls to bucket `b` (1 to [`BUCKETS`]); `false` if the
    /// count would overflow.
    pub fn add(&mut self, b: u8, n: u64) -> bool {
        let Some(slot) = self.0.get_mut(usize::from(b).wrapping_sub(1)) else {
            return false;
        };
        match slot.checked_add(n) {
            Some(v) => {
                *slot = v;
                true
            }
            None => false,
        }
    }

    /// Calls at or above `ms` (a bucket bound): the buckets whose lower
    /// bound is at least `ms`.
    pub fn at_or_over(&self, ms: u64) -> u64 {
        (1..=BUCKETS)
            .filter(|&b| bounds(b).is_some_and(|(lo, _)| lo >= ms))
            .fold(0u64, |a, b| a.saturating_add(self.0[usize::from(b - 1)]))
    }

    /// The bucket of the `p`-th percentile (nearest rank), `None` when
    /// nothing was measured.
    pub fn percentile(&self, p: u64) -> Option<Estimate> {
        let n = self.total();
        if n == 0 {
            return None;
        }
        // ceil(p * n / 100) without overflow for any n: u128.
        let rank = (u128::from(p) * u128::from(n)).div_ceil(100).max(1);
        let mut seen = 0u128;
        for b in 1..=BUCKETS {
            seen += u128::from(self.0[usize::from(b - 1)]);
            if seen >= rank {
                let (lo_ms, hi_ms) = bounds(b)?;
                return Some(Estimate {
                    bucket: b,
                    lo_ms,
                    hi_ms,
                });
            }
        }
        None
    }

    /// p50, p95 and p99, `None` when nothing was measured.
    pub fn percentiles(&self) -> Option<Percentiles> {
        Some(Percentiles {
            measured: self.total(),
            p50: self.percentile(50)?,
            p95: self.percentile(95)?,
            p99: self.percentile(99)?,
        })
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        let used: Vec<(u8, u64)> = (1..=BUCKETS)
            .map(|b| (b, self.0[usize::from(b - 1)]))
            .filter(|&(_, c)| c > 0)
            .collect();
        out.push(used.len() as u8);
        for (b, c) in used {
            out.push(b);
            out.extend_from_slice(&c.to_be_bytes());
        }
    }

    fn decode_from(bytes: &[u8]) -> Option<(Self, &[u8])> {
        let (&n, mut rest) = bytes.split_first()?;
        let mut c = Counts::default();
        let mut last = 0u8;
        for _ in 0..n {
            let (&b, r) = rest.split_first()?;
            let (count, r) = r.split_at_checked(8)?;
            let count = u64::from_be_bytes(count.try_into().ok()?);
            // Canonical: buckets ascending, each once, counts nonzero.
            if b <= last || count == 0 || !c.add(b, count) {
                return None;
            }
            last = b;
            rest = r;
        }
        Some((c, rest))
    }
}

/// Latency and TTFT counts of one route or provider in one window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Whole-call latency.
    pub latency: Counts,
    /// Time to first token (or first byte).
    pub ttft: Counts,
}

impl Histogram {
    /// Adds `other`; `false` (and `self` unchanged) on overflow.
    pub fn add(&mut self, other: &Histogram) -> bool {
        let mut next = self.clone();
        for b in 1..=BUCKETS {
            let i = usize::from(b - 1);
            if !next.latency.add(b, other.latency.0[i]) || !next.ttft.add(b, other.ttft.0[i]) {
                return false;
            }
        }
        *self = next;
        true
    }

    /// Whether nothing was measured.
    pub fn is_empty(&self) -> bool {
        self.latency.total() == 0 && self.ttft.total() == 0
    }

    /// Sparse: for latency then TTFT, a count byte then `(bucket u8, calls
    /// u64 BE)` per nonzero bucket, ascending.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.latency.encode_into(&mut out);
        self.ttft.encode_into(&mut out);
        out
    }

    /// Inverse of [`Histogram::encode`] (its canonical form only).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (latency, rest) = Counts::decode_from(bytes)?;
        let (ttft, rest) = Counts::decode_from(rest)?;
        rest.is_empty().then_some(Histogram { latency, ttft })
    }
}

#[cfg(test)]
mod tests;

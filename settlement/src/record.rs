//! Route records: per-class counters of one (user, provider, model, route)
//! in one settlement window.
//!
//! Each call carries one outcome class chosen by the gateway: `ok`,
//! `cancel`, `rate_limit`, `auth`, `transient`, `client` or `unknown`
//! (`unspecified`, the protobuf zero, and unknown values are refused with
//! code 12). A record counts each class separately, next to `requests`,
//! `units` and `amount`; every call adds one to `requests` and to exactly
//! one class, so the classes always sum to `requests`. `fail_count` is not
//! stored: it is `rate_limit + auth + transient + unknown`. Cancelled calls
//! (the end user gave up) and client errors (a bad request) are counted in
//! their own fields but never in `fail_count`, so they cannot hurt a
//! provider's record.

use serde::Serialize;

use crate::proto::Outcome;
use crate::time::rfc3339;

/// Counters of a route record (or of a whole window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Every record, whatever its class.
    pub requests: u64,
    /// Successful calls.
    pub ok: u64,
    /// Cancelled by the client: never a failure.
    pub cancel: u64,
    /// Rate-limited.
    pub rate_limit: u64,
    /// Refused for authentication or payment.
    pub auth: u64,
    /// 5xx, network and TLS failures, upstream timeouts.
    pub transient: u64,
    /// The sender's fault (other 4xx): never a failure.
    pub client: u64,
    /// Unclassified failures.
    pub unknown: u64,
    /// Work units.
    pub units: u64,
    /// Credits charged.
    pub amount: u64,
}

/// A counter or amount would pass `u64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

impl Counters {
    /// Failures that count against the provider: rate_limit + auth +
    /// transient + unknown. Never cancel, never client.
    pub fn fail_count(&self) -> u64 {
        // Each term is at most `requests`, and their sum too (see `add`).
        self.rate_limit + self.auth + self.transient + self.unknown
    }

    /// Counts one record.
    pub fn add_record(
        &mut self,
        outcome: Outcome,
        units: u64,
        amount: u64,
    ) -> Result<(), Overflow> {
        let mut one = Counters {
            requests: 1,
            units,
            amount,
            ..Counters::default()
        };
        match outcome {
            Outcome::Ok => one.ok = 1,
            Outcome::Cancel => one.cancel = 1,
            Outcome::RateLimit => one.rate_limit = 1,
            Outcome::Auth => one.auth = 1,
            Outcome::Transient => one.transient = 1,
            Outcome::Client => one.client = 1,
            Outcome::Unknown | Outcome::Unspecified => one.unknown = 1,
        }
        self.add(&one)
    }

    /// Adds `other`, all or nothing.
    pub fn add(&mut self, other: &Counters) -> Result<(), Overflow> {
        let a = self.as_array();
        let b = other.as_array();
        let mut out = [0u64; 10];
        for i in 0..10 {
            out[i] = a[i].checked_add(b[i]).ok_or(Overflow)?;
        }
        *self = Counters::from_array(out);
        Ok(())
    }

    fn as_array(&self) -> [u64; 10] {
        [
            self.requests,
            self.ok,
            self.cancel,
            self.rate_limit,
            self.auth,
            self.transient,
            self.client,
            self.unknown,
            self.units,
            self.amount,
        ]
    }

    fn from_array(a: [u64; 10]) -> Self {
        Counters {
            requests: a[0],
            ok: a[1],
            cancel: a[2],
            rate_limit: a[3],
            auth: a[4],
            transient: a[5],
            client: a[6],
            unknown: a[7],
            units: a[8],
            amount: a[9],
        }
    }

    /// 80 bytes: ten big-endian u64.
    pub fn encode(&self) -> Vec<u8> {
        self.as_array()
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect()
    }

    /// Inverse of [`Counters::encode`].
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 80 {
            return None;
        }
        let mut a = [0u64; 10];
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            a[i] = u64::from_be_bytes(chunk.try_into().ok()?);
        }
        Some(Counters::from_array(a))
    }
}

/// The identity of a route.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteId {
    /// Who is charged.
    pub user: String,
    /// Who served.
    pub provider: String,
    /// The model.
    pub model: String,
    /// The route.
    pub route: String,
}

/// A route record as queries return it (the documented JSON schema).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RouteRecordView {
    pub window: u64,
    pub window_start: String,
    pub window_end: String,
    pub user: String,
    pub provider: String,
    pub model: String,
    pub route: String,
    pub requests: u64,
    pub ok: u64,
    pub fail_count: u64,
    pub rate_limit: u64,
    pub auth: u64,
    pub transient: u64,
    pub unknown: u64,
    pub client: u64,
    pub cancel: u64,
    pub units: u64,
    pub amount: u64,
}

impl RouteRecordView {
    /// The view of `c` for `id` in `window` of `window_secs` seconds.
    pub fn new(id: &RouteId, window: u64, window_secs: u64, c: &Counters) -> Self {
        let start = window.saturating_mul(window_secs);
        Self {
            window,
            window_start: rfc3339(start),
            window_end: rfc3339(start.saturating_add(window_secs)),
            user: id.user.clone(),
            provider: id.provider.clone(),
            model: id.model.clone(),
            route: id.route.clone(),
            requests: c.requests,
            ok: c.ok,
            fail_count: c.fail_count(),
            rate_limit: c.rate_limit,
            auth: c.auth,
            transient: c.transient,
            unknown: c.unknown,
            client: c.client,
            cancel: c.cancel,
            units: c.units,
            amount: c.amount,
        }
    }
}

/// A settlement window as `/windows` returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct WindowView {
    pub window: u64,
    pub window_start: String,
    pub window_end: String,
    pub closed: bool,
    /// Closed, and its owed entries are still becoming hub calls (the
    /// closing queue holds it).
    #[serde(default)]
    pub converting: bool,
    pub routes: u64,
    pub requests: u64,
    pub fail_count: u64,
    pub cancel: u64,
    pub client: u64,
    pub units: u64,
    pub amount: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_roundtrip_and_fail_count_excludes_cancel_and_client() {
        let mut c = Counters::default();
        for o in Outcome::ALL {
            c.add_record(o, 3, 5).unwrap();
        }
        assert_eq!(c.requests, 7);
        assert_eq!(c.fail_count(), 4);
        assert_eq!(Counters::decode(&c.encode()), Some(c));
        assert_eq!(Counters::decode(&[0; 79]), None);
    }

    #[test]
    fn add_is_all_or_nothing() {
        let mut c = Counters {
            amount: u64::MAX,
            ..Counters::default()
        };
        let before = c;
        assert_eq!(c.add_record(Outcome::Ok, 1, 1), Err(Overflow));
        assert_eq!(c, before);
    }
}

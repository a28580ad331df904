//! Deciding an upstream call's outcome class, the same way in every gateway.
//!
//! Precedence, first match wins:
//! 1. `cancel`: our own client went away, or the client's deadline passed,
//!    whatever the error looks like (a reset or half-read body caused by
//!    the cancellation is still `cancel`);
//! 2. the HTTP status: 429 `rate_limit`; 401, 402, 403 `auth`; 5xx
//!    `transient`; other 4xx `client`; 2xx `ok`;
//! 3. an upstream timeout (ours, not the client's) is `transient`;
//! 4. the error text, case-insensitive, with the same precedence: a
//!    cancellation phrase (`context canceled`, `AbortError`, ...) not
//!    qualified by a timeout phrase gives `cancel` (cancellations are never
//!    failures); then rate-limit phrases give `rate_limit`; then timeout and
//!    network phrases give `transient`. The phrases are the real error
//!    strings of Go `net/http` and `crypto/tls`, hyper/reqwest, Python
//!    requests/urllib3/httpx/aiohttp and Node undici ([`phrases`]);
//! 5. anything else is `unknown`.

use tally_settlement::proto::Outcome;

pub mod phrases;

pub use phrases::{CANCEL_PHRASES, NETWORK_PHRASES, RATE_LIMIT_PHRASES, TIMEOUT_PHRASES};

/// What a gateway knows about one upstream call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamCall {
    /// The gateway's own client disconnected before the call finished.
    pub client_gone: bool,
    /// The client's deadline passed (the client's budget, not ours).
    pub client_deadline_passed: bool,
    /// The upstream did not answer within the gateway's timeout.
    pub upstream_timed_out: bool,
    /// The HTTP status the upstream answered, if it answered.
    pub status: Option<u16>,
    /// The error text, if the call failed (transport error, error body).
    pub error: Option<String>,
}

/// The outcome class of `call`.
pub fn classify(call: &UpstreamCall) -> Outcome {
    if call.client_gone || call.client_deadline_passed {
        return Outcome::Cancel;
    }
    if let Some(s) = call.status {
        match s {
            429 => return Outcome::RateLimit,
            401..=403 => return Outcome::Auth,
            500..=599 => return Outcome::Transient,
            400..=499 => return Outcome::Client,
            200..=299 => return Outcome::Ok,
            _ => {}
        }
    }
    if call.upstream_timed_out {
        return Outcome::Transient;
    }
    match &call.error {
        Some(text) => classify_text(text),
        None => Outcome::Unknown,
    }
}

/// The class an error text alone gives (step 4 of the precedence).
pub fn classify_text(text: &str) -> Outcome {
    let t = text.to_lowercase();
    let any = |list: &[phrases::Phrase]| list.iter().any(|(p, _)| phrases::contains_phrase(&t, p));
    let timeout = any(&TIMEOUT_PHRASES);
    if any(&CANCEL_PHRASES) && !timeout {
        return Outcome::Cancel;
    }
    if RATE_LIMIT_PHRASES.iter().any(|p| t.contains(p)) {
        return Outcome::RateLimit;
    }
    if timeout || any(&NETWORK_PHRASES) {
        return Outcome::Transient;
    }
    Outcome::Unknown
}

#[cfg(test)]
mod tests;

//! Deciding an upstream call's outcome class, the same way in every gateway.
//!
//! Precedence, first match wins:
//! 1. `cancel`: our own client went away, or the client's deadline passed,
//!    whatever the error looks like (a reset or half-read body caused by
//!    the cancellation is still `cancel`);
//! 2. the HTTP status: 429 `rate_limit`; 401, 402, 403 `auth`; 5xx
//!    `transient`; other 4xx `client`; 2xx `ok`;
//! 3. an upstream timeout (ours, not the client's) is `transient`;
//! 4. the error text, case-insensitive substrings: rate-limit phrases give
//!    `rate_limit`, network phrases give `transient`;
//! 5. anything else is `unknown`.

use tally_settlement::proto::Outcome;

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

/// Phrases that mean "rate limited".
pub const RATE_LIMIT_PHRASES: [&str; 4] = [
    "rate limit",
    "rate_limit",
    "quota exceeded",
    "too many requests",
];
/// Phrases that mean a network-level failure.
pub const NETWORK_PHRASES: [&str; 8] = [
    "connection refused",
    "connection reset",
    "no such host",
    "timeout",
    "tls handshake",
    "eof",
    "broken pipe",
    "dial tcp",
];

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
    if let Some(text) = &call.error {
        let t = text.to_ascii_lowercase();
        if RATE_LIMIT_PHRASES.iter().any(|p| t.contains(p)) {
            return Outcome::RateLimit;
        }
        if NETWORK_PHRASES.iter().any(|p| t.contains(p)) {
            return Outcome::Transient;
        }
    }
    Outcome::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(f: impl FnOnce(&mut UpstreamCall)) -> UpstreamCall {
        let mut c = UpstreamCall::default();
        f(&mut c);
        c
    }

    #[test]
    fn table() {
        use Outcome::*;
        let cases: Vec<(&str, UpstreamCall, Outcome)> = vec![
            // cancel beats everything
            ("client gone", call(|c| c.client_gone = true), Cancel),
            (
                "deadline passed",
                call(|c| c.client_deadline_passed = true),
                Cancel,
            ),
            (
                "gone + 500",
                call(|c| {
                    c.client_gone = true;
                    c.status = Some(500)
                }),
                Cancel,
            ),
            (
                "gone + reset",
                call(|c| {
                    c.client_gone = true;
                    c.error = Some("connection reset by peer".into())
                }),
                Cancel,
            ),
            (
                "deadline + half-read body",
                call(|c| {
                    c.client_deadline_passed = true;
                    c.status = Some(200);
                    c.error = Some("unexpected EOF".into())
                }),
                Cancel,
            ),
            (
                "deadline + 429",
                call(|c| {
                    c.client_deadline_passed = true;
                    c.status = Some(429)
                }),
                Cancel,
            ),
            (
                "deadline + upstream timeout",
                call(|c| {
                    c.client_deadline_passed = true;
                    c.upstream_timed_out = true
                }),
                Cancel,
            ),
            // statuses
            ("429", call(|c| c.status = Some(429)), RateLimit),
            ("401", call(|c| c.status = Some(401)), Auth),
            ("402", call(|c| c.status = Some(402)), Auth),
            ("403", call(|c| c.status = Some(403)), Auth),
            ("500", call(|c| c.status = Some(500)), Transient),
            ("503", call(|c| c.status = Some(503)), Transient),
            ("529", call(|c| c.status = Some(529)), Transient),
            ("599", call(|c| c.status = Some(599)), Transient),
            ("400", call(|c| c.status = Some(400)), Client),
            ("404", call(|c| c.status = Some(404)), Client),
            ("422", call(|c| c.status = Some(422)), Client),
            ("200", call(|c| c.status = Some(200)), Ok),
            ("204", call(|c| c.status = Some(204)), Ok),
            // status beats text and timeout
            (
                "400 saying rate limit",
                call(|c| {
                    c.status = Some(400);
                    c.error = Some("rate limit".into())
                }),
                Client,
            ),
            (
                "403 saying quota exceeded",
                call(|c| {
                    c.status = Some(403);
                    c.error = Some("Quota exceeded".into())
                }),
                Auth,
            ),
            (
                "500 saying too many requests",
                call(|c| {
                    c.status = Some(500);
                    c.error = Some("too many requests".into())
                }),
                Transient,
            ),
            (
                "429 + upstream timeout",
                call(|c| {
                    c.status = Some(429);
                    c.upstream_timed_out = true
                }),
                RateLimit,
            ),
            (
                "200 + eof",
                call(|c| {
                    c.status = Some(200);
                    c.error = Some("EOF".into())
                }),
                Ok,
            ),
            // other statuses fall through to text
            ("302", call(|c| c.status = Some(302)), Unknown),
            (
                "302 + connection reset",
                call(|c| {
                    c.status = Some(302);
                    c.error = Some("connection reset".into())
                }),
                Transient,
            ),
            // upstream timeout is transient, unlike the client's deadline
            (
                "upstream timeout",
                call(|c| c.upstream_timed_out = true),
                Transient,
            ),
            (
                "upstream timeout + rate limit text",
                call(|c| {
                    c.upstream_timed_out = true;
                    c.error = Some("rate limit".into())
                }),
                Transient,
            ),
            // text, case-insensitive
            (
                "Rate Limit text",
                call(|c| c.error = Some("Rate Limit reached".into())),
                RateLimit,
            ),
            (
                "rate_limit text",
                call(|c| c.error = Some("error: rate_limit_exceeded".into())),
                RateLimit,
            ),
            (
                "quota text",
                call(|c| c.error = Some("QUOTA EXCEEDED for model".into())),
                RateLimit,
            ),
            (
                "too many requests text",
                call(|c| c.error = Some("Too Many Requests".into())),
                RateLimit,
            ),
            (
                "rate limit beats network text",
                call(|c| c.error = Some("rate limit; connection reset".into())),
                RateLimit,
            ),
            (
                "refused",
                call(|c| {
                    c.error = Some("dial tcp 10.0.0.1:443: connect: Connection Refused".into())
                }),
                Transient,
            ),
            (
                "reset",
                call(|c| c.error = Some("connection reset by peer".into())),
                Transient,
            ),
            (
                "dns",
                call(|c| c.error = Some("lookup api: no such host".into())),
                Transient,
            ),
            (
                "timeout text",
                call(|c| c.error = Some("i/o Timeout".into())),
                Transient,
            ),
            (
                "tls",
                call(|c| c.error = Some("TLS handshake failure".into())),
                Transient,
            ),
            (
                "eof",
                call(|c| c.error = Some("unexpected EOF".into())),
                Transient,
            ),
            (
                "pipe",
                call(|c| c.error = Some("write: broken pipe".into())),
                Transient,
            ),
            (
                "dial tcp",
                call(|c| c.error = Some("dial tcp: lookup failed".into())),
                Transient,
            ),
            (
                "other text",
                call(|c| c.error = Some("model exploded".into())),
                Unknown,
            ),
            ("nothing known", UpstreamCall::default(), Unknown),
        ];
        for (name, c, want) in cases {
            assert_eq!(classify(&c), want, "{name}");
        }
    }
}

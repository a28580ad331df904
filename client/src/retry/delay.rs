//! Reading the delay a server asked for: the `Retry-After` header, a JSON
//! body's `RetryInfo.retryDelay`, and a delay stated only in an error
//! message's prose ("Please try again in 1.574s", "Please retry after 20
//! seconds", "try again in 2m0s").
//!
//! Every delay read here is capped at [`MAX_REQUESTED_DELAY`]: a server
//! that asks for a day, or a hostile `Retry-After: 99999999999`, gets an
//! hour at most, and no arithmetic on a requested delay can overflow.

use std::time::{Duration, SystemTime};

/// The longest delay a server can make a client wait (one hour). Longer
/// requests, from any source, are cut to it. With the additive jitter of
/// [`RetryPolicy::backoff`](super::RetryPolicy::backoff) a wait is at most
/// 1.25 times this.
pub const MAX_REQUESTED_DELAY: Duration = Duration::from_secs(3600);

/// `Retry-After`: delta seconds or an HTTP date (`Sun, 06 Nov 1994
/// 08:49:37 GMT`; the obsolete RFC 850 and asctime forms too, as RFC 9110
/// asks of recipients), from `now`. A date in the past is zero; a number
/// of seconds too large for any integer type, or a date centuries ahead,
/// is [`MAX_REQUESTED_DELAY`].
pub fn parse_retry_after(v: &str, now: SystemTime) -> Option<Duration> {
    let v = v.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Digits only: a delay, however many digits.
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_REQUESTED_DELAY));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_REQUESTED_DELAY),
    )
}

/// A `RetryInfo.retryDelay` anywhere in a JSON body (Google APIs style:
/// `"retryDelay": "1.5s"`), capped at [`MAX_REQUESTED_DELAY`].
pub fn parse_body_retry_delay(body: &str) -> Option<Duration> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    find_retry_delay(&v)
}

fn find_retry_delay(v: &serde_json::Value) -> Option<Duration> {
    match v {
        serde_json::Value::Object(o) => {
            if let Some(d) = o.get("retryDelay").and_then(|d| d.as_str()) {
                let secs: f64 = d.trim().strip_suffix('s')?.parse().ok()?;
                return secs_to_delay(secs);
            }
            o.values().find_map(find_retry_delay)
        }
        serde_json::Value::Array(a) => a.iter().find_map(find_retry_delay),
        _ => None,
    }
}

/// `secs` as a capped delay; `None` for NaN or a negative number.
fn secs_to_delay(secs: f64) -> Option<Duration> {
    if secs.is_nan() || secs < 0.0 {
        return None;
    }
    // Infinity and anything above the cap become the cap: never handed
    // to `from_secs_f64` unbounded (which panics on overflow).
    Some(Duration::from_secs_f64(
        secs.min(MAX_REQUESTED_DELAY.as_secs_f64()),
    ))
}

/// The words after which providers state a delay in an error message:
/// Google's Gemini API ("Please retry in 11.665902715s."), OpenAI ("Please
/// try again in 6ms.", "Please try again in 1.574s."), Azure OpenAI
/// ("Please retry after 20 seconds.", "Try again in 30 seconds.").
const PROSE_CUES: [&str; 4] = ["retry in", "retry after", "try again in", "try again after"];

/// A delay stated in prose after one of the cue phrases, case-insensitive:
/// a Go-style duration (`1.574s`, `6ms`, `2m0s`, `1h2m3s`) or a number and
/// a unit word (`20 seconds`, `1 minute`, `500 milliseconds`). The longest
/// such delay in `text` wins; it is capped at [`MAX_REQUESTED_DELAY`]. A
/// cue followed by no number and unit ("try again later") is nothing.
pub fn parse_prose_delay(text: &str) -> Option<Duration> {
    let lower = text.to_lowercase();
    let mut best: Option<Duration> = None;
    for cue in PROSE_CUES {
        let mut from = 0;
        while let Some(at) = lower.get(from..).and_then(|s| s.find(cue)) {
            let start = from + at + cue.len();
            from = start;
            if let Some(d) = lower.get(start..).and_then(duration_after) {
                best = Some(best.map_or(d, |b| b.max(d)));
            }
        }
    }
    best
}

/// The duration at the start of `s` (after at least one blank), if any.
fn duration_after(s: &str) -> Option<Duration> {
    // The cue must end a word: "retry in 5s", not "retry inside".
    let s = s.strip_prefix(|c: char| c.is_whitespace())?;
    let mut rest = s.trim_start();
    let mut total: u128 = 0;
    let mut parts = 0;
    loop {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            break;
        }
        let number = &rest[..digits];
        let after = &rest[digits..];
        let spaced = after.starts_with(' ');
        let after = after.trim_start_matches(' ');
        let unit_len = after
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(after.len());
        let nanos = decimal_times(number, unit_nanos(&after[..unit_len])?)?;
        total = total.saturating_add(nanos);
        parts += 1;
        rest = &after[unit_len..];
        // Go's compound form continues at once with the next number
        // ("2m0s"); a spaced form ends at its unit word.
        if spaced || !rest.starts_with(|c: char| c.is_ascii_digit()) {
            break;
        }
    }
    if parts == 0 {
        return None;
    }
    let cap = MAX_REQUESTED_DELAY.as_nanos();
    Some(if total >= cap {
        MAX_REQUESTED_DELAY
    } else {
        // Below the cap, so within u64 nanoseconds.
        Duration::from_nanos(u64::try_from(total).unwrap_or(u64::MAX))
    })
}

/// `number` (decimal digits with at most one point) times `unit`
/// nanoseconds, exactly, saturating; `None` if it is no such number.
fn decimal_times(number: &str, unit: u128) -> Option<u128> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() || frac.contains('.') {
        return None;
    }
    let int = int.bytes().fold(0u128, |acc, b| {
        acc.saturating_mul(10).saturating_add(u128::from(b - b'0'))
    });
    // Digits past the 18th are below a nanosecond of any unit.
    let frac = &frac[..frac.len().min(18)];
    let scale = 10u128.pow(frac.len() as u32);
    let frac = frac
        .bytes()
        .fold(0u128, |acc, b| acc * 10 + u128::from(b - b'0'));
    Some(int.saturating_mul(unit).saturating_add(frac * unit / scale))
}

/// Nanoseconds per unit word; `None` for a word that is no time unit.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000_000_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000_000,
        "ms" | "msec" | "millisecond" | "milliseconds" => 1_000_000,
        "us" | "µs" | "μs" | "microsecond" | "microseconds" => 1_000,
        "ns" | "nanosecond" | "nanoseconds" => 1,
        _ => return None,
    })
}

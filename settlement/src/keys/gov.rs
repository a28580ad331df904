//! The keys of governed state ([`crate::gov`], ADR 0020): parameter
//! versions and scheduled changes, and users' withdrawals. Part of
//! [`super`]'s layout.

use super::cat;

/// `meta/window_of_params`: the first window the parameters in force govern.
pub const PARAMS_SINCE: &[u8] = b"meta/window_of_params";
/// `par/at/<window BE>`: parameters kept for the windows from `window` up
/// to the next version, while one of them is open or converting.
pub const PARAMS_AT: &[u8] = b"par/at/";
/// `par/next/<window BE>`: a change scheduled from `window` (JSON).
pub const PARAMS_NEXT: &[u8] = b"par/next/";

/// `wd/<user>\0<call id BE>`: a user's withdrawal ([`crate::state::withdrawal`]).
pub const WITHDRAWAL: &[u8] = b"wd/";

/// `wd/<user>\0`.
pub fn withdrawal_prefix(user: &str) -> Vec<u8> {
    cat(&[WITHDRAWAL, user.as_bytes(), &[0]])
}

/// `wd/<user>\0<call id BE>`.
pub fn withdrawal(user: &str, id: u64) -> Vec<u8> {
    cat(&[WITHDRAWAL, user.as_bytes(), &[0], &id.to_be_bytes()])
}

/// `par/at/<window BE>`.
pub fn params_at(window: u64) -> Vec<u8> {
    cat(&[PARAMS_AT, &window.to_be_bytes()])
}

/// `par/next/<window BE>`.
pub fn params_next(window: u64) -> Vec<u8> {
    cat(&[PARAMS_NEXT, &window.to_be_bytes()])
}

/// The window of a key `prefix || window BE` (`None` for another shape).
pub fn parse_window_suffix(key: &[u8], prefix: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(prefix)?;
    Some(u64::from_be_bytes(rest.try_into().ok()?))
}

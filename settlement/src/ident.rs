//! Identifiers: users, providers, models and routes.

use crate::codes::Code;
use crate::error::Rejection;

/// Longest user or provider identifier, in bytes.
pub const MAX_PARTY_LEN: usize = 64;
/// Longest model or route identifier, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// True for the characters identifiers may use: `[A-Za-z0-9._:/-]`.
pub fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-')
}

/// Checks one identifier; `what` names it in the error.
pub fn check(what: &str, s: &str, max: usize) -> Result<(), Rejection> {
    if s.is_empty() {
        return Err(Rejection::new(
            Code::BadIdentifier,
            format!("{what} is empty"),
        ));
    }
    if s.len() > max {
        return Err(Rejection::new(
            Code::BadIdentifier,
            format!("{what} is {} bytes long, at most {max} allowed", s.len()),
        ));
    }
    if let Some(b) = s.bytes().find(|b| !is_ident_char(*b)) {
        return Err(Rejection::new(
            Code::BadIdentifier,
            format!(
                "{what} {s:?} has character {:?}; allowed: A-Z a-z 0-9 . _ : / -",
                b as char
            ),
        ));
    }
    Ok(())
}

/// Checks a user or provider.
pub fn check_party(what: &str, s: &str) -> Result<(), Rejection> {
    check(what, s, MAX_PARTY_LEN)
}

/// Checks a model or route.
pub fn check_name(what: &str, s: &str) -> Result<(), Rejection> {
    check(what, s, MAX_NAME_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_charset() {
        assert!(check_party("user", "alice.B_9:x/y-z").is_ok());
        assert!(check_name("model", &"m".repeat(128)).is_ok());
    }

    #[test]
    fn refuses_empty_long_and_foreign() {
        for bad in ["", "a b", "ä", "a\0b", "a?b", "a%2F"] {
            assert_eq!(
                check_party("user", bad).unwrap_err().code,
                Code::BadIdentifier,
                "{bad:?}"
            );
        }
        assert!(check_party("user", &"u".repeat(65)).is_err());
        assert!(check_name("route", &"r".repeat(129)).is_err());
    }
}

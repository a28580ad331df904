//! The state's key layout. All keys are ASCII-prefixed; identifiers never
//! contain `0x00`, so it separates their parts; numbers are big-endian so
//! keys sort by them.

use crate::record::RouteId;

pub const CHAIN_ID: &[u8] = b"meta/chain_id";
pub const PARAMS: &[u8] = b"meta/params";
/// Window of the last block.
pub const CUR_WINDOW: &[u8] = b"meta/cur_window";
/// Time (unix seconds) of the last block.
pub const LAST_TIME: &[u8] = b"meta/last_time";

pub const GATEWAY: &[u8] = b"gw/";
pub const BALANCE: &[u8] = b"bal/";
pub const REPORT_ID: &[u8] = b"rid/";
pub const REPORT_EXPIRY: &[u8] = b"rexp/";
pub const ROUTE: &[u8] = b"rr/";
pub const BY_PROVIDER: &[u8] = b"ip/";
pub const BY_USER: &[u8] = b"iu/";
pub const WINDOW: &[u8] = b"win/";
pub const OWED: &[u8] = b"owed/";

pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

pub fn gateway(pubkey: &[u8]) -> Vec<u8> {
    cat(&[GATEWAY, pubkey])
}

pub fn balance(user: &str) -> Vec<u8> {
    cat(&[BALANCE, user.as_bytes()])
}

pub fn report_id(id: &[u8]) -> Vec<u8> {
    cat(&[REPORT_ID, id])
}

pub fn report_expiry(expires_at: u64, id: &[u8]) -> Vec<u8> {
    cat(&[REPORT_EXPIRY, &expires_at.to_be_bytes(), id])
}

/// `rr/<user>\0<provider>\0<model>\0<route>\0` + window: a route's windows
/// sort together.
pub fn route_prefix(id: &RouteId) -> Vec<u8> {
    cat(&[
        ROUTE,
        id.user.as_bytes(),
        b"\0",
        id.provider.as_bytes(),
        b"\0",
        id.model.as_bytes(),
        b"\0",
        id.route.as_bytes(),
        b"\0",
    ])
}

pub fn route(id: &RouteId, window: u64) -> Vec<u8> {
    cat(&[&route_prefix(id), &window.to_be_bytes()])
}

/// `ip/<provider>\0` + window + `<user>\0<model>\0<route>`.
pub fn by_provider_prefix(provider: &str, window: Option<u64>) -> Vec<u8> {
    party_prefix(BY_PROVIDER, provider, window)
}

/// `iu/<user>\0` + window + `<provider>\0<model>\0<route>`.
pub fn by_user_prefix(user: &str, window: Option<u64>) -> Vec<u8> {
    party_prefix(BY_USER, user, window)
}

fn party_prefix(ns: &[u8], party: &str, window: Option<u64>) -> Vec<u8> {
    let mut k = cat(&[ns, party.as_bytes(), b"\0"]);
    if let Some(w) = window {
        k.extend_from_slice(&w.to_be_bytes());
    }
    k
}

pub fn by_provider(id: &RouteId, window: u64) -> Vec<u8> {
    cat(&[
        &by_provider_prefix(&id.provider, Some(window)),
        id.user.as_bytes(),
        b"\0",
        id.model.as_bytes(),
        b"\0",
        id.route.as_bytes(),
    ])
}

pub fn by_user(id: &RouteId, window: u64) -> Vec<u8> {
    cat(&[
        &by_user_prefix(&id.user, Some(window)),
        id.provider.as_bytes(),
        b"\0",
        id.model.as_bytes(),
        b"\0",
        id.route.as_bytes(),
    ])
}

/// Decodes an index key (`ip/` or `iu/`) into the route and window.
pub fn parse_index(key: &[u8], by_provider: bool) -> Option<(RouteId, u64)> {
    let ns = if by_provider { BY_PROVIDER } else { BY_USER };
    let rest = key.strip_prefix(ns)?;
    let sep = rest.iter().position(|b| *b == 0)?;
    let party = std::str::from_utf8(&rest[..sep]).ok()?;
    let rest = &rest[sep + 1..];
    if rest.len() < 8 {
        return None;
    }
    let window = u64::from_be_bytes(rest[..8].try_into().ok()?);
    let mut parts = rest[8..].split(|b| *b == 0);
    let a = std::str::from_utf8(parts.next()?).ok()?;
    let model = std::str::from_utf8(parts.next()?).ok()?;
    let route = std::str::from_utf8(parts.next()?).ok()?;
    if parts.next().is_some() {
        return None;
    }
    let (user, provider) = if by_provider { (a, party) } else { (party, a) };
    Some((
        RouteId {
            user: user.into(),
            provider: provider.into(),
            model: model.into(),
            route: route.into(),
        },
        window,
    ))
}

pub fn window(w: u64) -> Vec<u8> {
    cat(&[WINDOW, &w.to_be_bytes()])
}

/// `owed/<window>/<provider>\0<user>`: credits a provider is owed by a user
/// in a window.
pub fn owed(window: u64, provider: &str, user: &str) -> Vec<u8> {
    cat(&[
        OWED,
        &window.to_be_bytes(),
        b"/",
        provider.as_bytes(),
        b"\0",
        user.as_bytes(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_keys_parse_back() {
        let id = RouteId {
            user: "u:1".into(),
            provider: "p/x".into(),
            model: "m-1".into(),
            route: "/v1/chat".into(),
        };
        assert_eq!(
            parse_index(&by_provider(&id, 42), true),
            Some((id.clone(), 42))
        );
        assert_eq!(parse_index(&by_user(&id, 7), false), Some((id, 7)));
        assert_eq!(parse_index(b"ip/x", true), None);
    }
}

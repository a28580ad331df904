//! Paged reads of the records queries list: a route's records over all
//! windows, a provider's or user's records (through their indexes), the
//! windows with their totals, and the registered gateways.
//!
//! Record and window listings start at the first window whose SLA records
//! are kept ([`super::prune`], app version 7).
//!
//! A page is one bounded range scan: at most `limit` items from the start of
//! the listing or strictly after `cursor`, a state key an earlier page
//! returned as [`Listing::next`]. A cursor that is not a key of the listing
//! answers `None` (the caller's argument is wrong; state is fine).

use tally_store::{prefix_end, KvRead, Pairs};

use super::gateway::GatewayKey;
use crate::error::Fatal;
use crate::keys;
use crate::record::{Counters, RouteId};
use crate::state::chain::route;
use crate::state::prune::kept_from;
use crate::types::WindowInfo;

/// One page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing<T> {
    /// The items, in key order.
    pub items: Vec<T>,
    /// The last item's state key when more items follow (the next page's
    /// cursor), else `None`.
    pub next: Option<Vec<u8>>,
}

/// Whose records a party listing reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Party {
    /// A provider's, through the `ip/` index.
    Provider,
    /// A user's, through the `iu/` index.
    User,
}

/// The pairs of one page and the next page's cursor.
type RawPage = (Pairs, Option<Vec<u8>>);

/// A record of a party listing: its route, window and counters.
pub type PartyRecord = (RouteId, u64, Counters);

fn corrupt() -> Fatal {
    Fatal::Corrupt("state")
}

/// Up to `limit` pairs under `prefix` after `cursor` and not before
/// `from` (a key under `prefix`: the first kept window's), and the next
/// cursor; `None` if `cursor` does not lie under `prefix`.
fn page(
    kv: &impl KvRead,
    prefix: &[u8],
    from: Option<Vec<u8>>,
    cursor: Option<&[u8]>,
    limit: usize,
) -> Result<Option<RawPage>, Fatal> {
    let start = match cursor {
        Some(c) if !c.starts_with(prefix) => return Ok(None),
        Some(c) => {
            let mut s = c.to_vec();
            s.push(0);
            s
        }
        None => prefix.to_vec(),
    };
    let start = match from {
        Some(f) if f > start => f,
        _ => start,
    };
    let mut rows = kv.scan(&start, &prefix_end(prefix), limit.saturating_add(1))?;
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|(k, _)| k.clone())
    } else {
        None
    };
    Ok(Some((rows, next)))
}

fn window_after(key: &[u8], prefix_len: usize) -> Result<u64, Fatal> {
    key.get(prefix_len..)
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(corrupt)
}

/// A route's records over all windows, oldest first: (window, counters).
pub fn route_windows(
    kv: &impl KvRead,
    id: &RouteId,
    cursor: Option<&[u8]>,
    limit: usize,
) -> Result<Option<Listing<(u64, Counters)>>, Fatal> {
    let prefix = keys::route_prefix(id);
    let from = keys::route(id, kept_from(kv)?);
    let Some((rows, next)) = page(kv, &prefix, Some(from), cursor, limit)? else {
        return Ok(None);
    };
    let mut items = Vec::with_capacity(rows.len());
    for (k, v) in rows {
        let w = window_after(&k, prefix.len())?;
        items.push((w, Counters::decode(&v).ok_or_else(corrupt)?));
    }
    Ok(Some(Listing { items, next }))
}

/// A provider's or user's records, in one window or all (window first),
/// read through its index: (route, window, counters).
pub fn party_routes(
    kv: &impl KvRead,
    whose: Party,
    party: &str,
    window: Option<u64>,
    cursor: Option<&[u8]>,
    limit: usize,
) -> Result<Option<Listing<PartyRecord>>, Fatal> {
    let by_provider = whose == Party::Provider;
    let prefix_at = |w: Option<u64>| {
        if by_provider {
            keys::by_provider_prefix(party, w)
        } else {
            keys::by_user_prefix(party, w)
        }
    };
    let prefix = prefix_at(window);
    // Without a window the listing starts at the first kept one (a pruned
    // window is the caller's to refuse).
    let from = match window {
        None => Some(prefix_at(Some(kept_from(kv)?))),
        Some(_) => None,
    };
    let Some((rows, next)) = page(kv, &prefix, from, cursor, limit)? else {
        return Ok(None);
    };
    let mut items = Vec::with_capacity(rows.len());
    for (k, _) in rows {
        let (id, w) = keys::parse_index(&k, by_provider).ok_or_else(corrupt)?;
        // An index entry without its record is corrupt state.
        let c = route(kv, &id, w)
            .map_err(|e| match e {
                Fatal::Corrupt(_) => corrupt(),
                other => other,
            })?
            .ok_or_else(corrupt)?;
        items.push((id, w, c));
    }
    Ok(Some(Listing { items, next }))
}

/// The windows any report landed in, oldest first: (window, totals).
pub fn windows(
    kv: &impl KvRead,
    cursor: Option<&[u8]>,
    limit: usize,
) -> Result<Option<Listing<(u64, WindowInfo)>>, Fatal> {
    let from = keys::window(kept_from(kv)?);
    let Some((rows, next)) = page(kv, keys::WINDOW, Some(from), cursor, limit)? else {
        return Ok(None);
    };
    let mut items = Vec::with_capacity(rows.len());
    for (k, v) in rows {
        let w = window_after(&k, keys::WINDOW.len())?;
        items.push((w, WindowInfo::decode(&v).ok_or_else(corrupt)?));
    }
    Ok(Some(Listing { items, next }))
}

/// Every registered gateway key, by public key, with its standing.
pub fn gateways(kv: &impl KvRead) -> Result<Vec<(Vec<u8>, GatewayKey)>, Fatal> {
    let mut out = Vec::new();
    let mut bad = false;
    kv.for_each(keys::GATEWAY, &prefix_end(keys::GATEWAY), &mut |k, v| {
        let key = &k[keys::GATEWAY.len()..];
        match <[u8; 32]>::try_from(key)
            .ok()
            .and_then(|pk| GatewayKey::decode(&pk, v))
        {
            Some(g) => out.push((key.to_vec(), g)),
            None => bad = true,
        }
        !bad
    })?;
    if bad {
        return Err(Fatal::Corrupt("gateway key record"));
    }
    Ok(out)
}

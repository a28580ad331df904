//! Chain metadata, gateways, balances, windows and route
//! records: the state usage reports read and write.
//!
//! Report ids (replay protection) live in [`super::replay`].

use tally_store::{prefix_end, Kv, KvRead};

use super::{get_u64, put_u64, u64_or};
use crate::error::Fatal;
use crate::genesis::{GenesisError, Params};
use crate::keys;
use crate::record::{Counters, RouteId};
use crate::types::{PartyWindow, WindowInfo};

/// The app version the state runs under: 1 until an upgrade plan
/// switched it (ADR 0019).
pub fn app_version(kv: &impl KvRead) -> Result<u64, Fatal> {
    u64_or(kv, keys::APP_VERSION, 1)
}

/// Records the app version the state runs under from now on.
pub fn put_app_version(kv: &mut impl Kv, version: u64) {
    put_u64(kv, keys::APP_VERSION.to_vec(), version);
}

/// The chain's parameters (the defaults before genesis wrote them). A zero
/// window length (genesis refuses it; blocks divide by it) is corrupt.
pub fn params(kv: &impl KvRead) -> Result<Params, Fatal> {
    let p: Params = match kv.get(keys::PARAMS)? {
        None => return Ok(Params::default()),
        Some(b) => serde_json::from_slice(&b).map_err(|_| Fatal::Corrupt("params"))?,
    };
    if p.settlement_window_secs == 0 {
        return Err(Fatal::Corrupt("params"));
    }
    Ok(p)
}

/// Stores the chain's parameters.
pub fn put_params(kv: &mut impl Kv, params: &Params) -> Result<(), GenesisError> {
    kv.put(keys::PARAMS.to_vec(), serde_json::to_vec(params)?);
    Ok(())
}

/// The first window the parameters in force govern.
pub fn params_since(kv: &impl KvRead) -> Result<u64, Fatal> {
    Ok(get_u64(kv, keys::PARAMS_SINCE)?.unwrap_or(0))
}

/// Most kept parameter versions a lookup reads (one per change whose
/// windows are still open or converting).
const MAX_KEPT_PARAMS: usize = 1024;

/// The parameters that govern `window`: the version in force, or a kept
/// older one for a window before it.
pub fn params_at(kv: &impl KvRead, window: u64) -> Result<Params, Fatal> {
    if window >= params_since(kv)? {
        return params(kv);
    }
    // Kept versions are few: one per change whose windows are still open
    // or converting.
    let end = keys::params_at(window.saturating_add(1));
    let found = kv.scan(keys::PARAMS_AT, &end, MAX_KEPT_PARAMS)?.pop();
    match found {
        Some((_, b)) => serde_json::from_slice(&b).map_err(|_| Fatal::Corrupt("kept params")),
        None => params(kv),
    }
}

/// Stores parameters that were already checked (a governed change).
pub fn put_params_raw(kv: &mut impl Kv, params: &Params) {
    kv.put(
        keys::PARAMS.to_vec(),
        serde_json::to_vec(params).unwrap_or_default(),
    );
}

/// The chain id recorded at genesis (empty before).
pub fn chain_id(kv: &impl KvRead) -> Result<String, Fatal> {
    Ok(kv
        .get(keys::CHAIN_ID)?
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default())
}

/// Records the chain id.
pub fn put_chain_id(kv: &mut impl Kv, chain_id: &str) {
    kv.put(keys::CHAIN_ID.to_vec(), chain_id.as_bytes().to_vec());
}

/// The name of the gateway with ed25519 key `pubkey`, if registered.
pub fn gateway(kv: &impl KvRead, pubkey: &[u8; 32]) -> Result<Option<String>, Fatal> {
    Ok(kv
        .get(&keys::gateway(pubkey))?
        .map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// Registers a gateway.
pub fn put_gateway(kv: &mut impl Kv, pubkey: &[u8; 32], name: &str) {
    kv.put(keys::gateway(pubkey), name.as_bytes().to_vec());
}

/// A user's balance (0 if never funded).
pub fn balance(kv: &impl KvRead, user: &str) -> Result<u64, Fatal> {
    u64_or(kv, &keys::balance(user), 0)
}

/// Sets a user's balance.
pub fn put_balance(kv: &mut impl Kv, user: &str, amount: u64) {
    put_u64(kv, keys::balance(user), amount);
}

/// Time of the last block (0 before the first).
pub fn last_time(kv: &impl KvRead) -> Result<u64, Fatal> {
    u64_or(kv, keys::LAST_TIME, 0)
}

/// Records the time of the block being run.
pub fn put_last_time(kv: &mut impl Kv, time: u64) {
    put_u64(kv, keys::LAST_TIME.to_vec(), time);
}

/// Window of the last block, if a block ran.
pub fn cur_window(kv: &impl KvRead) -> Result<Option<u64>, Fatal> {
    get_u64(kv, keys::CUR_WINDOW)
}

/// Records the window of the block being run.
pub fn put_cur_window(kv: &mut impl Kv, window: u64) {
    put_u64(kv, keys::CUR_WINDOW.to_vec(), window);
}

/// A window's totals, if any report landed in it.
pub fn window_info(kv: &impl KvRead, window: u64) -> Result<Option<WindowInfo>, Fatal> {
    match kv.get(&keys::window(window))? {
        None => Ok(None),
        Some(b) => WindowInfo::decode(&b)
            .map(Some)
            .ok_or(Fatal::Corrupt("window")),
    }
}

/// Stores a window's totals.
pub fn put_window_info(kv: &mut impl Kv, window: u64, info: &WindowInfo) {
    kv.put(keys::window(window), info.encode());
}

/// A party's window totals under `key` ([`keys::provider_window`] or
/// [`keys::user_window`]), if it has any.
pub fn party_window(kv: &impl KvRead, key: &[u8]) -> Result<Option<PartyWindow>, Fatal> {
    match kv.get(key)? {
        None => Ok(None),
        Some(b) => PartyWindow::decode(&b)
            .map(Some)
            .ok_or(Fatal::Corrupt("party window totals")),
    }
}

/// A route's counters in `window`, if it has a record there.
pub fn route(kv: &impl KvRead, id: &RouteId, window: u64) -> Result<Option<Counters>, Fatal> {
    match kv.get(&keys::route(id, window))? {
        None => Ok(None),
        Some(b) => Counters::decode(&b)
            .map(Some)
            .ok_or(Fatal::Corrupt("route record")),
    }
}

/// Stores a route's counters; a new record is also indexed by provider and
/// by user.
pub fn put_route(kv: &mut impl Kv, id: &RouteId, window: u64, c: &Counters, is_new: bool) {
    kv.put(keys::route(id, window), c.encode());
    if is_new {
        kv.put(keys::by_provider(id, window), keys::PRESENT.to_vec());
        kv.put(keys::by_user(id, window), keys::PRESENT.to_vec());
    }
}

/// What one provider is owed by one user in an open window, read once and
/// written back with [`put_owed_slot`]: the key is built once for both
/// (report execution does this for every (provider, user) of a report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwedSlot {
    key: Vec<u8>,
    /// The amount owed.
    pub amount: u64,
}

/// Reads what `provider` is owed by `user` in `window` (0 if none).
pub fn owed_slot(
    kv: &impl KvRead,
    window: u64,
    provider: &str,
    user: &str,
) -> Result<OwedSlot, Fatal> {
    let key = keys::owed(window, provider, user);
    let amount = u64_or(kv, &key, 0)?;
    Ok(OwedSlot { key, amount })
}

/// Writes a slot read by [`owed_slot`] back with its (changed) amount.
pub fn put_owed_slot(kv: &mut impl Kv, slot: OwedSlot) {
    put_u64(kv, slot.key, slot.amount);
}

/// One entry of what was owed in a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owed {
    /// Who is owed.
    pub provider: String,
    /// Who owes.
    pub user: String,
    /// Credits.
    pub amount: u64,
}

/// Up to `limit` entries owed in `window`, in key order, starting after
/// the entry `after` (provider, user) if given: one bounded range scan.
pub fn owed_page(
    kv: &impl KvRead,
    window: u64,
    after: Option<(&str, &str)>,
    limit: usize,
) -> Result<Vec<Owed>, Fatal> {
    let prefix = keys::owed_prefix(window);
    let start = match after {
        Some((provider, user)) => successor(keys::owed(window, provider, user)),
        None => prefix.clone(),
    };
    let rows = kv.scan(&start, &prefix_end(&prefix), limit)?;
    let mut out = Vec::with_capacity(rows.len());
    for (k, v) in rows {
        let (provider, user) = keys::parse_owed(&k, window).ok_or(Fatal::Corrupt("owed key"))?;
        out.push(Owed {
            provider,
            user,
            amount: super::decode_u64(&v, "owed amount")?,
        });
    }
    Ok(out)
}

/// The smallest key after `key`.
fn successor(mut key: Vec<u8>) -> Vec<u8> {
    key.push(0);
    key
}

/// Forgets everything owed in `window` (one range delete).
pub fn clear_owed(kv: &mut impl Kv, window: u64) {
    kv.delete_prefix(&keys::owed_prefix(window));
}

/// Forgets what was owed in `window` up to and including the entry of
/// (`provider`, `user`) (one range delete).
pub fn clear_owed_through(kv: &mut impl Kv, window: u64, provider: &str, user: &str) {
    kv.delete_range(
        keys::owed_prefix(window),
        successor(keys::owed(window, provider, user)),
    );
}

/// A closed window in the closing queue: its owed entries are still
/// becoming hub calls, in key order, a bounded number per block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closing {
    /// The window.
    pub window: u64,
    /// Hub calls made from it so far.
    pub calls: u64,
    /// The cursor: (provider, user) of the last owed entry converted,
    /// `None` before the first.
    pub last: Option<(String, String)>,
}

impl Closing {
    /// Window `window`, nothing converted yet.
    pub fn new(window: u64) -> Self {
        Self {
            window,
            calls: 0,
            last: None,
        }
    }

    /// `calls` (8 bytes, big-endian), then `<provider>\0<user>` of the
    /// last entry converted (nothing before the first).
    fn encode(&self) -> Vec<u8> {
        let mut v = self.calls.to_be_bytes().to_vec();
        if let Some((provider, user)) = &self.last {
            v.extend_from_slice(provider.as_bytes());
            v.push(0);
            v.extend_from_slice(user.as_bytes());
        }
        v
    }

    /// Inverse of [`Closing::encode`].
    fn decode(window: u64, b: &[u8]) -> Option<Self> {
        let calls = u64::from_be_bytes(b.get(..8)?.try_into().ok()?);
        let rest = b.get(8..)?;
        let last = if rest.is_empty() {
            None
        } else {
            let sep = rest.iter().position(|c| *c == 0)?;
            let provider = std::str::from_utf8(rest.get(..sep)?).ok()?;
            let user = std::str::from_utf8(rest.get(sep + 1..)?).ok()?;
            Some((provider.to_string(), user.to_string()))
        };
        Some(Self {
            window,
            calls,
            last,
        })
    }
}

/// The oldest window of the closing queue, if any (one read of at most one
/// entry).
pub fn oldest_closing(kv: &impl KvRead) -> Result<Option<Closing>, Fatal> {
    let Some((k, v)) = kv.scan_prefix(keys::CLOSING, 1)?.into_iter().next() else {
        return Ok(None);
    };
    let window = keys::parse_closing(&k).ok_or(Fatal::Corrupt("closing key"))?;
    Closing::decode(window, &v)
        .map(Some)
        .ok_or(Fatal::Corrupt("closing entry"))
}

/// Whether `window` is in the closing queue.
pub fn is_closing(kv: &impl KvRead, window: u64) -> Result<bool, Fatal> {
    Ok(kv.get(&keys::closing(window))?.is_some())
}

/// Puts a window in the closing queue or moves its cursor.
pub fn put_closing(kv: &mut impl Kv, c: &Closing) {
    kv.put(keys::closing(c.window), c.encode());
}

/// Takes a window out of the closing queue (all its entries converted).
pub fn delete_closing(kv: &mut impl Kv, window: u64) {
    kv.delete(keys::closing(window));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closing_entry_decodes_back_and_refuses_corrupt_bytes() {
        for c in [
            Closing::new(3),
            Closing {
                window: 9,
                calls: 1001,
                last: Some(("p:1".into(), "u/2".into())),
            },
        ] {
            assert_eq!(Closing::decode(c.window, &c.encode()), Some(c));
        }
        assert_eq!(Closing::decode(1, &[0; 7]), None);
        assert_eq!(Closing::decode(1, b"\0\0\0\0\0\0\0\x01no-separator"), None);
    }
}

//! The state's key layout: every key prefix of the settlement state and
//! one builder per key, so nothing else builds keys by hand.
//!
//! All keys are ASCII-prefixed; identifiers never contain `0x00`, so it
//! separates their parts; numbers are big-endian so keys sort by them. No
//! prefix in [`LAYOUT`] is a prefix of another. The DKG component's keys
//! live in [`crate::dkg::keys`] and are listed in [`LAYOUT`] too. A leaf
//! module: it imports only [`RouteId`] (and `layout.rs` those keys).

use crate::record::RouteId;

mod gov;
mod layout;
mod prune;
mod replay;
mod slo;
pub use gov::*;
pub use layout::LAYOUT;
pub use prune::*;
pub use replay::*;
pub use slo::*;

/// The value of an index or marker entry (`ip/`, `iu/`, `rexp/`, `hcp/`,
/// `sret/`, `pexp/`): the single byte `0x01`. No key holds an empty value:
/// ICS23 cannot prove one, nor the absence of a key next to one.
pub const PRESENT: &[u8] = &[1];

/// `meta/chain_id`: the chain id recorded at genesis.
pub const CHAIN_ID: &[u8] = b"meta/chain_id";
/// `meta/params`: the chain parameters (JSON).
pub const PARAMS: &[u8] = b"meta/params";
/// Window of the last block.
pub const CUR_WINDOW: &[u8] = b"meta/cur_window";
/// Time (unix seconds) of the last block.
pub const LAST_TIME: &[u8] = b"meta/last_time";
/// `meta/next_call_id`: the id the next hub call gets.
pub const NEXT_CALL_ID: &[u8] = b"meta/next_call_id";

/// `gw/<pubkey>`: a registered gateway's name.
pub const GATEWAY: &[u8] = b"gw/";
/// `bal/<user>`: a user's balance.
pub const BALANCE: &[u8] = b"bal/";
/// `rr/<user>\0<provider>\0<model>\0<route>\0<window>`: a route record.
pub const ROUTE: &[u8] = b"rr/";
/// `ip/<provider>\0<window>...`: route records by provider.
pub const BY_PROVIDER: &[u8] = b"ip/";
/// `iu/<user>\0<window>...`: route records by user.
pub const BY_USER: &[u8] = b"iu/";
/// `win/<window>`: a window's totals.
pub const WINDOW: &[u8] = b"win/";
/// `pw/<provider>\0<window>`: a provider's totals in a window (provable).
pub const PROVIDER_WINDOW: &[u8] = b"pw/";
/// `uw/<user>\0<window>`: a user's totals in a window (provable).
pub const USER_WINDOW: &[u8] = b"uw/";
/// `owed/<window>/<provider>\0<user>`: credits owed in a window, until
/// they become a hub call.
pub const OWED: &[u8] = b"owed/";
/// `closing/<window>`: a closed window whose owed entries are still
/// becoming hub calls (the closing queue, oldest window first).
pub const CLOSING: &[u8] = b"closing/";

/// `gwn/<name>`: a registered gateway's ed25519 key, by name.
pub const GATEWAY_NAME: &[u8] = b"gwn/";
/// `ukey/<user>`: a user's ed25519 key (signs the user's allowances).
pub const USER_KEY: &[u8] = b"ukey/";
/// `useq/<user>`: the last sequence of the user's allowance changes.
pub const USER_SEQ: &[u8] = b"useq/";
/// `allow/<user>\0<gateway>`: an allowance (max per window, expiry).
pub const ALLOWANCE: &[u8] = b"allow/";
/// `aspent/<user>\0<gateway>`: what the gateway charged the user in the
/// window it last charged (window, amount).
pub const ALLOWANCE_SPENT: &[u8] = b"aspent/";

/// `hc/<id>`: an escrowed hub call (deleted once settled).
pub const HUB_CALL: &[u8] = b"hc/";
/// `hcp/<chain>\0<id>`: hub calls not yet in a batch.
pub const HUB_PENDING: &[u8] = b"hcp/";
/// `batch/<chain>\0<nonce>`: a batch record.
pub const BATCH: &[u8] = b"batch/";
/// `sret/<window><chain>\0<nonce>`: a settled batch whose calls are kept
/// until that window starts.
pub const SETTLED_RETAIN: &[u8] = b"sret/";
/// `sync/<chain>`: a hub chain's sync state.
pub const SYNC: &[u8] = b"sync/";
/// `psig/<digest>/<index>`: a stored partial signature.
pub const PSIG: &[u8] = b"psig/";
/// `pmsg/<digest>`: the message stored partials sign.
pub const PMSG: &[u8] = b"pmsg/";
/// `pexp/<height><digest>`: when a message's partials expire.
pub const PEXP: &[u8] = b"pexp/";
/// `hubcur/<chain>`: the next hub height deposits are read from.
pub const HUB_CURSOR: &[u8] = b"hubcur/";
/// `depseq/<chain>`: the next deposit sequence number.
pub const DEPOSIT_SEQ: &[u8] = b"depseq/";
/// `hubheld/<chain>\0<from_height><first_seq>`: a threshold-signed hub
/// block ahead of the deposit cursor, credited once the cursor reaches it
/// (app version 5, ADR 0024).
pub const HUB_HELD: &[u8] = b"hubheld/";
/// `meta/last_height`: the height of the last block.
pub const LAST_HEIGHT: &[u8] = b"meta/last_height";
/// `meta/app_version`: the app version the state runs under (absent: 1).
pub const APP_VERSION: &[u8] = b"meta/app_version";
/// `upg/plan`: the pending upgrade plan.
pub const UPGRADE_PLAN: &[u8] = b"upg/plan";
/// `upg/done/<name>`: an upgrade plan carried out, and its height.
pub const UPGRADE_DONE: &[u8] = b"upg/done/";

/// The concatenation of `parts`.
pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

/// `gw/<pubkey>`.
pub fn gateway(pubkey: &[u8]) -> Vec<u8> {
    cat(&[GATEWAY, pubkey])
}

/// `gwn/<name>`.
pub fn gateway_name(name: &str) -> Vec<u8> {
    cat(&[GATEWAY_NAME, name.as_bytes()])
}

/// `ukey/<user>`.
pub fn user_key(user: &str) -> Vec<u8> {
    cat(&[USER_KEY, user.as_bytes()])
}

/// `useq/<user>`.
pub fn user_seq(user: &str) -> Vec<u8> {
    cat(&[USER_SEQ, user.as_bytes()])
}

/// `allow/<user>\0`: every allowance a user gave.
pub fn allowance_prefix(user: &str) -> Vec<u8> {
    cat(&[ALLOWANCE, user.as_bytes(), b"\0"])
}

/// `allow/<user>\0<gateway>`.
pub fn allowance(user: &str, gateway: &str) -> Vec<u8> {
    cat(&[ALLOWANCE, user.as_bytes(), b"\0", gateway.as_bytes()])
}

/// `aspent/<user>\0<gateway>`.
pub fn allowance_spent(user: &str, gateway: &str) -> Vec<u8> {
    cat(&[ALLOWANCE_SPENT, user.as_bytes(), b"\0", gateway.as_bytes()])
}

/// `bal/<user>`.
pub fn balance(user: &str) -> Vec<u8> {
    cat(&[BALANCE, user.as_bytes()])
}

/// The scope of a report id: the 32-byte key of the gateway that sent it,
/// then the 16-byte id (ids are unique per gateway, not globally).
pub fn report_scope(gateway_key: &[u8], id: &[u8]) -> Vec<u8> {
    cat(&[gateway_key, id])
}

/// `upg/done/<name>`.
pub fn upgrade_done(name: &str) -> Vec<u8> {
    cat(&[UPGRADE_DONE, name.as_bytes()])
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

/// A route record: [`route_prefix`] + window.
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

/// The by-provider index entry of a route record.
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

/// The by-user index entry of a route record.
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

/// `pw/<provider>\0` + window.
pub fn provider_window(provider: &str, window: u64) -> Vec<u8> {
    cat(&[
        PROVIDER_WINDOW,
        provider.as_bytes(),
        b"\0",
        &window.to_be_bytes(),
    ])
}

/// `pw/<provider>\0`: every window of a provider's totals.
pub fn provider_window_prefix(provider: &str) -> Vec<u8> {
    cat(&[PROVIDER_WINDOW, provider.as_bytes(), b"\0"])
}

/// The party and window of a `<ns><party>\0<window>` key (`pw/`, `uw/`,
/// `plat/`); `None` if it is not one.
pub fn parse_party_window(key: &[u8], ns: &[u8]) -> Option<(String, u64)> {
    let rest = key.strip_prefix(ns)?;
    let sep = rest.iter().position(|b| *b == 0)?;
    let party = std::str::from_utf8(&rest[..sep]).ok()?;
    let w: [u8; 8] = rest[sep + 1..].try_into().ok()?;
    Some((party.to_string(), u64::from_be_bytes(w)))
}

/// `uw/<user>\0` + window.
pub fn user_window(user: &str, window: u64) -> Vec<u8> {
    cat(&[USER_WINDOW, user.as_bytes(), b"\0", &window.to_be_bytes()])
}

/// `win/<window>`.
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

/// `sret/<window><chain>\0<nonce>`.
pub fn settled_retain(window: u64, chain: &str, nonce: u64) -> Vec<u8> {
    cat(&[
        SETTLED_RETAIN,
        &window.to_be_bytes(),
        chain.as_bytes(),
        b"\0",
        &nonce.to_be_bytes(),
    ])
}

/// End (exclusive) of the `sret/` keys of windows up to `window`.
pub fn settled_retain_through(window: u64) -> Vec<u8> {
    cat(&[SETTLED_RETAIN, &window.saturating_add(1).to_be_bytes()])
}

/// The chain and nonce of an `sret/` key.
pub fn parse_settled_retain(key: &[u8]) -> Option<(String, u64)> {
    let rest = key.strip_prefix(SETTLED_RETAIN)?.get(8..)?;
    let sep = rest.iter().position(|b| *b == 0)?;
    let chain = std::str::from_utf8(rest.get(..sep)?).ok()?.to_string();
    let nonce = u64::from_be_bytes(rest.get(sep + 1..)?.try_into().ok()?);
    Some((chain, nonce))
}

/// `owed/<window>/`: everything owed in one window.
pub fn owed_prefix(window: u64) -> Vec<u8> {
    cat(&[OWED, &window.to_be_bytes(), b"/"])
}

/// The provider and user of an owed key under `owed_prefix(window)`.
pub fn parse_owed(key: &[u8], window: u64) -> Option<(String, String)> {
    let rest = key.strip_prefix(owed_prefix(window).as_slice())?;
    let sep = rest.iter().position(|b| *b == 0)?;
    Some((
        String::from_utf8_lossy(rest.get(..sep)?).into_owned(),
        String::from_utf8_lossy(rest.get(sep + 1..)?).into_owned(),
    ))
}

/// `closing/<window>`.
pub fn closing(window: u64) -> Vec<u8> {
    cat(&[CLOSING, &window.to_be_bytes()])
}

/// The window of a `closing/` key.
pub fn parse_closing(key: &[u8]) -> Option<u64> {
    let w = key.strip_prefix(CLOSING)?;
    Some(u64::from_be_bytes(w.try_into().ok()?))
}

/// `hc/<id>`.
pub fn hub_call(id: u64) -> Vec<u8> {
    cat(&[HUB_CALL, &id.to_be_bytes()])
}

/// `hcp/<chain>\0`: every pending hub call of a hub chain.
pub fn hub_pending_prefix(chain: &str) -> Vec<u8> {
    cat(&[HUB_PENDING, chain.as_bytes(), b"\0"])
}

/// `hcp/<chain>\0<id>`.
pub fn hub_pending(chain: &str, id: u64) -> Vec<u8> {
    cat(&[&hub_pending_prefix(chain), &id.to_be_bytes()])
}

/// The call id of a pending-call key of `chain`.
pub fn parse_hub_pending(key: &[u8], chain: &str) -> Option<u64> {
    let id = key.strip_prefix(hub_pending_prefix(chain).as_slice())?;
    Some(u64::from_be_bytes(id.try_into().ok()?))
}

/// `batch/<chain>\0<nonce>`.
pub fn batch(chain: &str, nonce: u64) -> Vec<u8> {
    cat(&[BATCH, chain.as_bytes(), b"\0", &nonce.to_be_bytes()])
}

/// `sync/<chain>`.
pub fn sync_state(chain: &str) -> Vec<u8> {
    cat(&[SYNC, chain.as_bytes()])
}

/// `psig/<digest>/`: every stored partial of one message.
pub fn psig_prefix(digest: &[u8]) -> Vec<u8> {
    cat(&[PSIG, digest, b"/"])
}

/// `psig/<digest>/<index>`.
pub fn psig(digest: &[u8], index: u32) -> Vec<u8> {
    cat(&[&psig_prefix(digest), &index.to_be_bytes()])
}

/// The signer index of a `psig/` key.
pub fn parse_psig_index(key: &[u8]) -> Option<u32> {
    let at = key.len().checked_sub(4)?;
    Some(u32::from_be_bytes(key.get(at..)?.try_into().ok()?))
}

/// `pmsg/<digest>`.
pub fn pmsg(digest: &[u8]) -> Vec<u8> {
    cat(&[PMSG, digest])
}

/// `pexp/<height><digest>`.
pub fn pexp(height: u64, digest: &[u8]) -> Vec<u8> {
    cat(&[PEXP, &height.to_be_bytes(), digest])
}

/// Start of the partial-expiry keys.
pub fn pexp_start() -> Vec<u8> {
    PEXP.to_vec()
}

/// End (exclusive) of the partial-expiry keys due at or before `height`.
pub fn pexp_through(height: u64) -> Vec<u8> {
    cat(&[PEXP, &height.saturating_add(1).to_be_bytes()])
}

/// The digest of a partial-expiry key.
pub fn parse_pexp(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(PEXP)?.get(8..)
}

/// `hubcur/<chain>`.
pub fn hub_cursor(chain: &str) -> Vec<u8> {
    cat(&[HUB_CURSOR, chain.as_bytes()])
}

/// `depseq/<chain>`.
pub fn deposit_seq(chain: &str) -> Vec<u8> {
    cat(&[DEPOSIT_SEQ, chain.as_bytes()])
}

/// `hubheld/<chain>\0`: every held hub block of a hub chain.
pub fn hub_held_prefix(chain: &str) -> Vec<u8> {
    cat(&[HUB_HELD, chain.as_bytes(), b"\0"])
}

/// `hubheld/<chain>\0<from_height u64><first_seq u64>`.
pub fn hub_held(chain: &str, from_height: u64, first_seq: u64) -> Vec<u8> {
    cat(&[
        &hub_held_prefix(chain),
        &from_height.to_be_bytes(),
        &first_seq.to_be_bytes(),
    ])
}

#[cfg(test)]
mod tests;

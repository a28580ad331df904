//! The keys of SLA-record pruning (app version 7, ADR 0026), and which
//! window an SLA key belongs to. Part of [`super`]'s layout.

use super::{
    BY_PROVIDER, BY_USER, LATENCY, PROVIDER_LATENCY, PROVIDER_WINDOW, ROUTE, USER_WINDOW, WINDOW,
};

/// `meta/sla_kept_from`: the first window whose SLA records are kept
/// (absent: 0, nothing pruned). It never goes down.
pub const SLA_KEPT_FROM: &[u8] = b"meta/sla_kept_from";
/// `meta/sla_prune`: the prune pass, the window it prunes below (8 bytes
/// BE) followed by the next key it reads (empty once the pass finished).
pub const SLA_PRUNE: &[u8] = b"meta/sla_prune";

/// The window of an SLA-record key (`rr/`, `ip/`, `iu/`, `win/`, `pw/`,
/// `uw/`, `lat/`, `plat/`),
/// `None` for any other key or one too short to name a window.
///
/// - `rr/<user>\0<provider>\0<model>\0<route>\0<window>`: the last 8 bytes;
/// - `win/<window>`: the 8 bytes after the prefix;
/// - `ip/`, `iu/`, `pw/`, `uw/`, `lat/`, `plat/`: `<party>\0<window>...`,
///   the 8 bytes after the first `0x00`.
pub fn sla_window(key: &[u8]) -> Option<u64> {
    let be = |b: &[u8]| {
        b.get(..8)
            .and_then(|w| w.try_into().ok())
            .map(u64::from_be_bytes)
    };
    if let Some(rest) = key.strip_prefix(ROUTE) {
        let split = rest.len().checked_sub(8)?;
        // Four separators precede the window.
        if rest[..split].iter().filter(|b| **b == 0).count() != 4 {
            return None;
        }
        return be(&rest[split..]);
    }
    if let Some(rest) = key.strip_prefix(WINDOW) {
        return (rest.len() == 8).then(|| be(rest)).flatten();
    }
    for ns in [
        BY_PROVIDER,
        BY_USER,
        PROVIDER_WINDOW,
        USER_WINDOW,
        LATENCY,
        PROVIDER_LATENCY,
    ] {
        if let Some(rest) = key.strip_prefix(ns) {
            let sep = rest.iter().position(|b| *b == 0)?;
            return be(&rest[sep + 1..]);
        }
    }
    None
}

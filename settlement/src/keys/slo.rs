//! The keys of service-level objectives ([`crate::slo`], ADR 0021):
//! policies, scheduled changes, verdicts, reputations and latency
//! histograms. Part of [`super`]'s layout.

use super::cat;

/// `slo/<provider>`: the policy in force for a provider (JSON).
pub const SLO_POLICY: &[u8] = b"slo/";
/// `slon/<from_window BE><provider>`: a policy change scheduled from a
/// window (JSON).
pub const SLO_NEXT: &[u8] = b"slon/";
/// `slov/<provider>\0<window BE>`: a provider's verdict for a window
/// (JSON, provable).
pub const SLO_VERDICT: &[u8] = b"slov/";
/// `rep/<provider>`: a provider's reputation (JSON, provable).
pub const REPUTATION: &[u8] = b"rep/";
/// `lat/<provider>\0<window BE><model>\0<route>`: a route's latency and
/// TTFT histogram in a window.
pub const LATENCY: &[u8] = b"lat/";
/// `plat/<provider>\0<window BE>`: a provider's latency and TTFT
/// histogram in a window.
pub const PROVIDER_LATENCY: &[u8] = b"plat/";

/// `slo/<provider>`.
pub fn slo_policy(provider: &str) -> Vec<u8> {
    cat(&[SLO_POLICY, provider.as_bytes()])
}

/// `slon/<from_window BE><provider>`.
pub fn slo_next(from_window: u64, provider: &str) -> Vec<u8> {
    cat(&[SLO_NEXT, &from_window.to_be_bytes(), provider.as_bytes()])
}

/// `slon/<window BE>`: the first key of changes scheduled from `window`.
pub fn slo_next_from(window: u64) -> Vec<u8> {
    cat(&[SLO_NEXT, &window.to_be_bytes()])
}

/// The window and provider of a `slon/` key.
pub fn parse_slo_next(key: &[u8]) -> Option<(u64, &[u8])> {
    let rest = key.strip_prefix(SLO_NEXT)?;
    let (w, provider) = rest.split_at_checked(8)?;
    Some((u64::from_be_bytes(w.try_into().ok()?), provider))
}

/// `slov/<provider>\0<window BE>`.
pub fn slo_verdict(provider: &str, window: u64) -> Vec<u8> {
    cat(&[
        SLO_VERDICT,
        provider.as_bytes(),
        &[0],
        &window.to_be_bytes(),
    ])
}

/// `slov/<provider>\0`: every verdict of a provider, oldest window first.
pub fn slo_verdict_prefix(provider: &str) -> Vec<u8> {
    cat(&[SLO_VERDICT, provider.as_bytes(), &[0]])
}

/// `rep/<provider>`.
pub fn reputation(provider: &str) -> Vec<u8> {
    cat(&[REPUTATION, provider.as_bytes()])
}

/// `lat/<provider>\0<window BE><model>\0<route>`.
pub fn route_latency(provider: &str, window: u64, model: &str, route: &str) -> Vec<u8> {
    cat(&[
        LATENCY,
        provider.as_bytes(),
        &[0],
        &window.to_be_bytes(),
        model.as_bytes(),
        &[0],
        route.as_bytes(),
    ])
}

/// `lat/<provider>\0<window BE>`: every route histogram of a provider in
/// a window.
pub fn route_latency_prefix(provider: &str, window: u64) -> Vec<u8> {
    cat(&[LATENCY, provider.as_bytes(), &[0], &window.to_be_bytes()])
}

/// `plat/<provider>\0<window BE>`.
pub fn provider_latency(provider: &str, window: u64) -> Vec<u8> {
    cat(&[
        PROVIDER_LATENCY,
        provider.as_bytes(),
        &[0],
        &window.to_be_bytes(),
    ])
}

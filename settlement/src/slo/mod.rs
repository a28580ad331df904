//! Service-level objectives with consequences (ADR 0021, app version 4).
//!
//! | part | what | module |
//! |---|---|---|
//! | policies | per provider: fail-rate ceiling, minimum judged calls, p95 latency and TTFT ceilings, credit rate; set by an `slo` proposal from a future window | [`policy`] |
//! | latency | one log-scale bucket byte per call for latency and TTFT; histograms per route and per provider and window; nearest-rank percentiles | [`latency`] |
//! | verdicts | met, breached or not judged, once per window in the block that closes it; reputation with a half-life of ~11 judged windows | [`judge`] |
//! | credits | a breached window's debts to the provider shrink by the credit rate (rounded up for the user) as they become hub calls, and the user's balance gets the difference | [`crate::sync::close`] |
//!
//! Below app version 4 none of it exists: an `slo` proposal is refused, a
//! report carrying latency is refused (code 38), and no block judges.

pub mod judge;
pub mod latency;
pub mod policy;

use tally_store::Kv;

use crate::error::Fatal;
use crate::state::chain::app_version;
use crate::types::{Event, SLO_VERSION};

/// The start-of-block step, after the block closed window `closed` (if
/// any) and before that window's debts start becoming hub calls: judges
/// `closed` by the policies it was open under, then puts in force the
/// changes due in `now_window`.
pub fn begin_block(
    kv: &mut impl Kv,
    closed: Option<u64>,
    now_window: u64,
) -> Result<Vec<Event>, Fatal> {
    if app_version(kv)? < SLO_VERSION {
        return Ok(Vec::new());
    }
    let mut events = match closed {
        Some(w) => judge::judge_window(kv, w)?,
        None => Vec::new(),
    };
    events.extend(policy::apply_due(kv, now_window)?);
    Ok(events)
}

/// The histograms a report's measured calls (`measured`, per provider,
/// model and route) leave in `window`: each route's and each provider's,
/// by key, read and added to. `None` if a count would overflow.
#[allow(clippy::type_complexity)]
pub fn plan_histograms(
    kv: &impl tally_store::KvRead,
    window: u64,
    measured: &std::collections::BTreeMap<(&str, &str, &str), latency::Histogram>,
) -> Result<Option<Vec<(Vec<u8>, latency::Histogram)>>, Fatal> {
    use std::collections::BTreeMap;
    let mut out: BTreeMap<Vec<u8>, latency::Histogram> = BTreeMap::new();
    for (&(provider, model, route), add) in measured {
        for key in [
            crate::keys::route_latency(provider, window, model, route),
            crate::keys::provider_latency(provider, window),
        ] {
            let h = match out.entry(key) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let have = match kv.get(e.key())? {
                        None => latency::Histogram::default(),
                        Some(b) => latency::Histogram::decode(&b)
                            .ok_or(Fatal::Corrupt("latency histogram"))?,
                    };
                    e.insert(have)
                }
            };
            if !h.add(add) {
                return Ok(None);
            }
        }
    }
    Ok(Some(out.into_iter().collect()))
}

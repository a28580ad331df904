//! The calls of a usage report, in either of its two encodings.
//!
//! A [`ReportUsage`] carries its calls as `records` (one [`UsageRecord`]
//! per call, every string written each time) and/or as `route_calls` (the
//! compact form: one [`RouteCalls`] per route whose strings are written
//! once, then three packed lists with one entry per call). The report's
//! calls are the records followed by every group's calls, in order.
//!
//! The two forms are equivalent by construction: [`CallTotals`] checks
//! every call with the same rules and sums it into the same per-route
//! counters, per-user debits and per-provider-and-user amounts owed,
//! whichever form carried it. Sums are order-independent, and a sum of
//! non-negative terms overflows exactly when some partial sum does, so
//! summing a group before adding it gives the counters and the overflow
//! verdict that per-call adding gives.
//!
//! `max_report_records` counts the calls of both forms together. Packed is
//! the only canonical encoding of a group's lists (unpacked lists are
//! refused as non-canonical, code 19, when the report's bytes are checked);
//! an empty group is code 9, lists of different lengths code 1. Sizes and
//! reasons: ADR 0014 (`docs/adr/0014-compact-reports.md`).
//!
//! [`group_records`] turns records into the compact form (what the SDK's
//! reporter sends) and [`expand`] turns a report back into records (for
//! tools and tests).

use std::collections::BTreeMap;

use crate::codes::Code;
use crate::error::{reject, ExecError, Rejection};
use crate::ident;
use crate::proto::{Outcome, ReportUsage, RouteCalls, UsageRecord};
use crate::record::{Counters, RouteId};
use crate::slo::latency::{Histogram, BUCKETS};
use crate::types::SLO_VERSION;

/// How many calls `report` carries, in both forms together (saturating:
/// the caller compares it with a cap far below `usize::MAX`).
pub fn call_count(report: &ReportUsage) -> usize {
    report
        .route_calls
        .iter()
        .fold(report.records.len(), |n, g| {
            n.saturating_add(g.outcomes.len())
        })
}

/// Records grouped by (user, provider, model, route), groups in key order
/// and calls in their order within the group: the compact form of the
/// same calls.
pub fn group_records(records: Vec<UsageRecord>) -> Vec<RouteCalls> {
    let mut groups: BTreeMap<(String, String, String, String), RouteCalls> = BTreeMap::new();
    for r in records {
        let g = groups
            .entry((r.user, r.provider, r.model, r.route))
            .or_insert_with_key(|(user, provider, model, route)| RouteCalls {
                user: user.clone(),
                provider: provider.clone(),
                model: model.clone(),
                route: route.clone(),
                ..RouteCalls::default()
            });
        g.outcomes.push(r.outcome);
        g.units.push(r.units);
        g.amounts.push(r.amount);
        // Bucket bytes: a value above 255 stays out of range (refused).
        g.latency.push(r.latency_bucket.min(255) as u8);
        g.ttft.push(r.ttft_bucket.min(255) as u8);
    }
    groups
        .into_values()
        .map(|mut g| {
            // A group with nothing measured carries no bucket bytes.
            for list in [&mut g.latency, &mut g.ttft] {
                if list.iter().all(|&b| b == 0) {
                    list.clear();
                }
            }
            g
        })
        .collect()
}

/// `report` with its records moved into the compact form.
pub fn compact(mut report: ReportUsage) -> ReportUsage {
    let records = std::mem::take(&mut report.records);
    report.route_calls.extend(group_records(records));
    report
}

/// Every call of `report` as a record, in order (records, then each
/// group's calls). A group whose lists differ in length yields only the
/// calls all three lists have (such a report is refused on chain).
pub fn expand(report: &ReportUsage) -> Vec<UsageRecord> {
    let mut out = report.records.clone();
    for g in &report.route_calls {
        let calls = g.outcomes.iter().zip(&g.units).zip(&g.amounts);
        for (k, ((&outcome, &units), &amount)) in calls.enumerate() {
            out.push(UsageRecord {
                user: g.user.clone(),
                provider: g.provider.clone(),
                model: g.model.clone(),
                route: g.route.clone(),
                outcome,
                units,
                amount,
                latency_bucket: g.latency.get(k).copied().unwrap_or(0).into(),
                ttft_bucket: g.ttft.get(k).copied().unwrap_or(0).into(),
            });
        }
    }
    out
}

/// What a report's calls add up to, checked call by call.
#[derive(Debug, Default)]
pub(crate) struct CallTotals<'a> {
    /// Counters to add, per route.
    pub routes: BTreeMap<RouteId, Counters>,
    /// Credits charged, per user.
    pub debits: BTreeMap<&'a str, u64>,
    /// Credits owed, per (provider, user).
    pub owed: BTreeMap<(&'a str, &'a str), u64>,
    /// Latency and TTFT measured, per (provider, model, route): only calls
    /// that carry a bucket (app version 4).
    pub latency: BTreeMap<(&'a str, &'a str, &'a str), Histogram>,
}

/// One call's latency and TTFT buckets (0: not measured), checked: each
/// at most [`BUCKETS`], and none before app version 4.
fn check_buckets(
    at: &dyn Fn() -> String,
    version: u64,
    latency: u32,
    ttft: u32,
) -> Result<(), ExecError> {
    if latency == 0 && ttft == 0 {
        return Ok(());
    }
    if version < SLO_VERSION {
        return Err(reject(
            Code::BadLatency,
            format!(
                "{}: latency buckets need app version {SLO_VERSION}; the chain runs version {version}",
                at()
            ),
        ));
    }
    if latency > u32::from(BUCKETS) || ttft > u32::from(BUCKETS) {
        return Err(reject(
            Code::BadLatency,
            format!(
                "{}: latency bucket {latency}, TTFT bucket {ttft}: buckets are 1 to {BUCKETS} (0: not measured)",
                at()
            ),
        ));
    }
    Ok(())
}

/// The class of one call, checked: a known outcome, and no amount on a
/// call that failed. `at` names the call in the error.
fn check_call(at: &dyn Fn() -> String, outcome: i32, amount: u64) -> Result<Outcome, ExecError> {
    let class = match Outcome::try_from(outcome) {
        Ok(Outcome::Unspecified) | Err(_) => {
            return Err(reject(
                Code::BadOutcome,
                format!("{}: outcome {outcome} is not a known class", at()),
            ))
        }
        Ok(o) => o,
    };
    if amount != 0 && !class.may_carry_amount() {
        return Err(reject(
            Code::FailedCallBilled,
            format!(
                "{}: a {} call carries amount {amount}; failed calls carry 0",
                at(),
                class.name()
            ),
        ));
    }
    Ok(class)
}

/// The four names of a route, checked. `at` names the call or group.
fn check_names(
    at: &dyn Fn() -> String,
    user: &str,
    provider: &str,
    model: &str,
    route: &str,
) -> Result<(), ExecError> {
    let named = |e: Rejection| Rejection::new(e.code, format!("{}: {}", at(), e.log));
    ident::check_party("user", user).map_err(named)?;
    ident::check_party("provider", provider).map_err(named)?;
    ident::check_name("model", model).map_err(named)?;
    ident::check_name("route", route).map_err(named)?;
    Ok(())
}

/// A group's bucket lists, checked: each empty or one byte per call, each
/// byte a bucket (or 0), none before app version 4.
fn check_group_buckets(g: usize, calls: &RouteCalls, version: u64) -> Result<(), ExecError> {
    let n = calls.outcomes.len();
    for (list, name) in [(&calls.latency, "latency"), (&calls.ttft, "ttft")] {
        if !list.is_empty() && list.len() != n {
            return Err(reject(
                Code::BadLatency,
                format!(
                    "route_calls {g} has {n} calls and {} {name} buckets: one per call, or none",
                    list.len()
                ),
            ));
        }
    }
    for k in 0..n {
        let at = || format!("route_calls {g} call {k}");
        let bucket = |l: &[u8]| l.get(k).copied().map_or(0, u32::from);
        check_buckets(&at, version, bucket(&calls.latency), bucket(&calls.ttft))?;
    }
    Ok(())
}

impl<'a> CallTotals<'a> {
    /// Checks and sums every call of `report`; `overflow` makes the error
    /// for a counter that would pass `u64::MAX`.
    pub(crate) fn of(
        report: &'a ReportUsage,
        version: u64,
        overflow: &dyn Fn() -> ExecError,
    ) -> Result<Self, ExecError> {
        let mut t = CallTotals::default();
        for (i, r) in report.records.iter().enumerate() {
            let at = || format!("record {i}");
            check_names(&at, &r.user, &r.provider, &r.model, &r.route)?;
            let class = check_call(&at, r.outcome, r.amount)?;
            check_buckets(&at, version, r.latency_bucket, r.ttft_bucket)?;
            t.measure(
                (&r.provider, &r.model, &r.route),
                &[r.latency_bucket as u8],
                &[r.ttft_bucket as u8],
                overflow,
            )?;
            let mut add = Counters::default();
            add.add_record(class, r.units, r.amount)
                .map_err(|_| overflow())?;
            t.add(
                &r.user,
                &r.provider,
                &r.model,
                &r.route,
                &add,
                r.amount,
                overflow,
            )?;
        }
        for (g, calls) in report.route_calls.iter().enumerate() {
            t.add_group(g, calls, version, overflow)?;
        }
        Ok(t)
    }

    /// Checks and sums group `g`'s calls.
    fn add_group(
        &mut self,
        g: usize,
        calls: &'a RouteCalls,
        version: u64,
        overflow: &dyn Fn() -> ExecError,
    ) -> Result<(), ExecError> {
        let at = || format!("route_calls {g}");
        check_names(
            &at,
            &calls.user,
            &calls.provider,
            &calls.model,
            &calls.route,
        )?;
        let n = calls.outcomes.len();
        if n == 0 {
            return Err(reject(
                Code::EmptyReport,
                format!("route_calls {g} has no calls"),
            ));
        }
        if calls.units.len() != n || calls.amounts.len() != n {
            return Err(reject(
                Code::MalformedTx,
                format!(
                    "route_calls {g} has {n} outcomes, {} units and {} amounts; \
                     the three lists need one entry per call",
                    calls.units.len(),
                    calls.amounts.len()
                ),
            ));
        }
        check_group_buckets(g, calls, version)?;
        self.measure(
            (&calls.provider, &calls.model, &calls.route),
            &calls.latency,
            &calls.ttft,
            overflow,
        )?;
        let mut add = Counters::default();
        let mut amount = 0u64;
        let lists = calls.outcomes.iter().zip(&calls.units).zip(&calls.amounts);
        for (k, ((&outcome, &units), &paid)) in lists.enumerate() {
            let at = || format!("route_calls {g} call {k}");
            let class = check_call(&at, outcome, paid)?;
            add.add_record(class, units, paid).map_err(|_| overflow())?;
            amount = amount.checked_add(paid).ok_or_else(overflow)?;
        }
        self.add(
            &calls.user,
            &calls.provider,
            &calls.model,
            &calls.route,
            &add,
            amount,
            overflow,
        )?;
        Ok(())
    }

    /// Counts the measured buckets (nonzero bytes, checked) of one route.
    fn measure(
        &mut self,
        route: (&'a str, &'a str, &'a str),
        latency: &[u8],
        ttft: &[u8],
        overflow: &dyn Fn() -> ExecError,
    ) -> Result<(), ExecError> {
        if latency.iter().chain(ttft).all(|&b| b == 0) {
            return Ok(());
        }
        let mut add = Histogram::default();
        for &b in latency.iter().filter(|&&b| b != 0) {
            add.latency.add(b, 1);
        }
        for &b in ttft.iter().filter(|&&b| b != 0) {
            add.ttft.add(b, 1);
        }
        if !self.latency.entry(route).or_default().add(&add) {
            return Err(overflow());
        }
        Ok(())
    }

    /// Adds the summed calls `add` (charging `amount`) of one route.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        user: &'a str,
        provider: &'a str,
        model: &str,
        route: &str,
        add: &Counters,
        amount: u64,
        overflow: &dyn Fn() -> ExecError,
    ) -> Result<(), ExecError> {
        let id = RouteId {
            user: user.to_string(),
            provider: provider.to_string(),
            model: model.to_string(),
            route: route.to_string(),
        };
        self.routes
            .entry(id)
            .or_default()
            .add(add)
            .map_err(|_| overflow())?;
        let d = self.debits.entry(user).or_default();
        *d = d.checked_add(amount).ok_or_else(overflow)?;
        let o = self.owed.entry((provider, user)).or_default();
        *o = o.checked_add(amount).ok_or_else(overflow)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(user: &str, route: &str, outcome: Outcome, units: u64, amount: u64) -> UsageRecord {
        UsageRecord {
            user: user.into(),
            provider: "p".into(),
            model: "m".into(),
            route: route.into(),
            outcome: outcome as i32,
            units,
            amount,
            ..Default::default()
        }
    }

    #[test]
    fn grouping_then_expanding_keeps_every_call_of_each_route_in_order() {
        let records = vec![
            rec("b", "/x", Outcome::Ok, 5, 2),
            rec("a", "/x", Outcome::Cancel, 1, 0),
            rec("b", "/x", Outcome::Auth, 7, 0),
            rec("a", "/y", Outcome::Ok, 3, 9),
        ];
        let groups = group_records(records.clone());
        // Hand-written: three routes in key order (a,/x) (a,/y) (b,/x).
        let keys: Vec<(&str, &str, usize)> = groups
            .iter()
            .map(|g| (g.user.as_str(), g.route.as_str(), g.outcomes.len()))
            .collect();
        assert_eq!(keys, vec![("a", "/x", 1), ("a", "/y", 1), ("b", "/x", 2)]);
        assert_eq!(groups[2].units, vec![5, 7]);
        assert_eq!(groups[2].amounts, vec![2, 0]);
        let report = compact(ReportUsage {
            records,
            ..ReportUsage::default()
        });
        assert!(report.records.is_empty());
        assert_eq!(call_count(&report), 4);
        let back = expand(&report);
        assert_eq!(back.len(), 4);
        assert_eq!(back[2], rec("b", "/x", Outcome::Ok, 5, 2));
        assert_eq!(back[3], rec("b", "/x", Outcome::Auth, 7, 0));
    }
}

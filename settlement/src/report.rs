//! Usage reports: a gateway's signed `ReportUsage` is checked from reads
//! into a [`Plan`], and the plan's writes happen only when every check
//! passed, so a rejected report changes nothing.
//!
//! The envelope is opened by [`crate::envelope`] (this module says how a
//! `SignedReport` names its signer: a gateway key registered in genesis);
//! [`crate::pipeline`] dispatches to [`plan_report`].
//!
//! A report's calls come as records or in the compact per-route form
//! ([`crate::calls`]); either way it charges each call's user, credits what each provider is
//! owed in the current window, adds the records to their route records
//! and the window's totals, and remembers the report id until it expires.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use prost::Message;
use tally_store::{Kv, KvRead};

use crate::allowance::{check_spend, Spend};
use crate::calls::{call_count, CallTotals};
use crate::codes::Code;
use crate::envelope::{self, key32, Envelope, Opened};
use crate::error::{reject, ExecError, Rejection};
use crate::genesis::Params;
use crate::keys;
use crate::proto::{tx, ReportUsage, SignedReport, Tx};
use crate::record::{Counters, RouteId};
use crate::slo::latency::Histogram;
use crate::slo::plan_histograms;
use crate::state::chain::{
    app_version, balance, owed_slot, party_window, put_balance, put_owed_slot, put_route,
    put_window_info, route, window_info, OwedSlot,
};
use crate::state::gateway::{gateway_key, GatewayKey};
use crate::state::replay::{put_report, report_seen};
use crate::types::{Event, PartyWindow, TxResult, WindowInfo, SIDE_IDS_VERSION};

/// Domain prefix of a gateway's report signature: the signed message is
/// `REPORT_SIGN_DOMAIN || body`.
pub const REPORT_SIGN_DOMAIN: &[u8] = b"tally/report/v1\0";

/// A route record as the plan will write it.
#[derive(Debug)]
struct PlannedRoute {
    /// The route.
    id: RouteId,
    /// Its counters after the report.
    counters: Counters,
    /// Whether the window had no record of it (it gets indexed).
    is_new: bool,
}

/// Everything a valid report will write, computed from reads only.
#[derive(Debug)]
pub struct Plan {
    /// Gateway key and report id: the replay-protection key.
    scope: Vec<u8>,
    body_hash: [u8; 32],
    /// The app version planned under (the report-id layout).
    app_version: u64,
    /// The block's height (0 before app version 6, which files the report
    /// id with it).
    height: u64,
    report_id: Vec<u8>,
    expires_at: u64,
    gateway: String,
    records: usize,
    window: u64,
    routes: Vec<PlannedRoute>,
    /// Users charged and their balance after the report.
    balances: Vec<(String, u64)>,
    /// What each provider will be owed by each user after the report.
    owed: Vec<OwedSlot>,
    window_info: WindowInfo,
    /// Provider and user window totals after the report, by key.
    parties: BTreeMap<Vec<u8>, PartyWindow>,
    /// Allowance use after the report.
    spend: Spend,
    /// Latency histograms after the report, by key (app version 4).
    histograms: Vec<(Vec<u8>, Histogram)>,
}

impl Plan {
    /// The report's id.
    pub fn report_id(&self) -> &[u8] {
        &self.report_id
    }

    /// The replay scope (gateway key and report id) and the expiry.
    pub fn scope(&self) -> (&[u8], u64) {
        (&self.scope, self.expires_at)
    }
}

impl Envelope for SignedReport {
    type Body = ReportUsage;
    /// The gateway's registered name.
    type Signer = GatewayKey;
    const DOMAIN: &'static [u8] = REPORT_SIGN_DOMAIN;
    const WHAT: &'static str = "report";
    const UNKNOWN_SIGNER: Code = Code::UnknownGateway;

    fn body(&self) -> &[u8] {
        &self.body
    }
    fn signature(&self) -> &[u8] {
        &self.signature
    }
    fn chain_id(body: &ReportUsage) -> &str {
        &body.chain_id
    }
    /// The envelope's gateway key, which genesis or a proposal must have
    /// registered (its standing is checked against the block time by
    /// [`plan_report`]).
    fn signer(
        &self,
        kv: &impl KvRead,
        _: &ReportUsage,
    ) -> Result<(GatewayKey, [u8; 32]), ExecError> {
        let key = key32(&self.gateway_key, Code::UnknownGateway, "gateway key")?;
        let g = gateway_key(kv, &key)?.ok_or_else(|| {
            reject(
                Code::UnknownGateway,
                format!("gateway key {} is not registered", hex::encode(key)),
            )
        })?;
        Ok((g, key))
    }
    fn who(g: &GatewayKey) -> String {
        format!("gateway {}", g.name)
    }
}

/// The report's own checks: id, expiry, replay (under the gateway's
/// `scope`, see [`keys::report_scope`]), record count.
fn check_header(
    kv: &impl KvRead,
    params: &Params,
    now: u64,
    report: &ReportUsage,
    scope: &[u8],
) -> Result<(), ExecError> {
    if report.report_id.len() != 16 {
        return Err(reject(
            Code::BadReportId,
            format!("report_id is {} bytes, want 16", report.report_id.len()),
        ));
    }
    let rid = hex::encode(&report.report_id);
    if report.expires_at <= now {
        return Err(reject(
            Code::ReportExpired,
            format!(
                "report {rid} expired at {} (block time {now})",
                report.expires_at
            ),
        ));
    }
    if report.expires_at - now > params.max_report_expiry_secs {
        return Err(reject(
            Code::ExpiryTooFar,
            format!(
                "report {rid} expires_at {} is more than {} s after block time {now}",
                report.expires_at, params.max_report_expiry_secs
            ),
        ));
    }
    if let Some(hash) = report_seen(kv, scope, now)? {
        return Err(ExecError::Rejected(
            Rejection::new(
                Code::DuplicateReport,
                format!(
                    "report {rid} of this gateway was already accepted (body sha256 {})",
                    hex::encode(hash)
                ),
            )
            .with_data(hash.to_vec()),
        ));
    }
    let calls = call_count(report);
    if calls == 0 {
        return Err(reject(
            Code::EmptyReport,
            format!("report {rid} has no records"),
        ));
    }
    if calls > params.max_report_records as usize {
        return Err(reject(
            Code::TooManyRecords,
            format!(
                "report {rid} has {calls} records, at most {} allowed",
                params.max_report_records
            ),
        ));
    }
    Ok(())
}

/// Refuses a report signed with a key of a suspended or removed gateway,
/// or with a key a rotation replaced once its grace is over.
fn check_standing(g: &GatewayKey, now: u64) -> Result<(), ExecError> {
    if g.removed || g.suspended {
        return Err(reject(
            Code::GatewayInactive,
            format!(
                "gateway {} is {}: its reports are refused",
                g.name,
                g.status()
            ),
        ));
    }
    match g.retired_until {
        Some(until) if now >= until => Err(reject(
            Code::GatewayKeyRetired,
            format!(
                "this key of gateway {} was replaced by a rotation; its grace ended at {until} (block time {now})",
                g.name
            ),
        )),
        _ => Ok(()),
    }
}

/// Plans an opened report at block time `now`: its own checks (see
/// [`check_header`]), then every call against balances, allowances and
/// 64-bit counters, from reads only.
pub fn plan_report(
    kv: &impl KvRead,
    params: &Params,
    now: u64,
    opened: Opened<ReportUsage, GatewayKey>,
) -> Result<Plan, ExecError> {
    let Opened {
        body: report,
        signer: standing,
        body_hash,
        ..
    } = opened;
    check_standing(&standing, now)?;
    let gateway = standing.name;
    // Report ids are remembered under the gateway's first key, so a report
    // signed again with a rotated key is still the same report.
    let scope = keys::report_scope(&standing.identity, &report.report_id);
    check_header(kv, params, now, &report, &scope)?;

    let rid = hex::encode(&report.report_id);
    let window = now / params.settlement_window_secs;
    let overflow = || {
        reject(
            Code::Overflow,
            format!("report {rid} overflows a 64-bit counter"),
        )
    };
    let records = call_count(&report);
    let version = app_version(kv)?;
    // The block's height (begin_block recorded it), which version 6 files
    // the report id with; CheckTx's plan is never applied.
    let height = if version >= SIDE_IDS_VERSION {
        crate::dkg::state::last_height(kv)?
    } else {
        0
    };
    let CallTotals {
        routes,
        debits,
        owed: owed_add,
        latency,
    } = CallTotals::of(&report, version, &overflow)?;
    let histograms = plan_histograms(kv, window, &latency)?.ok_or_else(overflow)?;

    let balances = plan_balances(kv, &rid, &debits)?;
    let spend = check_spend(kv, &gateway, now, window, &debits)?;
    let (planned, info, parties) = plan_routes(kv, window, routes, &overflow)?;
    let owed_new = plan_owed(kv, window, owed_add, &overflow)?;

    Ok(Plan {
        scope,
        body_hash,
        app_version: version,
        height,
        report_id: report.report_id,
        expires_at: report.expires_at,
        gateway,
        records,
        window,
        routes: planned,
        balances,
        owed: owed_new,
        window_info: info,
        parties,
        spend,
        histograms,
    })
}

/// Each charged user's balance after the report (users charged 0 are left
/// out); a balance that would go negative refuses the report.
fn plan_balances(
    kv: &impl KvRead,
    rid: &str,
    debits: &BTreeMap<&str, u64>,
) -> Result<Vec<(String, u64)>, ExecError> {
    let mut balances = Vec::with_capacity(debits.len());
    for (&user, &debit) in debits {
        let have = balance(kv, user)?;
        let left = have.checked_sub(debit).ok_or_else(|| {
            reject(
                Code::InsufficientBalance,
                format!("report {rid}: user {user} has {have} credits, the report charges {debit}"),
            )
        })?;
        if debit > 0 {
            balances.push((user.to_string(), left));
        }
    }
    Ok(balances)
}

/// The report's route records after it, and the window's and each
/// party's totals after it, by key.
#[allow(clippy::type_complexity)]
fn plan_routes(
    kv: &impl KvRead,
    window: u64,
    routes: BTreeMap<RouteId, Counters>,
    overflow: &dyn Fn() -> ExecError,
) -> Result<
    (
        Vec<PlannedRoute>,
        WindowInfo,
        BTreeMap<Vec<u8>, PartyWindow>,
    ),
    ExecError,
> {
    let mut info = window_info(kv, window)?.unwrap_or_default();
    let mut planned = Vec::with_capacity(routes.len());
    let mut parties: BTreeMap<Vec<u8>, PartyWindow> = BTreeMap::new();
    for (id, add) in routes {
        let stored = route(kv, &id, window)?;
        let is_new = stored.is_none();
        let mut counters = stored.unwrap_or_default();
        counters.add(&add).map_err(|_| overflow())?;
        info.totals.add(&add).map_err(|_| overflow())?;
        if is_new {
            info.routes += 1;
        }
        for key in [
            keys::provider_window(&id.provider, window),
            keys::user_window(&id.user, window),
        ] {
            let totals = match parties.entry(key) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    let have = party_window(kv, e.key())?.unwrap_or_default();
                    e.insert(have)
                }
            };
            totals.totals.add(&add).map_err(|_| overflow())?;
            if is_new {
                totals.routes += 1;
            }
        }
        planned.push(PlannedRoute {
            id,
            counters,
            is_new,
        });
    }
    Ok((planned, info, parties))
}

/// What each provider is owed by each user in `window` after the report
/// (pairs the report owes nothing are left out).
fn plan_owed(
    kv: &impl KvRead,
    window: u64,
    owed_add: BTreeMap<(&str, &str), u64>,
    overflow: &dyn Fn() -> ExecError,
) -> Result<Vec<OwedSlot>, ExecError> {
    let mut owed_new = Vec::with_capacity(owed_add.len());
    for ((provider, user), amount) in owed_add {
        if amount == 0 {
            continue;
        }
        let mut slot = owed_slot(kv, window, provider, user)?;
        slot.amount = slot.amount.checked_add(amount).ok_or_else(overflow)?;
        owed_new.push(slot);
    }
    Ok(owed_new)
}

impl Plan {
    /// Writes everything the plan computed and returns the accepted result.
    pub fn apply(self, kv: &mut impl Kv) -> TxResult {
        put_report(
            kv,
            self.app_version,
            self.height,
            &self.scope,
            self.expires_at,
            &self.body_hash,
        );
        for r in &self.routes {
            put_route(kv, &r.id, self.window, &r.counters, r.is_new);
        }
        for (user, left) in &self.balances {
            put_balance(kv, user, *left);
        }
        for slot in self.owed {
            put_owed_slot(kv, slot);
        }
        put_window_info(kv, self.window, &self.window_info);
        for (key, totals) in &self.parties {
            kv.put(key.clone(), totals.encode());
        }
        self.spend.apply(kv);
        for (key, h) in &self.histograms {
            kv.put(key.clone(), h.encode());
        }
        let rid = hex::encode(&self.report_id);
        TxResult::ok(
            format!(
                "report {rid} from {}: {} records on {} routes in window {}",
                self.gateway,
                self.records,
                self.routes.len(),
                self.window
            ),
            vec![Event::new(
                "usage_report",
                [
                    ("report_id", rid),
                    ("gateway", self.gateway),
                    ("records", self.records.to_string()),
                    ("window", self.window.to_string()),
                ],
            )],
        )
    }
}

/// Encodes and signs a report as a transaction, the way gateways do.
pub fn sign_report(key: &ed25519_dalek::SigningKey, report: &ReportUsage) -> Vec<u8> {
    let body = report.encode_to_vec();
    let signature = envelope::sign(key, REPORT_SIGN_DOMAIN, &body);
    Tx {
        sum: Some(tx::Sum::Report(SignedReport {
            body,
            gateway_key: key.verifying_key().to_bytes().to_vec(),
            signature,
        })),
    }
    .encode_to_vec()
}

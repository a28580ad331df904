//! Usage reports: a gateway's signed `ReportUsage` is checked from reads
//! into a [`Plan`], and the plan's writes happen only when every check
//! passed, so a rejected report changes nothing.
//!
//! A report's calls come as records or in the compact per-route form
//! ([`crate::calls`]); either way it charges each call's user, credits what each provider is
//! owed in the current window, adds the records to their route records
//! and the window's totals, and remembers the report id until it expires.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use ed25519_dalek::{Signature, VerifyingKey};
use prost::Message;
use sha2::{Digest, Sha256};
use tally_store::{Kv, KvRead};

use crate::allowance::{check_spend, plan_allowance, AllowancePlan, Spend};
use crate::calls::{call_count, CallTotals};
use crate::codes::Code;
use crate::error::{reject, ExecError, Rejection};
use crate::genesis::Params;
use crate::keys;
use crate::proto::{tx, ReportUsage, SignedReport, Tx};
use crate::record::{Counters, RouteId};
use crate::state::chain::{
    balance, chain_id, gateway, owed_slot, params, party_window, put_balance, put_owed_slot,
    put_report, put_route, put_window_info, report_seen, route, window_info, OwedSlot,
};
use crate::tx::decode_canonical;
use crate::types::{Event, PartyWindow, TxResult, WindowInfo};

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
}

impl Plan {
    /// The report's id.
    pub fn report_id(&self) -> &[u8] {
        &self.report_id
    }
}

/// A checked user transaction, ready to write.
#[derive(Debug)]
pub enum UserPlan {
    /// A usage report.
    Report(Box<Plan>),
    /// A validator's DKG or governance message.
    Validator(Box<crate::dkg::tx::ValidatorPlan>),
    /// An allowance change.
    Allowance(AllowancePlan),
}

impl UserPlan {
    /// Writes the transaction's changes and returns the accepted result.
    pub fn apply(self, kv: &mut impl Kv) -> Result<TxResult, ExecError> {
        match self {
            UserPlan::Report(p) => Ok(p.apply(kv)),
            UserPlan::Allowance(p) => Ok(p.apply(kv)),
            UserPlan::Validator(p) => p.apply(kv),
        }
    }

    /// What CheckTx answers for it.
    pub fn describe(&self) -> String {
        match self {
            UserPlan::Report(p) => format!("report {} passes checks", hex::encode(&p.report_id)),
            UserPlan::Allowance(_) => "allowance change passes checks".into(),
            UserPlan::Validator(p) => format!("{} passes checks", p.describe()),
        }
    }

    /// The replay scope (gateway key and report id) of a report.
    pub fn report_scope(&self) -> Option<(&[u8], u64)> {
        match self {
            UserPlan::Report(p) => Some((&p.scope, p.expires_at)),
            UserPlan::Allowance(_) | UserPlan::Validator(_) => None,
        }
    }
}

/// Gateway signatures this node has already verified, by
/// [`signature_id`]: a report whose signature is known verifies without
/// the ed25519 check. The answer cannot differ (the id commits to the key,
/// the signature and the signed body), so a node with a cache and one
/// without reach the same result; the cache only saves the work when the
/// same transaction is checked again (mempool recheck after every block,
/// then FinalizeBlock). Only signatures that verified are ever inserted.
pub trait VerifiedSignatures {
    /// Whether the signature with this id verified before.
    fn contains(&self, id: &[u8; 32]) -> bool;
    /// Remembers that the signature with this id verified.
    fn insert(&self, id: [u8; 32]);
}

/// No memory: every signature is verified.
#[derive(Clone, Copy, Debug, Default)]
pub struct VerifyAll;

impl VerifiedSignatures for VerifyAll {
    fn contains(&self, _: &[u8; 32]) -> bool {
        false
    }
    fn insert(&self, _: [u8; 32]) {}
}

/// The id of a report signature: SHA-256 of the gateway key, the signature
/// and SHA-256 of the signed body.
pub fn signature_id(gateway_key: &[u8], signature: &[u8], body_hash: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(gateway_key);
    h.update(signature);
    h.update(body_hash);
    h.finalize().into()
}

/// Plans the transaction `bytes` at block time `now`: it must fit
/// `max_tx_bytes`, decode, and be a valid usage report.
pub fn plan_tx(kv: &impl KvRead, now: u64, bytes: &[u8]) -> Result<UserPlan, ExecError> {
    plan_tx_with(kv, now, bytes, &VerifyAll)
}

/// [`plan_tx`], skipping the ed25519 check of signatures `sigs` knows.
pub fn plan_tx_with(
    kv: &impl KvRead,
    now: u64,
    bytes: &[u8],
    sigs: &dyn VerifiedSignatures,
) -> Result<UserPlan, ExecError> {
    let params = params(kv)?;
    if bytes.len() as u64 > params.max_tx_bytes {
        return Err(reject(
            Code::TxTooLarge,
            format!(
                "transaction is {} bytes, at most {} allowed",
                bytes.len(),
                params.max_tx_bytes
            ),
        ));
    }
    match decode_canonical(bytes)?.sum {
        Some(tx::Sum::Report(r)) => {
            plan_report(kv, &params, now, &r, sigs).map(|p| UserPlan::Report(Box::new(p)))
        }
        Some(tx::Sum::Allowance(a)) => plan_allowance(kv, now, &a).map(UserPlan::Allowance),
        Some(tx::Sum::Validator(v)) => {
            crate::dkg::tx::plan_validator_tx(kv, &v).map(|p| UserPlan::Validator(Box::new(p)))
        }
        Some(_) => Err(reject(Code::BadSystemTx, "not a usage report")),
        None => Err(reject(Code::MalformedTx, "transaction has no payload")),
    }
}

/// Checks who signed the report and that the signature verifies; returns
/// the gateway's name and key.
fn check_signature(
    kv: &impl KvRead,
    signed: &SignedReport,
    body_hash: &[u8; 32],
    sigs: &dyn VerifiedSignatures,
) -> Result<(String, [u8; 32]), ExecError> {
    let key: [u8; 32] = signed.gateway_key.as_slice().try_into().map_err(|_| {
        reject(
            Code::UnknownGateway,
            format!("gateway key is {} bytes, want 32", signed.gateway_key.len()),
        )
    })?;
    let gateway = gateway(kv, &key)?.ok_or_else(|| {
        reject(
            Code::UnknownGateway,
            format!(
                "gateway key {} is not registered in genesis",
                hex::encode(key)
            ),
        )
    })?;
    let sig: [u8; 64] = signed.signature.as_slice().try_into().map_err(|_| {
        reject(
            Code::BadSignature,
            format!("signature is {} bytes, want 64", signed.signature.len()),
        )
    })?;
    let id = signature_id(&key, &sig, body_hash);
    if sigs.contains(&id) {
        return Ok((gateway, key));
    }
    let vk = VerifyingKey::from_bytes(&key)
        .map_err(|_| reject(Code::UnknownGateway, "gateway key is not an ed25519 point"))?;
    let mut msg = Vec::with_capacity(REPORT_SIGN_DOMAIN.len() + signed.body.len());
    msg.extend_from_slice(REPORT_SIGN_DOMAIN);
    msg.extend_from_slice(&signed.body);
    vk.verify_strict(&msg, &Signature::from_bytes(&sig))
        .map_err(|_| {
            reject(
                Code::BadSignature,
                format!("signature does not verify for gateway {gateway}"),
            )
        })?;
    sigs.insert(id);
    Ok((gateway, key))
}

/// The report's own checks: chain, id, expiry, replay (under the
/// gateway's `scope`, see [`keys::report_scope`]), record count.
fn check_header(
    kv: &impl KvRead,
    params: &Params,
    now: u64,
    report: &ReportUsage,
    scope: &[u8],
) -> Result<(), ExecError> {
    let chain = chain_id(kv)?;
    if report.chain_id != chain {
        return Err(reject(
            Code::WrongChain,
            format!(
                "report is for chain {:?}, this is {:?}",
                report.chain_id, chain
            ),
        ));
    }
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
    if let Some(hash) = report_seen(kv, scope)? {
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

fn plan_report(
    kv: &impl KvRead,
    params: &Params,
    now: u64,
    signed: &SignedReport,
    sigs: &dyn VerifiedSignatures,
) -> Result<Plan, ExecError> {
    let report = ReportUsage::decode(signed.body.as_slice()).map_err(|e| {
        reject(
            Code::MalformedTx,
            format!("report body does not decode: {e}"),
        )
    })?;
    if report.encoded_len() != signed.body.len() || report.encode_to_vec() != signed.body {
        return Err(reject(
            Code::NonCanonical,
            "report body is not in canonical protobuf encoding (fields in order, no unknown or repeated fields)",
        ));
    }
    let body_hash: [u8; 32] = Sha256::digest(&signed.body).into();
    let (gateway, gateway_key) = check_signature(kv, signed, &body_hash, sigs)?;
    let scope = keys::report_scope(&gateway_key, &report.report_id);
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
    let CallTotals {
        routes,
        debits,
        owed: owed_add,
    } = CallTotals::of(&report, &overflow)?;

    let mut balances = Vec::with_capacity(debits.len());
    for (&user, &debit) in &debits {
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

    let spend = check_spend(kv, &gateway, now, window, &debits)?;
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
    let mut owed_new = Vec::with_capacity(owed_add.len());
    for ((provider, user), amount) in owed_add {
        if amount == 0 {
            continue;
        }
        let mut slot = owed_slot(kv, window, provider, user)?;
        slot.amount = slot.amount.checked_add(amount).ok_or_else(overflow)?;
        owed_new.push(slot);
    }

    Ok(Plan {
        scope,
        body_hash,
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
    })
}

impl Plan {
    /// Writes everything the plan computed and returns the accepted result.
    pub fn apply(self, kv: &mut impl Kv) -> TxResult {
        put_report(kv, &self.scope, self.expires_at, &self.body_hash);
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
    use ed25519_dalek::Signer;
    let body = report.encode_to_vec();
    let mut msg = Vec::with_capacity(REPORT_SIGN_DOMAIN.len() + body.len());
    msg.extend_from_slice(REPORT_SIGN_DOMAIN);
    msg.extend_from_slice(&body);
    let signature = key.sign(&msg).to_bytes().to_vec();
    Tx {
        sum: Some(tx::Sum::Report(SignedReport {
            body,
            gateway_key: key.verifying_key().to_bytes().to_vec(),
            signature,
        })),
    }
    .encode_to_vec()
}

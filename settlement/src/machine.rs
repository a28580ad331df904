//! The state transitions: genesis, block start, transactions.

use std::collections::BTreeMap;

use ed25519_dalek::{Signature, VerifyingKey};
use prost::Message;
use tally_store::{Kv, KvRead, StoreError};

use crate::codes::{Code, Rejection};
use crate::genesis::{parse_pubkey, Genesis, Params};
use crate::ident;
use crate::keys;
use crate::proto::{tx, Outcome, ReportUsage, SignedReport, Tx};
use crate::record::{Counters, RouteId};

/// Domain prefix of a gateway's report signature: the signed message is
/// `REPORT_SIGN_DOMAIN || body`.
pub const REPORT_SIGN_DOMAIN: &[u8] = b"tally/report/v1\0";

/// The block a transaction runs in: height and header time (unix seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Height.
    pub height: u64,
    /// Header time, whole unix seconds.
    pub time: u64,
}

/// An ABCI event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Event type.
    pub kind: String,
    /// Key-value attributes.
    pub attrs: Vec<(String, String)>,
}

/// The result of running or checking one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxResult {
    /// Result code.
    pub code: Code,
    /// What happened, for a person.
    pub log: String,
    /// Events, empty on rejection.
    pub events: Vec<Event>,
}

impl TxResult {
    fn rejected(r: Rejection) -> Self {
        Self {
            code: r.code,
            log: r.msg,
            events: Vec::new(),
        }
    }
}

/// Per-window totals kept beside the route records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowInfo {
    /// Sum of the window's route records.
    pub totals: Counters,
    /// Number of route records.
    pub routes: u64,
    /// Whether the window has closed (frozen).
    pub closed: bool,
}

impl WindowInfo {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = self.totals.encode();
        v.extend_from_slice(&self.routes.to_be_bytes());
        v.push(u8::from(self.closed));
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 89 {
            return None;
        }
        Some(Self {
            totals: Counters::decode(&b[..80])?,
            routes: u64::from_be_bytes(b[80..88].try_into().ok()?),
            closed: b[88] == 1,
        })
    }
}

fn corrupt(what: &str) -> Rejection {
    Rejection::new(Code::Internal, format!("stored {what} is corrupt"))
}

pub(crate) fn get_u64(kv: &impl KvRead, key: &[u8]) -> Result<Option<u64>, Rejection> {
    match kv.get(key)? {
        None => Ok(None),
        Some(v) => Ok(Some(u64::from_be_bytes(
            v.as_slice().try_into().map_err(|_| corrupt("integer"))?,
        ))),
    }
}

/// The chain's parameters.
pub fn params(kv: &impl KvRead) -> Result<Params, Rejection> {
    match kv.get(keys::PARAMS)? {
        None => Ok(Params::default()),
        Some(b) => serde_json::from_slice(&b).map_err(|_| corrupt("params")),
    }
}

/// The chain id recorded at genesis.
pub fn chain_id(kv: &impl KvRead) -> Result<String, Rejection> {
    Ok(kv
        .get(keys::CHAIN_ID)?
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default())
}

/// A user's balance.
pub fn balance(kv: &impl KvRead, user: &str) -> Result<u64, Rejection> {
    Ok(get_u64(kv, &keys::balance(user))?.unwrap_or(0))
}

/// Writes genesis state.
pub fn init_chain(kv: &mut impl Kv, chain_id: &str, genesis: &Genesis) -> Result<(), Rejection> {
    genesis
        .validate()
        .map_err(|e| Rejection::new(Code::Internal, e.to_string()))?;
    kv.put(keys::CHAIN_ID.to_vec(), chain_id.as_bytes().to_vec());
    let params = serde_json::to_vec(&genesis.params)
        .map_err(|e| Rejection::new(Code::Internal, e.to_string()))?;
    kv.put(keys::PARAMS.to_vec(), params);
    for gw in &genesis.gateways {
        let key = parse_pubkey(&gw.pubkey).map_err(|m| Rejection::new(Code::Internal, m))?;
        kv.put(keys::gateway(&key), gw.name.as_bytes().to_vec());
    }
    for b in &genesis.balances {
        kv.put(keys::balance(&b.user), b.amount.to_be_bytes().to_vec());
    }
    if let Some(d) = &genesis.dkg {
        crate::sync::init(kv, d)?;
    }
    Ok(())
}

/// Work at the start of every block: forget expired report ids and close
/// the windows the block time has left.
pub fn begin_block(kv: &mut impl Kv, block: &Block) -> Result<Vec<Event>, StoreError> {
    let mut events = Vec::new();
    // Report ids whose expires_at <= now can never be replayed: forget them.
    let start = keys::REPORT_EXPIRY.to_vec();
    let end = keys::cat(&[
        keys::REPORT_EXPIRY,
        &block.time.saturating_add(1).to_be_bytes(),
    ]);
    let mut expired = Vec::new();
    kv.for_each(&start, &end, &mut |k, _| {
        expired.push(k[keys::REPORT_EXPIRY.len() + 8..].to_vec());
        true
    })?;
    if !expired.is_empty() {
        for id in &expired {
            kv.delete(keys::report_id(id));
        }
        kv.delete_range(start, end);
    }

    let params: Params = match kv.get(keys::PARAMS)? {
        Some(b) => serde_json::from_slice(&b)
            .map_err(|e| StoreError::Corrupt(format!("stored params: {e}")))?,
        None => Params::default(),
    };
    let now_window = block.time / params.settlement_window_secs;
    let prev = kv
        .get(keys::CUR_WINDOW)?
        .and_then(|v| v.as_slice().try_into().ok().map(u64::from_be_bytes));
    if let Some(prev) = prev {
        if now_window > prev {
            let key = keys::window(prev);
            let calls = crate::sync::close_window(kv, prev, &params.hub_chain)?;
            if let Some(mut info) = kv.get(&key)?.and_then(|b| WindowInfo::decode(&b)) {
                info.closed = true;
                kv.put(key, info.encode());
                events.push(Event {
                    kind: "window_closed".into(),
                    attrs: vec![
                        ("window".into(), prev.to_string()),
                        ("routes".into(), info.routes.to_string()),
                        ("requests".into(), info.totals.requests.to_string()),
                        ("amount".into(), info.totals.amount.to_string()),
                        ("hub_calls".into(), calls.to_string()),
                    ],
                });
            }
        }
    }
    if prev != Some(now_window) {
        kv.put(keys::CUR_WINDOW.to_vec(), now_window.to_be_bytes().to_vec());
    }
    kv.put(keys::LAST_TIME.to_vec(), block.time.to_be_bytes().to_vec());
    crate::sync::expire_partials(kv, block.height)?;
    Ok(events)
}

/// Runs one transaction in `block`. A rejected transaction changes nothing.
pub fn deliver_tx(kv: &mut impl Kv, block: &Block, tx: &[u8]) -> TxResult {
    let result = match decode_tx(tx).map(|t| t.sum) {
        Ok(Some(tx::Sum::SyncStart(s))) => crate::sync::apply_start(kv, block, &s),
        Ok(Some(tx::Sum::Partials(p))) => {
            chain_id(kv).and_then(|c| crate::sync::apply_partials(kv, block, &c, &p, false))
        }
        _ => plan_tx(kv, block.time, tx).map(|plan| plan.apply(kv)),
    };
    result.unwrap_or_else(TxResult::rejected)
}

/// True for transactions only a block proposer may add.
pub fn is_system_tx(tx: &[u8]) -> bool {
    matches!(
        decode_tx(tx).map(|t| t.sum),
        Ok(Some(tx::Sum::SyncStart(_) | tx::Sum::Partials(_)))
    )
}

/// PrepareProposal's system transactions for `block`, computed on `sim`
/// (committed state in a throwaway overlay): a sync start when one is due,
/// then the new valid partials of `extensions`.
pub fn prepare_system(
    kv: &mut impl Kv,
    block: &Block,
    extensions: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>, Rejection> {
    begin_block(kv, block)?;
    let mut out = Vec::new();
    if let Some(start) = crate::sync::next_sync_start(kv, block.time)? {
        crate::sync::apply_start(kv, block, &start)?;
        out.push(
            Tx {
                sum: Some(tx::Sum::SyncStart(start)),
            }
            .encode_to_vec(),
        );
    }
    let chain = chain_id(kv)?;
    if let Some(p) = crate::sync::collect_partials(kv, &chain, extensions)? {
        out.push(
            Tx {
                sum: Some(tx::Sum::Partials(p)),
            }
            .encode_to_vec(),
        );
    }
    Ok(out)
}

/// ProcessProposal's check of a block's system transactions on `sim`:
/// they come first, at most one sync start, each exactly what committed
/// state allows, every partial valid and new. User transactions are not
/// run. A block without system transactions passes.
pub fn verify_system(kv: &mut impl Kv, block: &Block, txs: &[&[u8]]) -> Result<(), Rejection> {
    begin_block(kv, block)?;
    let chain = chain_id(kv)?;
    let mut user_seen = false;
    let mut starts = 0;
    for (i, t) in txs.iter().enumerate() {
        match decode_tx(t)?.sum {
            Some(tx::Sum::SyncStart(s)) => {
                starts += 1;
                if user_seen || starts > 1 {
                    return Err(Rejection::new(
                        Code::BadSystemTx,
                        format!("tx {i}: sync start out of place"),
                    ));
                }
                crate::sync::apply_start(kv, block, &s)?;
            }
            Some(tx::Sum::Partials(p)) => {
                if user_seen {
                    return Err(Rejection::new(
                        Code::BadSystemTx,
                        format!("tx {i}: system tx after user txs"),
                    ));
                }
                crate::sync::apply_partials(kv, block, &chain, &p, true)?;
            }
            _ => user_seen = true,
        }
    }
    Ok(())
}

/// Checks a transaction against committed state for the mempool, using the
/// last block's time as "now". Changes nothing.
pub fn check_tx(kv: &impl KvRead, tx: &[u8]) -> TxResult {
    let now = match get_u64(kv, keys::LAST_TIME) {
        Ok(t) => t.unwrap_or(0),
        Err(r) => return TxResult::rejected(r),
    };
    if is_system_tx(tx) {
        return TxResult::rejected(Rejection::new(
            Code::SystemTxFromMempool,
            "system transactions are added by the block proposer, never through the mempool",
        ));
    }
    match plan_tx(kv, now, tx) {
        Ok(plan) => TxResult {
            code: Code::Ok,
            log: format!("report {} passes checks", hex::encode(&plan.report_id)),
            events: Vec::new(),
        },
        Err(r) => TxResult::rejected(r),
    }
}

/// Decodes a transaction's bytes.
pub fn decode_tx(tx: &[u8]) -> Result<Tx, Rejection> {
    let decoded = Tx::decode(tx)
        .map_err(|e| Rejection::new(Code::MalformedTx, format!("not a Tally transaction: {e}")))?;
    if decoded.sum.is_none() {
        return Err(Rejection::new(
            Code::MalformedTx,
            "transaction has no payload",
        ));
    }
    Ok(decoded)
}

/// Everything a valid report will write, computed from reads only.
#[derive(Debug)]
struct Plan {
    report_id: Vec<u8>,
    expires_at: u64,
    gateway: String,
    records: usize,
    window: u64,
    routes: Vec<(RouteId, Counters, bool)>,
    balances: Vec<(String, u64)>,
    owed: Vec<(Vec<u8>, u64)>,
    window_info: WindowInfo,
}

fn plan_tx(kv: &impl KvRead, now: u64, bytes: &[u8]) -> Result<Plan, Rejection> {
    let params = params(kv)?;
    if bytes.len() as u64 > params.max_tx_bytes {
        return Err(Rejection::new(
            Code::TxTooLarge,
            format!(
                "transaction is {} bytes, at most {} allowed",
                bytes.len(),
                params.max_tx_bytes
            ),
        ));
    }
    match decode_tx(bytes)?.sum {
        Some(tx::Sum::Report(r)) => plan_report(kv, &params, now, &r),
        Some(_) => Err(Rejection::new(Code::BadSystemTx, "not a usage report")),
        None => Err(Rejection::new(
            Code::MalformedTx,
            "transaction has no payload",
        )),
    }
}

fn plan_report(
    kv: &impl KvRead,
    params: &Params,
    now: u64,
    signed: &SignedReport,
) -> Result<Plan, Rejection> {
    let report = ReportUsage::decode(signed.body.as_slice()).map_err(|e| {
        Rejection::new(
            Code::MalformedTx,
            format!("report body does not decode: {e}"),
        )
    })?;

    // Who signed, and did they?
    let key: [u8; 32] = signed.gateway_key.as_slice().try_into().map_err(|_| {
        Rejection::new(
            Code::UnknownGateway,
            format!("gateway key is {} bytes, want 32", signed.gateway_key.len()),
        )
    })?;
    let gateway = kv.get(&keys::gateway(&key))?.ok_or_else(|| {
        Rejection::new(
            Code::UnknownGateway,
            format!(
                "gateway key {} is not registered in genesis",
                hex::encode(key)
            ),
        )
    })?;
    let gateway = String::from_utf8_lossy(&gateway).into_owned();
    let sig: [u8; 64] = signed.signature.as_slice().try_into().map_err(|_| {
        Rejection::new(
            Code::BadSignature,
            format!("signature is {} bytes, want 64", signed.signature.len()),
        )
    })?;
    let vk = VerifyingKey::from_bytes(&key)
        .map_err(|_| Rejection::new(Code::UnknownGateway, "gateway key is not an ed25519 point"))?;
    let mut msg = Vec::with_capacity(REPORT_SIGN_DOMAIN.len() + signed.body.len());
    msg.extend_from_slice(REPORT_SIGN_DOMAIN);
    msg.extend_from_slice(&signed.body);
    vk.verify_strict(&msg, &Signature::from_bytes(&sig))
        .map_err(|_| {
            Rejection::new(
                Code::BadSignature,
                format!("signature does not verify for gateway {gateway}"),
            )
        })?;

    let chain = chain_id(kv)?;
    if report.chain_id != chain {
        return Err(Rejection::new(
            Code::WrongChain,
            format!(
                "report is for chain {:?}, this is {:?}",
                report.chain_id, chain
            ),
        ));
    }
    if report.report_id.len() != 16 {
        return Err(Rejection::new(
            Code::BadReportId,
            format!("report_id is {} bytes, want 16", report.report_id.len()),
        ));
    }
    let rid = hex::encode(&report.report_id);
    if report.expires_at <= now {
        return Err(Rejection::new(
            Code::ReportExpired,
            format!(
                "report {rid} expired at {} (block time {now})",
                report.expires_at
            ),
        ));
    }
    if report.expires_at - now > params.max_report_expiry_secs {
        return Err(Rejection::new(
            Code::ExpiryTooFar,
            format!(
                "report {rid} expires_at {} is more than {} s after block time {now}",
                report.expires_at, params.max_report_expiry_secs
            ),
        ));
    }
    if kv.get(&keys::report_id(&report.report_id))?.is_some() {
        return Err(Rejection::new(
            Code::DuplicateReport,
            format!("report {rid} was already accepted"),
        ));
    }
    if report.records.is_empty() {
        return Err(Rejection::new(
            Code::EmptyReport,
            format!("report {rid} has no records"),
        ));
    }
    if report.records.len() > params.max_report_records as usize {
        return Err(Rejection::new(
            Code::TooManyRecords,
            format!(
                "report {rid} has {} records, at most {} allowed",
                report.records.len(),
                params.max_report_records
            ),
        ));
    }

    let window = now / params.settlement_window_secs;
    let overflow = || {
        Rejection::new(
            Code::Overflow,
            format!("report {rid} overflows a 64-bit counter"),
        )
    };
    let mut routes: BTreeMap<RouteId, Counters> = BTreeMap::new();
    let mut debits: BTreeMap<&str, u64> = BTreeMap::new();
    let mut owed: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for (i, r) in report.records.iter().enumerate() {
        let at = |e: Rejection| Rejection::new(e.code, format!("record {i}: {}", e.msg));
        ident::check_party("user", &r.user).map_err(at)?;
        ident::check_party("provider", &r.provider).map_err(at)?;
        ident::check_name("model", &r.model).map_err(at)?;
        ident::check_name("route", &r.route).map_err(at)?;
        let outcome = match Outcome::try_from(r.outcome) {
            Ok(Outcome::Unspecified) | Err(_) => {
                return Err(Rejection::new(
                    Code::BadOutcome,
                    format!("record {i}: outcome {} is not a known class", r.outcome),
                ))
            }
            Ok(o) => o,
        };
        let id = RouteId {
            user: r.user.clone(),
            provider: r.provider.clone(),
            model: r.model.clone(),
            route: r.route.clone(),
        };
        routes
            .entry(id)
            .or_default()
            .add_record(outcome, r.units, r.amount)
            .map_err(|_| overflow())?;
        let d = debits.entry(&r.user).or_default();
        *d = d.checked_add(r.amount).ok_or_else(overflow)?;
        let o = owed.entry((&r.provider, &r.user)).or_default();
        *o = o.checked_add(r.amount).ok_or_else(overflow)?;
    }

    let mut balances = Vec::with_capacity(debits.len());
    for (user, debit) in debits {
        let have = balance(kv, user)?;
        let left = have.checked_sub(debit).ok_or_else(|| {
            Rejection::new(
                Code::InsufficientBalance,
                format!("report {rid}: user {user} has {have} credits, the report charges {debit}"),
            )
        })?;
        if debit > 0 {
            balances.push((user.to_string(), left));
        }
    }

    let mut window_info = match kv.get(&keys::window(window))? {
        Some(b) => WindowInfo::decode(&b).ok_or_else(|| corrupt("window"))?,
        None => WindowInfo::default(),
    };
    let mut planned = Vec::with_capacity(routes.len());
    for (id, add) in routes {
        let stored = kv.get(&keys::route(&id, window))?;
        let is_new = stored.is_none();
        let mut c = match stored {
            Some(b) => Counters::decode(&b).ok_or_else(|| corrupt("route record"))?,
            None => Counters::default(),
        };
        c.add(&add).map_err(|_| overflow())?;
        window_info.totals.add(&add).map_err(|_| overflow())?;
        if is_new {
            window_info.routes += 1;
        }
        planned.push((id, c, is_new));
    }
    let mut owed_new = Vec::with_capacity(owed.len());
    for ((provider, user), amount) in owed {
        if amount == 0 {
            continue;
        }
        let key = keys::owed(window, provider, user);
        let total = get_u64(kv, &key)?
            .unwrap_or(0)
            .checked_add(amount)
            .ok_or_else(overflow)?;
        owed_new.push((key, total));
    }

    Ok(Plan {
        report_id: report.report_id,
        expires_at: report.expires_at,
        gateway,
        records: report.records.len(),
        window,
        routes: planned,
        balances,
        owed: owed_new,
        window_info,
    })
}

impl Plan {
    fn apply(self, kv: &mut impl Kv) -> TxResult {
        kv.put(
            keys::report_id(&self.report_id),
            self.expires_at.to_be_bytes().to_vec(),
        );
        kv.put(
            keys::report_expiry(self.expires_at, &self.report_id),
            Vec::new(),
        );
        for (id, c, is_new) in &self.routes {
            kv.put(keys::route(id, self.window), c.encode());
            if *is_new {
                kv.put(keys::by_provider(id, self.window), Vec::new());
                kv.put(keys::by_user(id, self.window), Vec::new());
            }
        }
        for (user, left) in &self.balances {
            kv.put(keys::balance(user), left.to_be_bytes().to_vec());
        }
        for (key, total) in self.owed {
            kv.put(key, total.to_be_bytes().to_vec());
        }
        kv.put(keys::window(self.window), self.window_info.encode());
        let rid = hex::encode(&self.report_id);
        TxResult {
            code: Code::Ok,
            log: format!(
                "report {rid} from {}: {} records on {} routes in window {}",
                self.gateway,
                self.records,
                self.routes.len(),
                self.window
            ),
            events: vec![Event {
                kind: "usage_report".into(),
                attrs: vec![
                    ("report_id".into(), rid),
                    ("gateway".into(), self.gateway),
                    ("records".into(), self.records.to_string()),
                    ("window".into(), self.window.to_string()),
                ],
            }],
        }
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

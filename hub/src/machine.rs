//! The hub's state machine (pure: state through `tally_store::Kv`, time
//! from the block). A reference main chain: users deposit credits into
//! escrow, and the settlement chain's batches, threshold-signed by its
//! validators, pay providers out of that escrow, once per nonce.
//!
//! Genesis `app_state` is [`HubGenesis`] `{settlement_chain_id, name,
//! group_key, escrow, governors, governor_threshold}` (`tally-hub genesis`
//! writes it from Tally's key).
//!
//! - `Deposit {user, amount[, pubkey]}` adds to `escrow/<user>`, takes the
//!   next number from `meta/deposit_seq` and records `{seq, user, amount,
//!   height}` under `dep/<height><seq>`, so `/deposits/{from}/{to}` lists a
//!   height range in sequence order. There is no authentication: it is a
//!   faucet. A key binds the user first-come ([`crate::deposit`], ADR
//!   0020).
//! - `SubmitBatch {chain, nonce, calls, signature}` is checked in this
//!   order: the chain name (code 6), a nonce at or below
//!   `last_nonce/<chain>` (code 4 `AlreadySettled`, nothing paid), a nonce
//!   other than the next (3), calls non-empty and ascending by id (5), the
//!   group signature (of the key the hub holds now) over the batch digest
//!   in Tally's message format for `settlement_chain_id` (2). Then, if any user's escrow is below that
//!   user's total in the batch, the batch is refused whole (code 8, nothing
//!   written, the nonce still open); otherwise every call is paid in full
//!   from escrow to `payout/<provider>`, or, a withdrawal (kind 1), to
//!   `withdrawn/<user>`. The result `{chain, nonce,
//!   settled, height, calls, paid, shortfall}` (`shortfall` always 0) is
//!   stored under `result/<chain>/<nonce>` and `last_nonce/<chain>`
//!   advances.
//! - `RotateKey` replaces the group key batches verify against, signed by
//!   the key the hub holds; `GovernKey` does the same for a key the chain
//!   made by a recovery, signed by `governor_threshold` of the hub's
//!   governors ([`crate::keys`]).
//! - Queries ([`query_at`]): `/batch/{chain}/{nonce}` (code 22 until
//!   settled), `/last_nonce/{chain}`, `/escrow/{user}`,
//!   `/payout/{provider}`, `/deposits/{from}/{to}` (at most 10,000 heights,
//!   with `deposit_count`, the deposits made through `to`; refused if `to`
//!   is above the committed height), `/keys/{chain}` (every key the hub
//!   held, with the height it took effect), `/genesis`.

use std::collections::BTreeMap;

use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tally_settlement::bls::{self, Kind, PublicShares};
use tally_settlement::sync::batch_digest;
use tally_settlement::types::CALL_WITHDRAW;
use tally_store::{prefix_end, Kv, KvRead, StoreError};

use crate::kv::get_u64;

// The wire types live in `tally-hub-types`, shared with the relay; they
// are re-exported here so the hub's own code keeps one path to them.
pub use tally_hub_types::{
    hub_tx, Deposit, GovernKey, GovernorApproval, HubCode, HubTx, RotateKey, SubmitBatch,
};

/// The hub's genesis `app_state`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HubGenesis {
    /// The settlement chain's CometBFT chain id (bound into its signatures).
    pub settlement_chain_id: String,
    /// The name the settlement chain uses for this hub (its `hub_chain`).
    #[serde(default = "default_name")]
    pub name: String,
    /// Hex compressed G1 group key of the settlement chain's validators.
    pub group_key: String,
    /// Starting escrow balances.
    #[serde(default)]
    pub escrow: Vec<EscrowEntry>,
    /// Hex ed25519 keys of the hub's governors, who may accept a key the
    /// settlement chain made by a recovery (ADR 0018); none: no recovery.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub governors: Vec<String>,
    /// Governor approvals a `GovernKey` needs: more than half of
    /// `governors` (0 without governors).
    #[serde(default)]
    pub governor_threshold: u32,
    /// Credits the deposit that binds a user's key pays the hub (ADR
    /// 0020): what makes taking names cost something.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub registration_fee: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Most governors a hub may list.
pub const MAX_GOVERNORS: usize = 32;

impl HubGenesis {
    /// The governors' keys, checked: valid ed25519, distinct, at most
    /// [`MAX_GOVERNORS`], and a threshold that is a majority of them (0
    /// exactly when there are none).
    pub fn governor_keys(&self) -> Result<Vec<[u8; 32]>, String> {
        if self.governors.len() > MAX_GOVERNORS {
            return Err(format!("at most {MAX_GOVERNORS} governors"));
        }
        let mut keys: Vec<[u8; 32]> = Vec::with_capacity(self.governors.len());
        for g in &self.governors {
            let k: [u8; 32] = hex::decode(g.trim())
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| format!("governor {g:?} is not 32 bytes of hex"))?;
            ed25519_dalek::VerifyingKey::from_bytes(&k)
                .map_err(|_| format!("governor {g:?} is not an ed25519 key"))?;
            if keys.contains(&k) {
                return Err(format!("governor {g} is listed twice"));
            }
            keys.push(k);
        }
        let (n, t) = (keys.len() as u32, self.governor_threshold);
        let ok = if n == 0 { t == 0 } else { t <= n && 2 * t > n };
        if !ok {
            return Err(format!(
                "governor_threshold {t} with {n} governors: it must be a majority of them (0 without governors)"
            ));
        }
        Ok(keys)
    }
}

fn default_name() -> String {
    "hub".into()
}

/// A starting escrow balance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscrowEntry {
    /// User.
    pub user: String,
    /// Credits.
    pub amount: u64,
}

pub use crate::kv::HubResult;

fn reject(code: HubCode, log: impl Into<String>) -> HubResult {
    HubResult {
        code,
        log: log.into(),
        value: Vec::new(),
    }
}

const GENESIS: &[u8] = b"meta/genesis";
use crate::kv::{DEPOSIT, DEPOSIT_SEQ, ESCROW};
const PAYOUT: &[u8] = b"payout/";
const RESULT: &[u8] = b"result/";
const LAST_NONCE: &[u8] = b"last_nonce/";

fn key(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Parses and validates genesis.
pub fn parse_genesis(bytes: &[u8]) -> Result<(HubGenesis, PublicShares), String> {
    let g: HubGenesis = serde_json::from_slice(bytes).map_err(|e| format!("hub genesis: {e}"))?;
    g.governor_keys().map_err(|e| format!("hub genesis: {e}"))?;
    let pk = hex::decode(&g.group_key).map_err(|_| "group_key is not hex".to_string())?;
    let group = bls::parse_public_key(&pk).map_err(|e| format!("group_key: {e}"))?;
    Ok((
        g,
        PublicShares {
            threshold: 1,
            group,
            shares: Vec::new(),
        },
    ))
}

/// Writes genesis state.
pub fn init(kv: &mut impl Kv, app_state: &[u8]) -> Result<(), String> {
    let (g, _) = parse_genesis(app_state)?;
    for e in &g.escrow {
        kv.put(
            key(&[ESCROW, e.user.as_bytes()]),
            e.amount.to_be_bytes().to_vec(),
        );
    }
    kv.put(GENESIS.to_vec(), app_state.to_vec());
    Ok(())
}

/// Runs one transaction at `height`. An invalid transaction is an `Ok`
/// result with its code; `Err` means this node's store failed, and the
/// adapter halts instead of answering.
pub fn deliver(kv: &mut impl Kv, height: u64, tx: &[u8]) -> Result<HubResult, StoreError> {
    deliver_inner(kv, height, tx)
}

fn deliver_inner(kv: &mut impl Kv, height: u64, tx: &[u8]) -> Result<HubResult, StoreError> {
    let Ok(HubTx { sum: Some(sum) }) = HubTx::decode(tx) else {
        return Ok(reject(HubCode::Malformed, "not a hub transaction"));
    };
    match sum {
        hub_tx::Sum::Deposit(d) => {
            let fee = stored_genesis(kv)?.map_or(0, |(g, _)| g.registration_fee);
            crate::deposit::deposit(kv, height, &d, fee)
        }
        hub_tx::Sum::SubmitBatch(b) => submit_batch(kv, height, &b),
        hub_tx::Sum::RotateKey(_) | hub_tx::Sum::GovernKey(_) => key_change(kv, height, &sum),
    }
}

/// A `RotateKey` (signed by the key held) or a `GovernKey` (approved by
/// the governors) at `height` ([`crate::keys::rotate`]).
fn key_change(kv: &mut impl Kv, height: u64, sum: &hub_tx::Sum) -> Result<HubResult, StoreError> {
    let Some((g, genesis_key)) = stored_genesis(kv)? else {
        return Ok(reject(HubCode::Internal, "no genesis, or a corrupt one"));
    };
    let Ok(governors) = g.governor_keys() else {
        return Ok(reject(HubCode::Internal, "corrupt governors in genesis"));
    };
    let names = (g.name.as_str(), g.settlement_chain_id.as_str());
    let (change, by, who) = match sum {
        hub_tx::Sum::RotateKey(r) => (
            crate::keys::Change::of_rotation(r),
            crate::keys::By::Key(genesis_key, &r.signature),
            "the key held",
        ),
        hub_tx::Sum::GovernKey(r) => (
            crate::keys::Change::of_governed(r),
            crate::keys::By::Governors(&governors, g.governor_threshold, &r.approvals),
            "the governors",
        ),
        _ => return Ok(reject(HubCode::Malformed, "not a key change")),
    };
    Ok(match crate::keys::rotate(kv, height, names, &change, by)? {
        Ok(rec) => HubResult {
            code: HubCode::Ok,
            log: format!(
                "rotation {}: key of epoch {} holds from now (by {who})",
                change.nonce, change.epoch
            ),
            value: rec.to_string().into_bytes(),
        },
        Err((code, log)) => reject(code, log),
    })
}

/// The stored genesis and its group key (`None`: missing or corrupt).
fn stored_genesis(kv: &impl KvRead) -> Result<Option<(HubGenesis, PublicShares)>, StoreError> {
    let Some(gbytes) = kv.get(GENESIS)? else {
        return Ok(None);
    };
    Ok(parse_genesis(&gbytes).ok())
}

fn submit_batch(kv: &mut impl Kv, height: u64, b: &SubmitBatch) -> Result<HubResult, StoreError> {
    let Some((g, genesis_key)) = stored_genesis(kv)? else {
        return Ok(reject(HubCode::Internal, "no genesis, or a corrupt one"));
    };
    if b.chain != g.name {
        return Ok(reject(
            HubCode::WrongChain,
            format!("batch is for hub {:?}, this is {:?}", b.chain, g.name),
        ));
    }
    let last = get_u64(kv, &key(&[LAST_NONCE, b.chain.as_bytes()]))?;
    if b.nonce <= last && b.nonce > 0 {
        return Ok(reject(
            HubCode::AlreadySettled,
            format!("batch {} is already settled (last {last})", b.nonce),
        ));
    }
    if b.nonce != last + 1 {
        return Ok(reject(
            HubCode::BadNonce,
            format!("nonce {} is not the next one ({})", b.nonce, last + 1),
        ));
    }
    if b.calls.is_empty() || b.calls.windows(2).any(|w| w[0].id >= w[1].id) {
        return Ok(reject(
            HubCode::BadBatch,
            "calls must be non-empty and ascending by id",
        ));
    }
    // A call pays its provider (kind 0) or returns credits to its user
    // (kind 1, no provider).
    if let Some(c) = b.calls.iter().find(|c| match c.kind {
        0 => false,
        CALL_WITHDRAW => !c.provider.is_empty(),
        _ => true,
    }) {
        return Ok(reject(
            HubCode::BadBatch,
            format!(
                "call {} has kind {} with provider {:?}",
                c.id, c.kind, c.provider
            ),
        ));
    }
    let group = crate::keys::current(kv, &g.name, genesis_key)?;
    let digest = batch_digest(&b.chain, b.nonce, &b.calls);
    let msg = bls::message(&g.settlement_chain_id, Kind::Batch, &digest);
    let ok = bls::parse_signature(&b.signature).is_ok_and(|s| group.verify_group(&msg, &s));
    if !ok {
        return Ok(reject(
            HubCode::BadSignature,
            format!(
                "batch {} signature does not verify against the group key the hub holds",
                b.nonce
            ),
        ));
    }
    // Every user's total must be covered by that user's escrow, or nothing
    // is paid: a batch is settled in full or not at all (no shortfall).
    // A total beyond u64 (`None`) is covered by no escrow.
    let mut totals: BTreeMap<&str, Option<u64>> = BTreeMap::new();
    for c in &b.calls {
        let t = totals.entry(c.user.as_str()).or_insert(Some(0));
        *t = t.and_then(|t| t.checked_add(c.amount));
    }
    let mut owed: Vec<(&str, u64)> = Vec::with_capacity(totals.len());
    for (user, total) in totals {
        let have = get_u64(kv, &key(&[ESCROW, user.as_bytes()]))?;
        let Some(total) = total.filter(|t| *t <= have) else {
            let total = total.map_or_else(|| "more than 2^64".to_string(), |t| t.to_string());
            return Ok(reject(
                HubCode::InsufficientEscrow,
                format!(
                    "batch {}: {user} owes {total} but has {have} in escrow; nothing paid",
                    b.nonce
                ),
            ));
        };
        owed.push((user, total));
    }
    let mut paid = 0u64;
    for (user, total) in owed {
        let ek = key(&[ESCROW, user.as_bytes()]);
        let have = get_u64(kv, &ek)?;
        kv.put(ek, have.saturating_sub(total).to_be_bytes().to_vec());
        paid = paid.saturating_add(total);
    }
    let mut withdrawn = 0u64;
    for c in &b.calls {
        if c.kind == CALL_WITHDRAW {
            crate::deposit::add_withdrawn(kv, &c.user, c.amount)?;
            withdrawn = withdrawn.saturating_add(c.amount);
            continue;
        }
        let pk = key(&[PAYOUT, c.provider.as_bytes()]);
        let got = get_u64(kv, &pk)?.saturating_add(c.amount);
        kv.put(pk, got.to_be_bytes().to_vec());
    }
    // `paid` counts every credit that left escrow (withdrawals too);
    // `shortfall` stays in the result for readers of older answers; it is
    // always 0 since a batch that cannot be paid in full is refused.
    let mut result = json!({"chain": b.chain, "nonce": b.nonce, "settled": true, "height": height, "calls": b.calls.len(), "paid": paid, "shortfall": 0});
    if withdrawn > 0 {
        result["withdrawn"] = json!(withdrawn);
    }
    kv.put(
        key(&[RESULT, b.chain.as_bytes(), b"/", &b.nonce.to_be_bytes()]),
        result.to_string().into_bytes(),
    );
    kv.put(
        key(&[LAST_NONCE, b.chain.as_bytes()]),
        b.nonce.to_be_bytes().to_vec(),
    );
    Ok(HubResult {
        code: HubCode::Ok,
        log: format!("batch {} settled: paid {paid}", b.nonce),
        value: result.to_string().into_bytes(),
    })
}

/// Answers a query path (JSON values) from state committed at least up to
/// hub height `committed`.
///
/// `/batch/{chain}/{nonce}`, `/last_nonce/{chain}`, `/escrow/{user}`,
/// `/payout/{provider}`, `/genesis`, and
/// `/deposits/{from_height}/{to_height}` (inclusive, ordered by sequence
/// number): `{"from", "to", "deposits": [{"seq", "user", "amount",
/// "height"}...], "deposit_count"}`, where `deposit_count` is the number of
/// deposits ever made at heights up to and including `to` (the sequence
/// number of the last one). A range ending above `committed` is refused
/// (code 21): its list could still grow.
pub fn query_at(kv: &impl KvRead, path: &str, committed: u64) -> HubResult {
    match query_inner(kv, path, committed) {
        Ok(r) => r,
        Err(e) => reject(HubCode::Internal, e.to_string()),
    }
}

/// [`query_at`] without a height bound (a store with no commit height,
/// as in tests).
pub fn query(kv: &impl KvRead, path: &str) -> HubResult {
    query_at(kv, path, u64::MAX)
}

/// How many deposits the hub made at heights up to and including `to`:
/// the sequence number before that of the first deposit above `to`, or
/// every deposit so far if there is none. The total is read first, so a
/// commit between the two reads cannot make the count too large.
fn deposit_count_through(kv: &impl KvRead, to: u64) -> Result<u64, StoreError> {
    let total = get_u64(kv, DEPOSIT_SEQ)?;
    let Some(start) = to.checked_add(1) else {
        return Ok(total);
    };
    let after = kv.scan(
        &key(&[DEPOSIT, &start.to_be_bytes()]),
        &prefix_end(DEPOSIT),
        1,
    )?;
    Ok(match after.first() {
        Some((k, _)) => {
            // dep/ || u64 height || u64 seq
            let seq = k
                .get(DEPOSIT.len() + 8..)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| StoreError::Corrupt("deposit key".into()))?;
            seq.saturating_sub(1)
        }
        None => total,
    })
}

fn num(s: &str) -> Option<u64> {
    s.parse().ok()
}

fn query_inner(kv: &impl KvRead, path: &str, committed: u64) -> Result<HubResult, StoreError> {
    let ok = |v: serde_json::Value| HubResult {
        code: HubCode::Ok,
        log: String::new(),
        value: v.to_string().into_bytes(),
    };
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Ok(match segs.as_slice() {
        ["batch", chain, nonce] => {
            let Some(n) = num(nonce) else { return Ok(reject(HubCode::BadArgument, "nonce must be an integer")) };
            match kv.get(&key(&[RESULT, chain.as_bytes(), b"/", &n.to_be_bytes()]))? {
                Some(v) => HubResult { code: HubCode::Ok, log: String::new(), value: v },
                None => reject(HubCode::NotFound, format!("batch {n} of {chain} is not settled here")),
            }
        }
        ["last_nonce", chain] => ok(json!({"chain": chain, "last_nonce": get_u64(kv, &key(&[LAST_NONCE, chain.as_bytes()]))?})),
        ["escrow", user] => ok(json!({"user": user, "escrow": get_u64(kv, &key(&[ESCROW, user.as_bytes()]))?})),
        ["payout", p] => ok(json!({"provider": p, "paid": get_u64(kv, &key(&[PAYOUT, p.as_bytes()]))?})),
        ["withdrawn", user] => ok(json!({"user": user, "withdrawn": crate::deposit::withdrawn(kv, user)?})),
        ["user", user] => ok(json!({"user": user, "escrow": get_u64(kv, &key(&[ESCROW, user.as_bytes()]))?, "withdrawn": crate::deposit::withdrawn(kv, user)?, "key": crate::deposit::bound_key(kv, user)?})),
        ["fees"] => ok(json!({"fees": get_u64(kv, crate::deposit::FEES)?})),
        ["deposits", from, to] => {
            let (Some(f), Some(t)) = (num(from), num(to)) else {
                return Ok(reject(HubCode::BadArgument, "heights must be integers"));
            };
            if t < f || t - f > 10_000 {
                return Ok(reject(HubCode::BadArgument, "from <= to, at most 10000 heights"));
            }
            if t > committed {
                return Ok(reject(HubCode::BadArgument, format!("height {t} is not committed here yet (latest {committed})")));
            }
            let start = key(&[DEPOSIT, &f.to_be_bytes()]);
            let end = match t.checked_add(1) {
                Some(e) => key(&[DEPOSIT, &e.to_be_bytes()]),
                None => prefix_end(DEPOSIT),
            };
            let mut deps = Vec::new();
            kv.for_each(&start, &end, &mut |_, v| {
                if let Ok(d) = serde_json::from_slice::<serde_json::Value>(v) {
                    deps.push(d);
                }
                true
            })?;
            let count = deposit_count_through(kv, t)?;
            ok(json!({"from": f, "to": t, "deposits": deps, "deposit_count": count}))
        }
        ["keys", chain] => match stored_genesis(kv)? {
            Some((g, _)) => ok(crate::keys::list(kv, &g.group_key, chain)?),
            None => reject(HubCode::NotFound, "no genesis"),
        },
        ["genesis"] => match kv.get(GENESIS)? {
            Some(v) => HubResult { code: HubCode::Ok, log: String::new(), value: v },
            None => reject(HubCode::NotFound, "no genesis"),
        },
        _ => reject(HubCode::UnknownPath, format!("unknown path {path:?}; known: /batch/{{chain}}/{{nonce}}, /last_nonce/{{chain}}, /escrow/{{user}}, /payout/{{provider}}, /withdrawn/{{user}}, /user/{{user}}, /fees, /deposits/{{from}}/{{to}}, /keys/{{chain}}, /genesis")),
    })
}

//! Report ids: replay protection without sequence numbers.
//!
//! A report id belongs to the gateway that used it, and a report is
//! accepted at most once per scope (gateway key, `report_id`) while it has
//! not expired. A report that comes back before its expiry gets code 7
//! (`duplicate_report`) and changes nothing; its result's `data` is the
//! SHA-256 of the body the chain accepted under that id, so a gateway
//! counts the report as landed only when that is its own body's hash.
//! After the expiry it would be refused as expired (code 5) anyway.
//! Another gateway's report with the same 16 bytes is a different report.
//!
//! The layout depends on the app version the state runs under (ADR 0019);
//! the answers do not:
//!
//! - **Version 1**: `rid/<scope>` = `expires_at || sha256(body)` plus an
//!   expiry-index entry `rexp/<expires_at><scope>`. At the start of every
//!   block the index entries with `expires_at <= block time` are read,
//!   their `rid/` keys deleted and the index range removed with one range
//!   delete.
//! - **Version 2**: one key per report, `rb/<expires_at / 120><scope>` =
//!   `expires_at || sha256(body)`. A lookup reads every bucket a live id
//!   can be in (`now / 120 ..= (now + 600) / 120`, at most 7 point reads,
//!   600 s being [`MAX_REPORT_EXPIRY_CAP`]) and takes an entry whose
//!   `expires_at <= now` as absent. The first block of a new bucket drops
//!   every bucket that ended with one range delete, reading nothing. Half
//!   the keys (and tree leaves) of version 1, and no scan per block; an id
//!   stays stored up to 120 s past its expiry.
//!
//! The migration into version 2 moves the version-1 ids to their buckets,
//! at most [`MIGRATE_PER_BLOCK`] per block from the upgrade block on
//! (`meta/v1_ids` is present until it is done); meanwhile a lookup that
//! misses the buckets reads the id's version-1 key.

use tally_store::{prefix_end, Kv, KvRead};

use super::chain::{app_version, last_time};
use crate::error::Fatal;
use crate::genesis::MAX_REPORT_EXPIRY_CAP;
use crate::keys;

/// Seconds of expiry one version-2 bucket covers.
pub const BUCKET_SECS: u64 = 120;

/// The SHA-256 of the body of the report accepted under `scope`
/// ([`keys::report_scope`]: gateway key and report id), while it has not
/// expired at `now` (the block time, or in CheckTx the last block's).
pub fn report_seen(kv: &impl KvRead, scope: &[u8], now: u64) -> Result<Option<[u8; 32]>, Fatal> {
    if app_version(kv)? < 2 {
        return match kv.get(&keys::report_id(scope))? {
            None => Ok(None),
            Some(v) => decode(&v).map(|(_, h)| Some(h)),
        };
    }
    let first = now / BUCKET_SECS;
    let last = now.saturating_add(MAX_REPORT_EXPIRY_CAP) / BUCKET_SECS;
    for bucket in first..=last {
        if let Some(v) = kv.get(&keys::report_bucket(bucket, scope))? {
            let (expires_at, hash) = decode(&v)?;
            if expires_at > now {
                return Ok(Some(hash));
            }
        }
    }
    // Not moved yet (the migration moves a bounded number per block).
    if kv.get(keys::V1_IDS_LEFT)?.is_some() {
        if let Some(v) = kv.get(&keys::report_id(scope))? {
            let (expires_at, hash) = decode(&v)?;
            if expires_at > now {
                return Ok(Some(hash));
            }
        }
    }
    Ok(None)
}

fn decode(v: &[u8]) -> Result<(u64, [u8; 32]), Fatal> {
    let expires_at = v
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes);
    let hash = v.get(8..).and_then(|h| <[u8; 32]>::try_from(h).ok());
    let (Some(expires_at), Some(hash)) = (expires_at, hash) else {
        return Err(Fatal::Corrupt("report id entry"));
    };
    Ok((expires_at, hash))
}

fn entry(expires_at: u64, body_hash: &[u8; 32]) -> Vec<u8> {
    let mut v = expires_at.to_be_bytes().to_vec();
    v.extend_from_slice(body_hash);
    v
}

/// Remembers a report accepted under `scope` until `expires_at`, with the
/// SHA-256 of its body, in the layout of `app_version` (the state's, read
/// when the report was planned).
pub fn put_report(
    kv: &mut impl Kv,
    app_version: u64,
    scope: &[u8],
    expires_at: u64,
    body_hash: &[u8; 32],
) {
    if app_version < 2 {
        kv.put(keys::report_id(scope), entry(expires_at, body_hash));
        kv.put(
            keys::report_expiry(expires_at, scope),
            keys::PRESENT.to_vec(),
        );
    } else {
        kv.put(
            keys::report_bucket(expires_at / BUCKET_SECS, scope),
            entry(expires_at, body_hash),
        );
    }
}

/// Forgets report ids that expire at or before `time`, the time of the
/// block being begun (before it is recorded as the last block's time).
/// Version 1: every such id, then one range delete of their expiry
/// entries. Version 2: when `time` is in a later bucket than the last
/// block's, every bucket before `time`'s, with one range delete.
pub fn forget_reports_through(kv: &mut impl Kv, time: u64) -> Result<(), Fatal> {
    if app_version(kv)? >= 2 {
        let bucket = time / BUCKET_SECS;
        if bucket > last_time(kv)? / BUCKET_SECS {
            kv.delete_range(
                keys::report_bucket_start(0),
                keys::report_bucket_start(bucket),
            );
        }
        return Ok(());
    }
    let start = keys::report_expiry_start();
    let end = keys::report_expiry_through(time);
    let mut expired = Vec::new();
    let mut bad = false;
    kv.for_each(&start, &end, &mut |k, _| {
        match keys::parse_report_expiry(k) {
            Some(id) => expired.push(id.to_vec()),
            None => bad = true,
        }
        !bad
    })?;
    if bad {
        return Err(Fatal::Corrupt("report expiry key"));
    }
    if !expired.is_empty() {
        for id in &expired {
            kv.delete(keys::report_id(id));
        }
        kv.delete_range(start, end);
    }
    Ok(())
}

/// Version-1 report ids moved to their buckets per block, at most: the
/// migration's cost is spread over blocks (each id is one tree insert and
/// two deletes), so no block pays for the whole live set.
pub const MIGRATE_PER_BLOCK: usize = 10_000;

/// App version 2's migration, started by the upgrade block: marks that
/// version-1 ids are left (if any) and takes the first step.
pub fn start_migration(kv: &mut impl Kv, now: u64) -> Result<u64, Fatal> {
    if kv.scan_prefix(keys::REPORT_ID, 1)?.is_empty() {
        return Ok(0);
    }
    kv.put(keys::V1_IDS_LEFT.to_vec(), keys::PRESENT.to_vec());
    migrate_step(kv, now)
}

/// One step of app version 2's migration, at the start of a block at time
/// `now`: up to [`MIGRATE_PER_BLOCK`] version-1 report ids are moved to
/// their buckets (those still live at `now`; the others are dropped) and
/// their two version-1 keys deleted; the step that empties `rid/` ends the
/// migration. Until then lookups read the version-1 key of an id not found
/// in its bucket. Returns how many ids it took.
pub fn migrate_step(kv: &mut impl Kv, now: u64) -> Result<u64, Fatal> {
    if kv.get(keys::V1_IDS_LEFT)?.is_none() {
        return Ok(0);
    }
    let rows = kv.scan_prefix(keys::REPORT_ID, MIGRATE_PER_BLOCK)?;
    for (k, v) in &rows {
        let scope = k
            .strip_prefix(keys::REPORT_ID)
            .ok_or(Fatal::Corrupt("report id key"))?;
        let (expires_at, hash) = decode(v)?;
        kv.delete(k.clone());
        kv.delete(keys::report_expiry(expires_at, scope));
        if expires_at > now {
            kv.put(
                keys::report_bucket(expires_at / BUCKET_SECS, scope),
                entry(expires_at, &hash),
            );
        }
    }
    if rows.len() < MIGRATE_PER_BLOCK {
        // Nothing left: no index entry can be left either.
        kv.delete_range(
            keys::REPORT_EXPIRY.to_vec(),
            prefix_end(keys::REPORT_EXPIRY),
        );
        kv.delete(keys::V1_IDS_LEFT.to_vec());
    }
    Ok(rows.len() as u64)
}

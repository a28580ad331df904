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
//! - **Version 6**: the same buckets, as side state ([`tally_store::is_side`]):
//!   `\x01rb/<bucket><scope>` = `expires_at || sha256(body) || height`. Side
//!   state is stored and snapshot but is no leaf of the Merkle tree, so a
//!   report costs one flat entry instead of a leaf, its value and key
//!   copies and a path of tree nodes (per block and kept for every retained
//!   version). The state commits to them block by block instead: at the end
//!   of a block ([`commit_block_ids`]) one tree entry per bucket the block
//!   filed ids under, `rbd/<bucket><height>` = `count || sha256` over those
//!   entries in key order. A restored store is accepted only if its side
//!   entries give exactly those digests ([`check_side_ids`]). Buckets are
//!   dropped as in version 2, digests with them. Ids filed in the tree by
//!   version 5 stay there until their buckets end (`meta/tree_ids` names
//!   the last one); lookups read them too meanwhile. ADR 0025.
//!
//! The migration into version 2 moves the version-1 ids to their buckets,
//! at most [`MIGRATE_PER_BLOCK`] per block from the upgrade block on
//! (`meta/v1_ids` is present until it is done); meanwhile a lookup that
//! misses the buckets reads the id's version-1 key.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use tally_store::{prefix_end, Kv, KvRead};

use super::chain::{app_version, last_time};
use crate::error::Fatal;
use crate::genesis::MAX_REPORT_EXPIRY_CAP;
use crate::keys;
use crate::types::SIDE_IDS_VERSION;

/// Seconds of expiry one version-2 bucket covers.
pub const BUCKET_SECS: u64 = 120;

/// The SHA-256 of the body of the report accepted under `scope`
/// ([`keys::report_scope`]: gateway key and report id), while it has not
/// expired at `now` (the block time, or in CheckTx the last block's).
pub fn report_seen(kv: &impl KvRead, scope: &[u8], now: u64) -> Result<Option<[u8; 32]>, Fatal> {
    let version = app_version(kv)?;
    if version < 2 {
        return match kv.get(&keys::report_id(scope))? {
            None => Ok(None),
            Some(v) => decode(&v).map(|(_, h)| Some(h)),
        };
    }
    let first = now / BUCKET_SECS;
    let last = now.saturating_add(MAX_REPORT_EXPIRY_CAP) / BUCKET_SECS;
    let mut tree_last = last;
    if version >= SIDE_IDS_VERSION {
        for bucket in first..=last {
            if let Some(v) = kv.get(&keys::report_side(bucket, scope))? {
                let (expires_at, hash) = decode(&v)?;
                if expires_at > now {
                    return Ok(Some(hash));
                }
            }
        }
        // Version-5 ids left in the tree, while their buckets last.
        tree_last = match kv.get(keys::TREE_IDS_UNTIL)? {
            None => return Ok(None),
            Some(v) => last.min(read_u64(&v)?),
        };
    }
    for bucket in first..=tree_last {
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

fn read_u64(v: &[u8]) -> Result<u64, Fatal> {
    <[u8; 8]>::try_from(v)
        .map(u64::from_be_bytes)
        .map_err(|_| Fatal::Corrupt("report id marker"))
}

/// `expires_at || sha256(body)`, and from version 6 `|| height`.
fn decode(v: &[u8]) -> Result<(u64, [u8; 32]), Fatal> {
    let bad = || Fatal::Corrupt("report id entry");
    if v.len() != 40 && v.len() != 48 {
        return Err(bad());
    }
    let expires_at = <[u8; 8]>::try_from(&v[..8]).map_err(|_| bad())?;
    let hash = <[u8; 32]>::try_from(&v[8..40]).map_err(|_| bad())?;
    Ok((u64::from_be_bytes(expires_at), hash))
}

fn entry(expires_at: u64, body_hash: &[u8; 32]) -> Vec<u8> {
    let mut v = expires_at.to_be_bytes().to_vec();
    v.extend_from_slice(body_hash);
    v
}

/// Remembers a report accepted under `scope` until `expires_at`, with the
/// SHA-256 of its body, in the layout of `app_version` (the state's, read
/// when the report was planned); from version 6 as side state, with
/// `height`, the block's.
pub fn put_report(
    kv: &mut impl Kv,
    app_version: u64,
    height: u64,
    scope: &[u8],
    expires_at: u64,
    body_hash: &[u8; 32],
) {
    if app_version >= SIDE_IDS_VERSION {
        let mut v = entry(expires_at, body_hash);
        v.extend_from_slice(&height.to_be_bytes());
        kv.put(keys::report_side(expires_at / BUCKET_SECS, scope), v);
    } else if app_version < 2 {
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
    let version = app_version(kv)?;
    if version >= 2 {
        let bucket = time / BUCKET_SECS;
        if bucket > last_time(kv)? / BUCKET_SECS {
            if version >= SIDE_IDS_VERSION {
                kv.delete_range(keys::report_side_start(0), keys::report_side_start(bucket));
                kv.delete_range(
                    keys::report_digest_start(0),
                    keys::report_digest_start(bucket),
                );
                match kv.get(keys::TREE_IDS_UNTIL)? {
                    None => return Ok(()),
                    Some(v) if read_u64(&v)? < bucket => {
                        kv.delete(keys::TREE_IDS_UNTIL.to_vec());
                    }
                    Some(_) => {}
                }
            }
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

/// App version 6's switch at time `now`: ids version 5 filed in the tree
/// stay there until their buckets end; `meta/tree_ids` marks the last
/// bucket one can be in, so lookups read the tree only while it may hold
/// any. Returns 1 when there are some, else 0 (and no marker).
pub fn start_side_ids(kv: &mut impl Kv, now: u64) -> Result<u64, Fatal> {
    if kv.scan_prefix(keys::REPORT_BUCKET, 1)?.is_empty() {
        return Ok(0);
    }
    let last = now.saturating_add(MAX_REPORT_EXPIRY_CAP) / BUCKET_SECS;
    kv.put(keys::TREE_IDS_UNTIL.to_vec(), last.to_be_bytes().to_vec());
    Ok(1)
}

/// One bucket's share of a block's side report ids: how many, and the
/// SHA-256 over each entry's key and value, length-prefixed, in key order.
#[derive(Default)]
struct BucketDigest {
    count: u64,
    hash: Sha256,
}

impl BucketDigest {
    fn add(&mut self, k: &[u8], v: &[u8]) {
        self.count += 1;
        self.hash.update((k.len() as u32).to_be_bytes());
        self.hash.update(k);
        self.hash.update((v.len() as u32).to_be_bytes());
        self.hash.update(v);
    }

    fn value(self) -> Vec<u8> {
        let mut out = self.count.to_be_bytes().to_vec();
        out.extend_from_slice(&self.hash.finalize());
        out
    }
}

/// The end of block `height` from app version 6: one digest entry
/// `rbd/<bucket><height>` per bucket the block filed report ids under
/// (the block's buffered side puts, in key order; nothing committed is
/// read). Returns how many ids the block filed.
pub fn commit_block_ids(kv: &mut impl Kv, height: u64) -> Result<u64, Fatal> {
    if app_version(kv)? < SIDE_IDS_VERSION {
        return Ok(0);
    }
    let mut digests: BTreeMap<u64, BucketDigest> = BTreeMap::new();
    let mut bad = false;
    kv.for_each_buffered(
        keys::REPORT_SIDE,
        &prefix_end(keys::REPORT_SIDE),
        &mut |k, v| {
            match keys::parse_report_side(k) {
                Some((bucket, _)) => digests.entry(bucket).or_default().add(k, v),
                None => bad = true,
            }
            !bad
        },
    );
    if bad {
        return Err(Fatal::Corrupt("side report id key"));
    }
    let mut n = 0;
    for (bucket, d) in digests {
        n += d.count;
        kv.put(keys::report_digest(bucket, height), d.value());
    }
    Ok(n)
}

/// Why a restored store's side report ids are refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SideIdsError {
    /// A side key that is not a report id, a side entry without its
    /// height, or a digest key that does not parse: nothing but report ids
    /// may be side state.
    #[error("side state holds {0}, which no version of the state machine writes")]
    Unknown(String),
    /// The side ids of a bucket and block do not give the digest the tree
    /// holds for them (or there is no digest for them).
    #[error(
        "the side report ids of bucket {bucket} at height {height} do not match the tree's digest"
    )]
    Mismatch {
        /// The bucket.
        bucket: u64,
        /// The height that filed them.
        height: u64,
    },
    /// The tree holds a digest for which no side id came.
    #[error("the tree holds a digest for bucket {bucket} at height {height}, but no side report id of it came")]
    Missing {
        /// The bucket.
        bucket: u64,
        /// The height.
        height: u64,
    },
    /// The store could not be read.
    #[error("reading the restored state: {0}")]
    Store(String),
}

/// Checks that the side report ids of `kv` are exactly those the tree's
/// digests commit to: every side entry is a report id whose bucket and
/// height have a digest, each digest equals the SHA-256 over its ids (and
/// their count), and no digest lacks its ids. The one check that stands
/// between a restored node and a peer's made-up replay state (the tree,
/// verified against the app hash, covers only the digests). Returns the
/// number of side ids.
pub fn check_side_ids(kv: &(impl KvRead + ?Sized)) -> Result<u64, SideIdsError> {
    let store = |e: tally_store::StoreError| SideIdsError::Store(e.to_string());
    let mut groups: BTreeMap<(u64, u64), BucketDigest> = BTreeMap::new();
    let mut bad = None;
    kv.for_each(b"\x01", b"\x02", &mut |k, v| {
        let height = v.get(40..).and_then(|h| <[u8; 8]>::try_from(h).ok());
        match (keys::parse_report_side(k), height) {
            (Some((bucket, scope)), Some(h)) if !scope.is_empty() => groups
                .entry((bucket, u64::from_be_bytes(h)))
                .or_default()
                .add(k, v),
            _ => bad = Some(format!("key {k:02x?}")),
        }
        bad.is_none()
    })
    .map_err(store)?;
    if let Some(what) = bad {
        return Err(SideIdsError::Unknown(what));
    }
    let mut n = 0;
    let mut digests = BTreeMap::new();
    kv.for_each(
        keys::REPORT_DIGEST,
        &prefix_end(keys::REPORT_DIGEST),
        &mut |k, v| {
            match keys::parse_report_digest(k) {
                Some(at) => {
                    digests.insert(at, v.to_vec());
                }
                None => bad = Some(format!("digest key {k:02x?}")),
            }
            bad.is_none()
        },
    )
    .map_err(store)?;
    if let Some(what) = bad {
        return Err(SideIdsError::Unknown(what));
    }
    for ((bucket, height), d) in groups {
        n += d.count;
        if digests.remove(&(bucket, height)) != Some(d.value()) {
            return Err(SideIdsError::Mismatch { bucket, height });
        }
    }
    if let Some(((bucket, height), _)) = digests.into_iter().next() {
        return Err(SideIdsError::Missing { bucket, height });
    }
    Ok(n)
}

//! The report-id keys (replay protection, [`crate::state::replay`]): the
//! layout of app version 1 (`rid/`, `rexp/`), of version 2 (`rb/`) and of
//! version 6 (side state `\x01rb/` and its digests `rbd/`), and the markers
//! of the switches between them. Part of [`super`]'s layout.

use super::cat;

/// `rid/<gateway key><report_id>`: an accepted report id of one gateway,
/// until it expires: its expiry and the SHA-256 of its body.
pub const REPORT_ID: &[u8] = b"rid/";
/// `rexp/<expires_at><gateway key><report_id>`: report ids by expiry.
pub const REPORT_EXPIRY: &[u8] = b"rexp/";
/// `meta/v1_ids`: present while version-1 report ids are still being
/// moved to their buckets (app version 2's migration).
pub const V1_IDS_LEFT: &[u8] = b"meta/v1_ids";
/// `rb/<bucket><gateway key><report_id>`: an accepted report id of one
/// gateway from app version 2 on, filed under `expires_at / 120`: its
/// expiry and the SHA-256 of its body (ADR 0019).
pub const REPORT_BUCKET: &[u8] = b"rb/";

/// `\x01rb/<bucket><gateway key><report_id>`: an accepted report id from
/// app version 6 on, as side state (no tree leaf, ADR 0025): its expiry,
/// the SHA-256 of its body and the height that accepted it.
pub const REPORT_SIDE: &[u8] = b"\x01rb/";
/// `rbd/<bucket><height>`: how many report ids block `height` filed under
/// `bucket` as side state, and the SHA-256 over them (ADR 0025).
pub const REPORT_DIGEST: &[u8] = b"rbd/";
/// `meta/tree_ids`: the last bucket that may still hold version-5 report
/// ids in the tree (`rb/`), while there may be some (app version 6's
/// switch).
pub const TREE_IDS_UNTIL: &[u8] = b"meta/tree_ids";

/// `\x01rb/<bucket><scope>`.
pub fn report_side(bucket: u64, scope: &[u8]) -> Vec<u8> {
    cat(&[REPORT_SIDE, &bucket.to_be_bytes(), scope])
}

/// Start of the side report ids of `bucket` (`\x01rb/<bucket>`).
pub fn report_side_start(bucket: u64) -> Vec<u8> {
    cat(&[REPORT_SIDE, &bucket.to_be_bytes()])
}

/// `rbd/<bucket><height>`.
pub fn report_digest(bucket: u64, height: u64) -> Vec<u8> {
    cat(&[REPORT_DIGEST, &bucket.to_be_bytes(), &height.to_be_bytes()])
}

/// Start of the digests of `bucket` (`rbd/<bucket>`).
pub fn report_digest_start(bucket: u64) -> Vec<u8> {
    cat(&[REPORT_DIGEST, &bucket.to_be_bytes()])
}

/// The bucket of a side report-id key and its scope.
pub fn parse_report_side(key: &[u8]) -> Option<(u64, &[u8])> {
    let rest = key.strip_prefix(REPORT_SIDE)?;
    let bucket = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    Some((bucket, rest.get(8..)?))
}

/// The bucket and height of a digest key.
pub fn parse_report_digest(key: &[u8]) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(REPORT_DIGEST)?;
    if rest.len() != 16 {
        return None;
    }
    let bucket = u64::from_be_bytes(rest[..8].try_into().ok()?);
    let height = u64::from_be_bytes(rest[8..].try_into().ok()?);
    Some((bucket, height))
}

/// `rid/<scope>` (see [`report_scope`]).
pub fn report_id(scope: &[u8]) -> Vec<u8> {
    cat(&[REPORT_ID, scope])
}

/// `rexp/<expires_at><scope>`.
pub fn report_expiry(expires_at: u64, scope: &[u8]) -> Vec<u8> {
    cat(&[REPORT_EXPIRY, &expires_at.to_be_bytes(), scope])
}

/// `rb/<bucket><scope>`.
pub fn report_bucket(bucket: u64, scope: &[u8]) -> Vec<u8> {
    cat(&[REPORT_BUCKET, &bucket.to_be_bytes(), scope])
}

/// Start of the report-bucket keys of `bucket` (`rb/<bucket>`).
pub fn report_bucket_start(bucket: u64) -> Vec<u8> {
    cat(&[REPORT_BUCKET, &bucket.to_be_bytes()])
}

/// Start of the report-expiry keys.
pub fn report_expiry_start() -> Vec<u8> {
    REPORT_EXPIRY.to_vec()
}

/// End (exclusive) of the report-expiry keys of reports expiring at or
/// before `time`.
pub fn report_expiry_through(time: u64) -> Vec<u8> {
    cat(&[REPORT_EXPIRY, &time.saturating_add(1).to_be_bytes()])
}

/// The report scope (gateway key and id) of a report-expiry key.
pub fn parse_report_expiry(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(REPORT_EXPIRY)?.get(8..)
}

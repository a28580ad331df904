//! The report-id keys (replay protection, [`crate::state::replay`]): the
//! layout of app version 1 (`rid/`, `rexp/`) and of version 2 (`rb/`), and
//! the marker of the migration between them. Part of [`super`]'s layout.

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

//! Integers as the hub stores them (8 bytes, big-endian), the keys and
//! the result type the machine and its deposit module share. A leaf: the
//! machine, the deposits and the key history all read through it.

use tally_hub_types::HubCode;
use tally_store::{KvRead, StoreError};

/// `meta/deposit_seq`: the last deposit's sequence number.
pub(crate) const DEPOSIT_SEQ: &[u8] = b"meta/deposit_seq";
/// `escrow/<user>`: a user's escrow.
pub(crate) const ESCROW: &[u8] = b"escrow/";
/// `dep/<height><seq>`: a deposit's record (JSON).
pub(crate) const DEPOSIT: &[u8] = b"dep/";

/// The result of a transaction or query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubResult {
    /// Code.
    pub code: HubCode,
    /// Message.
    pub log: String,
    /// Query value (JSON), or event attributes for transactions.
    pub value: Vec<u8>,
}

/// A stored u64 (0 when absent); bytes of the wrong length are a corrupt
/// store, not a zero.
pub(crate) fn get_u64(kv: &impl KvRead, k: &[u8]) -> Result<u64, StoreError> {
    match kv.get(k)? {
        None => Ok(0),
        Some(v) => v
            .as_slice()
            .try_into()
            .map(u64::from_be_bytes)
            .map_err(|_| {
                StoreError::Corrupt(format!(
                    "value of {} is {} bytes, want 8",
                    String::from_utf8_lossy(k),
                    v.len()
                ))
            }),
    }
}

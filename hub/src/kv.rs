//! Integers as the hub stores them (8 bytes, big-endian). A leaf: the
//! machine and the key history both read through it.

use tally_store::{KvRead, StoreError};

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

//! Typed access to the settlement state: every read and write of a stored
//! value goes through a function here, over the keys of [`crate::keys`].
//!
//! Reads answer [`Fatal`] when the store fails or a stored value does not
//! decode; an absent value is not an error (each accessor says what absent
//! means). Integers are read by one function, [`get_u64`], which refuses
//! any value that is not exactly 8 bytes.
//!
//! - [`chain`]: chain metadata, gateways, balances, windows and
//!   route records.
//! - [`replay`]: report ids, in the layout of the state's app version.
//! - [`allowance`]: users' keys and the allowances they give gateways.
//! - [`gateway`]: gateway keys and their standing (ADR 0020).
//! - [`sync`]: the threshold key, hub calls, batches, sync state, deposit
//!   cursors and stored partial signatures.
//! - [`withdrawal`]: users' withdrawals (ADR 0020).
//! - [`prune`]: pruning old windows' SLA records (app version 7).
//! - [`listing`]: paged reads of what queries list (a route's records, a
//!   provider's or user's records, windows, gateways).
//!
//! Imports only leaves (keys, types, errors, protobuf and genesis types).

pub mod allowance;
pub mod chain;
pub mod gateway;
pub mod listing;
pub mod prune;
pub mod replay;
pub mod sync;
pub mod withdrawal;

use prost::Message;
use tally_store::{Kv, KvRead};

use crate::error::Fatal;

/// Decodes a stored big-endian u64; any other length is corrupt.
pub fn decode_u64(bytes: &[u8], what: &'static str) -> Result<u64, Fatal> {
    bytes
        .try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| Fatal::Corrupt(what))
}

/// The u64 stored under `key`, `None` if absent. The one integer reader:
/// a value of the wrong length is corrupt, never read as a default.
pub fn get_u64(kv: &impl KvRead, key: &[u8]) -> Result<Option<u64>, Fatal> {
    match kv.get(key)? {
        None => Ok(None),
        Some(v) => decode_u64(&v, "integer").map(Some),
    }
}

/// The u64 stored under `key`, `default` if absent (corrupt bytes are
/// still an error).
pub fn u64_or(kv: &impl KvRead, key: &[u8], default: u64) -> Result<u64, Fatal> {
    Ok(get_u64(kv, key)?.unwrap_or(default))
}

/// Stores `v` under `key` as 8 big-endian bytes.
pub fn put_u64(kv: &mut impl Kv, key: Vec<u8>, v: u64) {
    kv.put(key, v.to_be_bytes().to_vec());
}

/// The protobuf message stored under `key`, `None` if absent.
pub fn load<M: Message + Default>(
    kv: &impl KvRead,
    key: &[u8],
    what: &'static str,
) -> Result<Option<M>, Fatal> {
    match kv.get(key)? {
        None => Ok(None),
        Some(b) => M::decode(b.as_slice())
            .map(Some)
            .map_err(|_| Fatal::Corrupt(what)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_store::{MemBackend, Pending};

    use super::*;

    fn kv() -> Pending {
        Pending::open(Arc::new(MemBackend::new())).unwrap()
    }

    #[test]
    fn the_u64_reader_refuses_corrupt_bytes() {
        let mut kv = kv();
        kv.put(b"short".to_vec(), vec![1, 2, 3]);
        kv.put(b"long".to_vec(), vec![0; 9]);
        kv.put(b"empty".to_vec(), Vec::new());
        for key in [&b"short"[..], b"long", b"empty"] {
            assert!(matches!(get_u64(&kv, key), Err(Fatal::Corrupt("integer"))));
            // A default is for absent values only, never for corrupt ones.
            assert!(u64_or(&kv, key, 1).is_err());
        }
        assert_eq!(
            get_u64(&kv, b"short").unwrap_err().to_string(),
            "stored integer is corrupt"
        );
    }

    #[test]
    fn the_u64_reader_reads_values_and_defaults_absent_ones() {
        let mut kv = kv();
        put_u64(&mut kv, b"n".to_vec(), 42);
        assert_eq!(get_u64(&kv, b"n").unwrap(), Some(42));
        assert_eq!(get_u64(&kv, b"none").unwrap(), None);
        assert_eq!(u64_or(&kv, b"none", 7).unwrap(), 7);
        assert_eq!(u64_or(&kv, b"n", 7).unwrap(), 42);
    }
}

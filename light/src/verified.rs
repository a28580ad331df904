//! Verified reads as query answers: the values [`proven`](crate::proven)
//! read (verified or not) go into a [`ReadKv`] that answers only the keys
//! read (a read of any other key is an error), and the node's own query
//! code (`tally_settlement::query`) turns them into the JSON the node's
//! unverified query answers ([`answer`]): a verified answer looks the
//! same, plus `"height"` and `"verified": true` ([`stamped`]).

use std::collections::BTreeMap;

use serde_json::Value;
use tally_client::rpc::RpcClient;
use tally_settlement::Code;
use tally_store::{KvRead, StoreError};

use crate::client::{LightClient, VerifiedHeader};
use crate::error::{show_key, LightError};
use crate::proven::{read_unverified, read_verified};
use crate::source::RpcSource;

/// Values of the keys read, at one height.
#[derive(Debug)]
pub struct Read {
    /// The height the values are from.
    pub height: u64,
    /// Whether the light client verified them.
    pub verified: bool,
    /// What was read: the value, or `None` (absent).
    pub kv: ReadKv,
}

impl Read {
    /// `keys` read from `rpc` at its latest height, not verified.
    pub fn unverified(rpc: &RpcClient, keys: &[Vec<u8>]) -> Result<Self, LightError> {
        let (height, values) = read_unverified(rpc, keys)?;
        Ok(Self {
            height,
            verified: false,
            kv: ReadKv::new(keys, values),
        })
    }

    /// `keys` read through `client` and verified (waiting up to
    /// `header_wait` for the header that carries their app hash), and the
    /// header that proves them (it may become the next trust root).
    pub fn verified(
        client: &LightClient<RpcSource>,
        keys: &[Vec<u8>],
        header_wait: std::time::Duration,
    ) -> Result<(Self, VerifiedHeader), LightError> {
        let proven = read_verified(client, keys, header_wait)?;
        let read = Self {
            height: proven.height,
            verified: true,
            kv: ReadKv::new(keys, proven.values),
        };
        Ok((read, proven.header))
    }
}

/// State made of the keys read and nothing else.
#[derive(Debug, Default)]
pub struct ReadKv(BTreeMap<Vec<u8>, Option<Vec<u8>>>);

impl ReadKv {
    /// `keys` paired with their `values` (in the same order).
    pub fn new(keys: &[Vec<u8>], values: Vec<Option<Vec<u8>>>) -> Self {
        Self(keys.iter().cloned().zip(values).collect())
    }

    /// Adds `key` with `value` (`None`: read and absent).
    pub fn insert(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.0.insert(key, value);
    }
}

impl KvRead for ReadKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.0
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError::Backend(format!("key {} was not read", show_key(key))))
    }

    fn for_each(
        &self,
        start: &[u8],
        _end: &[u8],
        _f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        Err(StoreError::Backend(format!(
            "a scan from {} cannot be proven key by key",
            show_key(start)
        )))
    }
}

/// Why [`answer`] has no value.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The query code refused (not found, a key that was not read, ...).
    #[error("query {path} failed: code {code} ({name}): {log} (at height {height}, {how})")]
    Query {
        /// The query path.
        path: String,
        /// The result code.
        code: u32,
        /// The code's name.
        name: &'static str,
        /// The query's log.
        log: String,
        /// The height read.
        height: u64,
        /// `verified` or `not verified`.
        how: &'static str,
    },
    /// The answer is not JSON.
    #[error("query {path}: value is not JSON: {source}")]
    NotJson {
        /// The query path.
        path: String,
        /// The parser's error.
        source: serde_json::Error,
    },
}

/// Answers `path` from what `read` holds with the node's query code; a
/// query error (not found, ...) is an error naming the height.
pub fn answer(read: &Read, path: &str) -> Result<Value, AnswerError> {
    let r = tally_settlement::query::query(&read.kv, path);
    if r.code != Code::Ok {
        return Err(AnswerError::Query {
            path: path.to_string(),
            code: r.code.value(),
            name: r.code.name(),
            log: r.log,
            height: read.height,
            how: if read.verified {
                "verified"
            } else {
                "not verified"
            },
        });
    }
    serde_json::from_slice(&r.value).map_err(|source| AnswerError::NotJson {
        path: path.to_string(),
        source,
    })
}

/// `v` with `"height"` and `"verified"` added (when it is an object).
pub fn stamped(mut v: Value, read: &Read) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.insert("height".into(), read.height.into());
        o.insert("verified".into(), read.verified.into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_settlement::keys;

    #[test]
    fn only_the_keys_read_answer() {
        let mut kv = ReadKv::default();
        kv.insert(keys::balance("alice"), Some(5u64.to_be_bytes().to_vec()));
        kv.insert(keys::balance("bob"), None);
        // Absent parameters are the defaults; no window pruned.
        kv.insert(keys::PARAMS.to_vec(), None);
        kv.insert(keys::SLA_KEPT_FROM.to_vec(), None);
        let read = Read {
            height: 9,
            verified: true,
            kv,
        };
        let v = answer(&read, "/balance/alice").unwrap();
        assert_eq!(v, serde_json::json!({"user": "alice", "balance": 5}));
        let v = answer(&read, "/balance/bob").unwrap();
        assert_eq!(v["balance"], 0);
        // A key that was not read is an error, never an empty value.
        let e = answer(&read, "/balance/carol").unwrap_err().to_string();
        assert!(e.contains("was not read") && e.contains("height 9"), "{e}");
        let e = answer(&read, "/sla/provider/acme").unwrap_err().to_string();
        assert!(e.contains("cannot be proven"), "{e}");
        let v = stamped(serde_json::json!({"a": 1}), &read);
        assert_eq!(
            v,
            serde_json::json!({"a": 1, "height": 9, "verified": true})
        );
    }
}

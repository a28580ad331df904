//! Queries answered from single state keys read with `/key`, verified by
//! the light client with `--verify` ([`tally_node::light`]).
//!
//! The values read are put in a [`ReadKv`] that answers only the keys read
//! (a read of any other key is an error), and the node's own query code
//! (`tally_settlement::query`) turns them into the JSON the unverified query
//! prints: a verified answer looks the same, plus `"height"` and
//! `"verified": true`.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{bail, Context as _};
use serde_json::Value;
use tally_node::light::client::now;
use tally_node::light::proven::{read_unverified, read_verified};
use tally_node::light::{self, trust, LightClient, Options, RpcSource, TrustRoot};
use tally_node::rpc::Rpc;
use tally_settlement::Code;
use tally_store::{KvRead, StoreError};

use super::{render, Shape};
use crate::cli::args::{Output, QueryOpts, VerifyArgs};
use crate::cli::Context;

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

/// State made of the keys read and nothing else.
#[derive(Debug, Default)]
pub struct ReadKv(BTreeMap<Vec<u8>, Option<Vec<u8>>>);

impl KvRead for ReadKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(key).cloned().ok_or_else(|| {
            StoreError::Backend(format!("key {} was not read", light::show_key(key)))
        })
    }

    fn for_each(
        &self,
        start: &[u8],
        _end: &[u8],
        _f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        Err(StoreError::Backend(format!(
            "a scan from {} cannot be proven key by key",
            light::show_key(start)
        )))
    }
}

/// The trust root `--verify` uses: the flags, else the trust file in the
/// home directory. The second value is the file, when that is where it came
/// from.
fn trust_root(
    ctx: &Context,
    v: &VerifyArgs,
) -> anyhow::Result<(TrustRoot, Option<std::path::PathBuf>)> {
    match (v.trust_height, &v.trust_hash) {
        (Some(h), Some(hash)) => Ok((
            TrustRoot::new(None, h, hash).map_err(anyhow::Error::msg)?,
            None,
        )),
        _ => {
            let path = trust::path_in(ctx.home());
            Ok((TrustRoot::load(&path)?, Some(path)))
        }
    }
}

/// Reads `keys` from the first node of `opts` at one height; with
/// `--verify`, verified (or an error: nothing unverified comes back).
pub fn read(
    ctx: &Context,
    opts: &QueryOpts,
    v: &VerifyArgs,
    keys: &[Vec<u8>],
) -> anyhow::Result<Read> {
    let rpc = Rpc::new(&opts.node.primary());
    if !v.verify {
        let (height, values) = read_unverified(&rpc, keys)?;
        return Ok(Read {
            height,
            verified: false,
            kv: ReadKv(keys.iter().cloned().zip(values).collect()),
        });
    }
    let (root, file) = trust_root(ctx, v)?;
    let options = Options {
        trusting_period: v.trusting_period,
        ..Options::default()
    };
    let client = LightClient::new(RpcSource::new(rpc), root.clone(), options, now()?);
    let proven = read_verified(&client, keys, v.header_wait).context("--verify")?;
    // The verified header becomes the stored trust root: as trustworthy as
    // the old one, and newer (it keeps the root inside the trusting period
    // and makes the next verification shorter).
    if let Some(path) = file {
        if proven.header.height > root.height {
            if let Err(e) = proven.header.as_root().save(&path) {
                eprintln!("warning: could not advance the trust root: {e}");
            }
        }
    }
    Ok(Read {
        height: proven.height,
        verified: true,
        kv: ReadKv(keys.iter().cloned().zip(proven.values).collect()),
    })
}

/// Answers `path` from what `read` holds with the node's query code; a
/// query error (not found, ...) is an error naming the height.
pub fn answer(read: &Read, path: &str) -> anyhow::Result<Value> {
    let r = tally_settlement::query::query(&read.kv, path);
    if r.code != Code::Ok {
        let how = if read.verified {
            "verified"
        } else {
            "not verified"
        };
        bail!(
            "query {path} failed: code {} ({}): {} (at height {}, {how})",
            r.code.value(),
            r.code.name(),
            r.log,
            read.height
        );
    }
    serde_json::from_slice(&r.value).with_context(|| format!("query {path}: value is not JSON"))
}

/// `v` with `"height"` and `"verified"` added (when it is an object).
pub fn stamped(mut v: Value, read: &Read) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.insert("height".into(), read.height.into());
        o.insert("verified".into(), read.verified.into());
    }
    v
}

/// Prints `v` as `shape` (JSON: stamped with height and verified; table:
/// followed by a line saying what was verified).
pub fn print(opts: &QueryOpts, shape: Shape, v: Value, read: &Read) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match opts.format() {
        Output::Json => writeln!(out, "{}", stamped(v, read))?,
        Output::Table => {
            render(&mut out, shape, v)?;
            if read.verified {
                writeln!(
                    out,
                    "verified: state at height {} (proof checked against the app hash of header {}, verified from the trust root)",
                    read.height,
                    read.height + 1
                )?;
            } else {
                writeln!(
                    out,
                    "not verified: state at height {} as the node says (use --verify)",
                    read.height
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_settlement::keys;

    #[test]
    fn only_the_keys_read_answer() {
        let mut kv = ReadKv::default();
        kv.0.insert(keys::balance("alice"), Some(5u64.to_be_bytes().to_vec()));
        kv.0.insert(keys::balance("bob"), None);
        // Absent parameters are the defaults.
        kv.0.insert(keys::PARAMS.to_vec(), None);
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

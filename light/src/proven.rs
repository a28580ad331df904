//! State keys read with the `/key` query and, when asked, verified: each
//! value (or its absence) is checked with its ICS23 proof against the app
//! hash of a header the light client verified.
//!
//! `/key` answers the value stored under the raw state key in `data` at
//! `height` (0: the latest), code 0 when present and 22 (`not_found`) when
//! absent; with `prove` it carries one proof op `{type: "ics23:jmt", key,
//! data: CommitmentProof}`. The answer's `height` is the version `H` proven
//! at, whose app hash is in header `H + 1`.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};
use tally_settlement::Code;
use tally_store::proof::{self, PROOF_OP_TYPE};
use tendermint::merkle::proof::ProofOps;
use tendermint::serializers::bytes::base64string;

use tally_client::rpc::RpcClient;

use crate::client::{LightClient, VerifiedHeader};
use crate::error::{hex_upper, show_key, LightError};
use crate::source::{num, RpcSource, Source};

/// How often [`wait_for_height`] asks the node for its height.
const POLL: Duration = Duration::from_millis(250);

/// One `/key` answer, not verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyAnswer {
    /// The state key asked for.
    pub key: Vec<u8>,
    /// The height the value is from (its app hash is in header `height + 1`).
    pub height: u64,
    /// The value; `None` when the node says the key holds nothing.
    pub value: Option<Vec<u8>>,
    /// The ICS23 `CommitmentProof` (protobuf), when one was asked for.
    pub proof: Option<Vec<u8>>,
}

#[derive(Deserialize)]
struct RawAnswer {
    #[serde(default)]
    code: Value,
    #[serde(default)]
    log: String,
    #[serde(default, deserialize_with = "base64string::deserialize")]
    value: Vec<u8>,
    // CometBFT writes `proofOps`; `proof_ops` is accepted too.
    #[serde(default, alias = "proofOps")]
    proof_ops: Option<ProofOps>,
    #[serde(default)]
    height: Value,
}

/// Asks `rpc` for `key` at `height` (0: the latest), with its proof if
/// `prove`. Only checks the answer's shape.
pub fn query_key(
    rpc: &RpcClient,
    key: &[u8],
    height: u64,
    prove: bool,
) -> Result<KeyAnswer, LightError> {
    let r = rpc.call(
        "abci_query",
        json!({"path": "/key", "data": hex::encode(key), "height": height.to_string(), "prove": prove}),
    )?;
    let what = || format!("/key {}", show_key(key));
    let resp = r
        .get("response")
        .cloned()
        .ok_or_else(|| LightError::decode(what(), "no response"))?;
    let raw: RawAnswer = serde_json::from_value(resp).map_err(|e| LightError::decode(what(), e))?;
    let code = num(&raw.code).unwrap_or(0);
    let code = u32::try_from(code).map_err(|e| LightError::decode(what(), e))?;
    let value = match Code::from_value(code) {
        Some(Code::Ok) => Some(raw.value),
        Some(Code::NotFound) if raw.value.is_empty() => None,
        Some(Code::NotFound) => {
            return Err(LightError::decode(what(), "not_found with a value"));
        }
        other => {
            return Err(LightError::Query {
                code,
                name: other.map(Code::name).unwrap_or("?"),
                log: raw.log,
                height,
            })
        }
    };
    let answered = num(&raw.height).unwrap_or(0);
    if answered == 0 || (height != 0 && answered != height) {
        return Err(LightError::decode(
            what(),
            format!("asked for height {height}, the answer is for height {answered}"),
        ));
    }
    let proof = if prove {
        let ops = raw.proof_ops.map(|p| p.ops).unwrap_or_default();
        let [op] = ops.as_slice() else {
            return Err(LightError::decode(
                what(),
                format!("{} proof ops, expected one", ops.len()),
            ));
        };
        if op.field_type != PROOF_OP_TYPE || op.key != key {
            return Err(LightError::decode(
                what(),
                format!(
                    "proof op {:?} for key {}, expected {PROOF_OP_TYPE:?} for the key asked",
                    op.field_type,
                    show_key(&op.key)
                ),
            ));
        }
        Some(op.data.clone())
    } else {
        None
    };
    Ok(KeyAnswer {
        key: key.to_vec(),
        height: answered,
        value,
        proof,
    })
}

/// Checks that `answer`'s proof proves its value (or absence) under the app
/// hash of `header`, which must be the header at `answer.height + 1`.
pub fn check_proof(header: &VerifiedHeader, answer: &KeyAnswer) -> Result<(), LightError> {
    let fail = |reason: String| LightError::Proof {
        key: show_key(&answer.key),
        height: answer.height,
        header: header.height,
        app_hash: hex_upper(&header.app_hash),
        reason,
    };
    if header.height != answer.height + 1 {
        return Err(fail(format!(
            "the app hash of height {} is in header {}, not {}",
            answer.height,
            answer.height + 1,
            header.height
        )));
    }
    let proof = answer
        .proof
        .as_deref()
        .ok_or_else(|| fail("the answer carries no proof".into()))?;
    proof::verify(
        &header.app_hash,
        &answer.key,
        answer.value.as_deref(),
        proof,
    )
    .map_err(|e| fail(e.to_string()))
}

/// Waits until `source`'s latest height is at least `height`, at most
/// `wait`.
pub fn wait_for_height(
    source: &impl Source,
    height: u64,
    wait: Duration,
) -> Result<(), LightError> {
    let start = Instant::now();
    loop {
        let latest = source.latest_height()?;
        if latest >= height {
            return Ok(());
        }
        if start.elapsed() >= wait {
            return Err(LightError::NotYetAvailable {
                height,
                waited: start.elapsed(),
                latest,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// One value per key read, in order: the value, or `None` (absent).
pub type Values = Vec<Option<Vec<u8>>>;

/// Values of state keys that the light client verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The height the values are from.
    pub height: u64,
    /// The verified header at `height + 1` whose app hash proves them.
    pub header: VerifiedHeader,
    /// One per key asked, in order: the value, or `None` (proven absent).
    pub values: Values,
}

/// Reads `keys` (at least one) at the node's latest height with proofs,
/// waits (at most `wait`) for the next header, verifies it from the trust
/// root and checks every proof against its app hash.
pub fn read_verified(
    client: &LightClient<RpcSource>,
    keys: &[Vec<u8>],
    wait: Duration,
) -> Result<Verified, LightError> {
    let rpc = client.source().rpc();
    let (first, rest) = keys
        .split_first()
        .ok_or_else(|| LightError::decode("read_verified", "no keys to read"))?;
    let mut answers = vec![query_key(rpc, first, 0, true)?];
    let height = answers[0].height;
    for k in rest {
        answers.push(query_key(rpc, k, height, true)?);
    }
    wait_for_height(client.source(), height + 1, wait)?;
    let header = client.verify_to(height + 1)?;
    for a in &answers {
        check_proof(&header, a)?;
    }
    Ok(Verified {
        height,
        header,
        values: answers.into_iter().map(|a| a.value).collect(),
    })
}

/// Reads `keys` (at least one) at the node's latest height, without
/// proofs: what the node says, not verified.
pub fn read_unverified(rpc: &RpcClient, keys: &[Vec<u8>]) -> Result<(u64, Values), LightError> {
    let mut height = 0;
    let mut values = Vec::with_capacity(keys.len());
    for k in keys {
        let a = query_key(rpc, k, height, false)?;
        height = a.height;
        values.push(a.value);
    }
    Ok((height, values))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_settlement::{keys, Counters, RouteId};
    use tally_store::{Backend, Kv, MemBackend, Pending};
    use tendermint::Time;

    use super::*;

    fn route() -> RouteId {
        RouteId {
            user: "alice".into(),
            provider: "acme".into(),
            model: "m".into(),
            route: "/v1/chat".into(),
        }
    }

    /// A store with a route record and a balance committed at height 7:
    /// the header at 8 carries its root.
    fn store() -> (Arc<dyn Backend>, VerifiedHeader, Vec<u8>) {
        let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let mut p = Pending::open(backend.clone()).unwrap();
        let c = Counters {
            requests: 3,
            ok: 2,
            cancel: 1,
            amount: 9,
            ..Counters::default()
        };
        p.put(keys::route(&route(), 5), c.encode());
        p.put(keys::balance("alice"), 1000u64.to_be_bytes().to_vec());
        p.put(keys::balance("bob"), 7u64.to_be_bytes().to_vec());
        let meta = p.commit(7).unwrap();
        let header = VerifiedHeader {
            chain_id: "t".into(),
            height: 8,
            hash: vec![1; 32],
            app_hash: meta.app_hash.to_vec(),
            time: Time::unix_epoch(),
        };
        (backend, header, c.encode())
    }

    fn answer(backend: &Arc<dyn Backend>, key: Vec<u8>) -> KeyAnswer {
        let p = proof::prove(backend.as_ref(), &key, 7).unwrap();
        KeyAnswer {
            key,
            height: p.version,
            value: p.value,
            proof: Some(p.proof),
        }
    }

    #[test]
    fn honest_answers_verify() {
        let (b, header, record) = store();
        let a = answer(&b, keys::route(&route(), 5));
        assert_eq!(a.value.as_deref(), Some(&record[..]));
        check_proof(&header, &a).unwrap();
        let a = answer(&b, keys::balance("alice"));
        assert_eq!(a.value, Some(1000u64.to_be_bytes().to_vec()));
        check_proof(&header, &a).unwrap();
        // Absence is proven too.
        let a = answer(&b, keys::balance("carol"));
        assert_eq!(a.value, None);
        check_proof(&header, &a).unwrap();
    }

    #[test]
    fn tampered_answers_are_refused() {
        let (b, header, record) = store();
        let good = answer(&b, keys::route(&route(), 5));
        let refused = |a: &KeyAnswer, h: &VerifiedHeader| {
            let e = check_proof(h, a).unwrap_err();
            assert!(matches!(e, LightError::Proof { .. }), "{e}");
            e.to_string()
        };
        // One counter changed.
        let mut a = good.clone();
        let mut v = record.clone();
        v[7] ^= 1;
        a.value = Some(v);
        refused(&a, &header);
        // The value dropped: claimed absent.
        let mut a = good.clone();
        a.value = None;
        refused(&a, &header);
        // Another key's proof and value under this key.
        let mut a = answer(&b, keys::balance("bob"));
        a.key = keys::balance("alice");
        refused(&a, &header);
        // A present key claimed absent with a proof of another absent key.
        let mut a = answer(&b, keys::balance("carol"));
        a.key = keys::balance("alice");
        refused(&a, &header);
        // A byte of the proof flipped (wherever it lands: undecodable or
        // not matching the root).
        let proof = good.proof.clone().unwrap();
        for i in (0..proof.len()).step_by(7) {
            let mut a = good.clone();
            let mut p = proof.clone();
            p[i] ^= 0x20;
            a.proof = Some(p);
            refused(&a, &header);
        }
        // No proof at all.
        let mut a = good.clone();
        a.proof = None;
        assert!(refused(&a, &header).contains("no proof"));
        // Another app hash, or the header of another height.
        let mut h = header.clone();
        h.app_hash[0] ^= 1;
        refused(&good, &h);
        let mut h = header.clone();
        h.height = 7;
        assert!(refused(&good, &h).contains("header 8"));
    }
}

//! The reference hub, `tally-hub` (a CometBFT chain, `hub/`): reads are
//! `abci_query` paths (`/deposits/{from}/{to}` at the tip's height,
//! `/batch/{chain}/{nonce}`, `/last_nonce/{chain}`, `/keys/{chain}`), a
//! submission try is one `broadcast_tx_commit` of a prost `HubTx`.

use prost::Message;
use serde_json::Value;
use tally_client::rpc::{QueryAnswer, RpcError};
use tally_client::Broadcast;
use tally_hub_types::{hub_tx, HubTx, RotateKey, SubmitBatch};
use tally_settlement::proto::HubDeposit;

use super::protocol::{Deposits, Endpoint, HubProtocol, Payload, TryFailure, TryLimits};
use super::HubError;

/// `tally-hub`'s protocol (no state of its own).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReferenceHub;

/// A read's error as the breaker sees it: a JSON-RPC error is an answer,
/// anything else an unreachable endpoint.
fn rpc(e: RpcError) -> HubError {
    match e {
        e @ RpcError::Rpc { .. } => HubError::Rpc(e),
        e => HubError::Unreachable(e.to_string()),
    }
}

/// The JSON value of a query answer; `None` if the hub answered with an
/// error code (logged at debug level).
fn value(path: &str, a: &QueryAnswer) -> Result<Option<Value>, HubError> {
    if a.code != 0 {
        tracing::debug!(path, code = a.code, log = %a.log, "hub query refused");
        return Ok(None);
    }
    serde_json::from_slice(&a.value)
        .map(Some)
        .map_err(|e| HubError::Answer(format!("{path}: {e}")))
}

/// The JSON value of query `path` on `ep` at the latest height.
fn query(ep: Endpoint<'_>, path: &str) -> Result<Option<Value>, HubError> {
    let a = ep.client.abci_query(path).map_err(rpc)?;
    value(path, &a)
}

/// The `HubTx` bytes of `payload`.
pub(crate) fn encode(payload: &Payload) -> Vec<u8> {
    let sum = match payload.clone() {
        Payload::Batch {
            chain,
            nonce,
            calls,
            signature,
        } => hub_tx::Sum::SubmitBatch(SubmitBatch {
            chain,
            nonce,
            calls,
            signature,
        }),
        Payload::Rotation {
            chain,
            nonce,
            epoch,
            group_key,
            signature,
        } => hub_tx::Sum::RotateKey(RotateKey {
            chain,
            nonce,
            epoch,
            group_key,
            signature,
        }),
    };
    HubTx { sum: Some(sum) }.encode_to_vec()
}

impl HubProtocol for ReferenceHub {
    fn tip(&self, ep: Endpoint<'_>, _hub: &str) -> Result<u64, HubError> {
        Ok(ep.client.status().map_err(rpc)?.height)
    }

    fn deposits(
        &self,
        ep: Endpoint<'_>,
        _hub: &str,
        at: u64,
        (from, to): (u64, u64),
    ) -> Result<Deposits, HubError> {
        let path = format!("/deposits/{from}/{to}");
        let a = ep.client.abci_query_at(&path, at).map_err(rpc)?;
        if a.height < to {
            return Err(HubError::Stale {
                path,
                height: a.height,
                want: to,
            });
        }
        let v = value(&path, &a)?.ok_or_else(|| HubError::Answer(format!("{path} refused")))?;
        let count = v["deposit_count"]
            .as_u64()
            .ok_or_else(|| HubError::Answer(format!("{path}: no deposit_count")))?;
        let mut deposits: Vec<HubDeposit> = v["deposits"]
            .as_array()
            .map(|a| a.iter().map(deposit).collect())
            .unwrap_or_default();
        deposits.sort_by_key(|d| d.seq);
        Ok(Deposits {
            deposits,
            count,
            height: a.height,
        })
    }

    fn settled_at(&self, ep: Endpoint<'_>, hub: &str, nonce: u64) -> Result<Option<u64>, HubError> {
        Ok(query(ep, &format!("/batch/{hub}/{nonce}"))?.and_then(|v| v["height"].as_u64()))
    }

    fn last_nonce(&self, ep: Endpoint<'_>, hub: &str) -> Result<u64, HubError> {
        let path = format!("/last_nonce/{hub}");
        query(ep, &path)?
            .and_then(|v| v["last_nonce"].as_u64())
            .ok_or_else(|| HubError::Answer(format!("{path}: no last_nonce")))
    }

    fn last_rotation(&self, ep: Endpoint<'_>, hub: &str) -> Result<u64, HubError> {
        let path = format!("/keys/{hub}");
        query(ep, &path)?
            .and_then(|v| v["last_rotation"].as_u64())
            .ok_or_else(|| HubError::Answer(format!("{path}: no last_rotation")))
    }

    fn submit(
        &self,
        ep: Endpoint<'_>,
        payload: &Payload,
        _limits: TryLimits,
    ) -> Result<Broadcast, TryFailure> {
        match ep.client.broadcast_tx_commit(&encode(payload)) {
            Ok(c) => Ok(Broadcast::Result {
                code: c.final_code(),
                log: c.final_log().to_string(),
                height: c.height,
                data: c.final_data().to_vec(),
            }),
            Err(e) if e.is_tx_in_cache() => Ok(Broadcast::InCache),
            // Mempool full, timed out waiting for a block, node catching
            // up, a proxy's 429: the retry policy decides, and the
            // endpoint's breaker counts it.
            Err(e) => Err(TryFailure::endpoint(e.into_failure())),
        }
    }

    fn govern_command(&self) -> &'static str {
        "tally-hub govern-key"
    }
}

/// One deposit of a `/deposits` answer.
fn deposit(d: &Value) -> HubDeposit {
    HubDeposit {
        seq: d["seq"].as_u64().unwrap_or(0),
        user: d["user"].as_str().unwrap_or("").to_string(),
        amount: d["amount"].as_u64().unwrap_or(0),
        // A key that is not hex becomes bytes the chain refuses, so the
        // answer is refused, not stripped.
        pubkey: d["pubkey"]
            .as_str()
            .map(|h| unhex(h).unwrap_or_else(|| vec![0]))
            .unwrap_or_default(),
    }
}

/// The bytes of hex string `s` (`None` if it is not hex).
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect()
}

//! One submission try to the EVM hub, on one endpoint:
//!
//! 1. the contract and the chain come from the payload's hub name, and the
//!    endpoint must serve that chain;
//! 2. a transaction an earlier try sent for the same payload is looked up
//!    first: mined, its receipt is the answer;
//! 3. **simulate** with `eth_call` from this relay's account: a revert is
//!    the hub's answer ([`judge`]) and nothing is sent, so a duplicate
//!    (`AlreadySettled`, code 4) costs nothing;
//! 4. **gas**: the estimate plus `tally_hub_evm`'s margin, at least what
//!    an earlier `LowGas` asked for;
//! 5. **sign** an EIP-1559 transaction with the relay key: at the account's
//!    next nonce, or at the nonce of the earlier try's transaction that is
//!    still waiting (a replacement, fees a quarter higher), and send it;
//! 6. **wait** for the receipt until the try's deadline; a mined revert is
//!    replayed on the state its block left and judged like a simulation.

use std::time::{Duration, Instant};

use tally_client::{Broadcast, Failure};
use tally_hub_evm::abi::{self, Revert};
use tally_hub_evm::points::{PointError, PointKind};
use tally_hub_evm::tx::{self, Eip1559, SignedTx};
use tally_hub_evm::{gas_limit_for, At, CallRequest, EthError, EthRpc, Fees, HubName, Receipt};
use tally_hub_types::HubCode;

use super::{eth, parse_name, EvmProtocol};
use crate::hub::protocol::{Endpoint, Payload, TryFailure, TryLimits};

/// Time between receipt polls.
const POLL: Duration = Duration::from_millis(250);

/// The most gas a transaction is given.
const MAX_GAS: u64 = tally_hub_evm::hub::MAX_GAS;

/// What the tries of one payload leave for the next.
#[derive(Clone, Debug)]
pub(crate) struct Memory {
    /// The payload.
    payload: Payload,
    /// A transaction sent and not yet seen mined.
    waiting: Option<Waiting>,
    /// The least gas the next transaction gets (after a `LowGas`).
    gas_floor: u64,
}

/// A transaction sent for the payload.
#[derive(Clone, Debug)]
struct Waiting {
    signed: SignedTx,
    nonce: u64,
    fees: Fees,
    gas: u64,
}

/// What a revert means for the try: the hub's answer, or a retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The hub answered with this code (0 never; 4 already there).
    Code(u32, String),
    /// More gas would help: retry, never a refusal.
    MoreGas(String),
}

/// What `revert` means. `out_of_gas`: the transaction was mined and used
/// (nearly) all its gas, so a revert without data is gas running out.
/// `LowGas` is never a refusal (never `BadSignature`): the try is retried
/// with more gas.
pub(crate) fn judge(revert: &Revert, out_of_gas: bool) -> Verdict {
    match revert {
        Revert::LowGas { .. } => Verdict::MoreGas(revert.to_string()),
        Revert::Empty if out_of_gas => {
            Verdict::MoreGas("the transaction ran out of gas".to_string())
        }
        r => match r.code() {
            Some(c) => Verdict::Code(c.value(), r.to_string()),
            None => Verdict::Code(HubCode::Internal.value(), r.to_string()),
        },
    }
}

/// The calldata of `payload`, or the code of the hub's refusal of a point
/// that is not one (nothing would verify it).
pub(crate) fn calldata(payload: &Payload) -> Result<Vec<u8>, (u32, String)> {
    let r = match payload {
        Payload::Batch {
            nonce,
            calls,
            signature,
            ..
        } => abi::submit_batch_calldata(*nonce, calls, signature),
        Payload::Rotation {
            nonce,
            epoch,
            group_key,
            signature,
            ..
        } => abi::rotate_key_calldata(*nonce, *epoch, group_key, signature),
    };
    r.map_err(|e| {
        let code = match point_kind(&e) {
            PointKind::G1 => HubCode::BadKey,
            PointKind::G2 => HubCode::BadSignature,
        };
        (code.value(), e.to_string())
    })
}

fn point_kind(e: &PointError) -> PointKind {
    match e {
        PointError::Length { kind, .. }
        | PointError::Encoding { kind }
        | PointError::NotOnCurve { kind }
        | PointError::NotInSubgroup { kind }
        | PointError::Infinity { kind } => *kind,
    }
}

/// The payload's hub name.
fn chain(payload: &Payload) -> &str {
    match payload {
        Payload::Batch { chain, .. } | Payload::Rotation { chain, .. } => chain,
    }
}

/// The hub's answer `code` as a broadcast result.
fn answer(code: u32, log: String, height: u64) -> Broadcast {
    Broadcast::Result {
        code,
        log,
        height,
        data: Vec::new(),
    }
}

/// A failed call as a try failure: no answer counts against the
/// endpoint; a node's refusal (funds, nonce, fees) or a malformed answer
/// is retried without blame.
fn failure(e: EthError) -> TryFailure {
    match e {
        EthError::Unreachable(e) => TryFailure::endpoint(e.into_failure()),
        e => TryFailure::retry(e.to_string()),
    }
}

/// `fees` raised by a quarter over `old` where below it (a replacement
/// must pay more than the transaction it replaces).
pub(crate) fn bumped(fees: Fees, old: Fees) -> Fees {
    let up = |v: u128| v.saturating_add(v / 4).saturating_add(1);
    Fees {
        max_fee_per_gas: fees.max_fee_per_gas.max(up(old.max_fee_per_gas)),
        max_priority_fee_per_gas: fees
            .max_priority_fee_per_gas
            .max(up(old.max_priority_fee_per_gas)),
    }
}

/// One try of `payload` on `ep`.
pub(super) fn one_try(
    hub: &EvmProtocol,
    ep: Endpoint<'_>,
    payload: &Payload,
    limits: TryLimits,
) -> Result<Broadcast, TryFailure> {
    let name = match parse_name(chain(payload)) {
        Ok(n) => n,
        Err(e) => return Ok(answer(HubCode::WrongChain.value(), e.to_string(), 0)),
    };
    hub.check_chain(ep, &name)
        .map_err(|e| TryFailure::endpoint(Failure::Transport(e.to_string())))?;
    let data = match calldata(payload) {
        Ok(d) => d,
        Err((code, log)) => return Ok(answer(code, log, 0)),
    };
    let memory = hub
        .memory
        .lock()
        .ok()
        .and_then(|m| m.clone())
        .filter(|m| m.payload == *payload);
    let eth = eth(ep);
    let req = CallRequest {
        from: Some(hub.key.address()),
        to: Some(name.address),
        data,
        ..CallRequest::default()
    };
    let waiting = memory.as_ref().and_then(|m| m.waiting.clone());
    if let Some(w) = &waiting {
        if let Some(r) = eth.receipt(w.signed.hash).map_err(failure)? {
            return mined(hub, &eth, payload, &req, w, &r);
        }
    }
    let t = Try {
        hub,
        eth: &eth,
        name: &name,
        payload,
        gas_floor: memory.as_ref().map_or(0, |m| m.gas_floor),
    };
    match t.send(req.clone(), waiting) {
        Ok(sent) => wait(hub, &eth, payload, &req, &sent, limits.deadline),
        Err(Ended::Answered(b)) => Ok(b),
        Err(Ended::Failed(f)) => Err(f),
    }
}

/// How a try ended before anything was sent.
enum Ended {
    /// The hub's answer (a simulation's refusal).
    Answered(Broadcast),
    /// A failure to retry.
    Failed(TryFailure),
}

impl From<TryFailure> for Ended {
    fn from(f: TryFailure) -> Self {
        Ended::Failed(f)
    }
}

/// The parts of a try that send.
struct Try<'a> {
    hub: &'a EvmProtocol,
    eth: &'a EthRpc,
    name: &'a HubName,
    payload: &'a Payload,
    gas_floor: u64,
}

impl Try<'_> {
    /// Simulates, prices, signs and sends; the transaction sent.
    fn send(&self, req: CallRequest, waiting: Option<Waiting>) -> Result<Waiting, Ended> {
        if let Err(e) = self.eth.eth_call(&req, At::Latest) {
            return Err(self.refused(e));
        }
        let estimate = self
            .eth
            .estimate_gas(&req, At::Latest)
            .map_err(|e| self.refused(e))?;
        let gas = gas_limit_for(estimate).max(self.gas_floor).min(MAX_GAS);
        let fees = self.eth.fees().map_err(failure)?;
        let next = self
            .eth
            .next_nonce(self.hub.key.address())
            .map_err(failure)?;
        // A transaction still waiting at the account's last nonce is
        // replaced, not queued behind.
        let (nonce, fees) = match waiting {
            Some(w) if next <= w.nonce.saturating_add(1) => (w.nonce, bumped(fees, w.fees)),
            _ => (next, fees),
        };
        let signed = tx::sign(
            &self.hub.key,
            &Eip1559 {
                chain_id: self.name.chain_id,
                nonce,
                max_fee_per_gas: fees.max_fee_per_gas,
                max_priority_fee_per_gas: fees.max_priority_fee_per_gas,
                gas_limit: gas,
                to: Some(self.name.address),
                value: Default::default(),
                data: req.data,
            },
        )
        .map_err(|e| Ended::Failed(TryFailure::retry(e.to_string())))?;
        let w = Waiting {
            signed,
            nonce,
            fees,
            gas,
        };
        match self.eth.send_raw(&w.signed.raw) {
            Ok(_) => {}
            Err(EthError::Node { message, .. }) if message.contains("already known") => {}
            Err(e) => return Err(failure(e).into()),
        }
        self.hub.remember(Memory {
            payload: self.payload.clone(),
            waiting: Some(w.clone()),
            gas_floor: self.gas_floor,
        });
        tracing::info!(
            tx = %w.signed.hash,
            nonce,
            gas,
            max_fee_per_gas = fees.max_fee_per_gas,
            "sent the hub a transaction"
        );
        Ok(w)
    }

    /// A failed simulation or estimate: the hub's answer, or a failure
    /// to retry (`LowGas` even with the node's own gas cap: the next try
    /// sends the most gas a transaction may have).
    fn refused(&self, e: EthError) -> Ended {
        let EthError::Reverted(r) = e else {
            return Ended::Failed(failure(e));
        };
        match judge(&r, false) {
            Verdict::MoreGas(why) => {
                self.hub.remember(Memory {
                    payload: self.payload.clone(),
                    waiting: None,
                    gas_floor: MAX_GAS,
                });
                Ended::Failed(TryFailure::retry(why))
            }
            Verdict::Code(code, log) => Ended::Answered(answer(code, log, 0)),
        }
    }
}

/// Waits for `w`'s receipt until `deadline`.
fn wait(
    hub: &EvmProtocol,
    eth: &EthRpc,
    payload: &Payload,
    req: &CallRequest,
    w: &Waiting,
    deadline: Instant,
) -> Result<Broadcast, TryFailure> {
    loop {
        if let Some(r) = eth.receipt(w.signed.hash).map_err(failure)? {
            return mined(hub, eth, payload, req, w, &r);
        }
        if Instant::now() + POLL >= deadline {
            return Err(TryFailure {
                failure: Failure::Timeout,
                endpoint_ok: true,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// The answer of mined transaction `w`: taken, or its revert (replayed on
/// the state its block left) judged like a simulation's.
fn mined(
    hub: &EvmProtocol,
    eth: &EthRpc,
    payload: &Payload,
    req: &CallRequest,
    w: &Waiting,
    r: &Receipt,
) -> Result<Broadcast, TryFailure> {
    hub.forget();
    if r.success {
        let log = format!(
            "transaction {} mined in block {}",
            w.signed.hash, r.block_number
        );
        return Ok(answer(HubCode::Ok.value(), log, r.block_number));
    }
    let replay = CallRequest {
        gas: Some(w.gas),
        ..req.clone()
    };
    let out_of_gas = r.gas_used.saturating_mul(100) >= w.gas.saturating_mul(95);
    // On the state its block left: a transaction of another relay earlier
    // in the same block that settled the nonce shows as AlreadySettled.
    let revert = match eth.eth_call(&replay, At::Number(r.block_number)) {
        Err(EthError::Reverted(rv)) => rv,
        _ if out_of_gas => Revert::Empty,
        _ => Revert::Message("reverted; a replay on its block's state did not".into()),
    };
    match judge(&revert, out_of_gas) {
        Verdict::MoreGas(why) => {
            hub.remember(Memory {
                payload: payload.clone(),
                waiting: None,
                gas_floor: w.gas.saturating_mul(2),
            });
            Err(TryFailure::retry(format!(
                "transaction {} in block {}: {why}",
                w.signed.hash, r.block_number
            )))
        }
        Verdict::Code(code, log) => Ok(answer(code, log, r.block_number)),
    }
}

impl EvmProtocol {
    fn remember(&self, m: Memory) {
        if let Ok(mut slot) = self.memory.lock() {
            *slot = Some(m);
        }
    }

    fn forget(&self) {
        if let Ok(mut slot) = self.memory.lock() {
            *slot = None;
        }
    }
}

//! The EVM hub (ADR 0022): the `ITallyHub` contract on an
//! Ethereum-compatible chain, spoken to over the chain's JSON-RPC.
//!
//! - **Which contract.** The chain's `hub_chain` parameter names it,
//!   `evm:<chain id>:0x<address>` (`tally_hub_evm::name::HubName`), read
//!   from committed state at every poll like the other parameters. An
//!   endpoint whose `eth_chainId` is another chain is unreachable (logged
//!   once per endpoint and chain id; checked again until it matches).
//! - **Tip**: the `latest` block's number, or the `finalized` block's
//!   (setting `evm_tip`); the chain's confirmations already keep deposit
//!   ranges and settlements that many blocks deep.
//! - **Deposits** of blocks `from..=to`: the `Deposited` logs of the
//!   range and `depositCount()` at block `to`, on the endpoint that gave
//!   the tip; refused as stale when that endpoint's latest block is below
//!   `to` or it cannot answer state at `to`.
//! - **Settled**, **last nonce**, **last rotation**: `settledAt(nonce)`,
//!   `lastNonce()`, `lastRotation()` at the latest block.
//! - **A submission try** (`submit.rs`): simulate with `eth_call` (a
//!   custom error is the hub's answer, mapped to the reference hub's codes;
//!   `AlreadySettled` is code 4, delivered, and nothing is sent), estimate
//!   gas, sign an EIP-1559 transaction with this validator's relay key,
//!   send it and wait for its receipt within the try's time. `LowGas` is
//!   never a refusal: the try fails as a transport failure and the next
//!   one sends more gas. A try whose transaction got no receipt in time
//!   leaves it to the next try, which looks for its receipt first and
//!   otherwise replaces it (same account nonce, higher fees) rather than
//!   queueing a second one behind it.

use std::sync::Mutex;

use tally_client::Broadcast;
use tally_hub_evm::{At, EthError, EthRpc, HubName, RelayKey};

use super::protocol::{Deposits, Endpoint, HubProtocol, Payload, TryFailure, TryLimits};
use super::HubError;
use crate::config::{EvmConfig, EvmTip};

mod submit;

/// The EVM hub's protocol: this relay's key, the tip it reads, and what
/// it remembers between calls.
#[derive(Debug)]
pub(crate) struct EvmProtocol {
    key: RelayKey,
    tip: EvmTip,
    /// Per endpoint, the chain id it was last seen to serve.
    chain_ids: Mutex<Vec<Option<u64>>>,
    /// The last `hub_chain` found not to be an EVM hub name (logged once).
    bad_name: Mutex<Option<String>>,
    /// What the last tries of a payload left behind (a transaction
    /// waiting for its receipt, more gas needed).
    memory: Mutex<Option<submit::Memory>>,
}

impl EvmProtocol {
    /// The protocol for `endpoints` endpoints with `cfg`'s key and tip;
    /// refuses a key file that is missing, unreadable, not a key, or open
    /// to group or others.
    pub(crate) fn new(cfg: &EvmConfig, endpoints: usize) -> Result<Self, String> {
        let path = &cfg.key_file;
        if path.symlink_metadata().is_err() {
            return Err(format!(
                "the EVM hub needs this relay's key file {}, which is missing: \
                 `tallyd init` makes it (or set evm_key_file in app.toml)",
                path.display()
            ));
        }
        let key = RelayKey::load(path).map_err(|e| format!("EVM relay key: {e}"))?;
        tracing::info!(
            account = %key.address(),
            file = %path.display(),
            tip = cfg.tip.tag(),
            "EVM hub relay key loaded: this account pays the relay's gas"
        );
        Ok(Self::with_key(key, cfg.tip, endpoints))
    }

    /// The protocol with `key` (tests).
    pub(crate) fn with_key(key: RelayKey, tip: EvmTip, endpoints: usize) -> Self {
        Self {
            key,
            tip,
            chain_ids: Mutex::new(vec![None; endpoints]),
            bad_name: Mutex::new(None),
            memory: Mutex::new(None),
        }
    }

    /// Checks that `ep` serves `name`'s chain (asked once per endpoint
    /// while it does); another chain makes the endpoint unreachable.
    fn check_chain(&self, ep: Endpoint<'_>, name: &HubName) -> Result<(), HubError> {
        let known = self
            .chain_ids
            .lock()
            .ok()
            .and_then(|v| v.get(ep.index).copied().flatten());
        if known == Some(name.chain_id) {
            return Ok(());
        }
        let id = eth(ep).chain_id().map_err(read_error)?;
        if let Ok(mut v) = self.chain_ids.lock() {
            if let Some(slot) = v.get_mut(ep.index) {
                if *slot != Some(id) && id != name.chain_id {
                    tracing::error!(
                        endpoint = %ep.client.shown_url(),
                        chain_id = id,
                        want = name.chain_id,
                        hub = %name,
                        "EVM hub endpoint serves another chain than hub_chain names: not used"
                    );
                }
                *slot = Some(id);
            }
        }
        if id == name.chain_id {
            Ok(())
        } else {
            Err(HubError::Unreachable(format!(
                "{} serves EVM chain {id}, not chain {} of hub {name}",
                ep.client.shown_url(),
                name.chain_id
            )))
        }
    }

    /// The contract `hub` names, on an endpoint that serves its chain.
    fn target(&self, ep: Endpoint<'_>, hub: &str) -> Result<HubName, HubError> {
        let name = parse_name(hub).inspect_err(|e| {
            if let Ok(mut seen) = self.bad_name.lock() {
                if seen.as_deref() != Some(hub) {
                    tracing::error!(error = %e, "the EVM hub cannot be used");
                    *seen = Some(hub.to_string());
                }
            }
        })?;
        self.check_chain(ep, &name)?;
        Ok(name)
    }
}

/// The EVM hub `hub_chain` names: its chain id and contract address.
pub(crate) fn parse_name(hub: &str) -> Result<HubName, HubError> {
    hub.parse::<HubName>().map_err(|e| {
        HubError::Config(format!(
            "hub_kind is evm, but the chain's hub_chain is not an EVM hub name: {e}"
        ))
    })
}

/// The `eth_*` calls of `ep`.
fn eth(ep: Endpoint<'_>) -> EthRpc {
    EthRpc::new(ep.client.clone())
}

/// A read's error as the breaker sees it: no answer is an unreachable
/// endpoint; an error the node answered, a revert or a malformed answer
/// is an answer.
fn read_error(e: EthError) -> HubError {
    match e {
        EthError::Unreachable(e) => HubError::Unreachable(e.to_string()),
        e => HubError::Answer(e.to_string()),
    }
}

/// Deposits of blocks `from..=to` on `eth`: refused as stale when its
/// latest block is below `to` or it cannot answer `depositCount()` at
/// block `to` (a node that pruned that state, or has not got there).
fn deposits(eth: &EthRpc, name: &HubName, (from, to): (u64, u64)) -> Result<Deposits, HubError> {
    let latest = eth.block_number().map_err(read_error)?;
    let stale = |path: &str| HubError::Stale {
        path: path.to_string(),
        height: latest,
        want: to,
    };
    if latest < to {
        return Err(stale("eth_blockNumber"));
    }
    let count = match eth.deposit_count(name.address, At::Number(to)) {
        Ok(c) => c,
        Err(EthError::Node { message, .. }) => {
            tracing::debug!(to, message, "hub cannot answer state at the range's end");
            return Err(stale(&format!("depositCount() at block {to}")));
        }
        Err(e) => return Err(read_error(e)),
    };
    let logs = eth.deposits(name.address, from, to).map_err(read_error)?;
    Ok(Deposits {
        deposits: logs.into_iter().map(|d| d.deposit).collect(),
        count,
        height: latest,
    })
}

impl HubProtocol for EvmProtocol {
    fn tip(&self, ep: Endpoint<'_>, hub: &str) -> Result<u64, HubError> {
        self.target(ep, hub)?;
        let eth = eth(ep);
        match self.tip {
            EvmTip::Latest => eth.block_number().map_err(read_error),
            EvmTip::Finalized => eth
                .block(At::Finalized)
                .map_err(read_error)?
                .map(|b| b.number)
                .ok_or_else(|| HubError::Answer("the EVM node has no finalized block".into())),
        }
    }

    fn deposits(
        &self,
        ep: Endpoint<'_>,
        hub: &str,
        _at: u64,
        range: (u64, u64),
    ) -> Result<Deposits, HubError> {
        let name = self.target(ep, hub)?;
        deposits(&eth(ep), &name, range)
    }

    fn settled_at(&self, ep: Endpoint<'_>, hub: &str, nonce: u64) -> Result<Option<u64>, HubError> {
        let name = self.target(ep, hub)?;
        let at = eth(ep)
            .settled_at(name.address, nonce, At::Latest)
            .map_err(read_error)?;
        Ok((at != 0).then_some(at))
    }

    fn last_nonce(&self, ep: Endpoint<'_>, hub: &str) -> Result<u64, HubError> {
        let name = self.target(ep, hub)?;
        eth(ep)
            .last_nonce(name.address, At::Latest)
            .map_err(read_error)
    }

    fn last_rotation(&self, ep: Endpoint<'_>, hub: &str) -> Result<u64, HubError> {
        let name = self.target(ep, hub)?;
        eth(ep)
            .last_rotation(name.address, At::Latest)
            .map_err(read_error)
    }

    fn submit(
        &self,
        ep: Endpoint<'_>,
        payload: &Payload,
        limits: TryLimits,
    ) -> Result<Broadcast, TryFailure> {
        submit::one_try(self, ep, payload, limits)
    }

    fn govern_command(&self) -> &'static str {
        "tally-evm govern-key"
    }
}

#[cfg(test)]
pub(crate) mod tests;

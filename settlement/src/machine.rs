//! The state machine's entry points for the ABCI adapter: genesis, the
//! start of a block, running and checking one transaction. A thin
//! dispatcher: a transaction's bytes are decoded here, once, and the
//! decoded value is handed to the module that owns it: system transactions
//! to [`crate::sync`], every user transaction to [`crate::pipeline`].
//!
//! Results keep the two failure kinds apart: an invalid transaction is a
//! [`TxResult`] with its code (the block goes on), a local fault is a
//! [`Fatal`] error (the node must stop).

use tally_store::{Kv, KvRead};

use crate::codes::Code;
use crate::dkg::key::KeyCache;
use crate::dkg::state::put_active_key;
use crate::envelope::{VerifiedSignatures, VerifyAll};
use crate::error::{ExecError, Fatal, Rejection};
use crate::genesis::{parse_pubkey, Genesis, GenesisError};
use crate::pipeline::{block_scope, check_size, plan};
use crate::proto::{tx, Tx};
use crate::state::allowance::{put_allowance, put_gateway_name, put_user_key, Allowance};
use crate::state::chain::{
    chain_id, last_time, params, put_app_version, put_balance, put_chain_id, put_gateway,
    put_params,
};
use crate::sync::batch::apply_start;
use crate::sync::partials::apply_partials;
use crate::tx::{decode_tx, is_system_tx};
use crate::types::{Block, TxResult, PRUNE_VERSION};
use crate::upgrade::LATEST_APP_VERSION;

/// Writes genesis state at app version 1; a genesis that does not
/// validate writes nothing.
pub fn init_chain(kv: &mut impl Kv, chain_id: &str, genesis: &Genesis) -> Result<(), GenesisError> {
    init_chain_at(kv, chain_id, genesis, 1)
}

/// Writes genesis state for a chain that starts at app `version` (1 to
/// [`LATEST_APP_VERSION`]: a later version starts with its layout, with
/// nothing to migrate); anything invalid writes nothing.
pub fn init_chain_at(
    kv: &mut impl Kv,
    chain_id: &str,
    genesis: &Genesis,
    version: u64,
) -> Result<(), GenesisError> {
    if !(1..=LATEST_APP_VERSION).contains(&version) {
        return Err(GenesisError::Invalid(format!(
            "app version {version} is not one of 1 to {LATEST_APP_VERSION}"
        )));
    }
    genesis.validate()?;
    if genesis.params.sla_keep_windows > 0 && version < PRUNE_VERSION {
        return Err(GenesisError::Invalid(format!(
            "sla_keep_windows takes effect from app version {PRUNE_VERSION}; this genesis starts at version {version}"
        )));
    }
    if version > 1 {
        put_app_version(kv, version);
    }
    put_chain_id(kv, chain_id);
    put_params(kv, &genesis.params)?;
    for gw in &genesis.gateways {
        let key = parse_pubkey(&gw.pubkey).map_err(GenesisError::Invalid)?;
        put_gateway(kv, &key, &gw.name);
        put_gateway_name(kv, &gw.name, &key);
    }
    for u in &genesis.users {
        let key = parse_pubkey(&u.pubkey).map_err(GenesisError::Invalid)?;
        put_user_key(kv, &u.name, &key);
    }
    for a in &genesis.allowances {
        let allowance = Allowance {
            max_per_window: a.max_per_window,
            expires_at: a.expires_at,
        };
        put_allowance(kv, &a.user, &a.gateway, Some(allowance));
    }
    for b in &genesis.balances {
        put_balance(kv, &b.user, b.amount);
    }
    if let Some(d) = &genesis.dkg {
        put_active_key(kv, d).map_err(|e| GenesisError::Invalid(e.to_string()))?;
    }
    Ok(())
}

/// Runs one transaction in `block`. An invalid transaction is a result
/// with its code and changes nothing; `Err` means this node is broken.
pub fn deliver_tx(kv: &mut impl Kv, block: &Block, tx: &[u8]) -> Result<TxResult, Fatal> {
    deliver_tx_with(kv, block, tx, &VerifyAll, &KeyCache::new())
}

/// [`deliver_tx`], skipping the ed25519 check of envelope signatures
/// `sigs` knows (the result is the same; see [`VerifiedSignatures`]) and
/// reading the active threshold key through `cache`.
///
/// The bytes are decoded once. System transactions run as decoded (as
/// ProcessProposal checked them: their encoding need not be canonical);
/// anything else goes through the user pipeline, size first.
pub fn deliver_tx_with(
    kv: &mut impl Kv,
    block: &Block,
    tx: &[u8],
    sigs: &dyn VerifiedSignatures,
    cache: &KeyCache,
) -> Result<TxResult, Fatal> {
    let result = match decode_tx(tx) {
        Ok(Tx {
            sum: Some(tx::Sum::SyncStart(s)),
        }) => apply_start(kv, block, &s),
        Ok(Tx {
            sum: Some(tx::Sum::Partials(p)),
        }) => match chain_id(kv) {
            Ok(chain) => apply_partials(kv, cache, block, &chain, &p, false),
            Err(f) => Err(f.into()),
        },
        decoded => deliver_user(kv, block, tx, decoded, sigs),
    };
    settle(result)
}

/// A user transaction in FinalizeBlock: size, then the pipeline's plan,
/// then its writes.
fn deliver_user(
    kv: &mut impl Kv,
    block: &Block,
    tx: &[u8],
    decoded: Result<Tx, Rejection>,
    sigs: &dyn VerifiedSignatures,
) -> Result<TxResult, ExecError> {
    let params = params(kv)?;
    check_size(tx, &params)?;
    plan(kv, &params, block.time, tx, decoded, sigs)?.apply(kv)
}

/// Checks a transaction against committed state for the mempool, using the
/// last block's time as "now". Anything over `max_tx_bytes` is refused by
/// its length and a system transaction by its payload's field number
/// ([`is_system_tx`]), both before anything is decoded; the rest is
/// decoded once and planned by [`crate::pipeline`]. Changes nothing; `Err`
/// means this node is broken.
pub fn check_tx(kv: &impl KvRead, tx: &[u8]) -> Result<TxResult, Fatal> {
    Ok(check_tx_claim(kv, tx)?.result)
}

/// CheckTx's answer, with what the mempool needs to refuse variants of a
/// waiting report (see the ABCI adapter's mempool claims).
#[derive(Debug)]
pub struct CheckedTx {
    /// The answer.
    pub result: TxResult,
    /// For a report that passes: its replay scope (gateway key and report
    /// id) and its expiry.
    pub claim: Option<(Vec<u8>, u64)>,
    /// For a validator message or allowance change that passes: its
    /// one-per-block scope ([`crate::pipeline::block_scope`]).
    pub block_scope: Option<Vec<u8>>,
    /// The last block's time, the "now" of the check.
    pub now: u64,
}

/// [`check_tx`], also returning a passing report's scope.
pub fn check_tx_claim(kv: &impl KvRead, tx: &[u8]) -> Result<CheckedTx, Fatal> {
    check_tx_claim_with(kv, tx, &VerifyAll)
}

/// [`check_tx_claim`], skipping the ed25519 check of envelope signatures
/// `sigs` knows and remembering the ones it verifies.
pub fn check_tx_claim_with(
    kv: &impl KvRead,
    tx: &[u8],
    sigs: &dyn VerifiedSignatures,
) -> Result<CheckedTx, Fatal> {
    let now = last_time(kv)?;
    let done = |result| CheckedTx {
        result,
        claim: None,
        block_scope: None,
        now,
    };
    let params = params(kv)?;
    if let Err(r) = check_size(tx, &params) {
        return Ok(done(TxResult::rejected(r)));
    }
    if is_system_tx(tx) {
        return Ok(done(TxResult::rejected(Rejection::new(
            Code::SystemTxFromMempool,
            "system transactions are added by the block proposer, never through the mempool",
        ))));
    }
    let mut claim = None;
    let decoded = decode_tx(tx);
    let scope = decoded.as_ref().ok().and_then(block_scope);
    let result = settle(plan(kv, &params, now, tx, decoded, sigs).map(|plan| {
        claim = plan.report_scope().map(|(s, e)| (s.to_vec(), e));
        TxResult::ok(plan.describe(), Vec::new())
    }))?;
    let block_scope = scope.filter(|_| result.code == Code::Ok);
    Ok(CheckedTx {
        result,
        claim,
        block_scope,
        now,
    })
}

/// A rejection becomes the transaction's result; a fault stays an error.
fn settle(r: Result<TxResult, ExecError>) -> Result<TxResult, Fatal> {
    match r {
        Ok(ok) => Ok(ok),
        Err(ExecError::Rejected(r)) => Ok(TxResult::rejected(r)),
        Err(ExecError::Fatal(f)) => Err(f),
    }
}

//! InitChain: parse and apply the genesis `app_state`, enable vote
//! extensions from height 1. A genesis that cannot be read or applied
//! halts the node ([`HaltReason::BadGenesis`], exit status 2 in the
//! binaries): nothing sensible can run on it.

use bytes::Bytes;
use tally_settlement::{self as settlement, Genesis};
use tally_store::halt::HaltReason;
use tendermint_proto::v0_38::abci::{RequestInitChain, ResponseInitChain};
use tendermint_proto::v0_38::crypto::public_key::Sum;
use tendermint_proto::v0_38::types::{AbciParams, ConsensusParams, VersionParams};
use tracing::{error, info};

use crate::app::TallyApp;

/// The app version genesis starts at: CometBFT's
/// `consensus_params.version.app` (0 or absent: 1). A version this binary
/// lacks halts the node (`None`).
fn genesis_version(app: &TallyApp, req: &RequestInitChain) -> Option<u64> {
    let version = req
        .consensus_params
        .as_ref()
        .and_then(|p| p.version.as_ref())
        .map_or(1, |v| v.app.max(1));
    let max = app.max_app_version();
    if version > max {
        let why = format!(
            "genesis starts at app version {version}; this binary carries versions 1 to {max}"
        );
        error!(%why, "refusing genesis");
        app.halt(HaltReason::BadGenesis, 0, why);
        return None;
    }
    Some(version)
}

pub(crate) fn init_chain(app: &TallyApp, req: RequestInitChain) -> ResponseInitChain {
    if app.halted() {
        return ResponseInitChain::default();
    }
    let genesis = match Genesis::parse(&req.app_state_bytes) {
        Ok(g) => g,
        Err(e) => {
            // Stop with a clear message instead of starting a wrong chain.
            error!(error = %e, "refusing genesis app_state; fix genesis.json and restart");
            app.halt(HaltReason::BadGenesis, 0, e.to_string());
            return ResponseInitChain::default();
        }
    };
    let Some(version) = genesis_version(app, &req) else {
        return ResponseInitChain::default();
    };
    let mut c = app.consensus();
    if let Err(e) = settlement::init_chain_at(&mut c.pending, &req.chain_id, &genesis, version) {
        error!(error = %e, "genesis could not be applied");
        drop(c);
        app.halt(HaltReason::BadGenesis, 0, e.to_string());
        return ResponseInitChain::default();
    }
    // CometBFT's genesis validators, with the encryption keys genesis
    // lists for them: the set the on-chain DKG and proposals start from.
    let mut validators = Vec::with_capacity(req.validators.len());
    for v in &req.validators {
        let key = v.pub_key.as_ref().and_then(|k| match &k.sum {
            Some(Sum::Ed25519(b)) => <[u8; 32]>::try_from(b.as_slice()).ok(),
            _ => None,
        });
        match (key, u64::try_from(v.power)) {
            (Some(k), Ok(p)) => validators.push((k, p)),
            _ => {
                error!("genesis validator without an ed25519 key or with negative power");
                drop(c);
                app.halt(
                    HaltReason::BadGenesis,
                    0,
                    "genesis validators: ed25519 keys only".into(),
                );
                return ResponseInitChain::default();
            }
        }
    }
    if let Err(e) = settlement::dkg::init_validators(&mut c.pending, &validators) {
        error!(error = %e, "genesis validators could not be applied");
        drop(c);
        app.halt(HaltReason::BadGenesis, 0, e.to_string());
        return ResponseInitChain::default();
    }
    info!(
        chain_id = %req.chain_id,
        gateways = genesis.gateways.len(),
        funded_users = genesis.balances.len(),
        window_secs = genesis.params.settlement_window_secs,
        "genesis applied"
    );
    ResponseInitChain {
        // Vote extensions from height 1: the threshold signer rides on them.
        consensus_params: Some(ConsensusParams {
            abci: Some(AbciParams {
                vote_extensions_enable_height: 1,
            }),
            // Headers carry the app's protocol version, the one Info
            // answers: state sync checks that the two agree.
            version: Some(VersionParams { app: version }),
            ..Default::default()
        }),
        validators: Vec::new(),
        app_hash: Bytes::new(),
    }
}

//! Info, Query and CheckTx: the handlers that read committed state only,
//! straight from the backend, so they never wait for a block to execute.
//! A local fault here is answered (code 16 `internal`), not halted on:
//! nothing is being decided.

use bytes::Bytes;
use tally_settlement::{self as settlement, Code, TxResult};
use tally_store::proof::{self, ProofError};
use tendermint_proto::v0_38::abci::{
    CheckTxType, RequestCheckTx, RequestInfo, RequestQuery, ResponseCheckTx, ResponseInfo,
    ResponseQuery,
};
use tendermint_proto::v0_38::crypto::{ProofOp, ProofOps};
use tracing::warn;

use crate::app::TallyApp;
use crate::convert::codespace;
use crate::metrics::Phase;
use crate::CODESPACE;

pub(crate) fn info(app: &TallyApp, _req: RequestInfo) -> ResponseInfo {
    let last = app.last_commit();
    ResponseInfo {
        data: "tally".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        // The version committed state runs under (CometBFT takes it only
        // at genesis, and state sync checks it against the header).
        app_version: app.app_version(),
        last_block_height: last.height as i64,
        last_block_app_hash: if last.height == 0 {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(&last.app_hash)
        },
    }
}

/// Longest key `/key` accepts.
pub const MAX_QUERY_KEY: usize = 1024;

pub(crate) fn query(app: &TallyApp, req: RequestQuery) -> ResponseQuery {
    if req.path == settlement::query::KEY_PATH {
        return query_key(app, &req);
    }
    let height = app.last_commit().height as i64;
    if req.height != 0 && req.height != height {
        return ResponseQuery {
            code: Code::BadArgument.value(),
            log: format!("only the latest height ({height}) is served; ask with height 0"),
            height,
            codespace: CODESPACE.into(),
            ..Default::default()
        };
    }
    let r = app.query_path(&req.path);
    ResponseQuery {
        code: r.code.value(),
        log: r.log,
        value: r.value.into(),
        key: req.path.into_bytes().into(),
        height,
        codespace: codespace(r.code),
        ..Default::default()
    }
}

/// `/key`: the raw stored value of the key in `data` at `height` (0: the
/// latest), from the Merkle tree, with its ICS23 proof in `proof_ops` when
/// `prove` is set (a non-existence proof and code 22 when the key is absent).
/// The proof verifies against the app hash in the header at `height + 1`.
fn query_key(app: &TallyApp, req: &RequestQuery) -> ResponseQuery {
    let latest = app.last_commit().height;
    let answer = |code: Code, log: String, height: u64| ResponseQuery {
        code: code.value(),
        log,
        key: req.data.clone(),
        height: height as i64,
        codespace: codespace(code),
        ..Default::default()
    };
    let key = req.data.as_ref();
    if key.is_empty() || key.len() > MAX_QUERY_KEY || key[0] == 0 {
        return answer(
            Code::BadArgument,
            format!(
                "/key takes the raw state key in `data`: 1 to {MAX_QUERY_KEY} bytes, not starting with 0x00"
            ),
            latest,
        );
    }
    let height = match u64::try_from(req.height) {
        Ok(0) => latest,
        Ok(h) => h,
        Err(_) => {
            return answer(
                Code::BadArgument,
                format!("height {} is negative", req.height),
                latest,
            )
        }
    };
    if let Some(r) = pruned_window(app, req, height) {
        return r;
    }
    match proof::prove(app.committed_state().as_ref(), key, height) {
        Ok(p) => {
            let (code, log) = match &p.value {
                Some(_) => (Code::Ok, String::new()),
                None => (Code::NotFound, "no value under this key".to_string()),
            };
            let mut r = answer(code, log, p.version);
            r.value = p.value.unwrap_or_default().into();
            if req.prove {
                r.proof_ops = Some(ProofOps {
                    ops: vec![ProofOp {
                        r#type: proof::PROOF_OP_TYPE.into(),
                        key: req.data.to_vec(),
                        data: p.proof,
                    }],
                });
            }
            r
        }
        Err(
            e @ (ProofError::Pruned { .. }
            | ProofError::Future { .. }
            | ProofError::Empty
            | ProofError::EmptyState(_)),
        ) => answer(Code::HeightUnavailable, e.to_string(), height),
        Err(e @ ProofError::Side(_)) => answer(Code::BadArgument, e.to_string(), height),
        Err(ProofError::Store(e)) => {
            warn!(error = %e, height, "Query /key: local store fault");
            answer(Code::Internal, format!("local store fault: {e}"), height)
        }
    }
}

/// `/key` for an SLA-record key of a window pruned at `height` (before
/// that height's `meta/sla_kept_from`, app version 7, ADR 0026): code 28,
/// whether or not the key is deleted yet, with the value of
/// `meta/sla_kept_from` and, when `prove` is set, its proof at `height`
/// (the proof op names that key), so the answer can be verified. `None`
/// for any other key, or when the horizon cannot be read (the ordinary
/// answer follows).
fn pruned_window(app: &TallyApp, req: &RequestQuery, height: u64) -> Option<ResponseQuery> {
    let window = settlement::keys::sla_window(&req.data)?;
    let horizon = proof::prove(
        app.committed_state().as_ref(),
        settlement::keys::SLA_KEPT_FROM,
        height,
    )
    .ok()?;
    let kept = horizon
        .value
        .as_deref()
        .and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map_or(0, u64::from_be_bytes);
    let why = settlement::state::prune::pruned_reason(window, kept)?;
    Some(ResponseQuery {
        code: Code::HeightUnavailable.value(),
        log: format!("{why}; the proof, if asked for, is of meta/sla_kept_from"),
        key: req.data.clone(),
        value: horizon.value.unwrap_or_default().into(),
        height: height as i64,
        codespace: codespace(Code::HeightUnavailable),
        proof_ops: req.prove.then(|| ProofOps {
            ops: vec![ProofOp {
                r#type: proof::PROOF_OP_TYPE.into(),
                key: settlement::keys::SLA_KEPT_FROM.to_vec(),
                data: horizon.proof,
            }],
        }),
        ..Default::default()
    })
}

pub(crate) fn check_tx(app: &TallyApp, req: RequestCheckTx) -> ResponseCheckTx {
    let recheck = req.r#type == CheckTxType::Recheck as i32;
    // A new transaction meets a full mempool before anything is verified;
    // a recheck is of one already held.
    let full = if recheck {
        Ok(())
    } else {
        app.claims().room_for(req.tx.len())
    };
    let r = match full {
        Err(refused) => TxResult::rejected(refused),
        Ok(()) => check_and_claim(app, &req.tx),
    };
    if r.code == Code::Ok {
        app.claims().admit(req.tx.len());
    }
    let phase = if recheck {
        Phase::Recheck
    } else {
        Phase::CheckTx
    };
    app.metrics().rejected(phase, r.code.value());
    ResponseCheckTx {
        code: r.code.value(),
        log: r.log,
        data: r.data.into(),
        codespace: codespace(r.code),
        ..Default::default()
    }
}

/// CheckTx's verdict on `tx` against committed state, with its report or
/// one-per-block scope claimed when it passes.
fn check_and_claim(app: &TallyApp, tx: &[u8]) -> TxResult {
    match settlement::check_tx_claim_with(app.committed_state(), tx, app.signatures()) {
        Ok(checked) => {
            let claimed = match (&checked.claim, &checked.block_scope) {
                (Some((scope, expires_at)), _) => {
                    app.claims().claim(scope, *expires_at, tx, checked.now)
                }
                (None, Some(scope)) => app.claims().claim_once(scope, tx),
                (None, None) => Ok(()),
            };
            match claimed {
                Ok(()) => checked.result,
                Err(refused) => TxResult::rejected(refused),
            }
        }
        Err(f) => {
            warn!(error = %f, "CheckTx: local store fault");
            TxResult::internal(&f)
        }
    }
}

//! Info, Query and CheckTx: the handlers that read committed state only,
//! straight from the backend, so they never wait for a block to execute.
//! A local fault here is answered (code 16 `internal`), not halted on:
//! nothing is being decided.

use bytes::Bytes;
use tally_settlement::{self as settlement, Code, TxResult};
use tendermint_proto::v0_38::abci::{
    RequestCheckTx, RequestInfo, RequestQuery, ResponseCheckTx, ResponseInfo, ResponseQuery,
};
use tracing::warn;

use crate::app::TallyApp;
use crate::convert::codespace;
use crate::CODESPACE;

pub(crate) fn info(app: &TallyApp, _req: RequestInfo) -> ResponseInfo {
    let last = app.last_commit();
    ResponseInfo {
        data: "tally".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        app_version: 1,
        last_block_height: last.height as i64,
        last_block_app_hash: if last.height == 0 {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(&last.app_hash)
        },
    }
}

pub(crate) fn query(app: &TallyApp, req: RequestQuery) -> ResponseQuery {
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

pub(crate) fn check_tx(app: &TallyApp, req: RequestCheckTx) -> ResponseCheckTx {
    let r = match settlement::check_tx_claim(app.committed_state(), &req.tx) {
        Ok(checked) => match checked.claim {
            Some((scope, expires_at)) => {
                match app.claims().claim(&scope, expires_at, &req.tx, checked.now) {
                    Ok(()) => checked.result,
                    Err(refused) => TxResult::rejected(refused),
                }
            }
            None => checked.result,
        },
        Err(f) => {
            warn!(error = %f, "CheckTx: local store fault");
            TxResult::internal(&f)
        }
    };
    ResponseCheckTx {
        code: r.code.value(),
        log: r.log,
        data: r.data.into(),
        codespace: codespace(r.code),
        ..Default::default()
    }
}

//! The hub's ABCI adapter: thin, like Tally's. Nothing persists before
//! Commit; no handler panics. A genesis it cannot apply or a store failure
//! calls the [`Halt`] hook the binary gave [`HubApp::new`]; the app never
//! exits the process itself.
//!
//! CheckTx only checks that the bytes decode; ProcessProposal and
//! VerifyVoteExtension accept everything. A query at a height above the
//! committed one is refused (code 21); an answer's height is the committed
//! height, read before the state. The binary keeps the store in RocksDB at
//! `<home>/data/hub.db`, with the same change-set commit and Merkle-root
//! app hash as Tally's.

use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use tally_store::halt::{Halt, HaltEvent, HaltReason};
use tally_store::{Backend, CommitMeta, Pending, StoreError};
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{
    response_process_proposal::ProposalStatus, response_verify_vote_extension::VerifyStatus, Event,
    EventAttribute, ExecTxResult, RequestCheckTx, RequestFinalizeBlock, RequestInfo,
    RequestInitChain, RequestProcessProposal, RequestQuery, RequestVerifyVoteExtension,
    ResponseCheckTx, ResponseCommit, ResponseFinalizeBlock, ResponseInfo, ResponseInitChain,
    ResponseProcessProposal, ResponseQuery, ResponseVerifyVoteExtension,
};
use tracing::error;

use crate::machine::{self, HubCode};

/// The hub as an ABCI application. Clones share state.
#[derive(Clone, Debug)]
pub struct HubApp {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Arc<dyn Backend>,
    consensus: Mutex<(Pending, Option<u64>)>,
    committed: RwLock<CommitMeta>,
    halt: Halt,
}

impl HubApp {
    /// A hub over `backend`, resuming from its last commit. `halt` is
    /// called when the node must stop.
    pub fn new(backend: Arc<dyn Backend>, halt: Halt) -> Result<Self, StoreError> {
        let pending = Pending::open(backend.clone())?;
        let committed = RwLock::new(pending.committed().clone());
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                consensus: Mutex::new((pending, None)),
                committed,
                halt,
            }),
        })
    }

    /// The last committed height and app hash.
    pub fn last_commit(&self) -> CommitMeta {
        self.inner
            .committed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl HubApp {
    /// The store failed: log and halt.
    fn fatal(&self, height: u64, what: &str) {
        error!(height, error = %what, "FATAL: hub store failure; stopping");
        self.inner.halt.halt(HaltEvent {
            reason: HaltReason::StoreFailure,
            height,
            error: what.to_string(),
            upgrade_info: None,
        });
    }
}

impl Application for HubApp {
    fn info(&self, _req: RequestInfo) -> ResponseInfo {
        let m = self.last_commit();
        ResponseInfo {
            data: "tally-hub".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            app_version: 1,
            last_block_height: m.height as i64,
            last_block_app_hash: if m.height == 0 {
                Bytes::new()
            } else {
                Bytes::copy_from_slice(&m.app_hash)
            },
        }
    }

    fn init_chain(&self, req: RequestInitChain) -> ResponseInitChain {
        let mut c = self
            .inner
            .consensus
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Err(e) = machine::init(&mut c.0, &req.app_state_bytes) {
            error!(error = %e, "refusing hub genesis; fix genesis.json and restart");
            drop(c);
            self.inner.halt.halt(HaltEvent {
                reason: HaltReason::BadGenesis,
                height: 0,
                error: e.to_string(),
                upgrade_info: None,
            });
        }
        ResponseInitChain::default()
    }

    /// Answers from the latest committed state, with that height (read
    /// before the state, so the state is at least as new). A request for a
    /// height above it is refused, as Cosmos SDK apps refuse a future
    /// height; a lower one is answered from the latest state, which for
    /// the paths the relay reads at a height (deposits through a finalized
    /// height) is the same answer.
    fn query(&self, req: RequestQuery) -> ResponseQuery {
        let committed = self.last_commit().height;
        let asked = u64::try_from(req.height).unwrap_or(0);
        let r = if asked > committed {
            machine::HubResult {
                code: HubCode::BadArgument,
                log: format!("height {asked} is not committed here yet (latest {committed})"),
                value: Vec::new(),
            }
        } else {
            machine::query_at(&self.inner.backend, &req.path, committed)
        };
        ResponseQuery {
            code: r.code as u32,
            log: r.log,
            value: r.value.into(),
            height: committed as i64,
            ..Default::default()
        }
    }

    fn check_tx(&self, req: RequestCheckTx) -> ResponseCheckTx {
        let ok = machine::HubTx::decode_tx(&req.tx);
        ResponseCheckTx {
            code: if ok { 0 } else { HubCode::Malformed as u32 },
            log: if ok {
                String::new()
            } else {
                "not a hub transaction".into()
            },
            ..Default::default()
        }
    }

    fn process_proposal(&self, _req: RequestProcessProposal) -> ResponseProcessProposal {
        ResponseProcessProposal {
            status: ProposalStatus::Accept as i32,
        }
    }

    fn verify_vote_extension(
        &self,
        _req: RequestVerifyVoteExtension,
    ) -> ResponseVerifyVoteExtension {
        ResponseVerifyVoteExtension {
            status: VerifyStatus::Accept as i32,
        }
    }

    fn finalize_block(&self, req: RequestFinalizeBlock) -> ResponseFinalizeBlock {
        let height = req.height.max(0) as u64;
        let mut c = self
            .inner
            .consensus
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut tx_results = Vec::with_capacity(req.txs.len());
        for tx in &req.txs {
            let r = match machine::deliver(&mut c.0, height, tx) {
                Ok(r) => r,
                Err(e) => {
                    drop(c);
                    self.fatal(height, &e.to_string());
                    return ResponseFinalizeBlock::default();
                }
            };
            let events = if r.code == HubCode::Ok {
                vec![Event {
                    r#type: "hub".into(),
                    attributes: vec![EventAttribute {
                        key: "result".into(),
                        value: String::from_utf8_lossy(&r.value).into_owned(),
                        index: false,
                    }],
                }]
            } else {
                Vec::new()
            };
            tx_results.push(ExecTxResult {
                code: r.code as u32,
                log: r.log,
                events,
                ..Default::default()
            });
        }
        let app_hash = match c.0.app_hash_at(height) {
            Ok(h) => h,
            Err(e) => {
                drop(c);
                self.fatal(height, &e.to_string());
                return ResponseFinalizeBlock::default();
            }
        };
        c.1 = Some(height);
        ResponseFinalizeBlock {
            tx_results,
            app_hash: Bytes::copy_from_slice(&app_hash),
            ..Default::default()
        }
    }

    fn commit(&self) -> ResponseCommit {
        let mut c = self
            .inner
            .consensus
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some(height) = c.1.take() else {
            return ResponseCommit::default();
        };
        match c.0.commit(height) {
            Ok(m) => {
                *self
                    .inner
                    .committed
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = m
            }
            Err(e) => {
                drop(c);
                self.fatal(height, &e.to_string());
                return ResponseCommit::default();
            }
        }
        ResponseCommit { retain_height: 0 }
    }
}

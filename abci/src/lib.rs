//! The ABCI++ adapter: translates CometBFT's requests into calls of the pure
//! state machine in `tally-settlement` and its results back into responses.
//!
//! Threading: tendermint-abci runs one OS thread per CometBFT connection,
//! each with a clone of [`TallyApp`]. The consensus connection owns the
//! pending block state behind a mutex; the mempool (CheckTx) and query
//! connections read committed state straight from the backend, so they never
//! wait for a block to execute.
//!
//! No handler panics: every failure becomes an error code or log. The one
//! deliberate stop is a failed durable write in Commit (see
//! `docs/adr/0003-store-and-app-hash.md`).

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use bytes::Bytes;
use prost::Message;
use tally_settlement::bls::SecretShare;
use tally_settlement::proto::{tx, HubBlock, HubResult, SyncTxStart};
use tally_settlement::{self as settlement, Block, Code, Genesis};
use tally_store::{Backend, ChangeSet, CommitMeta, Pending, StoreError};
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{
    response_process_proposal::ProposalStatus, response_verify_vote_extension::VerifyStatus, Event,
    EventAttribute, ExecTxResult, RequestCheckTx, RequestExtendVote, RequestFinalizeBlock,
    RequestInfo, RequestInitChain, RequestPrepareProposal, RequestProcessProposal, RequestQuery,
    RequestVerifyVoteExtension, ResponseCheckTx, ResponseCommit, ResponseExtendVote,
    ResponseFinalizeBlock, ResponseInfo, ResponseInitChain, ResponsePrepareProposal,
    ResponseProcessProposal, ResponseQuery, ResponseVerifyVoteExtension,
};
use tendermint_proto::v0_38::types::{AbciParams, ConsensusParams};
use tracing::{error, info, warn};

/// The codespace of every Tally result code.
pub const CODESPACE: &str = "tally";

/// Errors of the adapter that are not ABCI responses.
#[derive(Debug, thiserror::Error)]
pub enum AbciError {
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Tally as an ABCI++ application. Cheap to clone: clones share state.
#[derive(Clone, Debug)]
pub struct TallyApp {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Arc<dyn Backend>,
    consensus: Mutex<Consensus>,
    /// The last commit, readable without waiting for a block to execute.
    committed: RwLock<CommitMeta>,
    /// This validator's threshold key share, if it signs.
    signer: RwLock<Option<SecretShare>>,
    /// Hub results the relay observed, waiting to be signed in ExtendVote.
    observed: Mutex<Vec<HubResult>>,
    /// Hub blocks (deposits) the relay observed, likewise.
    blocks: Mutex<Vec<HubBlock>>,
}

/// Most hub observations kept for signing.
const MAX_OBSERVED: usize = 64;

#[derive(Debug)]
struct Consensus {
    pending: Pending,
    /// Height executed by FinalizeBlock and not yet committed.
    finalized: Option<u64>,
    /// The writes pending before that FinalizeBlock (genesis writes before
    /// the first block), restored if the same height is executed again.
    before_block: ChangeSet,
}

/// What happened to a block, for callers that run the app in-process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// Height committed.
    pub height: u64,
    /// App hash after it.
    pub app_hash: [u8; 32],
}

impl TallyApp {
    /// An app over `backend`, resuming from its last commit.
    pub fn new(backend: Arc<dyn Backend>) -> Result<Self, AbciError> {
        let pending = Pending::open(backend.clone())?;
        let committed = RwLock::new(pending.committed().clone());
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                consensus: Mutex::new(Consensus {
                    pending,
                    finalized: None,
                    before_block: ChangeSet::default(),
                }),
                committed,
                signer: RwLock::new(None),
                observed: Mutex::new(Vec::new()),
                blocks: Mutex::new(Vec::new()),
            }),
        })
    }

    fn consensus(&self) -> MutexGuard<'_, Consensus> {
        // A poisoned lock means a handler panicked; the state it guarded is
        // still the last consistent one we wrote, so keep going.
        self.inner
            .consensus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The last committed height and app hash.
    pub fn last_commit(&self) -> Committed {
        let m = self
            .inner
            .committed
            .read()
            .unwrap_or_else(|e| e.into_inner());
        Committed {
            height: m.height,
            app_hash: m.app_hash,
        }
    }

    /// Committed state, for read-only use.
    pub fn committed_state(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Gives the app this validator's threshold key share: from now on its
    /// vote extensions carry partial signatures.
    pub fn set_signer(&self, share: SecretShare) {
        *self.inner.signer.write().unwrap_or_else(|e| e.into_inner()) = Some(share);
    }

    /// The relay's hand-in: a hub result it observed for an attempt. The
    /// next vote extensions sign it while the chain is waiting for it.
    pub fn hand_in(&self, result: HubResult) {
        let mut o = self
            .inner
            .observed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !o.contains(&result) {
            o.push(result);
        }
        let excess = o.len().saturating_sub(MAX_OBSERVED);
        o.drain(..excess);
    }

    /// The relay's hand-in of a finalized hub block range with its deposits.
    /// Ranges the chain has moved past are dropped.
    pub fn hand_in_block(&self, block: HubBlock) {
        let mut b = self.inner.blocks.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok((cursor, _)) = settlement::sync::hub_cursor(&self.inner.backend, &block.chain) {
            b.retain(|x| x.from_height >= cursor);
        }
        if !b.contains(&block) {
            b.push(block);
        }
        let excess = b.len().saturating_sub(MAX_OBSERVED);
        b.drain(..excess);
    }

    fn committed_pending(&self) -> Result<Pending, StoreError> {
        Pending::open(self.inner.backend.clone())
    }

    /// Answers a query path against committed state.
    pub fn query_path(&self, path: &str) -> settlement::query::QueryResult {
        settlement::query::query(&self.inner.backend, path)
    }
}

fn block_time(t: Option<&tendermint_proto::google::protobuf::Timestamp>) -> u64 {
    t.map(|t| t.seconds.max(0) as u64).unwrap_or(0)
}

fn to_events(events: Vec<settlement::Event>) -> Vec<Event> {
    events
        .into_iter()
        .map(|e| Event {
            r#type: e.kind,
            attributes: e
                .attrs
                .into_iter()
                .map(|(key, value)| EventAttribute {
                    key,
                    value,
                    index: true,
                })
                .collect(),
        })
        .collect()
}

fn codespace(code: Code) -> String {
    if code == Code::Ok {
        String::new()
    } else {
        CODESPACE.to_string()
    }
}

impl Application for TallyApp {
    fn info(&self, _req: RequestInfo) -> ResponseInfo {
        let last = self.last_commit();
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

    fn init_chain(&self, req: RequestInitChain) -> ResponseInitChain {
        let genesis = match Genesis::parse(&req.app_state_bytes) {
            Ok(g) => g,
            Err(e) => {
                // Nothing sensible can run on a genesis we cannot read; stop
                // with a clear message instead of starting a wrong chain.
                error!(error = %e, "refusing genesis app_state; fix genesis.json and restart");
                std::process::exit(2);
            }
        };
        let mut c = self.consensus();
        if let Err(e) = settlement::init_chain(&mut c.pending, &req.chain_id, &genesis) {
            error!(error = %e, "genesis could not be applied");
            std::process::exit(2);
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
                ..Default::default()
            }),
            validators: Vec::new(),
            app_hash: Bytes::new(),
        }
    }

    fn query(&self, req: RequestQuery) -> ResponseQuery {
        let height = self.last_commit().height as i64;
        if req.height != 0 && req.height != height {
            return ResponseQuery {
                code: Code::BadArgument.value(),
                log: format!("only the latest height ({height}) is served; ask with height 0"),
                height,
                codespace: CODESPACE.into(),
                ..Default::default()
            };
        }
        let r = self.query_path(&req.path);
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

    fn check_tx(&self, req: RequestCheckTx) -> ResponseCheckTx {
        let r = settlement::check_tx(&self.inner.backend, &req.tx);
        ResponseCheckTx {
            code: r.code.value(),
            log: r.log,
            codespace: codespace(r.code),
            ..Default::default()
        }
    }

    fn prepare_proposal(&self, req: RequestPrepareProposal) -> ResponsePrepareProposal {
        let max = usize::try_from(req.max_tx_bytes.max(0)).unwrap_or(usize::MAX);
        let mut used = 0usize;
        let mut txs = Vec::with_capacity(req.txs.len() + 2);
        // System transactions first, their bytes reserved before user txs.
        let block = Block {
            height: req.height.max(0) as u64,
            time: block_time(req.time.as_ref()),
        };
        let extensions: Vec<Vec<u8>> = req
            .local_last_commit
            .as_ref()
            .map(|c| c.votes.iter().map(|v| v.vote_extension.to_vec()).collect())
            .unwrap_or_default();
        let system = self
            .committed_pending()
            .map_err(settlement::Rejection::from)
            .and_then(|mut sim| settlement::prepare_system(&mut sim, &block, &extensions));
        match system {
            Ok(sys) => {
                for t in sys {
                    if used + t.len() <= max {
                        used += t.len();
                        txs.push(Bytes::from(t));
                    }
                }
            }
            Err(e) => warn!(height = block.height, error = %e, "no system transactions this block"),
        }
        for tx in req.txs {
            // Skip what ProcessProposal would refuse; keep the mempool order.
            if settlement::decode_tx(&tx).is_err() || settlement::is_system_tx(&tx) {
                continue;
            }
            if used.saturating_add(tx.len()) > max {
                continue;
            }
            used += tx.len();
            txs.push(tx);
        }
        ResponsePrepareProposal { txs }
    }

    fn process_proposal(&self, req: RequestProcessProposal) -> ResponseProcessProposal {
        let bad = req
            .txs
            .iter()
            .position(|tx| settlement::decode_tx(tx).is_err());
        let status = match bad {
            Some(i) => {
                warn!(
                    height = req.height,
                    index = i,
                    "rejecting proposal: undecodable transaction"
                );
                ProposalStatus::Reject
            }
            None => {
                let block = Block {
                    height: req.height.max(0) as u64,
                    time: block_time(req.time.as_ref()),
                };
                let txs: Vec<&[u8]> = req.txs.iter().map(|t| t.as_ref()).collect();
                let verdict = self
                    .committed_pending()
                    .map_err(settlement::Rejection::from)
                    .and_then(|mut sim| settlement::verify_system(&mut sim, &block, &txs));
                match verdict {
                    Ok(()) => ProposalStatus::Accept,
                    Err(e) if e.code == Code::Internal => fatal_store_error(block.height, &e.msg),
                    Err(e) => {
                        warn!(height = req.height, error = %e, "rejecting proposal: invalid system transaction");
                        ProposalStatus::Reject
                    }
                }
            }
        };
        ResponseProcessProposal {
            status: status as i32,
        }
    }

    fn extend_vote(&self, req: RequestExtendVote) -> ResponseExtendVote {
        let signer = self
            .inner
            .signer
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(share) = signer else {
            return ResponseExtendVote::default();
        };
        // Batches started in the block being voted on are signed right away.
        let proposed: Vec<SyncTxStart> = req
            .txs
            .iter()
            .filter_map(|t| match settlement::decode_tx(t).ok()?.sum {
                Some(tx::Sum::SyncStart(s)) => Some(s),
                _ => None,
            })
            .collect();
        let observed = self
            .inner
            .observed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let blocks = self
            .inner
            .blocks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let backend = &self.inner.backend;
        let ext = settlement::chain_id(backend).and_then(|chain| {
            settlement::sync::extension(backend, &chain, &share, &proposed, &observed, &blocks)
        });
        match ext {
            Ok(e) => ResponseExtendVote {
                vote_extension: e.encode_to_vec().into(),
            },
            Err(e) => {
                warn!(height = req.height, error = %e, "empty vote extension");
                ResponseExtendVote::default()
            }
        }
    }

    fn verify_vote_extension(
        &self,
        req: RequestVerifyVoteExtension,
    ) -> ResponseVerifyVoteExtension {
        let status =
            if settlement::sync::extension_well_formed(&self.inner.backend, &req.vote_extension) {
                VerifyStatus::Accept
            } else {
                VerifyStatus::Reject
            };
        ResponseVerifyVoteExtension {
            status: status as i32,
        }
    }

    fn finalize_block(&self, req: RequestFinalizeBlock) -> ResponseFinalizeBlock {
        let block = Block {
            height: req.height.max(0) as u64,
            time: block_time(req.time.as_ref()),
        };
        let mut c = self.consensus();
        if c.finalized.take().is_some() {
            // The same height again without a Commit: start from the state
            // before the first execution.
            warn!(
                height = block.height,
                "FinalizeBlock repeated before Commit; re-executing"
            );
            let before = c.before_block.clone();
            c.pending.set_changes(before);
        } else {
            c.before_block = c.pending.changes().clone();
        }
        let events = match settlement::begin_block(&mut c.pending, &block) {
            Ok(ev) => to_events(ev),
            Err(e) => fatal_store_error(block.height, &e.to_string()),
        };
        let mut tx_results = Vec::with_capacity(req.txs.len());
        for tx in &req.txs {
            let r = settlement::deliver_tx(&mut c.pending, &block, tx);
            if r.code == Code::Internal {
                fatal_store_error(block.height, &r.log);
            }
            tx_results.push(ExecTxResult {
                code: r.code.value(),
                log: r.log,
                events: to_events(r.events),
                codespace: codespace(r.code),
                ..Default::default()
            });
        }
        let app_hash = c.pending.app_hash_at(block.height);
        c.finalized = Some(block.height);
        ResponseFinalizeBlock {
            events,
            tx_results,
            validator_updates: Vec::new(),
            consensus_param_updates: None,
            app_hash: Bytes::copy_from_slice(&app_hash),
        }
    }

    fn commit(&self) -> ResponseCommit {
        let mut c = self.consensus();
        let Some(height) = c.finalized.take() else {
            warn!("Commit without FinalizeBlock; nothing to write");
            return ResponseCommit::default();
        };
        match c.pending.commit(height) {
            Ok(meta) => {
                *self
                    .inner
                    .committed
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = meta;
            }
            Err(e) => fatal_store_error(height, &e.to_string()),
        }
        ResponseCommit { retain_height: 0 }
    }
}

/// The node's own storage failed (a read, a corrupt value, a write). The
/// block's result would depend on a local fault, so no answer is safe:
/// continuing would report an app hash this node cannot reproduce. Stop with
/// a clear message; after the fault is fixed CometBFT replays from the last
/// commit. See docs/adr/0003-store-and-app-hash.md.
fn fatal_store_error(height: u64, what: &str) -> ! {
    error!(height, error = %what, "FATAL: local store failure; stopping the app (CometBFT will replay from the last commit after restart)");
    std::process::exit(3);
}

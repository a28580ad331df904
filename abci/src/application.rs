//! The `Application` impl: each ABCI++ method of [`TallyApp`] hands its
//! request to the handler module of its group, and times it (the
//! `abci_duration_seconds` histogram, see `metrics`). Kept apart from `app` so the
//! app's state does not depend on the handlers that use it.

use std::time::Instant;

use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{
    RequestApplySnapshotChunk, RequestLoadSnapshotChunk, RequestOfferSnapshot,
    ResponseApplySnapshotChunk, ResponseListSnapshots, ResponseLoadSnapshotChunk,
    ResponseOfferSnapshot,
};
use tendermint_proto::v0_38::abci::{
    RequestCheckTx, RequestExtendVote, RequestFinalizeBlock, RequestInfo, RequestInitChain,
    RequestPrepareProposal, RequestProcessProposal, RequestQuery, RequestVerifyVoteExtension,
    ResponseCheckTx, ResponseCommit, ResponseExtendVote, ResponseFinalizeBlock, ResponseInfo,
    ResponseInitChain, ResponsePrepareProposal, ResponseProcessProposal, ResponseQuery,
    ResponseVerifyVoteExtension,
};

use crate::app::TallyApp;
use crate::metrics::Method;
use crate::{finalize, info, init, proposal, snapshot, vote_extension};

impl Application for TallyApp {
    fn info(&self, req: RequestInfo) -> ResponseInfo {
        info::info(self, req)
    }

    fn init_chain(&self, req: RequestInitChain) -> ResponseInitChain {
        init::init_chain(self, req)
    }

    fn query(&self, req: RequestQuery) -> ResponseQuery {
        info::query(self, req)
    }

    fn check_tx(&self, req: RequestCheckTx) -> ResponseCheckTx {
        let t = Instant::now();
        let r = info::check_tx(self, req);
        self.metrics().observe(Method::CheckTx, t.elapsed());
        r
    }

    fn prepare_proposal(&self, req: RequestPrepareProposal) -> ResponsePrepareProposal {
        let t = Instant::now();
        let r = proposal::prepare_proposal(self, req);
        self.metrics().observe(Method::PrepareProposal, t.elapsed());
        r
    }

    fn process_proposal(&self, req: RequestProcessProposal) -> ResponseProcessProposal {
        let t = Instant::now();
        let r = proposal::process_proposal(self, req);
        self.metrics().observe(Method::ProcessProposal, t.elapsed());
        r
    }

    fn extend_vote(&self, req: RequestExtendVote) -> ResponseExtendVote {
        let t = Instant::now();
        let r = vote_extension::extend_vote(self, req);
        self.metrics().observe(Method::ExtendVote, t.elapsed());
        r
    }

    fn verify_vote_extension(
        &self,
        req: RequestVerifyVoteExtension,
    ) -> ResponseVerifyVoteExtension {
        let t = Instant::now();
        let r = vote_extension::verify_vote_extension(self, req);
        self.metrics()
            .observe(Method::VerifyVoteExtension, t.elapsed());
        r
    }

    fn finalize_block(&self, req: RequestFinalizeBlock) -> ResponseFinalizeBlock {
        let t = Instant::now();
        let r = finalize::finalize_block(self, req);
        self.metrics().observe(Method::FinalizeBlock, t.elapsed());
        r
    }

    fn commit(&self) -> ResponseCommit {
        let t = Instant::now();
        let r = finalize::commit(self);
        self.metrics().observe(Method::Commit, t.elapsed());
        r
    }

    fn list_snapshots(&self) -> ResponseListSnapshots {
        snapshot::list_snapshots(self)
    }

    fn offer_snapshot(&self, req: RequestOfferSnapshot) -> ResponseOfferSnapshot {
        snapshot::offer_snapshot(self, req)
    }

    fn load_snapshot_chunk(&self, req: RequestLoadSnapshotChunk) -> ResponseLoadSnapshotChunk {
        snapshot::load_snapshot_chunk(self, req)
    }

    fn apply_snapshot_chunk(&self, req: RequestApplySnapshotChunk) -> ResponseApplySnapshotChunk {
        snapshot::apply_snapshot_chunk(self, req)
    }
}

//! The `Application` impl: each ABCI++ method of [`TallyApp`] hands its
//! request to the handler module of its group. Kept apart from `app` so the
//! app's state does not depend on the handlers that use it.

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
        info::check_tx(self, req)
    }

    fn prepare_proposal(&self, req: RequestPrepareProposal) -> ResponsePrepareProposal {
        proposal::prepare_proposal(self, req)
    }

    fn process_proposal(&self, req: RequestProcessProposal) -> ResponseProcessProposal {
        proposal::process_proposal(self, req)
    }

    fn extend_vote(&self, req: RequestExtendVote) -> ResponseExtendVote {
        vote_extension::extend_vote(self, req)
    }

    fn verify_vote_extension(
        &self,
        req: RequestVerifyVoteExtension,
    ) -> ResponseVerifyVoteExtension {
        vote_extension::verify_vote_extension(self, req)
    }

    fn finalize_block(&self, req: RequestFinalizeBlock) -> ResponseFinalizeBlock {
        finalize::finalize_block(self, req)
    }

    fn commit(&self) -> ResponseCommit {
        finalize::commit(self)
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

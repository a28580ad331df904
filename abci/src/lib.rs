//! The ABCI++ adapter: translates CometBFT's requests into calls of the pure
//! state machine in `tally-settlement` and its results back into responses.
//!
//! One module per handler group, each only translating and dispatching:
//!
//! - [`app`]: the [`TallyApp`] and its shared state.
//! - `application`: the `Application` impl, delegating to the handlers
//!   below.
//! - `init`: InitChain.
//! - `info`: Info, Query and CheckTx (read committed state only).
//! - `proposal`: PrepareProposal and ProcessProposal.
//! - `vote_extension`: ExtendVote and VerifyVoteExtension.
//! - `finalize`: FinalizeBlock and Commit.
//! - [`snapshot`]: state sync (ListSnapshots, LoadSnapshotChunk,
//!   OfferSnapshot, ApplySnapshotChunk) over a node's [`SnapshotStore`].
//! - [`inbox`]: the relay's hand-ins ([`HandIn`]) waiting to be signed.
//! - `convert`: block times, events and codespaces into protobuf.
//! - [`metrics`]: the app's Prometheus metrics ([`AppMetrics`]), updated by
//!   the handlers with atomics only, registered by the node.
//!
//! Threading: tendermint-abci runs one OS thread per CometBFT connection,
//! each with a clone of [`TallyApp`]. The consensus connection owns the
//! pending block state behind a mutex; the mempool (CheckTx) and query
//! connections read committed state straight from the backend, so they never
//! wait for a block to execute.
//!
//! No handler panics: an invalid input becomes an error code or log. A
//! local fault the state machine reports as `Fatal` while executing or
//! verifying a block, a failed durable write in Commit, and a genesis that
//! cannot be applied call the [`Halt`] hook the binary gave
//! [`TallyApp::new`] (see `docs/adr/0003-store-and-app-hash.md`); the app
//! never exits the process itself.

pub mod app;
mod application;
mod convert;
mod finalize;
pub mod inbox;
mod info;
mod init;
pub mod mempool;
pub mod metrics;
mod proposal;
pub mod sigcache;
pub mod snapshot;
pub mod snapshot_store;
pub mod upgrade;
mod vote_extension;

pub use app::{AbciError, Committed, TallyApp};
pub use inbox::{HandIn, Inbox};
pub use metrics::AppMetrics;
pub use snapshot_store::{SnapshotInfo, SnapshotStore};
pub use tally_store::halt::{Halt, HaltEvent, HaltLog, HaltReason};
pub use upgrade::{upgrade_info, UpgradeStop};

/// The codespace of every Tally result code.
pub const CODESPACE: &str = "tally";

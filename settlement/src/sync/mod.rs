//! Settlement sync: closed windows become escrowed hub calls, batches are
//! threshold-signed through vote extensions, and each hub chain's attempts
//! follow `AsyncBatchState { last_sync, attempt }` with a backdated
//! `last_sync` on failure (the ~60 s cooldown). Deposits come back the
//! same way, as threshold-signed hub blocks.
//!
//! Everything here is deterministic and reads only state and block time.
//! One submodule per concern, each importing only the siblings above it
//! and the leaf and `state` modules:
//!
//! - [`digest`]: the bytes validators sign (a leaf).
//! - [`close`]: closed windows into hub calls, a bounded number per block.
//! - [`batch`](mod@batch): SyncTxStart, signed batches.
//! - [`results`]: hub results for an attempt (HubSyncEnd).
//! - [`deposits`]: hub blocks and the deposits they credit.
//! - [`awaited`]: which messages the chain waits for (dispatch on kind).
//! - [`partials`]: SubmitPartials: store, combine at the threshold, act.
//! - [`vote_extension`]: ExtendVote, VerifyVoteExtension, and gathering
//!   extensions into SubmitPartials.
//!
//! This module only re-exports; its items are reachable as
//! `tally_settlement::sync::*`.

pub mod awaited;
pub mod batch;
pub mod close;
pub mod deposits;
pub mod digest;
pub mod partials;
pub mod results;
pub mod vote_extension;

pub use crate::state::sync::{batch, hub_call, hub_cursor, pending_calls, sync_state};
pub use crate::types::{BatchStatus, HubCursor};
pub use awaited::Bodies;
pub use batch::{is_running, next_attempt_not_before, next_sync_start};
pub use digest::{batch_digest, block_digest, result_digest, rotation_digest};
pub use partials::check_shape;
pub use vote_extension::{
    check_extension, check_extension_with, collect_partials, extension, BadExtension,
};

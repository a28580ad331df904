//! Tally's state machine: pure and deterministic.
//!
//! No I/O, no clock, no floats, ordered maps only. State is read and written
//! through [`tally_store::Kv`]; time is the block header's. The ABCI adapter
//! calls [`init_chain`], then per block [`begin_block`], [`deliver_tx`]
//! for each transaction and [`end_block`]; proposals go through [`prepare_system`] and
//! [`verify_system`], mempool checks through [`check_tx`] and reads through
//! [`query::query`].
//!
//! Modules, leaves first (a module imports only modules above it in this
//! list, so there are no cycles; a name in backticks in this list is a
//! module, and every module has one: `settlement/tests/architecture_doc.rs`):
//!
//! - leaves: [`codes`] (result codes), [`error`] (invalid input vs broken
//!   node), [`ident`], [`time`], [`proto`], [`bls`], `record` (route
//!   counters), `genesis`, [`keys`] (every key prefix), [`types`] (blocks,
//!   results, events, batch status, named records), [`tx`] (transaction
//!   bytes), [`query_path`] (query paths, built and parsed; shared with the
//!   CLI);
//! - [`state`]: typed accessors over the keys, one corrupt-checking integer
//!   reader;
//! - [`sync`]: settlement sync, one submodule per concern;
//! - [`envelope`]: the one opener of signed envelopes (body, chain id,
//!   signer key, signature; one table of codes) and the verified-signature
//!   cache's interface;
//! - [`calls`]: a report's calls in either encoding (records or the
//!   compact per-route form), checked and summed;
//! - [`allowance`]: users' allowances for gateways, changed by signed
//!   transactions and spent by reports;
//! - [`report`]: usage reports, planned then applied;
//! - [`dkg`]: the threshold key and validator set made and changed on
//!   chain (ceremonies, resharing, proposals, their accessors and
//!   queries), above `state`; its leaves `dkg::keys` (state keys, listed in
//!   `keys::LAYOUT`), `dkg::key` (the key record, read by `genesis`) and
//!   `dkg::types` sit with the leaves, and `sync` reads the active key
//!   through `dkg::state`;
//! - [`pipeline`]: the one dispatcher of user transactions (every signed
//!   kind: reports, allowances, validator messages), where a new kind is
//!   added;
//! - [`block`]: start-of-block work;
//! - [`upgrade`]: software upgrade plans, the switch to a new app version
//!   and each version's migration (ADR 0019);
//! - [`gov`]: governance proposals (upgrades, parameter changes from a
//!   future window, gateways after genesis; ADR 0020), checked when opened
//!   and accepted and carried out when accepted;
//! - [`user`]: what users sign besides allowances: key changes and
//!   withdrawals (ADR 0020);
//! - [`slo`]: service-level objectives: policies, latency histograms,
//!   verdicts at window close, credits and reputation (ADR 0021);
//! - [`system`]: the proposer's system transactions;
//! - [`machine`]: the entry points, decoding each transaction once and
//!   dispatching to the above;
//! - [`query`]: read-only JSON queries.

pub mod allowance;
pub mod block;
pub mod bls;
pub mod calls;
pub mod codes;
pub mod dkg;
pub mod envelope;
pub mod error;
mod genesis;
pub mod gov;
pub mod ident;
pub mod keys;
pub mod machine;
pub mod pipeline;
pub mod proto;
pub mod query;
pub mod query_path;
mod record;
pub mod report;
pub mod slo;
pub mod state;
pub mod sync;
pub mod system;
pub mod time;
pub mod tx;
pub mod types;
pub mod upgrade;
pub mod user;

pub use allowance::{sign_allowance, ALLOWANCE_SIGN_DOMAIN};
pub use block::{begin_block, begin_block_with, end_block};
pub use codes::Code;
pub use dkg::key::{KeyCache, KeyEpoch};
pub use envelope::{VerifiedSignatures, VerifyAll};
pub use error::{ExecError, Fatal, Rejection};
pub use genesis::{
    parse_pubkey, AllowanceEntry, BalanceEntry, GatewayEntry, Genesis, GenesisError, Params,
    UserEntry,
};
pub use machine::{
    check_tx, check_tx_claim, check_tx_claim_with, deliver_tx, deliver_tx_with, init_chain,
    init_chain_at, CheckedTx,
};
pub use record::{Counters, Overflow, RouteId, RouteRecordView, WindowView};
pub use report::{sign_report, REPORT_SIGN_DOMAIN};
pub use state::chain::{balance, chain_id, params};
pub use system::{prepare_system, rederive_start, verify_system};
pub use tx::{decode_tx, is_system_tx};
pub use types::{BatchStatus, Block, Event, PartyWindow, TxResult, WindowInfo};

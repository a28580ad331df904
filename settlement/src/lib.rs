//! Tally's state machine: pure and deterministic.
//!
//! No I/O, no clock, no floats, ordered maps only. State is read and written
//! through [`tally_store::Kv`]; time is the block header's. The ABCI adapter
//! calls [`init_chain`], then per block [`begin_block`] and [`deliver_tx`]
//! for each transaction; mempool checks go through [`check_tx`] and reads
//! through [`query::query`].

pub mod bls;
mod codes;
mod genesis;
pub mod ident;
pub mod keys;
mod machine;
pub mod proto;
pub mod query;
pub mod query_path;
mod record;
pub mod sync;
pub mod time;

pub use codes::{Code, Rejection};
pub use genesis::{
    parse_pubkey, BalanceEntry, DkgGenesis, GatewayEntry, Genesis, GenesisError, Params,
};
pub use machine::{
    balance, begin_block, chain_id, check_tx, decode_tx, deliver_tx, init_chain, is_system_tx,
    params, prepare_system, sign_report, verify_system, Block, Event, TxResult, WindowInfo,
    REPORT_SIGN_DOMAIN,
};
pub use record::{Counters, Overflow, RouteId, RouteRecordView, WindowView};

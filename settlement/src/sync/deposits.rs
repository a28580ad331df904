//! Deposits: finalized hub block ranges with the deposits they carry,
//! observed by each validator's relay and threshold-signed. A signed
//! HubBlock credits its deposits once and moves the hub cursor past it.
//!
//! Ranges are fixed (`hub_block_range` heights from the cursor) and
//! deposits gap-free from the next expected sequence number, so every
//! honest validator signs the same bytes.

use tally_store::{Kv, KvRead};

use super::digest::block_digest;
use crate::error::Fatal;
use crate::genesis::Params;
use crate::ident;
use crate::proto::HubBlock;
use crate::state::chain::{balance, put_balance};
use crate::state::sync::{hub_cursor, put_deposit_seq, put_hub_height};
use crate::types::Event;

/// Whether the chain waits for a signature on hub block `b` with `digest`:
/// the hub chain's next range, deposits numbered on from the cursor, each
/// positive and for a valid user.
pub fn awaits_block(
    kv: &impl KvRead,
    p: &Params,
    b: &HubBlock,
    digest: &[u8; 32],
) -> Result<bool, Fatal> {
    let cursor = hub_cursor(kv, &p.hub_chain)?;
    let fixed = b.chain == p.hub_chain
        && b.from_height == cursor.height
        && b.to_height == cursor.height + p.hub_block_range - 1;
    let gap_free = b.deposits.iter().enumerate().all(|(i, d)| {
        d.seq == cursor.deposit_seq + i as u64
            && d.amount > 0
            && ident::check_party("user", &d.user).is_ok()
    });
    Ok(fixed && gap_free && block_digest(b) == *digest)
}

/// A hub block signed by t validators: its deposits are credited once and
/// the cursor moves past it (an empty range moves it too).
pub fn credit_deposits(kv: &mut impl Kv, b: &HubBlock) -> Result<Event, Fatal> {
    let mut credited = 0u64;
    for d in &b.deposits {
        let bal = balance(kv, &d.user)?.saturating_add(d.amount);
        put_balance(kv, &d.user, bal);
        credited = credited.saturating_add(d.amount);
    }
    let next_seq = b.deposits.last().map(|d| d.seq + 1);
    put_hub_height(kv, &b.chain, b.to_height + 1);
    if let Some(n) = next_seq {
        put_deposit_seq(kv, &b.chain, n);
    }
    Ok(Event::new(
        "hub_deposits",
        [
            ("chain", b.chain.clone()),
            ("from_height", b.from_height.to_string()),
            ("to_height", b.to_height.to_string()),
            ("deposits", b.deposits.len().to_string()),
            ("credited", credited.to_string()),
        ],
    ))
}

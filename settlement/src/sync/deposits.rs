//! Deposits: finalized hub block ranges with the deposits they carry,
//! observed by each validator's relay and threshold-signed. A signed
//! HubBlock credits its deposits once and moves the hub cursor past it.
//!
//! Ranges are fixed (`hub_block_range` heights from the cursor) and
//! deposits gap-free from the next expected sequence number, so every
//! honest validator signs the same bytes. One message carries at most
//! `max_block_deposits` deposits: a range holding more is credited in
//! several messages over the same heights, each exactly full and marked
//! `more` except the last, so a burst of deposits costs more messages,
//! never a bigger one.

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
/// positive and for a valid user, at most `max_block_deposits` of them and
/// exactly that many when `more` is set.
pub fn awaits_block(
    kv: &impl KvRead,
    p: &Params,
    b: &HubBlock,
    digest: &[u8; 32],
) -> Result<bool, Fatal> {
    let cursor = hub_cursor(kv, &p.hub_chain)?;
    let fixed = b.chain == p.hub_chain
        && b.from_height == cursor.height
        && b.to_height == cursor.height.saturating_add(p.hub_block_range - 1);
    let cap = p.max_block_deposits as usize;
    let sized = if b.more {
        b.deposits.len() == cap
    } else {
        b.deposits.len() <= cap
    };
    if !(fixed && sized) {
        return Ok(false);
    }
    let gap_free = b.deposits.iter().enumerate().all(|(i, d)| {
        d.seq == cursor.deposit_seq.saturating_add(i as u64)
            && d.amount > 0
            && ident::check_party("user", &d.user).is_ok()
    });
    Ok(gap_free && block_digest(b) == *digest)
}

/// A hub block signed by t validators: its deposits are credited once and
/// the sequence cursor moves past them; the height cursor moves past the
/// range unless `more` says the range holds further deposits (an empty
/// range moves it too).
pub fn credit_deposits(kv: &mut impl Kv, b: &HubBlock) -> Result<Event, Fatal> {
    let mut credited = 0u64;
    for d in &b.deposits {
        let bal = balance(kv, &d.user)?.saturating_add(d.amount);
        put_balance(kv, &d.user, bal);
        credited = credited.saturating_add(d.amount);
    }
    let next_seq = b.deposits.last().map(|d| d.seq.saturating_add(1));
    if !b.more {
        put_hub_height(kv, &b.chain, b.to_height.saturating_add(1));
    }
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
            ("more", b.more.to_string()),
            ("credited", credited.to_string()),
        ],
    ))
}

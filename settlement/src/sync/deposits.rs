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
//! never a bigger one. Each message also carries the hub's cumulative
//! deposit count through the range's end ([`check_count`]): a hub answer
//! that left deposits out of the range is refused, not credited short.
//!
//! Per hub chain the state keeps a cursor `hubcur/<chain>` (first hub
//! height not yet covered; absent: 1) and `depseq/<chain>` (next deposit
//! number expected; absent: 1). A `HubBlock {chain, from_height,
//! to_height, deposits}` is recognised at the cursor only if it covers exactly `[cursor,
//! cursor + hub_block_range - 1]` and its deposits are numbered `next_seq,
//! next_seq + 1, ...` with valid users and non-zero amounts. When `t`
//! validators have signed one, each deposit is added to its user's
//! balance, the sequence moves past the last deposit, the cursor moves to
//! `to_height + 1` unless `more` is set, and a `hub_deposits` event is
//! emitted. A range without deposits is signed too and just moves the
//! cursor. `/sync/{chain}` shows `hub_cursor`, `next_deposit_seq` and
//! `held_hub_blocks`.
//! Digest layout: `docs/signing.md` 3.3.
//!
//! **Messages in flight** (app version 5, ADR 0024). Before version 5 the
//! chain waits for exactly one message, the one at the cursor, so deposits
//! move one message per two blocks (signed in one block's extensions,
//! credited in the next). From version 5 it also waits for the messages
//! that follow it: up to [`in_flight`] `= 2 × max_block_messages` of them,
//! each at a *slot* `(from_height, first_seq)` that an honest relay
//! reaches by splitting the ranges after the cursor the same way
//! ([`check_slot`]): a range `k < in_flight` ranges past the cursor, a
//! first sequence number at most `in_flight × max_block_deposits` past the
//! next expected one (a multiple of the cap within the cursor's own range),
//! deposits numbered on from it and a count that agrees. A message signed
//! at the cursor is credited at once and then every held message the
//! cursor reaches, in order ([`block_signed`]); one signed ahead of it is
//! held under `hubheld/<chain>` until then, and no longer awaited. Held
//! messages the cursor passes are deleted, so a range split differently
//! can never be credited twice. Structure is all the chain can check of a
//! message ahead, as of one at the cursor: that its deposits are the hub's
//! rests on `t` validators' relays having signed it, as before.

use tally_store::{Kv, KvRead};

use super::digest::block_digest;
use crate::error::Fatal;
use crate::genesis::Params;
use crate::ident;
use crate::keys;
use crate::proto::HubBlock;
use crate::state::allowance::{put_user_key, user_key};
use crate::state::chain::{app_version, balance, put_balance};
use crate::state::sync::{
    drop_held_blocks_below, held_block, hub_cursor, put_deposit_seq, put_held_block, put_hub_height,
};
use crate::types::Event;
use crate::types::{GROWTH_VERSION, PIPELINE_VERSION};

/// Why the chain does not wait for a signature on a hub block: it is not
/// the message an honest relay would build for the chain's cursor.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockRefusal {
    /// Another hub chain, or not the fixed range at the cursor.
    #[error("hub block {chain}:{from}..={to} is not the next range ({want_chain}:{want_from}..={want_to})")]
    NotNextRange {
        /// The block's chain.
        chain: String,
        /// The block's first height.
        from: u64,
        /// The block's last height.
        to: u64,
        /// The chain's hub chain.
        want_chain: String,
        /// The cursor.
        want_from: u64,
        /// The cursor's range end.
        want_to: u64,
    },
    /// From app version 5: not in any slot the chain waits for (a range
    /// not aligned with the cursor's or too far past it, a first sequence
    /// number behind the cursor or too far past it).
    #[error("hub block at heights from {from}, first deposit {first_seq}, is in no slot the chain waits for (cursor {cursor}, next deposit {next_seq}, {window} messages in flight)")]
    OutOfWindow {
        /// The block's first height.
        from: u64,
        /// Its first sequence number ([`first_seq`]).
        first_seq: u64,
        /// The chain's hub cursor.
        cursor: u64,
        /// The next deposit expected.
        next_seq: u64,
        /// [`in_flight`].
        window: u64,
    },
    /// More than `max_block_deposits`, or fewer with `more` set.
    #[error("hub block carries {len} deposits with more={more}; the cap is {cap} (exactly {cap} when more)")]
    Size {
        /// Deposits carried.
        len: usize,
        /// The block's `more`.
        more: bool,
        /// `max_block_deposits`.
        cap: usize,
    },
    /// A deposit whose key is not an ed25519 key, or any key before app
    /// version 3.
    #[error("deposit {index} of the hub block: {why}")]
    Key {
        /// Position in the message.
        index: usize,
        /// Why.
        why: String,
    },
    /// A deposit out of sequence, of zero credits, or for a bad user.
    #[error("deposit {index} of the hub block: seq {seq} (want {want}), amount {amount}, user {user:?}: not gap-free from the cursor, zero, or not a valid user")]
    Deposit {
        /// Position in the message.
        index: usize,
        /// Its sequence number.
        seq: u64,
        /// The one expected there.
        want: u64,
        /// Its amount.
        amount: u64,
        /// Its user.
        user: String,
    },
    /// `deposit_count` disagrees with what crediting the message leaves
    /// credited: the list is short (or the count wrong).
    #[error("hub block deposit_count {count} with more={more}, but crediting it leaves {credited} deposits credited: the count must equal that when more=false and exceed it when more=true")]
    Count {
        /// The block's `deposit_count`.
        count: u64,
        /// Deposits credited on the chain once this message is.
        credited: u64,
        /// The block's `more`.
        more: bool,
    },
}

/// The deposit-count rule for block `b` when the chain expects sequence
/// number `next_seq` next (so `next_seq - 1` deposits are credited): once
/// `b` is credited, `next_seq - 1 + len` are. The final message of a range
/// (`more == false`) must say exactly that many deposits exist through
/// `to_height`; a `more == true` message promises at least one further
/// deposit in the range, so its count must be strictly larger. A hub
/// answer that lists fewer deposits than its count is thus never credited
/// as complete, and the chunks of one range agree with its last message.
pub fn check_count(next_seq: u64, b: &HubBlock) -> Result<(), BlockRefusal> {
    let credited = next_seq
        .saturating_sub(1)
        .saturating_add(b.deposits.len() as u64);
    let ok = if b.more {
        b.deposit_count > credited
    } else {
        b.deposit_count == credited
    };
    if ok {
        Ok(())
    } else {
        Err(BlockRefusal::Count {
            count: b.deposit_count,
            credited,
            more: b.more,
        })
    }
}

/// Whether hub block `b` is the message at the cursor (digest aside; from
/// app version 5 others are awaited too, [`check_slot`]): the hub chain's
/// next range, deposits numbered on from the
/// cursor, each positive and for a valid user, at most
/// `max_block_deposits` of them and exactly that many when `more` is set,
/// and a `deposit_count` that meets [`check_count`]. The outer `Result` is
/// the store; the inner one says why `b` is refused.
pub fn check_block(
    kv: &impl KvRead,
    p: &Params,
    b: &HubBlock,
) -> Result<Result<(), BlockRefusal>, Fatal> {
    let cursor = hub_cursor(kv, &p.hub_chain)?;
    let want_to = cursor.height.saturating_add(p.hub_block_range - 1);
    if !(b.chain == p.hub_chain && b.from_height == cursor.height && b.to_height == want_to) {
        return Ok(Err(BlockRefusal::NotNextRange {
            chain: b.chain.clone(),
            from: b.from_height,
            to: b.to_height,
            want_chain: p.hub_chain.clone(),
            want_from: cursor.height,
            want_to,
        }));
    }
    if let Err(why) = check_size(p, b) {
        return Ok(Err(why));
    }
    if let Err(why) = check_deposits(kv, b, cursor.deposit_seq)? {
        return Ok(Err(why));
    }
    Ok(check_count(cursor.deposit_seq, b))
}

/// How many hub-block messages the chain waits for at once under `p` at
/// app `version`: the one at the cursor and those after it.
pub fn in_flight(p: &Params, version: u64) -> u64 {
    if version >= PIPELINE_VERSION {
        u64::from(p.max_block_messages).saturating_mul(2).max(1)
    } else {
        1
    }
}

/// The sequence number a message's slot is keyed by: its first deposit's,
/// or for a message without deposits the one after its count (what the
/// cursor expects next once the range before it is credited).
pub fn first_seq(b: &HubBlock) -> u64 {
    b.deposits
        .first()
        .map_or(b.deposit_count.saturating_add(1), |d| d.seq)
}

/// Where a message the chain waits for sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// At the cursor: credited as soon as it is signed.
    Next,
    /// After it: held once signed, credited when the cursor reaches it.
    Ahead,
}

/// Whether hub block `b` is a message the chain waits for, and where:
/// [`check_block`] for the one at the cursor; from app version 5 also
/// one in the slots after it (see the module doc). The outer `Result` is
/// the store; the inner one says why `b` is refused.
pub fn check_slot(
    kv: &impl KvRead,
    p: &Params,
    b: &HubBlock,
) -> Result<Result<Slot, BlockRefusal>, Fatal> {
    let window = in_flight(p, app_version(kv)?);
    let cursor = hub_cursor(kv, &p.hub_chain)?;
    let first = first_seq(b);
    if window <= 1 || (b.from_height == cursor.height && first == cursor.deposit_seq) {
        return Ok(check_block(kv, p, b)?.map(|()| Slot::Next));
    }
    let range = p.hub_block_range;
    let ranges_ahead = b
        .from_height
        .checked_sub(cursor.height)
        .filter(|d| d % range == 0)
        .map(|d| d / range);
    let placed = b.chain == p.hub_chain
        && ranges_ahead.is_some_and(|k| k < window)
        && b.to_height == b.from_height.saturating_add(range - 1);
    let cap = u64::from(p.max_block_deposits);
    let seqs_ahead = first.checked_sub(cursor.deposit_seq);
    let seq_ok = seqs_ahead.is_some_and(|a| {
        a / cap < window
            && (b.from_height != cursor.height || (a % cap == 0 && !b.deposits.is_empty()))
    });
    if !placed || !seq_ok {
        return Ok(Err(BlockRefusal::OutOfWindow {
            from: b.from_height,
            first_seq: first,
            cursor: cursor.height,
            next_seq: cursor.deposit_seq,
            window,
        }));
    }
    if let Err(why) = check_size(p, b) {
        return Ok(Err(why));
    }
    if let Err(why) = check_deposits(kv, b, first)? {
        return Ok(Err(why));
    }
    Ok(check_count(first, b).map(|()| Slot::Ahead))
}

/// The size rule: at most `max_block_deposits`, exactly that many when
/// `more` is set.
fn check_size(p: &Params, b: &HubBlock) -> Result<(), BlockRefusal> {
    let cap = p.max_block_deposits as usize;
    let sized = if b.more {
        b.deposits.len() == cap
    } else {
        b.deposits.len() <= cap
    };
    if sized {
        Ok(())
    } else {
        Err(BlockRefusal::Size {
            len: b.deposits.len(),
            more: b.more,
            cap,
        })
    }
}

/// Each deposit numbered `first, first + 1, ...`, positive, for a valid
/// user, with a key that is an ed25519 point or none (none before app
/// version 3).
fn check_deposits(
    kv: &impl KvRead,
    b: &HubBlock,
    first: u64,
) -> Result<Result<(), BlockRefusal>, Fatal> {
    let keyed = app_version(kv)? >= GROWTH_VERSION;
    for (i, d) in b.deposits.iter().enumerate() {
        if !d.pubkey.is_empty() {
            let why = if keyed {
                check_deposit_key(&d.pubkey).err()
            } else {
                Some(format!(
                    "keys in deposits need app version {GROWTH_VERSION}"
                ))
            };
            if let Some(why) = why {
                return Ok(Err(BlockRefusal::Key { index: i, why }));
            }
        }
        let want = first.saturating_add(i as u64);
        if d.seq != want || d.amount == 0 || ident::check_party("user", &d.user).is_err() {
            return Ok(Err(BlockRefusal::Deposit {
                index: i,
                seq: d.seq,
                want,
                amount: d.amount,
                user: d.user.clone(),
            }));
        }
    }
    Ok(Ok(()))
}

/// Whether `key` may ride in a deposit: 32 bytes that are an ed25519
/// point. The hub refuses a deposit that fails this (the same function),
/// so a deposit the hub took can never stop the chain's cursor.
pub fn check_deposit_key(key: &[u8]) -> Result<[u8; 32], String> {
    let k = <[u8; 32]>::try_from(key)
        .map_err(|_| format!("a deposit's key is {} bytes, not 32", key.len()))?;
    ed25519_dalek::VerifyingKey::from_bytes(&k)
        .map_err(|_| "a deposit's key is not an ed25519 point".to_string())?;
    Ok(k)
}

/// Whether the chain waits for a signature on hub block `b` with `digest`:
/// [`check_block`] accepts it and `digest` is its digest.
pub fn awaits_block(
    kv: &impl KvRead,
    p: &Params,
    b: &HubBlock,
    digest: &[u8; 32],
) -> Result<bool, Fatal> {
    if block_digest(b) != *digest {
        return Ok(false);
    }
    Ok(match check_slot(kv, p, b)? {
        Ok(Slot::Next) => true,
        // A slot already holding a signed message waits for nothing more.
        Ok(Slot::Ahead) => held_block(kv, &b.chain, b.from_height, first_seq(b))?.is_none(),
        Err(_) => false,
    })
}

/// A hub block signed by `t` validators: at the cursor its deposits are
/// credited, then every held message the cursor reaches in turn; ahead of
/// it, it is held (app version 5). A message in no slot (the state moved
/// since it was recognised) is left alone.
pub fn block_signed(kv: &mut impl Kv, p: &Params, b: &HubBlock) -> Result<Vec<Event>, Fatal> {
    match check_slot(kv, p, b)? {
        Ok(Slot::Next) => credit_in_order(kv, p, b),
        Ok(Slot::Ahead) => {
            let first = first_seq(b);
            put_held_block(kv, b, first);
            Ok(vec![Event::new(
                "hub_block_held",
                [
                    ("chain", b.chain.clone()),
                    ("from_height", b.from_height.to_string()),
                    ("first_seq", first.to_string()),
                    ("deposits", b.deposits.len().to_string()),
                ],
            )])
        }
        Err(_) => Ok(Vec::new()),
    }
}

/// Credits `b` (at the cursor), then from app version 5 each held message
/// at the cursor it leaves, until none is held there; held messages the
/// cursor passed are deleted on the way.
fn credit_in_order(kv: &mut impl Kv, p: &Params, b: &HubBlock) -> Result<Vec<Event>, Fatal> {
    let mut events = credit_deposits(kv, b)?;
    if in_flight(p, app_version(kv)?) <= 1 {
        return Ok(events);
    }
    loop {
        let c = hub_cursor(kv, &b.chain)?;
        drop_held_blocks_below(kv, &b.chain, c.height, c.deposit_seq);
        let Some(next) = held_block(kv, &b.chain, c.height, c.deposit_seq)? else {
            break;
        };
        kv.delete(keys::hub_held(&b.chain, c.height, c.deposit_seq));
        if check_block(kv, p, &next)?.is_err() {
            // Held when it fitted its slot; the parameters changed since.
            events.push(Event::new(
                "hub_block_dropped",
                [
                    ("chain", next.chain.clone()),
                    ("from_height", next.from_height.to_string()),
                    ("first_seq", c.deposit_seq.to_string()),
                ],
            ));
            break;
        }
        events.extend(credit_deposits(kv, &next)?);
    }
    Ok(events)
}

/// A hub block signed by t validators: its deposits are credited once and
/// the sequence cursor moves past them; the height cursor moves past the
/// range unless `more` says the range holds further deposits (an empty
/// range moves it too).
pub fn credit_deposits(kv: &mut impl Kv, b: &HubBlock) -> Result<Vec<Event>, Fatal> {
    let mut credited = 0u64;
    let mut events = Vec::new();
    for d in &b.deposits {
        let before = balance(kv, &d.user)?;
        if let Ok(key) = check_deposit_key(&d.pubkey) {
            // The deposit that first funds a user without a key binds its
            // key (ADR 0020); on any other the key is ignored.
            if before == 0 && user_key(kv, &d.user)?.is_none() {
                put_user_key(kv, &d.user, &key);
                events.push(Event::new(
                    "user_registered",
                    [
                        ("user", d.user.clone()),
                        ("pubkey", hex::encode(key)),
                        ("deposit_seq", d.seq.to_string()),
                    ],
                ));
            }
        }
        put_balance(kv, &d.user, before.saturating_add(d.amount));
        credited = credited.saturating_add(d.amount);
    }
    let next_seq = b.deposits.last().map(|d| d.seq.saturating_add(1));
    if !b.more {
        put_hub_height(kv, &b.chain, b.to_height.saturating_add(1));
    }
    if let Some(n) = next_seq {
        put_deposit_seq(kv, &b.chain, n);
    }
    events.insert(
        0,
        Event::new(
            "hub_deposits",
            [
                ("chain", b.chain.clone()),
                ("from_height", b.from_height.to_string()),
                ("to_height", b.to_height.to_string()),
                ("deposits", b.deposits.len().to_string()),
                ("more", b.more.to_string()),
                ("credited", credited.to_string()),
            ],
        ),
    );
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::HubDeposit;

    /// `n` deposits numbered from `first`.
    fn block(first: u64, n: u64, more: bool, count: u64) -> HubBlock {
        HubBlock {
            chain: "hub".into(),
            from_height: 1,
            to_height: 10,
            deposits: (first..first + n)
                .map(|seq| HubDeposit {
                    seq,
                    user: "u".into(),
                    amount: 1,
                    pubkey: Vec::new(),
                })
                .collect(),
            more,
            deposit_count: count,
        }
    }

    #[test]
    fn the_count_is_exact_for_a_last_message_and_larger_for_a_chunk() {
        // 4 credited before (next seq 5); the message lists 5..=7.
        assert_eq!(check_count(5, &block(5, 3, false, 7)), Ok(()));
        for count in [6, 8, 0] {
            assert_eq!(
                check_count(5, &block(5, 3, false, count)),
                Err(BlockRefusal::Count {
                    count,
                    credited: 7,
                    more: false
                })
            );
        }
        assert_eq!(check_count(5, &block(5, 3, true, 8)), Ok(()));
        assert_eq!(check_count(5, &block(5, 3, true, 900)), Ok(()));
        assert!(check_count(5, &block(5, 3, true, 7)).is_err());
        // An empty last message: the count is what is already credited.
        assert_eq!(check_count(5, &block(5, 0, false, 4)), Ok(()));
        assert!(check_count(5, &block(5, 0, false, 5)).is_err());
        assert_eq!(check_count(1, &block(5, 0, false, 0)), Ok(()));
    }
}

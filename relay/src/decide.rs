//! The relay's decisions as pure functions of what it read (committed chain
//! state, the hub's answers, how long ago it first saw the batch signed):
//! no I/O and no clock, so every rule is unit-tested here and the loop in
//! `poll.rs` only reads, calls these, and carries out the step.

use std::time::Duration;

use tally_settlement::proto::{BatchRecord, HubBlock, HubDeposit, SyncState};
use tally_settlement::BatchStatus;

/// The hub height range `(from, to)` to hand in as the next `HubBlock`:
/// `range` heights from `cursor`, once the hub's `tip` is `confirmations`
/// blocks past its end. `None` while it is not that deep.
pub fn deposit_range(cursor: u64, range: u64, tip: u64, confirmations: u64) -> Option<(u64, u64)> {
    let to = cursor.checked_add(range.max(1) - 1)?;
    (tip >= to.saturating_add(confirmations)).then_some((cursor, to))
}

/// The next hub-block message of a range from the hub's deposits in it
/// (`all`, any order): the deposits from sequence number `next_seq` on, at
/// most `cap` of them, and whether the range holds more after those. Every
/// honest relay that reads the same finalized range builds the same
/// message, so a burst of deposits becomes several messages of `cap`.
pub fn deposit_message(
    mut all: Vec<HubDeposit>,
    next_seq: u64,
    cap: usize,
) -> (Vec<HubDeposit>, bool) {
    all.retain(|d| d.seq >= next_seq);
    all.sort_by_key(|d| d.seq);
    let more = all.len() > cap;
    all.truncate(cap);
    (all, more)
}

/// The hub-block message of hub heights `from..=to` from the hub's answer
/// for them: [`deposit_message`]'s deposits and `more`, and the hub's
/// cumulative deposit count through `to` (`deposit_count`), which every
/// message of the range carries alike (the chain checks it against what it
/// has credited: `tally_settlement::sync::deposits::check_count`).
pub fn hub_block(
    chain: &str,
    (from, to): (u64, u64),
    all: Vec<HubDeposit>,
    deposit_count: u64,
    next_seq: u64,
    cap: usize,
) -> HubBlock {
    let (deposits, more) = deposit_message(all, next_seq, cap);
    HubBlock {
        chain: chain.to_string(),
        from_height: from,
        to_height: to,
        deposits,
        more,
        deposit_count,
    }
}

/// The messages of hub heights `from..=to` from sequence number
/// `first_seq` on: [`hub_block`] from `first_seq`, then from the deposit
/// after its last while it says `more`, at most `max` of them (at least
/// one: a range with nothing from `first_seq` on is one empty message).
/// With app version 5 the chain waits for several messages at once
/// (ADR 0024); every honest relay splits a range the same way, so each
/// message's slot and bytes agree.
pub fn range_messages(
    chain: &str,
    (from, to): (u64, u64),
    mut all: Vec<HubDeposit>,
    deposit_count: u64,
    first_seq: u64,
    cap: usize,
    max: usize,
) -> Vec<HubBlock> {
    all.retain(|d| d.seq >= first_seq);
    all.sort_by_key(|d| d.seq);
    let mut out = Vec::new();
    let mut next = first_seq;
    loop {
        let b = hub_block(chain, (from, to), all.clone(), deposit_count, next, cap);
        let more = b.more;
        next = b.deposits.last().map_or(next, |d| d.seq.saturating_add(1));
        out.push(b);
        if !more || out.len() >= max.max(1) {
            return out;
        }
        all.retain(|d| d.seq >= next);
    }
}

/// What the hub showed for the current nonce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubView {
    /// Hub height at which the nonce settled, if it did.
    pub settled_at: Option<u64>,
    /// The hub's latest height.
    pub tip: u64,
}

/// Everything one decision looks at.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// The chain's sync state (committed).
    pub state: &'a SyncState,
    /// The current nonce's batch (committed), if formed.
    pub batch: Option<&'a BatchRecord>,
    /// The hub's view of the current nonce; `None` if the hub could not be
    /// read.
    pub hub: Option<HubView>,
    /// Hub blocks a settlement must be under before it is handed in.
    pub confirmations: u64,
    /// Wall-clock seconds (unix), compared with the attempt's start.
    pub now_unix: u64,
    /// The chain's `attempt_deadline_secs`.
    pub attempt_deadline_secs: u64,
    /// Since when this relay has seen the current attempt's batch signed.
    pub since_signed: Option<Duration>,
    /// This relay's signer rank; `None`: it never submits.
    pub rank: Option<u32>,
    /// Delay between ranks.
    pub stagger: Duration,
    /// This relay already started a submission for this (nonce, attempt).
    pub submitted: bool,
}

/// What the relay does after one poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing now.
    Idle,
    /// The hub settled the nonce but not `confirmations` deep yet: wait,
    /// and drop any submission still in flight.
    SettledShallow,
    /// Hand in `settled` for the current attempt.
    Settled,
    /// The attempt is `elapsed` seconds old and unsettled: hand in `failed`.
    DeadlinePassed {
        /// Seconds since the attempt started.
        elapsed: u64,
    },
    /// Submit the signed batch now.
    Submit,
}

/// The rules, in order: nothing without a current attempt; a settlement
/// the hub shows wins over everything; an attempt the chain already marked
/// failed is left to its cooldown; a deadline ends the attempt; a signed
/// batch is submitted once, by rank, `rank × stagger` after this relay first
/// saw it signed.
pub fn decide(i: &Inputs<'_>) -> Step {
    let st = i.state;
    if st.current_nonce == 0 || st.attempt == 0 {
        return Step::Idle;
    }
    if let Some(HubView {
        settled_at: Some(at),
        tip,
    }) = i.hub
    {
        return if tip >= at.saturating_add(i.confirmations) {
            Step::Settled
        } else {
            Step::SettledShallow
        };
    }
    if st.failed_attempt == st.attempt {
        return Step::Idle;
    }
    let Some(batch) = i.batch else {
        return Step::Idle;
    };
    let elapsed = i.now_unix.saturating_sub(st.last_sync);
    if elapsed >= i.attempt_deadline_secs {
        return Step::DeadlinePassed { elapsed };
    }
    if batch.status != BatchStatus::Signed.value() || i.submitted {
        return Step::Idle;
    }
    match (i.rank, i.since_signed) {
        (Some(rank), Some(since)) if since >= i.stagger.saturating_mul(rank) => Step::Submit,
        _ => Step::Idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> SyncState {
        SyncState {
            last_sync: 1_000,
            attempt: 1,
            current_nonce: 7,
            ..Default::default()
        }
    }

    fn batch(status: BatchStatus) -> BatchRecord {
        BatchRecord {
            chain: "hub".into(),
            nonce: 7,
            status: status.value(),
            ..Default::default()
        }
    }

    fn inputs<'a>(st: &'a SyncState, b: Option<&'a BatchRecord>) -> Inputs<'a> {
        Inputs {
            state: st,
            batch: b,
            hub: Some(HubView {
                settled_at: None,
                tip: 100,
            }),
            confirmations: 2,
            now_unix: 1_005,
            attempt_deadline_secs: 30,
            since_signed: Some(Duration::ZERO),
            rank: Some(0),
            stagger: Duration::from_secs(2),
            submitted: false,
        }
    }

    #[test]
    fn deposit_ranges_wait_for_confirmations() {
        assert_eq!(deposit_range(1, 10, 10, 1), None);
        assert_eq!(deposit_range(1, 10, 11, 1), Some((1, 10)));
        assert_eq!(deposit_range(11, 10, 23, 4), None);
        assert_eq!(deposit_range(11, 10, 24, 4), Some((11, 20)));
        // A zero range still means one height; no overflow at the top.
        assert_eq!(deposit_range(5, 0, 5, 0), Some((5, 5)));
        assert_eq!(deposit_range(u64::MAX, 2, u64::MAX, 0), None);
    }

    fn dep(seq: u64) -> HubDeposit {
        HubDeposit {
            seq,
            user: format!("u{seq}"),
            amount: seq,
            pubkey: Vec::new(),
        }
    }

    #[test]
    fn deposit_messages_take_at_most_cap_from_the_cursor() {
        // Hand-computed: seqs 3..=9 in the range, cursor at 5, cap 3.
        let all: Vec<HubDeposit> = [9, 3, 4, 5, 6, 7, 8].into_iter().map(dep).collect();
        let (d, more) = deposit_message(all.clone(), 5, 3);
        assert_eq!(d.iter().map(|x| x.seq).collect::<Vec<_>>(), [5, 6, 7]);
        assert!(more);
        let (d, more) = deposit_message(all.clone(), 8, 3);
        assert_eq!(d.iter().map(|x| x.seq).collect::<Vec<_>>(), [8, 9]);
        assert!(!more);
        // Exactly cap left: all of them, nothing more.
        let (d, more) = deposit_message(all.clone(), 7, 3);
        assert_eq!(d.len(), 3);
        assert!(!more);
        let (d, more) = deposit_message(all, 10, 3);
        assert!(d.is_empty() && !more);
    }

    #[test]
    fn every_message_of_a_range_carries_the_hubs_count() {
        // Seqs 3..=9 in range 11..=20, the hub's count through 20 is 9;
        // cursor at 5, cap 3: [5, 6, 7] + more, then [8, 9].
        let all: Vec<HubDeposit> = (3..=9).map(dep).collect();
        let b = hub_block("hub", (11, 20), all.clone(), 9, 5, 3);
        assert_eq!(
            (b.chain.as_str(), b.from_height, b.to_height),
            ("hub", 11, 20)
        );
        assert_eq!(
            b.deposits.iter().map(|x| x.seq).collect::<Vec<_>>(),
            [5, 6, 7]
        );
        assert!(b.more);
        assert_eq!(b.deposit_count, 9);
        let b = hub_block("hub", (11, 20), all, 9, 8, 3);
        assert_eq!(b.deposits.iter().map(|x| x.seq).collect::<Vec<_>>(), [8, 9]);
        assert!(!b.more);
        assert_eq!(b.deposit_count, 9);
    }

    #[test]
    fn a_range_splits_into_every_message_from_the_first_seq() {
        // Hand-computed: seqs 5..=12 (unordered), cap 3.
        let all: Vec<HubDeposit> = [12, 5, 9, 6, 7, 8, 11, 10].into_iter().map(dep).collect();
        let seqs = |v: &[HubBlock]| -> Vec<(Vec<u64>, bool)> {
            v.iter()
                .map(|b| (b.deposits.iter().map(|d| d.seq).collect(), b.more))
                .collect()
        };
        let m = range_messages("hub", (1, 10), all.clone(), 12, 5, 3, 10);
        assert_eq!(
            seqs(&m),
            [
                (vec![5, 6, 7], true),
                (vec![8, 9, 10], true),
                (vec![11, 12], false)
            ]
        );
        assert!(m
            .iter()
            .all(|b| b.deposit_count == 12 && b.from_height == 1));
        // At most `max`; from a later first seq; exactly cap left.
        let m = range_messages("hub", (1, 10), all.clone(), 12, 5, 3, 2);
        assert_eq!(seqs(&m).len(), 2);
        let m = range_messages("hub", (1, 10), all.clone(), 12, 7, 3, 10);
        assert_eq!(seqs(&m), [(vec![7, 8, 9], true), (vec![10, 11, 12], false)]);
        // Nothing from the first seq on: one empty message; max 0 still
        // builds one.
        let m = range_messages("hub", (1, 10), all.clone(), 12, 13, 3, 0);
        assert_eq!(seqs(&m), [(vec![], false)]);
    }

    #[test]
    fn nothing_without_an_attempt() {
        let mut st = state();
        st.attempt = 0;
        let b = batch(BatchStatus::Signed);
        assert_eq!(decide(&inputs(&st, Some(&b))), Step::Idle);
        let mut st = state();
        st.current_nonce = 0;
        assert_eq!(decide(&inputs(&st, Some(&b))), Step::Idle);
    }

    #[test]
    fn rank_zero_submits_a_signed_batch_once() {
        let st = state();
        let b = batch(BatchStatus::Signed);
        let mut i = inputs(&st, Some(&b));
        assert_eq!(decide(&i), Step::Submit);
        i.submitted = true;
        assert_eq!(decide(&i), Step::Idle);
    }

    #[test]
    fn only_signed_batches_are_submitted() {
        let st = state();
        for status in [BatchStatus::Pending, BatchStatus::Settled] {
            let b = batch(status);
            assert_eq!(decide(&inputs(&st, Some(&b))), Step::Idle, "{status:?}");
        }
        assert_eq!(decide(&inputs(&st, None)), Step::Idle);
    }

    #[test]
    fn ranks_are_staggered_from_when_the_batch_was_seen_signed() {
        let st = state();
        let b = batch(BatchStatus::Signed);
        let mut i = inputs(&st, Some(&b));
        i.rank = Some(2);
        // The attempt started long ago (signing was slow), but this relay
        // saw the signature only 3.9 s ago: rank 2 waits for 4 s.
        i.now_unix = 1_020;
        i.since_signed = Some(Duration::from_millis(3_900));
        assert_eq!(decide(&i), Step::Idle);
        i.since_signed = Some(Duration::from_secs(4));
        assert_eq!(decide(&i), Step::Submit);
        i.since_signed = None;
        assert_eq!(decide(&i), Step::Idle);
    }

    #[test]
    fn a_node_without_a_share_never_submits() {
        let st = state();
        let b = batch(BatchStatus::Signed);
        let mut i = inputs(&st, Some(&b));
        i.rank = None;
        i.since_signed = Some(Duration::from_secs(600));
        assert_eq!(decide(&i), Step::Idle);
    }

    #[test]
    fn a_settlement_is_handed_in_only_when_deep_enough() {
        let st = state();
        let b = batch(BatchStatus::Signed);
        let mut i = inputs(&st, Some(&b));
        i.hub = Some(HubView {
            settled_at: Some(50),
            tip: 51,
        });
        assert_eq!(decide(&i), Step::SettledShallow);
        i.hub = Some(HubView {
            settled_at: Some(50),
            tip: 52,
        });
        assert_eq!(decide(&i), Step::Settled);
        // Settled wins over a passed deadline and over a failed attempt.
        i.now_unix = 2_000;
        assert_eq!(decide(&i), Step::Settled);
        let mut failed = state();
        failed.failed_attempt = 1;
        let mut j = inputs(&failed, Some(&b));
        j.hub = i.hub;
        assert_eq!(decide(&j), Step::Settled);
    }

    #[test]
    fn the_deadline_fails_an_unsettled_attempt() {
        let st = state();
        let b = batch(BatchStatus::Pending);
        let mut i = inputs(&st, Some(&b));
        i.now_unix = 1_029;
        assert_eq!(decide(&i), Step::Idle);
        i.now_unix = 1_030;
        assert_eq!(decide(&i), Step::DeadlinePassed { elapsed: 30 });
        // Also when the hub cannot be read at all.
        i.hub = None;
        assert_eq!(decide(&i), Step::DeadlinePassed { elapsed: 30 });
    }

    #[test]
    fn a_failed_attempt_waits_for_its_cooldown() {
        let mut st = state();
        st.failed_attempt = 1;
        let b = batch(BatchStatus::Signed);
        let mut i = inputs(&st, Some(&b));
        assert_eq!(decide(&i), Step::Idle);
        i.now_unix = 5_000;
        assert_eq!(decide(&i), Step::Idle);
    }

    #[test]
    fn an_unreadable_hub_does_not_stop_a_submission() {
        let st = state();
        let b = batch(BatchStatus::Signed);
        let mut i = inputs(&st, Some(&b));
        i.hub = None;
        assert_eq!(decide(&i), Step::Submit);
    }
}

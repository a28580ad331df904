//! The closing queue against a model: a plain map of owed entries per
//! window, converted in order, `budget` per block.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use proptest::prelude::*;
use tally_store::{KvRead, MemBackend, Pending};

use crate::block::begin_block;
use crate::genesis::Params;
use crate::keys;
use crate::proto::HubCall;
use crate::state::chain::{oldest_closing, owed_slot, put_owed_slot, put_params, Closing};
use crate::state::sync::{next_call_id, pending_calls};
use crate::types::{Block, Event};

const SECS: u64 = 60;
const CHAIN: &str = "hub";

/// What is owed in one window: (provider, user) -> amount, in key order.
type Owed = BTreeMap<(String, String), u64>;

struct Chain {
    kv: Pending,
    height: u64,
}

impl Chain {
    fn new(budget: u32) -> Self {
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        let p = Params {
            settlement_window_secs: SECS,
            max_close_per_block: budget,
            ..Params::default()
        };
        put_params(&mut kv, &p).unwrap();
        kv.commit(0).unwrap();
        Chain { kv, height: 0 }
    }

    /// Runs one block's start at `time`, uncommitted: its events and how
    /// many hub calls it made.
    fn begin(&mut self, time: u64) -> (Vec<Event>, u64) {
        self.height += 1;
        let before = next_call_id(&self.kv).unwrap();
        let b = Block {
            height: self.height,
            time,
        };
        let events = begin_block(&mut self.kv, &b).unwrap();
        let made = next_call_id(&self.kv).unwrap() - before;
        (events, made)
    }

    /// Runs and commits one block at `time`.
    fn block(&mut self, time: u64) -> (Vec<Event>, u64) {
        let out = self.begin(time);
        self.kv.commit(self.height).unwrap();
        out
    }

    /// The keys the uncommitted block wrote (puts and deletes).
    fn written(&self) -> Vec<Vec<u8>> {
        self.kv.changes().writes.keys().cloned().collect()
    }

    /// Adds `owed` to window `w`, as accepted reports would.
    fn owe(&mut self, w: u64, owed: &Owed) {
        for ((provider, user), amount) in owed {
            let mut slot = owed_slot(&self.kv, w, provider, user).unwrap();
            slot.amount += amount;
            put_owed_slot(&mut self.kv, slot);
        }
        self.height += 1;
        self.kv.commit(self.height).unwrap();
    }

    fn calls(&self) -> Vec<HubCall> {
        pending_calls(&self.kv, CHAIN, None, usize::MAX).unwrap()
    }

    /// What closed windows (before `open`) still owe in state: (window,
    /// provider, user, amount) in key order.
    fn owed_left(&self, open: u64) -> Vec<(u64, String, String, u64)> {
        let rows = self
            .kv
            .scan(keys::OWED, &keys::owed_prefix(open), usize::MAX)
            .unwrap();
        rows.into_iter()
            .map(|(k, v)| {
                let w = u64::from_be_bytes(k[keys::OWED.len()..][..8].try_into().unwrap());
                let (p, u) = keys::parse_owed(&k, w).unwrap();
                (w, p, u, u64::from_be_bytes(v.try_into().unwrap()))
            })
            .collect()
    }

    fn queue_empty(&self) -> bool {
        oldest_closing(&self.kv).unwrap().is_none()
            && self.kv.scan_prefix(keys::OWED, 1).unwrap().is_empty()
    }
}

/// A window's entries not yet converted, in key order.
type Left = VecDeque<((String, String), u64)>;

/// The model: windows waiting in order, each with its entries left.
#[derive(Default)]
struct Model {
    queue: VecDeque<(u64, Left)>,
    calls: Vec<HubCall>,
}

impl Model {
    fn close(&mut self, w: u64, owed: &Owed) {
        if !owed.is_empty() {
            self.queue
                .push_back((w, owed.iter().map(|(k, v)| (k.clone(), *v)).collect()));
        }
    }

    fn owed_left(&self) -> Vec<(u64, String, String, u64)> {
        let mut out = Vec::new();
        for (w, entries) in &self.queue {
            for ((p, u), a) in entries {
                out.push((*w, p.clone(), u.clone(), *a));
            }
        }
        out
    }

    fn step(&mut self, budget: u32) {
        let mut left = budget;
        while left > 0 {
            let Some((w, entries)) = self.queue.front_mut() else {
                return;
            };
            let w = *w;
            match entries.pop_front() {
                Some(((provider, user), amount)) => {
                    self.calls.push(HubCall {
                        id: self.calls.len() as u64 + 1,
                        provider,
                        user,
                        amount,
                        window: w,
                        kind: 0,
                    });
                    left -= 1;
                }
                None => {
                    self.queue.pop_front();
                }
            }
        }
        // A window whose last entry used the last of the budget is done.
        while self.queue.front().is_some_and(|(_, e)| e.is_empty()) {
            self.queue.pop_front();
        }
    }
}

fn owed(entries: &[(&str, &str, u64)]) -> Owed {
    entries
        .iter()
        .map(|(p, u, a)| ((p.to_string(), u.to_string()), *a))
        .collect()
}

fn kinds(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.kind.as_str()).collect()
}

fn attr<'a>(e: &'a Event, key: &str) -> &'a str {
    e.attrs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap()
}

#[test]
fn a_small_window_converts_in_the_block_it_closes_without_a_queue_entry() {
    let mut c = Chain::new(1000);
    c.block(0);
    c.owe(
        0,
        &owed(&[("p2", "u", 5), ("p1", "u2", 3), ("p1", "u1", 7)]),
    );
    let (events, made) = c.begin(SECS);
    // The queue key is never written, not even as a delete.
    assert!(!c.written().contains(&keys::closing(0)));
    c.kv.commit(c.height).unwrap();
    assert_eq!(made, 3);
    assert_eq!(kinds(&events), ["hub_calls_made", "window_converted"]);
    assert_eq!(attr(&events[1], "hub_calls"), "3");
    let got: Vec<_> = c
        .calls()
        .into_iter()
        .map(|h| (h.id, h.provider, h.user, h.amount))
        .collect();
    assert_eq!(
        got,
        [
            (1, "p1".into(), "u1".into(), 7),
            (2, "p1".into(), "u2".into(), 3),
            (3, "p2".into(), "u".into(), 5)
        ]
    );
    assert!(c.queue_empty());
}

#[test]
fn a_large_window_converts_over_blocks_within_the_budget() {
    let mut c = Chain::new(2);
    c.block(0);
    let entries: Vec<_> = (0..5).map(|i| (format!("p{i}"), "u".to_string())).collect();
    let o: Owed = entries.iter().cloned().map(|k| (k, 1)).collect();
    c.owe(0, &o);
    let (_, made) = c.block(SECS);
    assert_eq!(made, 2);
    // The converted entries are gone; the others wait.
    let left: Vec<_> = c.owed_left(1).into_iter().map(|o| o.1).collect();
    assert_eq!(left, ["p2", "p3", "p4"]);
    assert_eq!(
        oldest_closing(&c.kv).unwrap(),
        Some(Closing {
            window: 0,
            calls: 2,
            last: Some(("p1".into(), "u".into())),
        })
    );
    let (_, made) = c.block(SECS + 1);
    assert_eq!(made, 2);
    let (events, made) = c.block(SECS + 2);
    assert_eq!(made, 1);
    assert_eq!(kinds(&events), ["hub_calls_made", "window_converted"]);
    assert_eq!(attr(&events[1], "hub_calls"), "5");
    assert!(c.queue_empty());
    let ids: Vec<_> = c.calls().iter().map(|h| h.id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
}

#[test]
fn a_second_window_waits_behind_the_first_and_a_jump_closes_the_last() {
    let mut c = Chain::new(3);
    c.block(0);
    c.owe(
        0,
        &owed(&[("a", "u", 1), ("b", "u", 1), ("c", "u", 1), ("d", "u", 1)]),
    );
    c.block(SECS); // window 0 closes: a, b, c; d waits
    c.owe(1, &owed(&[("a", "v", 2), ("b", "v", 2), ("c", "v", 2)]));
    // A block five windows later closes window 1 (no block ran between).
    let (events, made) = c.block(6 * SECS);
    assert_eq!(made, 3);
    assert_eq!(
        kinds(&events),
        ["hub_calls_made", "window_converted", "hub_calls_made"]
    );
    assert_eq!(oldest_closing(&c.kv).unwrap().map(|q| q.window), Some(1));
    let (_, made) = c.block(6 * SECS + 1);
    assert_eq!(made, 1);
    assert!(c.queue_empty());
    let got: Vec<_> = c.calls().iter().map(|h| (h.id, h.window)).collect();
    assert_eq!(
        got,
        [(1, 0), (2, 0), (3, 0), (4, 0), (5, 1), (6, 1), (7, 1)]
    );
}

#[test]
fn a_window_closing_while_the_budget_is_spent_waits_in_the_queue() {
    let mut c = Chain::new(2);
    c.block(0);
    c.owe(
        0,
        &owed(&[("a", "u", 1), ("b", "u", 1), ("c", "u", 1), ("d", "u", 1)]),
    );
    c.block(SECS);
    c.owe(1, &owed(&[("a", "v", 2)]));
    let (_, made) = c.block(2 * SECS); // a, b of 0 earlier; c, d now
    assert_eq!(made, 2);
    assert_eq!(
        oldest_closing(&c.kv).unwrap(),
        Some(Closing::new(1)),
        "window 1 waits in the queue"
    );
    let (_, made) = c.block(2 * SECS + 1);
    assert_eq!(made, 1);
    assert!(c.queue_empty());
}

#[test]
fn a_block_with_nothing_to_convert_writes_only_what_it_always_wrote() {
    let mut c = Chain::new(5);
    c.block(0);
    // A window that owes nothing closes: no queue entry, no call id.
    c.begin(SECS);
    assert_eq!(
        c.written(),
        [
            keys::CUR_WINDOW.to_vec(),
            keys::LAST_HEIGHT.to_vec(),
            keys::LAST_TIME.to_vec()
        ]
    );
    assert!(c.kv.changes().ranges.is_empty());
    c.kv.commit(c.height).unwrap();
    // Work done, queue empty: a later block in the same window.
    c.owe(1, &owed(&[("a", "u", 1)]));
    c.block(2 * SECS);
    c.begin(2 * SECS + 1);
    assert_eq!(
        c.written(),
        [keys::LAST_HEIGHT.to_vec(), keys::LAST_TIME.to_vec()]
    );
    assert!(c.kv.changes().ranges.is_empty());
}

/// One window of the run: what is owed in it, how many more blocks run in
/// it after the one that opened it, and how many windows later the next
/// block comes.
fn window_spec() -> impl Strategy<Value = (Owed, u64, u64)> {
    let key = ("p[a-c]{1,2}", "u[a-c]{0,2}");
    (
        proptest::collection::btree_map(key, 1u64..1000, 0..12),
        0u64..3,
        1u64..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn conversion_matches_the_model(
        budget in 1u32..6,
        windows in proptest::collection::vec(window_spec(), 1..5),
    ) {
        let mut c = Chain::new(budget);
        let mut m = Model::default();
        let mut w = 0u64;
        c.block(0);
        let mut all: BTreeMap<(String, String, u64), u64> = BTreeMap::new();
        for (owed, extra_blocks, gap) in &windows {
            c.owe(w, owed);
            for ((p, u), a) in owed {
                all.insert((u.clone(), p.clone(), w), *a);
            }
            for i in 0..*extra_blocks {
                let (_, made) = c.block(w * SECS + 1 + i);
                prop_assert!(made <= u64::from(budget));
                m.step(budget);
                prop_assert_eq!(c.calls(), m.calls.clone());
                prop_assert_eq!(c.owed_left(w), m.owed_left());
            }
            let closed = w;
            w += gap;
            let (_, made) = c.block(w * SECS);
            prop_assert!(made <= u64::from(budget));
            m.close(closed, owed);
            m.step(budget);
            prop_assert_eq!(c.calls(), m.calls.clone());
            prop_assert_eq!(c.owed_left(w), m.owed_left());
        }
        // Drain the backlog in the last window.
        let total = all.len() as u64;
        for i in 0..=total / u64::from(budget) + 1 {
            let (_, made) = c.block(w * SECS + 1 + i);
            prop_assert!(made <= u64::from(budget));
            m.step(budget);
            prop_assert_eq!(c.calls(), m.calls.clone());
        }
        prop_assert!(c.queue_empty());
        prop_assert!(m.queue.is_empty());
        let calls = c.calls();
        prop_assert_eq!(calls.len() as u64, total);
        let ids: Vec<u64> = calls.iter().map(|h| h.id).collect();
        prop_assert_eq!(ids, (1..=total).collect::<Vec<_>>());
        // Ids follow (window, provider, user) order, and every owed entry
        // is exactly one call of the same amount.
        let order: Vec<_> = calls
            .iter()
            .map(|h| (h.window, h.provider.clone(), h.user.clone()))
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        prop_assert_eq!(order, sorted);
        let got: BTreeMap<_, _> = calls
            .into_iter()
            .map(|h| ((h.user, h.provider, h.window), h.amount))
            .collect();
        prop_assert_eq!(got, all);
    }
}

//! The relay's hand-ins: what it observed on the hub, waiting for this
//! validator's next vote extensions to sign while the chain waits for it.
//!
//! One typed entry, [`HandIn`], through `TallyApp::hand_in`. The inbox
//! keeps at most [`MAX_HELD`] items of each kind (the oldest go first),
//! never the same one twice, and drops hub blocks the chain's deposit
//! cursor has moved past (an earlier range, or an earlier part of a range
//! split into several messages).

use tally_settlement::proto::{HubBlock, HubResult};
use tally_settlement::sync::{Bodies, HubCursor};

/// Most items of each kind the inbox holds.
pub const MAX_HELD: usize = 64;

/// Something the relay observed on the hub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandIn {
    /// The hub's outcome of one attempt of the current batch.
    Result(HubResult),
    /// A finalized hub block range with its deposits.
    Block(HubBlock),
}

impl From<HubResult> for HandIn {
    fn from(r: HubResult) -> Self {
        HandIn::Result(r)
    }
}

impl From<HubBlock> for HandIn {
    fn from(b: HubBlock) -> Self {
        HandIn::Block(b)
    }
}

/// Hand-ins waiting to be signed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inbox {
    results: Vec<HubResult>,
    blocks: Vec<HubBlock>,
}

impl Inbox {
    /// Adds `item` unless already held. For a hub block, `cursor` is the
    /// chain's deposit cursor for that hub (if it could be read): held
    /// blocks it has moved past are dropped first.
    pub fn put(&mut self, item: HandIn, cursor: Option<HubCursor>) {
        match item {
            HandIn::Result(r) => push_bounded(&mut self.results, r),
            HandIn::Block(b) => {
                if let Some(c) = cursor {
                    self.blocks.retain(|x| {
                        let first = x.deposits.first().map_or(u64::MAX, |d| d.seq);
                        x.from_height > c.height
                            || (x.from_height == c.height && first >= c.deposit_seq)
                    });
                }
                push_bounded(&mut self.blocks, b);
            }
        }
    }

    /// Hub results held, oldest first.
    pub fn results(&self) -> &[HubResult] {
        &self.results
    }

    /// Hub blocks held, oldest first.
    pub fn blocks(&self) -> &[HubBlock] {
        &self.blocks
    }

    /// Every body held, by digest: what this node's proposals can carry.
    pub fn bodies(&self) -> Bodies {
        let mut b = Bodies::default();
        for r in &self.results {
            b.add_result(r.clone());
        }
        for x in &self.blocks {
            b.add_block(x.clone());
        }
        b
    }
}

/// Appends `item` if new, then drops the oldest beyond [`MAX_HELD`].
fn push_bounded<T: PartialEq>(held: &mut Vec<T>, item: T) {
    if !held.contains(&item) {
        held.push(item);
    }
    let excess = held.len().saturating_sub(MAX_HELD);
    held.drain(..excess);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(nonce: u64) -> HubResult {
        HubResult {
            chain: "hub".into(),
            nonce,
            attempt: 1,
            settled: true,
        }
    }

    fn cur(height: u64) -> Option<HubCursor> {
        Some(HubCursor {
            height,
            deposit_seq: 1,
        })
    }

    fn block(from: u64) -> HubBlock {
        HubBlock {
            chain: "hub".into(),
            from_height: from,
            to_height: from + 9,
            deposits: Vec::new(),
            more: false,
            deposit_count: 0,
        }
    }

    #[test]
    fn holds_each_item_once_and_at_most_max_held() {
        let mut inbox = Inbox::default();
        inbox.put(result(1).into(), None);
        inbox.put(result(1).into(), None);
        assert_eq!(inbox.results(), &[result(1)]);
        for n in 2..=(MAX_HELD as u64 + 5) {
            inbox.put(HandIn::Result(result(n)), None);
        }
        assert_eq!(inbox.results().len(), MAX_HELD);
        assert_eq!(inbox.results().first(), Some(&result(6)));
        assert!(inbox.blocks().is_empty());
    }

    #[test]
    fn drops_blocks_the_cursor_moved_past() {
        let mut inbox = Inbox::default();
        inbox.put(block(1).into(), cur(1));
        inbox.put(block(11).into(), cur(1));
        assert_eq!(inbox.blocks().len(), 2);
        inbox.put(block(21).into(), cur(11));
        assert_eq!(inbox.blocks(), &[block(11), block(21)]);
        // An unreadable cursor keeps what is held.
        inbox.put(block(31).into(), None);
        assert_eq!(inbox.blocks().len(), 3);
    }

    #[test]
    fn drops_parts_of_a_split_range_already_credited() {
        let part = |first: u64, more: bool| HubBlock {
            chain: "hub".into(),
            from_height: 11,
            to_height: 20,
            deposits: (first..first + 2)
                .map(|seq| tally_settlement::proto::HubDeposit {
                    seq,
                    user: "u".into(),
                    amount: 1,
                    pubkey: Vec::new(),
                })
                .collect(),
            more,
            deposit_count: 12,
        };
        let mut inbox = Inbox::default();
        let at = |seq| {
            Some(HubCursor {
                height: 11,
                deposit_seq: seq,
            })
        };
        inbox.put(part(5, true).into(), at(5));
        inbox.put(part(7, false).into(), at(7));
        // The first part was credited (cursor at seq 7): only the second stays.
        assert_eq!(inbox.blocks(), &[part(7, false)]);
    }
}

//! The mempool's view of report ids: which (gateway, report id) pairs a
//! transaction waiting in the mempool already uses.
//!
//! Committed state refuses a report whose id its gateway already used
//! (code 7), but only once the first one commits. Until then anyone can
//! gossip byte variants of one valid report, and every variant would pass
//! CheckTx. This set closes that gap: a transaction that passes CheckTx
//! claims its report's scope (gateway key and report id) with the hash of
//! its bytes; another transaction claiming the same scope with other bytes
//! is refused with code 26 `report_pending`, the same bytes again are
//! accepted (CometBFT's own cache usually stops those first).
//!
//! The set is cleared at every Commit: CometBFT then re-checks every
//! transaction still in the mempool (`recheck = true`, its default, with
//! the mempool locked), which claims their scopes again, while the ones
//! the block included are now refused by committed state. Claims also
//! lapse at the report's expiry. The set is capped at [`MAX_CLAIMS`]
//! entries (far above CometBFT's mempool size); past that a new report is
//! refused until the next commit.
//!
//! # Room in the mempool
//!
//! CometBFT checks that its mempool has room twice: before it sends a
//! transaction to CheckTx, and again when the answer comes back. A
//! transaction the app accepted but that finds the mempool full at the
//! second check is dropped without a word: the RPC caller, even with
//! `broadcast_tx_sync`, has already been told code 0, and only CometBFT's
//! `mempool_rejected_txs` counter moves. At saturation that was 2,252 and
//! 5,252 accepted reports in 10-second steps (`tally-bench network`).
//!
//! So the app keeps its own count of what it let into the mempool since the
//! last commit, [`Claims::admit`], and refuses a new transaction with code
//! 39 `mempool_full` once that count reaches CometBFT's limits
//! ([`MempoolLimit`], read from `[mempool]` of the node's `config.toml`).
//! CometBFT adds accepted transactions in the order the answers arrive, so
//! when the app accepts one, the mempool holds at most the count before it,
//! below the limit, and the second check always passes. The count is right
//! because CometBFT locks the mempool for Commit and the recheck after it:
//! the count is reset at Commit, and every transaction still in the mempool
//! is rechecked (and counted again) before any new one is checked. It can
//! overcount (a copy CometBFT then throws away as already held), which
//! refuses early until the next block, never loses; the one way it can
//! undercount is a recheck refusal answered after CometBFT's
//! `recheck_timeout`, which CometBFT ignores (ADR 0023). With `recheck = false`
//! nothing is rechecked and the count would undercount, so then no limit is
//! kept (the node warns at start).

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tally_settlement::{Code, Rejection};

/// Most scopes claimed at once.
pub const MAX_CLAIMS: usize = 100_000;

/// CometBFT's mempool limits (`[mempool] size` and `max_txs_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MempoolLimit {
    /// Most transactions.
    pub txs: usize,
    /// Most bytes of transactions.
    pub bytes: u64,
}

impl Default for MempoolLimit {
    /// CometBFT v0.38's defaults.
    fn default() -> Self {
        MempoolLimit {
            txs: 5000,
            bytes: 1 << 30,
        }
    }
}

/// Report scopes claimed by transactions in the mempool.
#[derive(Debug, Default)]
pub struct Claims {
    by_scope: HashMap<Vec<u8>, Claim>,
    /// One-per-block scopes (a validator's message kind, a user's allowance
    /// changes) of transactions waiting, with their bytes' hash.
    once: HashMap<Vec<u8>, [u8; 32]>,
    /// The limits new transactions are kept under (none: no limit).
    limit: Option<MempoolLimit>,
    /// Transactions accepted (checked or rechecked) since the last commit.
    held_txs: usize,
    /// Their bytes.
    held_bytes: u64,
}

#[derive(Debug)]
struct Claim {
    tx_hash: [u8; 32],
    expires_at: u64,
}

impl Claims {
    /// Claims `scope` for the transaction `tx` (expiring at `expires_at`),
    /// at last-block time `now`; refuses another transaction's claim.
    pub fn claim(
        &mut self,
        scope: &[u8],
        expires_at: u64,
        tx: &[u8],
        now: u64,
    ) -> Result<(), Rejection> {
        let tx_hash: [u8; 32] = Sha256::digest(tx).into();
        if let Some(c) = self.by_scope.get(scope) {
            if c.tx_hash == tx_hash || c.expires_at <= now {
                self.by_scope.remove(scope);
            } else {
                return Err(Rejection::new(
                    Code::ReportPending,
                    format!(
                        "another transaction with this gateway's report id {} is waiting in the mempool",
                        hex::encode(scope.get(32..).unwrap_or_default())
                    ),
                ));
            }
        }
        if self.by_scope.len() >= MAX_CLAIMS {
            self.by_scope.retain(|_, c| c.expires_at > now);
            if self.by_scope.len() >= MAX_CLAIMS {
                return Err(Rejection::new(
                    Code::ReportPending,
                    format!("{MAX_CLAIMS} reports are waiting in the mempool; retry after the next block"),
                ));
            }
        }
        self.by_scope.insert(
            scope.to_vec(),
            Claim {
                tx_hash,
                expires_at,
            },
        );
        Ok(())
    }

    /// Claims the one-per-block `scope` (settlement's `block_scope`) for
    /// `tx`: a second transaction of that scope while one waits is refused
    /// (code 34); the same bytes again pass.
    pub fn claim_once(&mut self, scope: &[u8], tx: &[u8]) -> Result<(), Rejection> {
        let tx_hash: [u8; 32] = Sha256::digest(tx).into();
        match self.once.get(scope) {
            Some(h) if *h != tx_hash => Err(Rejection::new(
                Code::TxPending,
                "a transaction of this validator and kind (or this user's allowance change) is already waiting in the mempool: one per block; retry after it lands",
            )),
            Some(_) => Ok(()),
            None if self.once.len() >= MAX_CLAIMS => Err(Rejection::new(
                Code::TxPending,
                format!("{MAX_CLAIMS} such transactions are waiting in the mempool; retry after the next block"),
            )),
            None => {
                self.once.insert(scope.to_vec(), tx_hash);
                Ok(())
            }
        }
    }

    /// Keeps new transactions under `limit` (`None`: no limit).
    pub fn set_limit(&mut self, limit: Option<MempoolLimit>) {
        self.limit = limit;
    }

    /// Refuses (code 39) a new transaction of `len` bytes when the mempool
    /// has no room for it by the app's count.
    pub fn room_for(&self, len: usize) -> Result<(), Rejection> {
        let Some(l) = self.limit else { return Ok(()) };
        if self.held_txs >= l.txs {
            return Err(Rejection::new(
                Code::MempoolFull,
                format!(
                    "this node's mempool holds {} transactions, its limit ([mempool] size); send again after the next block",
                    l.txs
                ),
            ));
        }
        if self.held_bytes.saturating_add(len as u64) > l.bytes {
            return Err(Rejection::new(
                Code::MempoolFull,
                format!(
                    "this node's mempool holds {} bytes of transactions, and {len} more would pass its limit ([mempool] max_txs_bytes {}); send again after the next block",
                    self.held_bytes, l.bytes
                ),
            ));
        }
        Ok(())
    }

    /// Counts a transaction of `len` bytes that CheckTx (or a recheck)
    /// accepted: CometBFT keeps it in the mempool.
    pub fn admit(&mut self, len: usize) {
        self.held_txs = self.held_txs.saturating_add(1);
        self.held_bytes = self.held_bytes.saturating_add(len as u64);
    }

    /// Transactions and bytes counted since the last commit.
    pub fn held(&self) -> (usize, u64) {
        (self.held_txs, self.held_bytes)
    }

    /// Forgets every claim and the count (at Commit; rechecks claim and
    /// count again).
    pub fn clear(&mut self) {
        self.by_scope.clear();
        self.once.clear();
        self.held_txs = 0;
        self.held_bytes = 0;
    }

    /// Number of claims.
    pub fn len(&self) -> usize {
        self.by_scope.len()
    }

    /// Whether nothing is claimed.
    pub fn is_empty(&self) -> bool {
        self.by_scope.is_empty()
    }
}

// ok: unwraps below are in unit tests only, never on a request path.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variant_is_refused_the_same_bytes_are_not() {
        let mut c = Claims::default();
        let scope = [7u8; 48];
        c.claim(&scope, 100, b"tx-a", 10).unwrap(); // ok: unit test
        c.claim(&scope, 100, b"tx-a", 10).unwrap(); // ok: unit test
        let e = c.claim(&scope, 100, b"tx-b", 10).unwrap_err(); // ok: unit test
        assert_eq!(e.code, Code::ReportPending);
        // Another gateway's scope with the same id is independent.
        let mut other = scope;
        other[0] = 8;
        c.claim(&other, 100, b"tx-b", 10).unwrap(); // ok: unit test
        assert_eq!(c.len(), 2);
        // After expiry the scope is free; after a commit too.
        c.claim(&scope, 200, b"tx-b", 100).unwrap(); // ok: unit test
        c.clear();
        c.claim(&scope, 300, b"tx-c", 100).unwrap(); // ok: unit test
    }

    #[test]
    fn the_count_refuses_at_the_limit_and_restarts_at_commit() {
        let mut c = Claims::default();
        // No limit: always room.
        for _ in 0..10 {
            c.admit(100);
        }
        assert!(c.room_for(usize::MAX).is_ok());
        c.clear();
        c.set_limit(Some(MempoolLimit { txs: 3, bytes: 250 }));
        // Three 80-byte transactions fit (240 <= 250); a fourth does not,
        // by count; a 20-byte one would not either.
        for _ in 0..3 {
            assert!(c.room_for(80).is_ok());
            c.admit(80);
        }
        assert_eq!(c.held(), (3, 240));
        assert_eq!(c.room_for(1).unwrap_err().code, Code::MempoolFull); // ok: unit test
        c.clear();
        // Bytes: 200 fits, then 51 more would pass 250, 50 would not.
        c.admit(200);
        assert_eq!(c.room_for(51).unwrap_err().code, Code::MempoolFull); // ok: unit test
        assert!(c.room_for(50).is_ok());
        c.clear();
        assert_eq!(c.held(), (0, 0));
        assert!(c.room_for(250).is_ok());
    }

    #[test]
    fn one_transaction_per_block_scope_waits_at_a_time() {
        let mut c = Claims::default();
        c.claim_once(b"validator/k\x02", b"ack-1").unwrap(); // ok: unit test
        c.claim_once(b"validator/k\x02", b"ack-1").unwrap(); // ok: unit test
        let e = c.claim_once(b"validator/k\x02", b"ack-2").unwrap_err(); // ok: unit test
        assert_eq!(e.code, Code::TxPending);
        c.claim_once(b"validator/k\x03", b"reveal").unwrap(); // ok: unit test
        c.clear();
        c.claim_once(b"validator/k\x02", b"ack-2").unwrap(); // ok: unit test
    }
}

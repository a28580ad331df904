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

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tally_settlement::{Code, Rejection};

/// Most scopes claimed at once.
pub const MAX_CLAIMS: usize = 100_000;

/// Report scopes claimed by transactions in the mempool.
#[derive(Debug, Default)]
pub struct Claims {
    by_scope: HashMap<Vec<u8>, Claim>,
    /// One-per-block scopes (a validator's message kind, a user's allowance
    /// changes) of transactions waiting, with their bytes' hash.
    once: HashMap<Vec<u8>, [u8; 32]>,
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

    /// Forgets every claim (at Commit; rechecks claim again).
    pub fn clear(&mut self) {
        self.by_scope.clear();
        self.once.clear();
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

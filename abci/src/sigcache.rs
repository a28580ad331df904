//! Envelope signatures this node verified (reports, allowance changes,
//! validator messages: every kind the one opener
//! `tally_settlement::envelope::open` opens), so that a transaction is
//! ed25519-checked once per node rather than at CheckTx, at every mempool
//! recheck after a block, and again in FinalizeBlock.
//!
//! The set holds signature ids (`tally_settlement::envelope::signature_id`:
//! a hash of the signing domain, the key, the signature and the body's
//! hash) of signatures that verified; a known id answers "verifies"
//! without the curve arithmetic. Nothing else is skipped: registration,
//! expiry, replay and every state check run each time. Since an id can only get in by
//! verifying, a node with the set decides exactly as a node without it
//! would, so app hashes cannot depend on it. Bounded to [`CAPACITY`] ids
//! (oldest forgotten first): about 6 MB.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use tally_settlement::VerifiedSignatures;

/// Most signature ids remembered (far above a mempool's worth).
pub const CAPACITY: usize = 65_536;

/// A bounded set of verified signature ids, shared by the mempool and
/// consensus connections.
#[derive(Debug, Default)]
pub struct SignatureCache {
    inner: Mutex<Ids>,
}

#[derive(Debug, Default)]
struct Ids {
    set: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl SignatureCache {
    /// Number of ids held.
    pub fn len(&self) -> usize {
        self.lock().set.len()
    }

    /// Whether no id is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ids> {
        // A panic while holding the lock leaves a consistent set (each
        // operation is one insert or remove pair): keep using it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl VerifiedSignatures for SignatureCache {
    fn contains(&self, id: &[u8; 32]) -> bool {
        self.lock().set.contains(id)
    }

    fn insert(&self, id: [u8; 32]) {
        let mut ids = self.lock();
        if !ids.set.insert(id) {
            return;
        }
        ids.order.push_back(id);
        while ids.order.len() > CAPACITY {
            if let Some(old) = ids.order.pop_front() {
                ids.set.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_up_to_capacity_and_forgets_the_oldest_first() {
        let c = SignatureCache::default();
        let id = |i: usize| {
            let mut b = [0u8; 32];
            b[..8].copy_from_slice(&(i as u64).to_le_bytes());
            b
        };
        for i in 0..CAPACITY + 10 {
            c.insert(id(i));
        }
        c.insert(id(CAPACITY + 5)); // again: no second entry
        assert_eq!(c.len(), CAPACITY);
        assert!(!c.contains(&id(0)) && !c.contains(&id(9)));
        assert!(c.contains(&id(10)) && c.contains(&id(CAPACITY + 9)));
    }
}

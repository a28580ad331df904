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
//!
//! It also keeps the compressed G1 points this node validated
//! (`tally_settlement::envelope::parse_public_key_with`: a DKG dealing's
//! commitment and ephemeral keys), each with the point it parsed to, so
//! that the dealing block's FinalizeBlock does not decompress and
//! subgroup-check again the points CheckTx already checked (at n = 100 a
//! dealing holds 167 of them, each some tens of µs of curve arithmetic).
//! Keyed by the exact 48 bytes; only points that validated get in, so a
//! node with the memory decides as a node without it. Bounded to
//! [`POINT_CAPACITY`] points (oldest forgotten first): about 6 MB.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use tally_settlement::bls::PublicKey;
use tally_settlement::VerifiedSignatures;

/// Most signature ids remembered (far above a mempool's worth).
pub const CAPACITY: usize = 65_536;

/// Most validated G1 points remembered: 7 · 4096, the most a table of
/// 32,768 slots holds, and more than one ceremony's dealings at 128
/// validators (128 · (86 + 128) = 27,392 points).
pub const POINT_CAPACITY: usize = 28_672;

/// A bounded set of verified signature ids and validated G1 points, shared
/// by the mempool and consensus connections.
#[derive(Debug, Default)]
pub struct SignatureCache {
    inner: Mutex<Ids>,
    points: Mutex<Points>,
}

#[derive(Debug, Default)]
struct Ids {
    set: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

#[derive(Debug, Default)]
struct Points {
    map: HashMap<[u8; 48], PublicKey>,
    order: VecDeque<[u8; 48]>,
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

    /// Number of validated points held.
    pub fn points(&self) -> usize {
        self.lock_points().map.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ids> {
        // A panic while holding the lock leaves a consistent set (each
        // operation is one insert or remove pair): keep using it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_points(&self) -> std::sync::MutexGuard<'_, Points> {
        // As `lock`: each operation is one insert or remove pair.
        self.points.lock().unwrap_or_else(|e| e.into_inner())
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

    fn valid_point(&self, bytes: &[u8]) -> Option<PublicKey> {
        let key: &[u8; 48] = bytes.try_into().ok()?;
        self.lock_points().map.get(key).copied()
    }

    fn insert_valid_point(&self, bytes: &[u8], point: &PublicKey) {
        // Only the compressed form (what honest dealers send) is kept.
        let Ok(key) = <[u8; 48]>::try_from(bytes) else {
            return;
        };
        let mut points = self.lock_points();
        if points.map.contains_key(&key) {
            return;
        }
        // Room first, so the table never grows past its bound.
        while points.order.len() >= POINT_CAPACITY {
            match points.order.pop_front() {
                Some(old) => points.map.remove(&old),
                None => break,
            };
        }
        points.map.insert(key, *point);
        points.order.push_back(key);
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

    /// Valid G1 points from `i` (distinct for distinct `i`).
    fn point(i: usize) -> ([u8; 48], PublicKey) {
        let mut ikm = [7u8; 32];
        ikm[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let pk = tally_settlement::dkg::crypto::EncKey::from_ikm(&ikm)
            .unwrap()
            .public();
        (pk.compress(), pk)
    }

    #[test]
    fn points_answer_only_for_their_exact_48_bytes() {
        let c = SignatureCache::default();
        let (bytes, pk) = point(1);
        assert_eq!(c.valid_point(&bytes), None);
        c.insert_valid_point(&bytes, &pk);
        assert_eq!(c.valid_point(&bytes), Some(pk));
        // Another point, a prefix, a longer string with the same start:
        // nothing.
        assert_eq!(c.valid_point(&point(2).0), None);
        assert_eq!(c.valid_point(&bytes[..47]), None);
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert_eq!(c.valid_point(&longer), None);
        let mut flipped = bytes;
        flipped[47] ^= 1;
        assert_eq!(c.valid_point(&flipped), None);
        // The 96-byte form is valid too but not kept.
        c.insert_valid_point(&pk.serialize(), &pk);
        assert_eq!(c.valid_point(&pk.serialize()), None);
        assert_eq!(c.points(), 1);
    }

    #[test]
    fn points_are_bounded_and_forget_the_oldest_first() {
        let c = SignatureCache::default();
        // Distinct keys, one point (the bound counts keys, not points).
        let (_, pk) = point(0);
        let key = |i: usize| {
            let mut b = [0u8; 48];
            b[..8].copy_from_slice(&(i as u64).to_le_bytes());
            b
        };
        for i in 0..POINT_CAPACITY + 10 {
            c.insert_valid_point(&key(i), &pk);
        }
        c.insert_valid_point(&key(POINT_CAPACITY + 5), &pk);
        assert_eq!(c.points(), POINT_CAPACITY);
        assert!(c.valid_point(&key(9)).is_none());
        assert!(c.valid_point(&key(10)).is_some());
        assert!(c.valid_point(&key(POINT_CAPACITY + 9)).is_some());
    }
}

//! The signed-message layouts the oracles need, written from
//! `docs/signing.md` alone (section 2, the signed message; 3.2, the hub
//! result digest; 3.3, the hub block digest) with SHA-256 from `sha2`, not
//! from `tally_settlement::sync` or `tally_settlement::bls`. If the code's
//! layout drifts from the doc, the pool's messages stop being the ones the
//! chain waits for and every target that signs them fails.

use sha2::{Digest, Sha256};
use tally_settlement::proto::{HubBlock, HubResult};

/// Message kinds (signing.md section 2): 1 batch, 2 hub result, 3 hub block.
pub const KINDS: std::ops::RangeInclusive<u32> = 1..=3;

/// `put_str(s) = u8(len(s)) || s`, the length clamped to 255 (section 3).
fn put_str(h: &mut Sha256, s: &str) {
    let b = s.as_bytes();
    let n = b.len().min(255);
    h.update([n as u8]);
    h.update(&b[..n]);
}

/// Section 3.2: `SHA-256("tally/hub-result/v1" || put_str(hub_chain) ||
/// u64(nonce) || u32(attempt) || u8(settled))`.
pub fn result_digest(r: &HubResult) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tally/hub-result/v1");
    put_str(&mut h, &r.chain);
    h.update(r.nonce.to_be_bytes());
    h.update(r.attempt.to_be_bytes());
    h.update([u8::from(r.settled)]);
    h.finalize().into()
}

/// Section 3.3: `SHA-256("tally/hub-block/v3" || put_str(hub_chain) ||
/// u64(from_height) || u64(to_height) || u8(more) || u64(deposit_count) ||
/// u64(number of deposits) || each: u64(seq) || put_str(user) ||
/// u64(amount))`.
pub fn block_digest(b: &HubBlock) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tally/hub-block/v3");
    put_str(&mut h, &b.chain);
    h.update(b.from_height.to_be_bytes());
    h.update(b.to_height.to_be_bytes());
    h.update([u8::from(b.more)]);
    h.update(b.deposit_count.to_be_bytes());
    h.update((b.deposits.len() as u64).to_be_bytes());
    for d in &b.deposits {
        h.update(d.seq.to_be_bytes());
        put_str(&mut h, &d.user);
        h.update(d.amount.to_be_bytes());
    }
    h.finalize().into()
}

/// Section 2: `"tally/v1" || u8(len(chain_id)) || chain_id || u8(kind) ||
/// payload`, the bytes every partial signs.
pub fn message(chain_id: &str, kind: u32, digest: &[u8; 32]) -> Vec<u8> {
    let id = &chain_id.as_bytes()[..chain_id.len().min(255)];
    let mut m = b"tally/v1".to_vec();
    m.push(id.len() as u8);
    m.extend_from_slice(id);
    m.push(kind as u8);
    m.extend_from_slice(digest);
    m
}

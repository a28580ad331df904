//! The 32-byte digests validators threshold-sign: a batch of hub calls, a
//! hub result, a hub block's deposits, a key rotation. Layouts in `docs/signing.md`; the
//! hub recomputes the batch digest, so these bytes are a wire format.
//!
//! Pure functions of their input; imports only the protobuf types.

use sha2::{Digest, Sha256};

use crate::proto::{HubBlock, HubCall, HubResult};

/// The digest validators sign for a batch: layout v1 when every call
/// pays a provider (kind 0), else v2, which adds each call's kind (ADR
/// 0020), so a batch of payments signs the same bytes it always did.
pub fn batch_digest(chain: &str, nonce: u64, calls: &[HubCall]) -> [u8; 32] {
    let v2 = calls.iter().any(|c| c.kind != 0);
    let mut h = Sha256::new();
    h.update(if v2 {
        b"tally/batch/v2"
    } else {
        b"tally/batch/v1"
    });
    put_str(&mut h, chain);
    h.update(nonce.to_be_bytes());
    h.update((calls.len() as u64).to_be_bytes());
    for c in calls {
        h.update(c.id.to_be_bytes());
        put_str(&mut h, &c.user);
        put_str(&mut h, &c.provider);
        h.update(c.amount.to_be_bytes());
        h.update(c.window.to_be_bytes());
        if v2 {
            h.update(c.kind.to_be_bytes());
        }
    }
    h.finalize().into()
}

/// The digest validators sign for a hub result.
pub fn result_digest(r: &HubResult) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tally/hub-result/v1");
    put_str(&mut h, &r.chain);
    h.update(r.nonce.to_be_bytes());
    h.update(r.attempt.to_be_bytes());
    h.update([u8::from(r.settled)]);
    h.finalize().into()
}

/// The digest validators sign for a hub block: layout v3 when no deposit
/// carries a key, else v4, which adds to each deposit a byte 0 (no key)
/// or 1 followed by the 32-byte key (ADR 0020).
pub fn block_digest(b: &HubBlock) -> [u8; 32] {
    let v4 = b.deposits.iter().any(|d| !d.pubkey.is_empty());
    let mut h = Sha256::new();
    h.update(if v4 {
        b"tally/hub-block/v4"
    } else {
        b"tally/hub-block/v3"
    });
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
        if v4 {
            h.update([u8::from(!d.pubkey.is_empty())]);
            h.update(&d.pubkey);
        }
    }
    h.finalize().into()
}

/// The digest the outgoing key signs to hand the hub `to` its successor:
/// the hub's name, the rotation's nonce (1, 2, ... per hub), the new
/// key's epoch and its compressed group key.
pub fn rotation_digest(hub: &str, nonce: u64, epoch: u64, group_key: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tally/key-rotation/v1");
    put_str(&mut h, hub);
    h.update(nonce.to_be_bytes());
    h.update(epoch.to_be_bytes());
    h.update((group_key.len() as u64).to_be_bytes());
    h.update(group_key);
    h.finalize().into()
}

/// A string as one length byte and at most 255 bytes.
fn put_str(h: &mut Sha256, s: &str) {
    let b = s.as_bytes();
    let n = b.len().min(255);
    h.update([n as u8]);
    h.update(b.get(..n).unwrap_or(b));
}

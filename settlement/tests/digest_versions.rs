//! The layouts ADR 0020 added, rebuilt from `docs/signing.md` (3.1 batch
//! version 2, 3.3 hub block version 4) with `sha2` alone, against the
//! code; and the rule that decides the version: a batch of payments only
//! and a hub block without keys keep the bytes of the older versions.

use sha2::{Digest, Sha256};
use tally_settlement::proto::{HubBlock, HubCall, HubDeposit};
use tally_settlement::sync::digest::{batch_digest, block_digest};

fn put_str(h: &mut Sha256, s: &str) {
    h.update([s.len() as u8]);
    h.update(s.as_bytes());
}

fn call(id: u64, provider: &str, kind: u32) -> HubCall {
    HubCall {
        id,
        user: "alice".into(),
        provider: provider.into(),
        amount: 10 * id,
        window: 7,
        kind,
    }
}

/// The doc's batch layout, version `v` (1 or 2).
fn doc_batch(v: u8, calls: &[HubCall]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(format!("tally/batch/v{v}").as_bytes());
    put_str(&mut h, "hub");
    h.update(3u64.to_be_bytes());
    h.update((calls.len() as u64).to_be_bytes());
    for c in calls {
        h.update(c.id.to_be_bytes());
        put_str(&mut h, &c.user);
        put_str(&mut h, &c.provider);
        h.update(c.amount.to_be_bytes());
        h.update(c.window.to_be_bytes());
        if v == 2 {
            h.update(c.kind.to_be_bytes());
        }
    }
    h.finalize().into()
}

#[test]
fn a_batch_with_a_withdrawal_is_signed_in_version_2_and_payments_only_in_version_1() {
    let pay = [call(1, "acme", 0), call(2, "beta", 0)];
    assert_eq!(batch_digest("hub", 3, &pay), doc_batch(1, &pay));
    let mixed = [call(1, "acme", 0), call(2, "", 1)];
    assert_eq!(batch_digest("hub", 3, &mixed), doc_batch(2, &mixed));
    assert_ne!(doc_batch(1, &mixed), doc_batch(2, &mixed));
}

fn deposit(seq: u64, pubkey: Vec<u8>) -> HubDeposit {
    HubDeposit {
        seq,
        user: format!("u{seq}"),
        amount: 100 + seq,
        pubkey,
    }
}

/// The doc's hub block layout, version `v` (3 or 4).
fn doc_block(v: u8, b: &HubBlock) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(format!("tally/hub-block/v{v}").as_bytes());
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
        if v == 4 {
            if d.pubkey.is_empty() {
                h.update([0]);
            } else {
                h.update([1]);
                h.update(&d.pubkey);
            }
        }
    }
    h.finalize().into()
}

#[test]
fn a_hub_block_with_a_key_is_signed_in_version_4_and_without_in_version_3() {
    let mut b = HubBlock {
        chain: "hub".into(),
        from_height: 11,
        to_height: 20,
        deposits: vec![deposit(5, Vec::new()), deposit(6, Vec::new())],
        more: false,
        deposit_count: 6,
    };
    assert_eq!(block_digest(&b), doc_block(3, &b));
    b.deposits[1].pubkey = vec![9; 32];
    assert_eq!(block_digest(&b), doc_block(4, &b));
    assert_ne!(doc_block(3, &b), doc_block(4, &b));
}

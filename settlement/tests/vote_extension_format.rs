//! Vote extensions cross an upgrade (ADR 0019): an extension made at H
//! under app version 1 is read at H + 1 under version 2. Their format is
//! frozen: these tests pin the encoding of a `VoteExtension` and of the
//! message a partial signs to bytes written out by hand here, from the
//! protobuf wire rules and `docs/signing.md`, so a change to either fails
//! before it can split an upgrade.

use prost::Message;
use tally_settlement::bls::{message, Kind};
use tally_settlement::proto::{PartialSig, VoteExtension};

fn pinned_extension() -> Vec<u8> {
    // PartialSig: index 1 (08 01), kind 1 (10 01), digest 32 x 0x11
    // (1a 20 ..), signature 96 x 0x22 (22 60 ..), epoch 3 (38 03):
    // 2 + 2 + 34 + 98 + 2 = 138 bytes, the varint 8a 01.
    let mut sig = vec![0x08, 0x01, 0x10, 0x01, 0x1a, 0x20];
    sig.extend([0x11; 32]);
    sig.extend([0x22, 0x60]);
    sig.extend([0x22; 96]);
    sig.extend([0x38, 0x03]);
    assert_eq!(sig.len(), 138);
    // VoteExtension: field 1, length-delimited (0a), length 138.
    let mut ve = vec![0x0a, 0x8a, 0x01];
    ve.extend(sig);
    ve
}

fn extension() -> VoteExtension {
    VoteExtension {
        partials: vec![PartialSig {
            index: 1,
            kind: 1,
            digest: vec![0x11; 32],
            signature: vec![0x22; 96],
            epoch: 3,
        }],
    }
}

#[test]
fn a_vote_extension_encodes_to_the_pinned_bytes() {
    assert_eq!(extension().encode_to_vec(), pinned_extension());
}

#[test]
fn the_pinned_bytes_decode_to_the_same_extension() {
    let decoded = VoteExtension::decode(pinned_extension().as_slice()).expect("decodes");
    assert_eq!(decoded, extension());
}

#[test]
fn a_partial_signs_the_pinned_message() {
    // "tally/v1" || len(chain id) || chain id || kind || payload.
    let mut want = b"tally/v1".to_vec();
    want.push(5);
    want.extend(b"tally");
    want.push(1);
    want.extend([0x33; 32]);
    assert_eq!(message("tally", Kind::Batch, &[0x33; 32]), want);
}

//! Transaction bytes: decoding, telling user transactions (reports,
//! allowances, validator messages) from system transactions (added by the
//! proposer only) without decoding, size bounds of proposed transactions,
//! and encoding system transactions.

use prost::Message;

use crate::codes::Code;
use crate::error::Rejection;
use crate::genesis::Params;
use crate::proto::{tx, SubmitPartials, SyncTxStart, Tx};

/// Field numbers of the `Tx` payload (`proto/tally/v1`).
const FIELD_SYNC_START: u64 = 2;
const FIELD_PARTIALS: u64 = 3;
/// The payload field numbers of system transactions.
pub const SYSTEM_FIELDS: [u64; 2] = [FIELD_SYNC_START, FIELD_PARTIALS];

/// Reads a protobuf varint at `*at`, moving past it.
fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The payload field number of a transaction's envelope and the length of
/// that field, read without decoding anything (no allocation): the last
/// length-delimited top-level field wins, as in protobuf's `oneof`. `None`
/// when the top level is not a sequence of well-formed fields.
pub fn peek_payload(tx: &[u8]) -> Option<(u64, usize)> {
    let mut at = 0usize;
    let mut last = None;
    while at < tx.len() {
        let key = varint(tx, &mut at)?;
        match key & 7 {
            0 => {
                varint(tx, &mut at)?;
            }
            1 => at = at.checked_add(8)?,
            2 => {
                let len = usize::try_from(varint(tx, &mut at)?).ok()?;
                at = at.checked_add(len)?;
                last = Some((key >> 3, len));
            }
            5 => at = at.checked_add(4)?,
            _ => return None,
        }
        if at > tx.len() {
            return None;
        }
    }
    last
}

/// The most bytes an honest system transaction can take under `p` with
/// `signers` share holders at app `version`: a SubmitPartials of
/// `max_block_messages` messages, each with one partial per signer and a
/// full hub-block body; a SyncTxStart of `max_batch_calls` ids. Anything
/// larger is refused by its length before it is decoded.
pub fn system_tx_bound(p: &Params, signers: usize, field: u64, version: u64) -> usize {
    const PARTIAL: usize = 192; // index, kind, 32-byte digest, 96-byte signature, framing
                                // seq, user (<= 64 bytes), amount, framing; from app version 3 a
                                // 32-byte key too (ADR 0020).
    let deposit: usize = if version >= crate::types::GROWTH_VERSION {
        130
    } else {
        96
    };
    const SLACK: usize = 256; // chain name, heights, more, deposit count, framing (~105 bytes)
    let msgs = p.max_block_messages as usize;
    match field {
        FIELD_PARTIALS => msgs.saturating_mul(
            signers
                .saturating_mul(PARTIAL)
                .saturating_add((p.max_block_deposits as usize).saturating_mul(deposit))
                .saturating_add(SLACK),
        ),
        FIELD_SYNC_START => (p.max_batch_calls as usize)
            .saturating_mul(11)
            .saturating_add(SLACK),
        _ => usize::MAX,
    }
}

/// Refuses, by length alone, a proposed transaction over `max_tx_bytes` or
/// a system transaction over [`system_tx_bound`] (at app `version`): a
/// proposer cannot make other validators decode (and allocate for) more
/// than an honest block holds.
pub fn check_proposed_size(
    tx: &[u8],
    p: &Params,
    signers: usize,
    version: u64,
) -> Result<(), Rejection> {
    if tx.len() as u64 > p.max_tx_bytes {
        return Err(Rejection::new(
            Code::TxTooLarge,
            format!(
                "transaction is {} bytes, at most {}",
                tx.len(),
                p.max_tx_bytes
            ),
        ));
    }
    if let Some((field, len)) = peek_payload(tx) {
        let bound = system_tx_bound(p, signers, field, version);
        if len > bound {
            return Err(Rejection::new(
                Code::BadSystemTx,
                format!("system transaction payload is {len} bytes, at most {bound}"),
            ));
        }
    }
    Ok(())
}

/// Decodes a transaction's bytes; a transaction without a payload is
/// malformed.
pub fn decode_tx(tx: &[u8]) -> Result<Tx, Rejection> {
    let decoded = Tx::decode(tx)
        .map_err(|e| Rejection::new(Code::MalformedTx, format!("not a Tally transaction: {e}")))?;
    if decoded.sum.is_none() {
        return Err(Rejection::new(
            Code::MalformedTx,
            "transaction has no payload",
        ));
    }
    Ok(decoded)
}

/// True for transactions only a block proposer may add: the payload field
/// ([`peek_payload`], read without decoding or allocating) is a
/// `SyncTxStart` or a `SubmitPartials`. A user transaction in canonical
/// encoding has its payload as its only field, so this never refuses one;
/// bytes that only look like a system transaction this way (and may not
/// decode at all) are refused as one.
pub fn is_system_tx(tx: &[u8]) -> bool {
    matches!(
        peek_payload(tx),
        Some((FIELD_SYNC_START | FIELD_PARTIALS, _))
    )
}

/// The bytes of a SyncTxStart system transaction.
pub fn encode_sync_start(start: SyncTxStart) -> Vec<u8> {
    Tx {
        sum: Some(tx::Sum::SyncStart(start)),
    }
    .encode_to_vec()
}

/// The bytes of a SubmitPartials system transaction.
pub fn encode_partials(partials: SubmitPartials) -> Vec<u8> {
    Tx {
        sum: Some(tx::Sum::Partials(partials)),
    }
    .encode_to_vec()
}

//! Transaction bytes: decoding, telling user transactions (usage reports)
//! from system transactions (added by the proposer only), and encoding
//! system transactions.

use prost::Message;

use crate::codes::Code;
use crate::error::Rejection;
use crate::proto::{tx, SubmitPartials, SyncTxStart, Tx};

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

/// True for transactions only a block proposer may add.
pub fn is_system_tx(tx: &[u8]) -> bool {
    matches!(
        decode_tx(tx).map(|t| t.sum),
        Ok(Some(tx::Sum::SyncStart(_) | tx::Sum::Partials(_)))
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

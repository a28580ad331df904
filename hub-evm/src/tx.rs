//! EIP-1559 transactions signed with a [`RelayKey`].
//!
//! [`sign`] builds an EIP-1559 (type 2) transaction with an empty access
//! list, signs its signing hash (`keccak256(0x02 || rlp(fields))`) with the
//! relay's key and returns the EIP-2718 bytes `eth_sendRawTransaction`
//! takes, with the transaction's hash (`keccak256` of those bytes), which
//! is what nodes answer and receipts are looked up by.

use alloy_consensus::{SignableTransaction, TxEip1559};
use alloy_primitives::{Address, Bytes, TxKind, B256, U256};
use alloy_signer::SignerSync;

use crate::key::RelayKey;

/// An EIP-1559 transaction before signing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eip1559 {
    /// The chain the transaction is valid on (EIP-155 replay protection).
    pub chain_id: u64,
    /// The sender's account nonce.
    pub nonce: u64,
    /// The most the sender pays per gas, base fee included (wei).
    pub max_fee_per_gas: u128,
    /// The most of that which goes to the block producer (wei).
    pub max_priority_fee_per_gas: u128,
    /// Gas limit.
    pub gas_limit: u64,
    /// The called contract, or `None` to create one (`data` is then its
    /// creation code).
    pub to: Option<Address>,
    /// Wei sent along.
    pub value: U256,
    /// Calldata or creation code.
    pub data: Vec<u8>,
}

/// A signed transaction, ready for `eth_sendRawTransaction`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedTx {
    /// The EIP-2718 encoding: `0x02 || rlp([chain_id, nonce, max
    /// priority fee, max fee, gas limit, to, value, data, access list,
    /// y parity, r, s])`.
    pub raw: Vec<u8>,
    /// `keccak256(raw)`.
    pub hash: B256,
}

/// Why a transaction could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum TxError {
    /// The signer failed (it does not for a valid in-memory key).
    #[error("signing the transaction failed: {0}")]
    Sign(String),
}

/// Signs `tx` with `key`.
pub fn sign(key: &RelayKey, tx: &Eip1559) -> Result<SignedTx, TxError> {
    let unsigned = TxEip1559 {
        chain_id: tx.chain_id,
        nonce: tx.nonce,
        gas_limit: tx.gas_limit,
        max_fee_per_gas: tx.max_fee_per_gas,
        max_priority_fee_per_gas: tx.max_priority_fee_per_gas,
        to: match tx.to {
            Some(a) => TxKind::Call(a),
            None => TxKind::Create,
        },
        value: tx.value,
        access_list: Default::default(),
        input: Bytes::from(tx.data.clone()),
    };
    let sig = key
        .signer()
        .sign_hash_sync(&unsigned.signature_hash())
        .map_err(|e| TxError::Sign(e.to_string()))?;
    let signed = unsigned.into_signed(sig);
    let mut raw = Vec::with_capacity(signed.eip2718_encoded_length());
    signed.eip2718_encode(&mut raw);
    Ok(SignedTx {
        raw,
        hash: *signed.hash(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::keccak256;

    const ANVIL0: &str = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

    fn tx() -> Eip1559 {
        Eip1559 {
            chain_id: 31337,
            nonce: 7,
            max_fee_per_gas: 2_000_000_000,
            max_priority_fee_per_gas: 1_000_000_000,
            gas_limit: 21_000,
            to: Some(Address::repeat_byte(0x11)),
            value: U256::from(5u64),
            data: vec![0xde, 0xad],
        }
    }

    #[test]
    fn a_signed_transaction_is_type_2_hashes_to_its_bytes_and_recovers_the_sender() {
        let key = RelayKey::from_hex(ANVIL0).unwrap();
        let s = sign(&key, &tx()).unwrap();
        assert_eq!(s.raw[0], 0x02);
        assert_eq!(s.hash, keccak256(&s.raw));
        // Decode with alloy's own decoder and recover the signer.
        let mut buf = &s.raw[1..];
        let decoded =
            <TxEip1559 as alloy_consensus::transaction::RlpEcdsaDecodableTx>::rlp_decode_signed(
                &mut buf,
            )
            .unwrap();
        assert_eq!(decoded.tx().nonce, 7);
        assert_eq!(decoded.tx().input.as_ref(), &[0xde, 0xad]);
        let sender = decoded
            .signature()
            .recover_address_from_prehash(&decoded.signature_hash())
            .unwrap();
        assert_eq!(sender, key.address());
        // Deterministic (RFC 6979 nonces): the same transaction signs the
        // same bytes; another nonce signs others.
        assert_eq!(sign(&key, &tx()).unwrap(), s);
        let mut t2 = tx();
        t2.nonce = 8;
        assert_ne!(sign(&key, &t2).unwrap().hash, s.hash);
    }

    #[test]
    fn a_creation_has_an_empty_to() {
        let key = RelayKey::from_hex(ANVIL0).unwrap();
        let mut t = tx();
        t.to = None;
        let s = sign(&key, &t).unwrap();
        let mut buf = &s.raw[1..];
        let decoded =
            <TxEip1559 as alloy_consensus::transaction::RlpEcdsaDecodableTx>::rlp_decode_signed(
                &mut buf,
            )
            .unwrap();
        assert_eq!(decoded.tx().to, TxKind::Create);
    }
}

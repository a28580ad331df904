//! The reference hub's wire types: the transactions a hub accepts
//! ([`HubTx`]: a [`Deposit`] or a [`SubmitBatch`]) and the result codes it
//! answers with ([`HubCode`]).
//!
//! Both sides use this crate: the hub app (`tally-hub`) decodes and executes
//! these transactions, and the relay inside `tallyd` encodes
//! `SubmitBatch` and reads the codes. Keeping them here means `tallyd` does
//! not link the hub's state machine for a handful of message types.

use prost::Message;
use tally_settlement::proto::HubCall;

/// Hub transactions.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HubTx {
    /// What the transaction does.
    #[prost(oneof = "hub_tx::Sum", tags = "1, 2, 3, 4")]
    pub sum: Option<hub_tx::Sum>,
}

/// The kinds of [`HubTx`].
pub mod hub_tx {
    /// The payload.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Sum {
        /// Escrow credits for a user (the localnet faucet).
        #[prost(message, tag = "1")]
        Deposit(super::Deposit),
        /// Settle a batch of the settlement chain.
        #[prost(message, tag = "2")]
        SubmitBatch(super::SubmitBatch),
        /// Replace the settlement chain's group key.
        #[prost(message, tag = "3")]
        RotateKey(super::RotateKey),
        /// Replace the group key by the hub's governors (a recovery).
        #[prost(message, tag = "4")]
        GovernKey(super::GovernKey),
    }
}

impl HubTx {
    /// Whether `tx` decodes as a hub transaction.
    pub fn decode_tx(tx: &[u8]) -> bool {
        matches!(HubTx::decode(tx), Ok(HubTx { sum: Some(_) }))
    }
}

/// A deposit into a user's escrow.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Deposit {
    /// The user (same identifier as on the settlement chain).
    #[prost(string, tag = "1")]
    pub user: String,
    /// Credits.
    #[prost(uint64, tag = "2")]
    pub amount: u64,
    /// Empty, or an ed25519 key the deposit binds to `user` if it is the
    /// one that first funds it (ADR 0020).
    #[prost(bytes = "vec", tag = "3")]
    pub pubkey: Vec<u8>,
}

/// A threshold-signed batch from the settlement chain.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SubmitBatch {
    /// The name the settlement chain gives this hub (its `hub_chain`).
    #[prost(string, tag = "1")]
    pub chain: String,
    /// The batch nonce; must be the last settled + 1.
    #[prost(uint64, tag = "2")]
    pub nonce: u64,
    /// The calls, ascending by id.
    #[prost(message, repeated, tag = "3")]
    pub calls: Vec<HubCall>,
    /// The group signature (96 bytes).
    #[prost(bytes = "vec", tag = "4")]
    pub signature: Vec<u8>,
}

/// A key rotation from the settlement chain: its current group key signs
/// (kind 4, `tally/key-rotation/v1` digest) the key that replaces it.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RotateKey {
    /// The name the settlement chain gives this hub (its `hub_chain`).
    #[prost(string, tag = "1")]
    pub chain: String,
    /// The rotation nonce; must be the last applied + 1.
    #[prost(uint64, tag = "2")]
    pub nonce: u64,
    /// The new key's epoch on the settlement chain.
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    /// The new compressed group key (48 bytes).
    #[prost(bytes = "vec", tag = "4")]
    pub group_key: Vec<u8>,
    /// The current group key's signature (96 bytes).
    #[prost(bytes = "vec", tag = "5")]
    pub signature: Vec<u8>,
}

/// A key the settlement chain made by a *recovery* (its outgoing key could
/// not sign it), accepted by the hub's governors instead: at least
/// `governor_threshold` of the ed25519 keys its genesis lists sign
/// [`govern_message`] for this rotation (ADR 0018).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct GovernKey {
    /// The name the settlement chain gives this hub (its `hub_chain`).
    #[prost(string, tag = "1")]
    pub chain: String,
    /// The rotation nonce; must be the last applied + 1.
    #[prost(uint64, tag = "2")]
    pub nonce: u64,
    /// The new key's epoch on the settlement chain.
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    /// The new compressed group key (48 bytes).
    #[prost(bytes = "vec", tag = "4")]
    pub group_key: Vec<u8>,
    /// The governors' approvals, at most one per governor.
    #[prost(message, repeated, tag = "5")]
    pub approvals: Vec<GovernorApproval>,
}

/// One governor's approval of a [`GovernKey`].
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct GovernorApproval {
    /// The governor's ed25519 public key (32 bytes), as genesis lists it.
    #[prost(bytes = "vec", tag = "1")]
    pub pubkey: Vec<u8>,
    /// ed25519 signature (64 bytes) over [`govern_message`].
    #[prost(bytes = "vec", tag = "2")]
    pub signature: Vec<u8>,
}

/// What a governor signs to accept rotation `nonce` of the chain the hub
/// calls `chain` (settlement chain `settlement_chain_id`): `"tally-hub/
/// govern-key/v1" || 0x00 || len(settlement_chain_id) as one byte ||
/// settlement_chain_id || the rotation digest` (`tally/key-rotation/v1`,
/// the same 32 bytes Tally's validators sign for an ordinary rotation).
pub fn govern_message(
    settlement_chain_id: &str,
    chain: &str,
    nonce: u64,
    epoch: u64,
    group_key: &[u8],
) -> Vec<u8> {
    let id = &settlement_chain_id.as_bytes()[..settlement_chain_id.len().min(255)];
    let mut m = b"tally-hub/govern-key/v1\0".to_vec();
    m.push(id.len() as u8);
    m.extend_from_slice(id);
    m.extend_from_slice(&tally_settlement::sync::rotation_digest(
        chain, nonce, epoch, group_key,
    ));
    m
}

/// Hub result codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum HubCode {
    /// Accepted.
    Ok = 0,
    /// Not a hub transaction.
    Malformed = 1,
    /// The batch (or rotation) signature does not verify against the
    /// group key the hub holds now.
    BadSignature = 2,
    /// The nonce (batch or rotation) is not the next one.
    BadNonce = 3,
    /// This nonce is already settled (or this rotation already applied):
    /// nothing is paid or rotated twice.
    AlreadySettled = 4,
    /// Calls empty, not ascending, or with a bad identifier.
    BadBatch = 5,
    /// The batch names another hub.
    WrongChain = 6,
    /// A deposit of zero, or one that would overflow.
    BadDeposit = 7,
    /// Some user's escrow cannot cover that user's total in the batch: the
    /// whole batch is refused, nothing is paid and the nonce stays open.
    InsufficientEscrow = 8,
    /// A rotation's new group key is not a valid compressed G1 point.
    BadKey = 9,
    /// A governed key without enough valid governor approvals (or on a
    /// hub with no governors).
    NotGoverned = 10,
    /// The node's store failed.
    Internal = 16,
    /// Query: no such path.
    UnknownPath = 20,
    /// Query: a bad argument.
    BadArgument = 21,
    /// Query: nothing there.
    NotFound = 22,
}

impl HubCode {
    /// Every code.
    pub const ALL: [HubCode; 15] = [
        HubCode::Ok,
        HubCode::Malformed,
        HubCode::BadSignature,
        HubCode::BadNonce,
        HubCode::AlreadySettled,
        HubCode::BadBatch,
        HubCode::WrongChain,
        HubCode::BadDeposit,
        HubCode::InsufficientEscrow,
        HubCode::BadKey,
        HubCode::NotGoverned,
        HubCode::Internal,
        HubCode::UnknownPath,
        HubCode::BadArgument,
        HubCode::NotFound,
    ];

    /// The code as it travels in CheckTx/FinalizeBlock results.
    pub fn value(self) -> u32 {
        self as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submit_batch_roundtrips_and_garbage_is_not_a_hub_tx() {
        let tx = HubTx {
            sum: Some(hub_tx::Sum::SubmitBatch(SubmitBatch {
                chain: "hub".into(),
                nonce: 3,
                calls: vec![HubCall::default()],
                signature: vec![7; 96],
            })),
        };
        let bytes = tx.encode_to_vec();
        assert!(HubTx::decode_tx(&bytes));
        assert_eq!(HubTx::decode(bytes.as_slice()).unwrap(), tx);
        assert!(!HubTx::decode_tx(&[0xff, 0xff]));
        assert!(!HubTx::decode_tx(&[]));
    }

    #[test]
    fn codes_are_stable() {
        assert_eq!(HubCode::Ok.value(), 0);
        assert_eq!(HubCode::AlreadySettled.value(), 4);
        assert_eq!(HubCode::InsufficientEscrow.value(), 8);
        assert_eq!(HubCode::Internal.value(), 16);
        assert_eq!(HubCode::NotFound.value(), 22);
    }
}

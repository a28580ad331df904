//! What a revert of the hub contract means: [`Revert::decode`] reads
//! revert data (as a node returns it for a failed `eth_call` or
//! `eth_estimateGas`) as one of the contract's custom errors, Solidity's
//! `Error(string)` or `Panic(uint256)`. The hub's refusals ([`Refusal`])
//! each have a reference-hub result code ([`RefusalCode`], the values of
//! `tally_hub_types::HubCode`):
//!
//! | contract error | [`RefusalCode`] | value |
//! |---|---|---|
//! | `AlreadySettled`, `RotationApplied` | `AlreadySettled` | 4 |
//! | `NonceGap`, `RotationGap` | `BadNonce` | 3 |
//! | `BadSignature` | `BadSignature` | 2 |
//! | `InsufficientEscrow` | `InsufficientEscrow` | 8 |
//! | `BadBatch` | `BadBatch` | 5 |
//! | `BadDeposit` | `BadDeposit` | 7 |
//! | `BadKey` | `BadKey` | 9 |
//! | `NotGovernor` | `NotGoverned` | 10 |
//!
//! `LowGas` is deliberately **not** a [`Refusal`]: the transaction ran out
//! of gas before the signature check could run, so it says nothing about
//! the batch; the answer is to send again with more gas. It is its own
//! [`Revert::LowGas`] variant, which has no code, so no match on codes can
//! take it for `BadSignature`. `NothingToWithdraw` and `TransferFailed`
//! concern a user's own withdrawal, not Tally's messages, and have no code
//! either.

use alloy_primitives::{Address, U256};
use alloy_sol_types::{ContractError, SolInterface};

use super::ITallyHub::ITallyHubErrors as E;

/// One of the hub's refusals of a Tally message or a deposit: the
/// contract looked at the input and said no. Each has a reference-hub
/// code ([`Refusal::code`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Batch `nonce` is at or below the last settled one (`last`).
    #[error("batch {nonce} is already settled (last settled {last})")]
    AlreadySettled {
        /// The batch.
        nonce: u64,
        /// The hub's last settled nonce.
        last: u64,
    },
    /// Batch `nonce` is not the next one (`expected`).
    #[error("batch {nonce} is not the next one ({expected})")]
    NonceGap {
        /// The batch.
        nonce: u64,
        /// The nonce the hub expects.
        expected: u64,
    },
    /// The signature does not verify against the hub's group key.
    #[error("the signature does not verify against the hub's group key")]
    BadSignature,
    /// `user` owes `owed` in the batch but holds `escrow`: nothing paid.
    #[error("user {user} owes {owed} credits in the batch but holds {escrow}")]
    InsufficientEscrow {
        /// The user.
        user: String,
        /// Its total in the batch.
        owed: u64,
        /// Its escrow.
        escrow: u64,
    },
    /// The calls are not a valid batch (`call_id` 0: the batch as a whole).
    #[error("bad batch (call {call_id}): {reason}")]
    BadBatch {
        /// The offending call, 0 for the whole batch.
        call_id: u64,
        /// Why.
        reason: String,
    },
    /// A deposit the hub refuses.
    #[error("bad deposit: {reason}")]
    BadDeposit {
        /// Why.
        reason: String,
    },
    /// A key that is not a valid point or whose two forms differ.
    #[error("bad group key")]
    BadKey,
    /// The sender is not a governor.
    #[error("{caller} is not a governor of this hub")]
    NotGovernor {
        /// The sender.
        caller: Address,
    },
    /// Rotation `nonce` is at or below the last applied one.
    #[error("rotation {nonce} is already applied (last applied {last})")]
    RotationApplied {
        /// The rotation.
        nonce: u64,
        /// The hub's last applied rotation.
        last: u64,
    },
    /// Rotation `nonce` is not the next one (`expected`).
    #[error("rotation {nonce} is not the next one ({expected})")]
    RotationGap {
        /// The rotation.
        nonce: u64,
        /// The rotation the hub expects.
        expected: u64,
    },
}

/// The reference hub's result code for a [`Refusal`]: the same numbers as
/// `tally_hub_types::HubCode` (`value()`), so the relay treats both hubs'
/// answers alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RefusalCode {
    /// The signature does not verify.
    BadSignature = 2,
    /// The nonce (batch or rotation) is not the next one.
    BadNonce = 3,
    /// Already settled (or the rotation already applied).
    AlreadySettled = 4,
    /// Not a valid batch.
    BadBatch = 5,
    /// A refused deposit.
    BadDeposit = 7,
    /// Some user's escrow does not cover the batch.
    InsufficientEscrow = 8,
    /// Not a valid group key.
    BadKey = 9,
    /// Not a governor's approval.
    NotGoverned = 10,
}

impl RefusalCode {
    /// The number, as `tally_hub_types::HubCode::value` gives it.
    pub fn value(self) -> u32 {
        self as u32
    }
}

impl Refusal {
    /// This refusal's reference-hub code (the table of this module's
    /// docs, `abi/revert.rs`).
    pub fn code(&self) -> RefusalCode {
        match self {
            Refusal::AlreadySettled { .. } | Refusal::RotationApplied { .. } => {
                RefusalCode::AlreadySettled
            }
            Refusal::NonceGap { .. } | Refusal::RotationGap { .. } => RefusalCode::BadNonce,
            Refusal::BadSignature => RefusalCode::BadSignature,
            Refusal::InsufficientEscrow { .. } => RefusalCode::InsufficientEscrow,
            Refusal::BadBatch { .. } => RefusalCode::BadBatch,
            Refusal::BadDeposit { .. } => RefusalCode::BadDeposit,
            Refusal::BadKey => RefusalCode::BadKey,
            Refusal::NotGovernor { .. } => RefusalCode::NotGoverned,
        }
    }
}

/// What a revert of the hub contract means ([`Revert::decode`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Revert {
    /// The hub refused the input: the only variant with a code.
    #[error("hub refused: {0}")]
    Refused(Refusal),
    /// Too little gas was left for the signature check (`needed` before
    /// the pairing, `left` then): send again with more gas. Never a bad
    /// signature, and no [`RefusalCode`].
    #[error("too little gas for the signature check: {left} left, {needed} needed (send again with more gas)")]
    LowGas {
        /// Gas the check needs.
        needed: U256,
        /// Gas that was left.
        left: U256,
    },
    /// The caller has nothing to withdraw.
    #[error("nothing to withdraw")]
    NothingToWithdraw,
    /// Sending the withdrawal to the caller failed.
    #[error("sending the withdrawal failed")]
    TransferFailed,
    /// Solidity's `Error(string)`.
    #[error("reverted: {0}")]
    Message(String),
    /// Solidity's `Panic(uint256)` (an assertion or arithmetic fault: a
    /// bug in the contract).
    #[error("contract panicked with code {0:#x}")]
    Panic(U256),
    /// A revert without data: out of gas before any check could say
    /// more, or a call into something that is not the hub.
    #[error("reverted without data (out of gas, or not the hub contract)")]
    Empty,
    /// Data that is none of the above.
    #[error("reverted with unknown data 0x{}", hex::encode(.0))]
    Unknown(Vec<u8>),
}

impl Revert {
    /// Reads revert data (as a node returns it for a failed `eth_call`).
    pub fn decode(data: &[u8]) -> Revert {
        if data.is_empty() {
            return Revert::Empty;
        }
        match ContractError::<E>::abi_decode(data) {
            Ok(ContractError::CustomError(e)) => Self::of(e),
            Ok(ContractError::Revert(r)) => Revert::Message(r.reason),
            Ok(ContractError::Panic(p)) => Revert::Panic(p.code),
            Err(_) => Revert::Unknown(data.to_vec()),
        }
    }

    fn of(e: E) -> Revert {
        use Refusal as R;
        Revert::Refused(match e {
            E::AlreadySettled(x) => R::AlreadySettled {
                nonce: x.nonce,
                last: x.last,
            },
            E::NonceGap(x) => R::NonceGap {
                nonce: x.nonce,
                expected: x.expected,
            },
            E::BadSignature(_) => R::BadSignature,
            E::LowGas(x) => {
                return Revert::LowGas {
                    needed: x.needed,
                    left: x.left,
                }
            }
            E::InsufficientEscrow(x) => R::InsufficientEscrow {
                user: x.user,
                owed: x.owed,
                escrow: x.escrow,
            },
            E::BadBatch(x) => R::BadBatch {
                call_id: x.callId,
                reason: x.reason,
            },
            E::BadDeposit(x) => R::BadDeposit { reason: x.reason },
            E::BadKey(_) => R::BadKey,
            E::RotationApplied(x) => R::RotationApplied {
                nonce: x.nonce,
                last: x.last,
            },
            E::RotationGap(x) => R::RotationGap {
                nonce: x.nonce,
                expected: x.expected,
            },
            E::NotGovernor(x) => R::NotGovernor { caller: x.caller },
            E::NothingToWithdraw(_) => return Revert::NothingToWithdraw,
            E::TransferFailed(_) => return Revert::TransferFailed,
        })
    }

    /// The refusal, if the hub refused the input.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Revert::Refused(r) => Some(r),
            _ => None,
        }
    }

    /// The reference-hub code, if the hub refused the input; `None` for
    /// everything else ([`Revert::LowGas`] included).
    pub fn code(&self) -> Option<RefusalCode> {
        self.refusal().map(Refusal::code)
    }

    /// Whether this is [`Revert::LowGas`]: more gas would help.
    pub fn is_low_gas(&self) -> bool {
        matches!(self, Revert::LowGas { .. })
    }
}

#[cfg(test)]
mod tests;

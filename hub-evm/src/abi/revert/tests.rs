//! Tests of revert decoding and refusal codes.

use super::*;
use crate::abi::ITallyHub as H;
use alloy_sol_types::SolError;
use proptest::prelude::*;

fn err<T: SolError>(e: T) -> Vec<u8> {
    e.abi_encode()
}

/// Every custom error of the interface, its decoding, and its code: the
/// table of the module docs.
#[test]
fn every_contract_error_decodes_to_its_meaning_and_code() {
    let u = |n: u64| n;
    let cases: Vec<(Vec<u8>, Revert, Option<u32>)> = vec![
        (
            err(H::AlreadySettled { nonce: 3, last: 4 }),
            Revert::Refused(Refusal::AlreadySettled { nonce: 3, last: 4 }),
            Some(4),
        ),
        (
            err(H::NonceGap {
                nonce: 9,
                expected: 5,
            }),
            Revert::Refused(Refusal::NonceGap {
                nonce: 9,
                expected: 5,
            }),
            Some(3),
        ),
        (
            err(H::BadSignature {}),
            Revert::Refused(Refusal::BadSignature),
            Some(2),
        ),
        (
            err(H::InsufficientEscrow {
                user: "alice".into(),
                owed: u(10),
                escrow: 7,
            }),
            Revert::Refused(Refusal::InsufficientEscrow {
                user: "alice".into(),
                owed: 10,
                escrow: 7,
            }),
            Some(8),
        ),
        (
            err(H::BadBatch {
                callId: 12,
                reason: "not ascending".into(),
            }),
            Revert::Refused(Refusal::BadBatch {
                call_id: 12,
                reason: "not ascending".into(),
            }),
            Some(5),
        ),
        (
            err(H::BadDeposit {
                reason: "zero".into(),
            }),
            Revert::Refused(Refusal::BadDeposit {
                reason: "zero".into(),
            }),
            Some(7),
        ),
        (err(H::BadKey {}), Revert::Refused(Refusal::BadKey), Some(9)),
        (
            err(H::NotGovernor {
                caller: Address::repeat_byte(7),
            }),
            Revert::Refused(Refusal::NotGovernor {
                caller: Address::repeat_byte(7),
            }),
            Some(10),
        ),
        (
            err(H::RotationApplied { nonce: 1, last: 2 }),
            Revert::Refused(Refusal::RotationApplied { nonce: 1, last: 2 }),
            Some(4),
        ),
        (
            err(H::RotationGap {
                nonce: 4,
                expected: 3,
            }),
            Revert::Refused(Refusal::RotationGap {
                nonce: 4,
                expected: 3,
            }),
            Some(3),
        ),
        (
            err(H::LowGas {
                needed: U256::from(200_000u64),
                left: U256::from(90_000u64),
            }),
            Revert::LowGas {
                needed: U256::from(200_000u64),
                left: U256::from(90_000u64),
            },
            None,
        ),
        (
            err(H::NothingToWithdraw {}),
            Revert::NothingToWithdraw,
            None,
        ),
        (err(H::TransferFailed {}), Revert::TransferFailed, None),
    ];
    // One case per custom error of the interface.
    assert_eq!(cases.len(), E::COUNT);
    for (data, want, code) in cases {
        let got = Revert::decode(&data);
        assert_eq!(got, want);
        assert_eq!(got.code().map(RefusalCode::value), code, "{got}");
        assert_eq!(got.refusal().is_some(), code.is_some());
    }
}

#[test]
fn solidity_builtin_reverts_and_garbage_decode_without_a_code() {
    let msg = alloy_sol_types::Revert::from("no").abi_encode();
    assert_eq!(Revert::decode(&msg), Revert::Message("no".into()));
    let panic = alloy_sol_types::Panic::from(0x11u64).abi_encode();
    assert_eq!(Revert::decode(&panic), Revert::Panic(U256::from(0x11)));
    assert_eq!(Revert::decode(&[]), Revert::Empty);
    assert_eq!(Revert::decode(&[1, 2, 3]), Revert::Unknown(vec![1, 2, 3]));
    // A known selector with a truncated body is not that error.
    let mut cut = err(H::AlreadySettled { nonce: 3, last: 4 });
    cut.truncate(20);
    assert_eq!(Revert::decode(&cut), Revert::Unknown(cut.clone()));
    for r in [
        Revert::decode(&msg),
        Revert::decode(&panic),
        Revert::Empty,
        Revert::Unknown(vec![1]),
    ] {
        assert_eq!(r.code(), None);
    }
}

#[test]
fn refusal_codes_have_the_reference_hubs_values() {
    for (c, v) in [
        (RefusalCode::BadSignature, 2),
        (RefusalCode::BadNonce, 3),
        (RefusalCode::AlreadySettled, 4),
        (RefusalCode::BadBatch, 5),
        (RefusalCode::BadDeposit, 7),
        (RefusalCode::InsufficientEscrow, 8),
        (RefusalCode::BadKey, 9),
        (RefusalCode::NotGoverned, 10),
    ] {
        assert_eq!(c.value(), v);
    }
}

proptest! {
    /// Whatever gas figures the contract reports, LowGas is "retry with
    /// more gas": no refusal, no code, never BadSignature.
    #[test]
    fn low_gas_is_never_bad_signature(needed in any::<[u8; 32]>(), left in any::<[u8; 32]>()) {
        let data = err(H::LowGas {
            needed: U256::from_be_bytes(needed),
            left: U256::from_be_bytes(left),
        });
        let r = Revert::decode(&data);
        prop_assert!(r.is_low_gas());
        prop_assert_eq!(r.code(), None);
        prop_assert!(r.refusal().is_none());
        prop_assert_ne!(r.code(), Some(RefusalCode::BadSignature));
    }

    /// Decoding never panics, and only data that starts with one of the
    /// contract's refusal selectors is given a code.
    #[test]
    fn arbitrary_revert_data_decodes_without_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let r = Revert::decode(&data);
        if r.code().is_some() {
            let sel: [u8; 4] = data[..4].try_into().unwrap();
            prop_assert!(E::valid_selector(sel));
        }
    }
}

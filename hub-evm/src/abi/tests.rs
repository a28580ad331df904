//! Tests of the ABI module: revert decoding and codes, calldata.

use super::*;
use alloy_sol_types::{SolCall, SolError};
use proptest::prelude::*;
use ITallyHub as H;

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

fn key_and_sig() -> (Vec<u8>, Vec<u8>) {
    let s = tally_settlement::bls::SecretShare::from_bytes(1, &[3u8; 32]).unwrap();
    (
        s.public().compress().to_vec(),
        s.sign(b"m").sig_bytes().to_vec(),
    )
}

#[test]
fn a_batch_calldata_carries_the_calls_and_the_eip2537_signature() {
    let (_, sig) = key_and_sig();
    let calls = vec![
        HubCall {
            id: 1,
            user: "alice".into(),
            provider: "acme-ai".into(),
            amount: 36,
            window: 30_000_000,
            kind: 0,
        },
        HubCall {
            id: 2,
            user: "bob".into(),
            provider: String::new(),
            amount: 5,
            window: 30_000_001,
            kind: 1,
        },
    ];
    let data = submit_batch_calldata(7, &calls, &sig).unwrap();
    let back = H::submitBatchCall::abi_decode(&data).unwrap();
    assert_eq!(back.nonce, 7);
    assert_eq!(back.calls.len(), 2);
    assert_eq!(back.calls[1].kind, 1);
    assert_eq!(back.calls[0].user, "alice");
    assert_eq!(back.calls[0].window, 30_000_000);
    assert_eq!(
        back.signature.as_ref(),
        &crate::points::g2_to_eip2537(&sig).unwrap()[..]
    );
    // A signature that is not a point never becomes calldata.
    assert!(submit_batch_calldata(7, &calls, &[0u8; 96]).is_err());
    assert!(submit_batch_calldata(7, &calls, &sig[..95]).is_err());
}

#[test]
fn constructor_arguments_decode_back() {
    let (key, _) = key_and_sig();
    let args = DeployArgs {
        tally_chain_id: "tally-localnet".into(),
        group_key: key.clone(),
        last_rotation: 2,
        wei_per_credit: U256::from(1_000_000_000u64),
        registration_fee: 10,
        governors: vec![Address::repeat_byte(1), Address::repeat_byte(2)],
        governor_threshold: 2,
    };
    let enc = constructor_args(&args).unwrap();
    type Params<'a> = <TallyHubConstructor::constructorCall as SolConstructor>::Parameters<'a>;
    let tuple = <Params<'_> as alloy_sol_types::SolType>::abi_decode_params(&enc).unwrap();
    let back = TallyHubConstructor::constructorCall::new(tuple);
    assert_eq!(back.tallyChainId_, "tally-localnet");
    assert_eq!(back.groupKey_.as_ref(), &key[..]);
    assert_eq!(
        back.groupKeyPoint_.as_ref(),
        &crate::points::g1_to_eip2537(&key).unwrap()[..]
    );
    assert_eq!(back.lastRotation_, 2);
    assert_eq!(back.weiPerCredit_, U256::from(1_000_000_000u64));
    assert_eq!(back.registrationFee_, 10);
    assert_eq!(back.governors_.len(), 2);
    assert_eq!(back.governorThreshold_, U256::from(2));
    let mut bad = args.clone();
    bad.group_key = vec![0xc0; 48];
    assert!(matches!(constructor_args(&bad), Err(AbiError::Point(_))));
}

#[test]
fn rotation_and_governance_calldata() {
    let (key, sig) = key_and_sig();
    let r = H::rotateKeyCall::abi_decode(&rotate_key_calldata(2, 5, &key, &sig).unwrap()).unwrap();
    assert_eq!((r.nonce, r.epoch), (2, 5));
    assert_eq!(r.groupKey.as_ref(), &key[..]);
    assert_eq!(r.groupKeyPoint.len(), 128);
    assert_eq!(r.signature.len(), 256);
    let g = H::governKeyCall::abi_decode(&govern_key_calldata(3, 6, &key).unwrap()).unwrap();
    assert_eq!((g.nonce, g.epoch, g.groupKeyPoint.len()), (3, 6, 128));
    let d = H::depositCall::abi_decode(&deposit_calldata("alice", &[9; 32])).unwrap();
    assert_eq!((d.user.as_str(), d.pubkey.len()), ("alice", 32));
    assert_eq!(withdraw_calldata(), H::withdrawCall::SELECTOR.to_vec());
}

#[test]
fn an_empty_or_broken_artifact_is_a_typed_error() {
    assert_eq!(parse_artifact(""), Err(AbiError::NoArtifact));
    assert!(matches!(parse_artifact("{"), Err(AbiError::Artifact(_))));
    assert!(matches!(
        parse_artifact(r#"{"solc":"x","abi":[],"bytecode":"0xzz","source_sha256":{}}"#),
        Err(AbiError::Artifact(_))
    ));
    assert!(matches!(
        parse_artifact(r#"{"solc":"x","abi":[],"bytecode":"0x6000","source_sha256":"00"}"#),
        Err(AbiError::Artifact(_))
    ));
    let ok = parse_artifact(
        r#"{"solc":"x","abi":[],"bytecode":"0x6000","source_sha256":{"A.sol":"00"}}"#,
    )
    .unwrap();
    assert_eq!(ok.bytecode, vec![0x60, 0x00]);
    assert_eq!(ok.source_sha256["A.sol"], "00");
}

/// The built artifact is the build of the sources beside it: a source
/// edited without `npm run build` fails here.
#[test]
fn the_artifact_is_built_from_the_sources_in_the_tree() {
    use sha2::{Digest, Sha256};
    let a = artifact().expect("the crate is built with contract/build/TallyHub.json");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("contract");
    let files: Vec<&str> = a.source_sha256.keys().map(String::as_str).collect();
    assert_eq!(files, ["ITallyHub.sol", "TallyHub.sol"]);
    for (file, sha) in &a.source_sha256 {
        let text = std::fs::read(dir.join(file)).unwrap();
        assert_eq!(
            &hex::encode(Sha256::digest(&text)),
            sha,
            "{file} changed since build/TallyHub.json was built: run `npm run build` in hub-evm/contract"
        );
    }
    assert!(a.solc.starts_with("0.8."), "{}", a.solc);
}

/// The canonical type of an ABI JSON parameter (tuples expanded).
fn canonical_type(p: &serde_json::Value) -> String {
    let ty = p["type"].as_str().unwrap();
    match ty.strip_prefix("tuple") {
        Some(suffix) => {
            let inner: Vec<String> = p["components"]
                .as_array()
                .unwrap()
                .iter()
                .map(canonical_type)
                .collect();
            format!("({}){suffix}", inner.join(","))
        }
        None => ty.to_string(),
    }
}

/// `name(type,...)` of every ABI entry of `kind`, sorted.
fn signatures(abi: &serde_json::Value, kind: &str) -> Vec<String> {
    let mut out: Vec<String> = abi
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| {
            let args: Vec<String> = e["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(canonical_type)
                .collect();
            format!("{}({})", e["name"].as_str().unwrap_or(""), args.join(","))
        })
        .collect();
    out.sort();
    out
}

/// The compiled contract has exactly the functions, errors and events of
/// `ITallyHub.sol` the bindings come from, and the constructor
/// [`constructor_args`] encodes for.
#[test]
fn the_artifact_abi_is_the_interfaces() {
    use alloy_primitives::keccak256;
    let a = artifact().unwrap();
    let sel = |s: &String| <[u8; 4]>::try_from(&keccak256(s.as_bytes())[..4]).unwrap();
    let mut funcs: Vec<[u8; 4]> = signatures(&a.abi, "function").iter().map(sel).collect();
    let mut ours: Vec<[u8; 4]> = H::ITallyHubCalls::selectors().collect();
    funcs.sort();
    ours.sort();
    assert_eq!(
        funcs,
        ours,
        "functions: {:?}",
        signatures(&a.abi, "function")
    );
    let mut errs: Vec<[u8; 4]> = signatures(&a.abi, "error").iter().map(sel).collect();
    let mut ours: Vec<[u8; 4]> = E::selectors().collect();
    errs.sort();
    ours.sort();
    assert_eq!(errs, ours, "errors: {:?}", signatures(&a.abi, "error"));
    let mut evs: Vec<[u8; 32]> = signatures(&a.abi, "event")
        .iter()
        .map(|s| keccak256(s.as_bytes()).0)
        .collect();
    let mut ours: Vec<[u8; 32]> = H::ITallyHubEvents::SELECTORS.to_vec();
    evs.sort();
    ours.sort();
    assert_eq!(evs, ours, "events: {:?}", signatures(&a.abi, "event"));
    assert_eq!(
        signatures(&a.abi, "constructor"),
        vec!["(string,bytes,bytes,uint64,uint256,uint64,address[],uint256)".to_string()]
    );
}

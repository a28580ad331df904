//! Tests of the ABI module: calldata, constructor arguments and the
//! artifact. Revert decoding is tested in `revert/tests.rs`.

use super::*;
use alloy_sol_types::{SolCall, SolInterface};
use ITallyHub as H;

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
    let mut ours: Vec<[u8; 4]> = H::ITallyHubErrors::selectors().collect();
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

//! The EVM protocol's pure parts: the hub name, what a revert means, the
//! codes of points that are not points, replacement fees, and the key
//! file the relay refuses to start without.

use tally_hub_evm::abi::Revert;
use tally_hub_evm::Fees;
use tally_hub_types::HubCode;
use tally_settlement::proto::HubCall;

use super::submit::{bumped, calldata, judge, Verdict};
use super::*;

const NAME: &str = "evm:31337:0x5fbdb2315678afecb367f032d93f642f64180aa3";

/// A 4-byte selector and 32-byte words: revert data as a node returns it.
fn revert(selector: &str, words: &[u64]) -> Vec<u8> {
    let mut d: Vec<u8> = (0..selector.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&selector[i..i + 2], 16).unwrap())
        .collect();
    for w in words {
        d.extend_from_slice(&[0; 24]);
        d.extend_from_slice(&w.to_be_bytes());
    }
    d
}

// keccak256 of each error's signature, first four bytes:
// AlreadySettled(uint64,uint64), LowGas(uint256,uint256), BadSignature(),
// NonceGap(uint64,uint64).
const ALREADY_SETTLED: &str = "3d89cf75";
const LOW_GAS: &str = "e99dff16";
const BAD_SIGNATURE: &str = "5cd5d233";

#[test]
fn the_hub_name_gives_the_chain_id_and_the_contract() {
    let n = parse_name(NAME).unwrap();
    assert_eq!(n.chain_id, 31337);
    assert_eq!(
        n.address.to_string().to_lowercase(),
        "0x5fbdb2315678afecb367f032d93f642f64180aa3"
    );
    // The reference hub's name, or a non-canonical one, is a setup error
    // that names the parameter (not an unreachable endpoint).
    for bad in [
        "hub",
        "evm:31337:0x5FbDB2315678afecb367f032d93F642f64180aa3",
    ] {
        match parse_name(bad) {
            Err(HubError::Config(m)) => assert!(m.contains("hub_chain"), "{m}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn reverts_are_the_hubs_codes() {
    let code = |data: &[u8], out_of_gas| judge(&Revert::decode(data), out_of_gas);
    // AlreadySettled is code 4: the relay counts it as delivered.
    assert!(matches!(
        code(&revert(ALREADY_SETTLED, &[7, 7]), false),
        Verdict::Code(4, _)
    ));
    assert_eq!(HubCode::AlreadySettled.value(), 4);
    assert!(matches!(
        code(&revert(BAD_SIGNATURE, &[]), false),
        Verdict::Code(2, _)
    ));
    // A revert the contract does not explain is a refusal, code 16.
    assert!(matches!(
        code(&[0xde, 0xad, 0xbe, 0xef], false),
        Verdict::Code(16, _)
    ));
    assert!(matches!(code(&[], false), Verdict::Code(16, _)));
}

#[test]
fn low_gas_is_a_retry_never_a_bad_signature() {
    let low = Revert::decode(&revert(LOW_GAS, &[300_000, 120_000]));
    assert!(low.is_low_gas(), "{low:?}");
    for out_of_gas in [false, true] {
        match judge(&low, out_of_gas) {
            Verdict::MoreGas(why) => assert!(why.contains("gas"), "{why}"),
            v => panic!("LowGas judged {v:?}"),
        }
    }
    // A mined transaction that used all its gas and reverted without data
    // ran out of gas: a retry too.
    assert!(matches!(judge(&Revert::Empty, true), Verdict::MoreGas(_)));
}

#[test]
fn a_point_that_is_not_one_is_refused_with_its_code() {
    let call = HubCall {
        id: 1,
        user: "alice".into(),
        provider: "bob".into(),
        amount: 25,
        window: 3,
        kind: 0,
    };
    let batch = Payload::Batch {
        chain: NAME.into(),
        nonce: 7,
        calls: vec![call],
        signature: vec![0xAB; 96],
    };
    assert_eq!(
        calldata(&batch).unwrap_err().0,
        HubCode::BadSignature.value()
    );
    let rotation = Payload::Rotation {
        chain: NAME.into(),
        nonce: 2,
        epoch: 1,
        group_key: vec![0xAB; 48],
        signature: vec![0xAB; 96],
    };
    assert_eq!(calldata(&rotation).unwrap_err().0, HubCode::BadKey.value());
}

#[test]
fn a_replacement_pays_at_least_a_quarter_more() {
    let old = Fees {
        max_fee_per_gas: 400,
        max_priority_fee_per_gas: 100,
    };
    let now = Fees {
        max_fee_per_gas: 300,
        max_priority_fee_per_gas: 200,
    };
    let b = bumped(now, old);
    assert_eq!((b.max_fee_per_gas, b.max_priority_fee_per_gas), (501, 200));
}

/// A relay key file (anvil's second development account) with `mode`, of
/// its own for test `name`; the poll tests use it too.
pub(crate) fn key_file(name: &str, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("tally-relay-evm-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("relay_evm_key.hex");
    std::fs::write(
        &path,
        "59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[test]
fn the_relay_refuses_a_missing_or_open_key_file() {
    let cfg = |key_file| EvmConfig {
        tip: EvmTip::Latest,
        key_file,
    };
    let missing = std::env::temp_dir().join("tally-relay-evm-no-such-dir/key.hex");
    let e = EvmProtocol::new(&cfg(missing), 1).unwrap_err();
    assert!(e.contains("missing") && e.contains("tallyd init"), "{e}");
    for mode in [0o644, 0o640, 0o604] {
        let e = EvmProtocol::new(&cfg(key_file(&format!("{mode:o}"), mode)), 1).unwrap_err();
        assert!(e.contains("too open"), "{mode:o}: {e}");
    }
    assert!(EvmProtocol::new(&cfg(key_file("600", 0o600)), 1).is_ok());
}

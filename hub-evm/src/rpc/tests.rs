//! Tests of the JSON-RPC helpers that need no node: error sorting and
//! quantity parsing. The calls themselves are tested against anvil
//! (`tests/anvil.rs`).

use super::*;
use alloy_sol_types::SolError;

fn rpc_err(code: i64, message: &str, data: &str) -> RpcError {
    RpcError::Rpc {
        method: "eth_call".into(),
        code,
        message: message.into(),
        data: data.into(),
    }
}

#[test]
fn revert_data_in_an_execution_error_is_decoded() {
    let data = ITallyHub::BadSignature {}.abi_encode();
    let e = classify(
        "eth_call",
        rpc_err(3, "execution reverted", &hex_data(&data)),
        true,
    );
    assert_eq!(
        e,
        EthError::Reverted(Revert::Refused(crate::abi::Refusal::BadSignature))
    );
    assert_eq!(
        e.revert().and_then(Revert::code).map(|c| c.value()),
        Some(2)
    );
    // The same from eth_estimateGas.
    let e = classify(
        "eth_estimateGas",
        rpc_err(3, "execution reverted", &hex_data(&data)),
        true,
    );
    assert!(e.revert().is_some());
}

#[test]
fn an_execution_error_without_data_is_an_empty_revert() {
    for (code, msg) in [
        (3, "execution reverted"),
        (-32003, "Out of gas: gas required exceeds allowance: 30000"),
        (-32000, "execution reverted"),
        (-32603, "EVM error OutOfGas"),
    ] {
        assert_eq!(
            classify("eth_call", rpc_err(code, msg, ""), true),
            EthError::Reverted(Revert::Empty),
            "{code} {msg}"
        );
    }
}

#[test]
fn errors_of_methods_that_run_no_code_are_the_nodes() {
    let e = classify(
        "eth_sendRawTransaction",
        rpc_err(-32003, "nonce too low", "0x1234"),
        false,
    );
    assert!(
        matches!(&e, EthError::Node { code: -32003, message, .. } if message == "nonce too low"),
        "{e:?}"
    );
    // A JSON-RPC error of an executing method that is not about execution.
    let e = classify("eth_call", rpc_err(-32602, "invalid params", ""), true);
    assert!(matches!(e, EthError::Node { code: -32602, .. }), "{e:?}");
}

#[test]
fn no_answer_is_unreachable_and_a_bad_answer_is_an_answer_error() {
    let t = RpcError::Transport {
        url: "http://127.0.0.1:28899".into(),
        msg: "connection refused".into(),
    };
    let e = classify("eth_call", t.clone(), true);
    assert_eq!(e, EthError::Unreachable(t));
    assert!(e.to_string().contains("EVM node unreachable"), "{e}");
    assert!(!e.to_string().contains("CometBFT"), "{e}");
    let h = RpcError::Http {
        url: "u".into(),
        status: 503,
        retry_after: None,
        body: "busy".into(),
    };
    assert!(matches!(
        classify("eth_chainId", h, false),
        EthError::Unreachable(_)
    ));
    let d = RpcError::Decode {
        method: "eth_chainId".into(),
        msg: "no result".into(),
    };
    assert!(matches!(
        classify("eth_chainId", d, false),
        EthError::Answer { .. }
    ));
}

#[test]
fn quantities_are_parsed_strictly() {
    let m = "m";
    assert_eq!(parse_u64(m, "n", &json!("0x0")).unwrap(), 0);
    assert_eq!(parse_u64(m, "n", &json!("0x7a69")).unwrap(), 31337);
    assert_eq!(
        parse_u64(m, "n", &json!("0xffffffffffffffff")).unwrap(),
        u64::MAX
    );
    for bad in [
        json!("0x"),
        json!("7a69"),
        json!("0xzz"),
        json!(31337),
        json!(null),
        json!("0x10000000000000000"),
    ] {
        assert!(parse_u64(m, "n", &bad).is_err(), "{bad}");
    }
    assert_eq!(parse_bytes(m, "d", &json!("0x")).unwrap(), Vec::<u8>::new());
    assert!(parse_bytes(m, "d", &json!("0x1")).is_err());
    assert!(parse_b256(m, "h", &json!("0x00")).is_err());
    assert!(parse_address(m, "a", &json!(format!("0x{}", "11".repeat(20)))).is_ok());
}

#[test]
fn a_call_request_has_the_fields_nodes_expect() {
    let r = CallRequest {
        from: Some(Address::repeat_byte(1)),
        to: Some(Address::repeat_byte(2)),
        value: U256::from(16u64),
        data: vec![0xab],
        gas: Some(100_000),
    };
    let j = r.to_json();
    assert_eq!(j["data"], "0xab");
    assert_eq!(j["value"], "0x10");
    assert_eq!(j["gas"], "0x186a0");
    assert_eq!(
        j["to"].as_str().unwrap().to_lowercase(),
        format!("0x{}", "02".repeat(20))
    );
    let bare = CallRequest::default().to_json();
    assert_eq!(bare, json!({"data": "0x"}));
    assert_eq!(At::Number(255).param(), json!("0xff"));
    assert_eq!(At::Finalized.param(), json!("finalized"));
}

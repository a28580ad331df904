//! Tests of the JSON-RPC helpers that need no node: error sorting (the
//! JSON forms of values are tested in `types/tests.rs`). The calls
//! themselves are tested against anvil (`tests/anvil.rs`).

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

//! Tests of the values' JSON forms: strict parsing of quantities and
//! data, call objects, blocks, receipts and deposit logs.

use super::*;
use alloy_primitives::Bytes;

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

#[test]
fn blocks_and_receipts_take_optional_fields_as_absent_or_null() {
    let h = format!("0x{}", "ab".repeat(32));
    let b = BlockRef::from_json("m", &json!({"number": "0x10", "hash": h})).unwrap();
    assert_eq!((b.number, b.base_fee), (16, None));
    let b = json!({"number": "0x10", "hash": h, "baseFeePerGas": "0x7"});
    assert_eq!(BlockRef::from_json("m", &b).unwrap().base_fee, Some(7));
    let mut r = json!({
        "transactionHash": h, "blockNumber": "0x2", "blockHash": h,
        "status": "0x1", "gasUsed": "0x5208", "contractAddress": null,
    });
    let got = Receipt::from_json("m", &r).unwrap();
    assert!(got.success);
    assert_eq!((got.gas_used, got.effective_gas_price), (21000, 0));
    assert_eq!(got.contract_address, None);
    r["effectiveGasPrice"] = json!("0x3b9aca00");
    r["contractAddress"] = json!(format!("0x{}", "11".repeat(20)));
    let got = Receipt::from_json("m", &r).unwrap();
    assert_eq!(got.effective_gas_price, 1_000_000_000);
    assert_eq!(got.contract_address, Some(Address::repeat_byte(0x11)));
    r["contractAddress"] = json!("0x11");
    let e = Receipt::from_json("m", &r).unwrap_err();
    assert!(
        e.to_string()
            .contains("contractAddress has 1 bytes, not 20"),
        "{e}"
    );
}

#[test]
fn a_deposit_log_decodes_and_a_removed_one_is_refused() {
    let ev = ITallyHub::Deposited {
        seq: 4,
        user: "alice".into(),
        from: Address::repeat_byte(9),
        amount: 70,
        fee: 30,
        pubkey: Bytes::from(vec![1u8; 48]),
    };
    let data = ev.encode_log_data();
    let topics: Vec<String> = data.topics().iter().map(|t| t.to_string()).collect();
    let h = format!("0x{}", "cd".repeat(32));
    let mut log = json!({
        "topics": topics,
        "data": hex_data(&data.data),
        "blockNumber": "0x9",
        "transactionHash": h,
    });
    let d = DepositLog::from_log("eth_getLogs", &log).unwrap();
    assert_eq!(
        (d.deposit.seq, d.deposit.user.as_str(), d.deposit.amount),
        (4, "alice", 70)
    );
    assert_eq!(
        (d.fee, d.from, d.block_number),
        (30, Address::repeat_byte(9), 9)
    );
    assert_eq!(d.deposit.pubkey, vec![1u8; 48]);
    log["removed"] = json!(true);
    let e = DepositLog::from_log("eth_getLogs", &log).unwrap_err();
    assert!(e.to_string().contains("removed"), "{e}");
}

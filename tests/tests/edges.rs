//! Issue 11 through the ABCI call sequence (four in-process validators):
//! a user's allowance change travels through the mempool and the proposal
//! into a block like a report, and the mempool refuses a re-wrapped or
//! re-signed variant of a waiting report until a block commits.

use bytes::Bytes;
use ed25519_dalek::SigningKey;
use prost::Message;
use sha2::{Digest, Sha256};
use tally_settlement::proto::{AllowanceChange, Outcome, ReportUsage, UsageRecord};
use tally_settlement::{sign_allowance, sign_report, Code};
use tally_tests::driver::Net;
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::RequestCheckTx;

const CHAIN: &str = "tally-edges";
const T0: i64 = 1_800_000_000;

fn gw() -> SigningKey {
    SigningKey::from_bytes(&[3; 32])
}

fn carol() -> SigningKey {
    SigningKey::from_bytes(&[4; 32])
}

/// carol (key registered, 100 credits) gave the gateway nothing yet.
fn net() -> Net {
    let state = serde_json::json!({
        "params": {"settlement_window_secs": 60},
        "gateways": [{"name": "gw", "pubkey": hex::encode(gw().verifying_key().to_bytes())}],
        "users": [{"name": "carol", "pubkey": hex::encode(carol().verifying_key().to_bytes())}],
        "balances": [{"user": "carol", "amount": 100}],
    });
    let mut net = Net::in_memory(4, CHAIN, T0).expect("net");
    net.init(&state.to_string()).expect("init");
    net
}

fn report(id: u8, amount: u64) -> ReportUsage {
    ReportUsage {
        chain_id: CHAIN.into(),
        report_id: vec![id; 16],
        expires_at: T0 as u64 + 300,
        records: vec![UsageRecord {
            user: "carol".into(),
            provider: "p".into(),
            model: "m".into(),
            route: "/r".into(),
            outcome: Outcome::Ok as i32,
            units: 1,
            amount,
            ..Default::default()
        }],
        route_calls: Vec::new(),
    }
}

fn check(net: &Net, tx: &[u8]) -> (u32, Vec<u8>) {
    let r = net.nodes[0].app.check_tx(RequestCheckTx {
        tx: Bytes::copy_from_slice(tx),
        r#type: 0,
    });
    (r.code, r.data.to_vec())
}

fn balance(net: &Net) -> u64 {
    let r = net.nodes[0].app.query_path("/balance/carol");
    let v: serde_json::Value = serde_json::from_slice(&r.value).expect("json");
    v["balance"].as_u64().expect("balance")
}

#[test]
fn an_allowance_change_is_proposed_and_committed_like_a_report() {
    let mut net = net();
    let pay = sign_report(&gw(), &report(1, 7));
    let out = net.block(vec![pay.clone()], 1).expect("block");
    assert_eq!(out.tx_results[0].code, Code::NoAllowance.value());
    let grant = sign_allowance(
        &carol(),
        &AllowanceChange {
            chain_id: CHAIN.into(),
            user: "carol".into(),
            gateway: "gw".into(),
            max_per_window: 10,
            expires_at: T0 as u64 + 3600,
            sequence: 1,
        },
    );
    assert_eq!(check(&net, &grant).0, 0);
    let out = net.block(vec![grant], 1).expect("block");
    assert_eq!(
        out.block.txs.len(),
        1,
        "the proposer dropped the allowance change"
    );
    assert_eq!(out.tx_results[0].code, 0, "{}", out.tx_results[0].log);
    let out = net.block(vec![pay], 1).expect("block");
    assert_eq!(out.tx_results[0].code, 0, "{}", out.tx_results[0].log);
    assert_eq!(balance(&net), 93);
}

#[test]
fn the_mempool_refuses_a_variant_of_a_waiting_report_until_a_block_commits() {
    let mut net = net();
    let grant = sign_allowance(
        &carol(),
        &AllowanceChange {
            chain_id: CHAIN.into(),
            user: "carol".into(),
            gateway: "gw".into(),
            max_per_window: 100,
            expires_at: T0 as u64 + 3600,
            sequence: 1,
        },
    );
    net.block(vec![grant], 1).expect("block");
    let first = report(5, 2);
    let original = sign_report(&gw(), &first);
    // A re-signed variant (the gateway's own bug or a leaked key) with the
    // same id, and the original sent twice.
    let variant = sign_report(&gw(), &report(5, 3));
    assert_eq!(check(&net, &original).0, 0);
    assert_eq!(check(&net, &original).0, 0, "the same bytes again are fine");
    assert_eq!(check(&net, &variant).0, Code::ReportPending.value());
    // Once the original commits, the variant meets committed state: code 7
    // with the SHA-256 of the body the chain holds.
    let out = net.block(vec![original], 1).expect("block");
    assert_eq!(out.tx_results[0].code, 0, "{}", out.tx_results[0].log);
    let (code, data) = check(&net, &variant);
    assert_eq!(code, Code::DuplicateReport.value());
    assert_eq!(data, Sha256::digest(first.encode_to_vec()).to_vec());
    // Another id from the same gateway is not held back by the claims.
    assert_eq!(check(&net, &sign_report(&gw(), &report(6, 1))).0, 0);
    assert_eq!(balance(&net), 98);
}

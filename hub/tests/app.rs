//! The hub's ABCI query answers: the height they are from, and a height
//! the node has not committed yet refused.

use std::sync::Arc;

use prost::Message;
use tally_hub::machine::{hub_tx, Deposit, HubCode, HubTx};
use tally_hub::HubApp;
use tally_store::halt::Halt;
use tally_store::MemBackend;
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{RequestFinalizeBlock, RequestQuery};

fn query(app: &HubApp, path: &str, height: i64) -> (u32, i64) {
    let r = app.query(RequestQuery {
        path: path.into(),
        height,
        ..Default::default()
    });
    (r.code, r.height)
}

#[test]
fn answers_carry_the_committed_height_and_refuse_a_future_one() {
    let (halt, _log) = Halt::recording();
    let app = HubApp::new(Arc::new(MemBackend::new()), halt).unwrap();
    let deposit = HubTx {
        sum: Some(hub_tx::Sum::Deposit(Deposit {
            user: "alice".into(),
            amount: 5,
            pubkey: Vec::new(),
        })),
    }
    .encode_to_vec();
    for h in 1..=3i64 {
        let txs = if h == 2 {
            vec![deposit.clone().into()]
        } else {
            vec![]
        };
        app.finalize_block(RequestFinalizeBlock {
            height: h,
            txs,
            ..Default::default()
        });
        app.commit();
    }
    let bad = HubCode::BadArgument.value();
    // Committed through 3: heights 0 (latest) to 3 are answered at 3.
    assert_eq!(query(&app, "/last_nonce/hub", 0), (0, 3));
    assert_eq!(query(&app, "/deposits/1/3", 3), (0, 3));
    assert_eq!(query(&app, "/deposits/1/3", 2), (0, 3));
    // Height 4 is not committed: refused, whatever the path.
    assert_eq!(query(&app, "/last_nonce/hub", 4), (bad, 3));
    assert_eq!(query(&app, "/deposits/1/3", 4), (bad, 3));
    // A range ending above the committed height could still grow.
    assert_eq!(query(&app, "/deposits/1/4", 0), (bad, 3));
    let r = app.query(RequestQuery {
        path: "/deposits/1/3".into(),
        ..Default::default()
    });
    let v: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
    assert_eq!(v["deposit_count"], 1);
    assert_eq!(v["deposits"][0]["height"], 2);
}

/// The README's hub code table names every code with its number, and no
/// other (queries 20-22 share one row).
#[test]
fn the_readme_code_table_is_the_hub_codes() {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("| code | name | meaning |\n|---|---|---|\n| 0 | `Ok` |")
        .expect("hub code table");
    let mut documented: Vec<(u32, String)> = Vec::new();
    for line in readme[start..].lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let nums: Vec<u32> = cells[1]
            .split('/')
            .map(|n| n.trim().parse().unwrap())
            .collect();
        let names: Vec<String> = cells[2]
            .split('/')
            .map(|n| n.trim().trim_matches('`').to_string())
            .collect();
        assert_eq!(nums.len(), names.len(), "{line}");
        documented.extend(nums.into_iter().zip(names));
    }
    let code: Vec<(u32, String)> = HubCode::ALL
        .iter()
        .map(|c| (c.value(), format!("{c:?}")))
        .collect();
    assert_eq!(documented, code);
}

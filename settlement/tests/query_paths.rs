//! The paths `query_path` builds are the paths `query` serves: every
//! constructor reaches a served path, and identifiers holding `/` reach the
//! right record.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use tally_settlement::proto::{Outcome, ReportUsage, UsageRecord};
use tally_settlement::query::query;
use tally_settlement::query_path::{self as qp, QueryPath};
use tally_settlement::{
    begin_block, deliver_tx, init_chain, sign_report, Block, Code, GatewayEntry, Genesis,
};
use tally_store::{MemBackend, Pending};

const CHAIN: &str = "tally-test";
const T0: u64 = 1_800_000_000;

fn gw_key() -> SigningKey {
    SigningKey::from_bytes(&[9u8; 32])
}

fn setup() -> Pending {
    let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = Genesis {
        gateways: vec![GatewayEntry {
            name: "gw".into(),
            pubkey: hex::encode(gw_key().verifying_key().to_bytes()),
        }],
        allowances: vec![tally_settlement::AllowanceEntry {
            user: "u:1".into(),
            gateway: "gw".into(),
            max_per_window: 1,
            expires_at: T0 + 3600,
        }],
        ..Genesis::default()
    };
    init_chain(&mut p, CHAIN, &g).unwrap();
    let b = Block {
        height: 1,
        time: T0,
    };
    begin_block(&mut p, &b).unwrap();
    let report = ReportUsage {
        chain_id: CHAIN.into(),
        report_id: vec![1; 16],
        expires_at: T0 + 60,
        records: vec![UsageRecord {
            user: "u:1".into(),
            provider: "org/prov".into(),
            model: "llama/3-70b".into(),
            route: "/v1/chat".into(),
            outcome: Outcome::Ok as i32,
            units: 1,
            amount: 0,
            ..Default::default()
        }],
        route_calls: Vec::new(),
    };
    let r = deliver_tx(&mut p, &b, &sign_report(&gw_key(), &report)).expect("no local fault");
    assert_eq!(r.code, Code::Ok, "{}", r.log);
    p
}

#[test]
fn every_built_path_is_served() {
    let p = setup();
    let w = T0 / 60;
    let paged = |q: QueryPath| q.page(Some(10), None);
    for path in [
        paged(qp::sla_route("u:1", "org/prov", "llama/3-70b", "/v1/chat")),
        qp::sla_route_window("u:1", "org/prov", "llama/3-70b", "/v1/chat", w),
        paged(qp::sla_provider("org/prov", None)),
        paged(qp::sla_provider("org/prov", Some(w))),
        paged(qp::sla_user("u:1", None)),
        paged(qp::sla_user("u:1", Some(w))),
        paged(qp::windows()),
        qp::balance("u:1"),
        qp::params(),
        qp::gateways(),
        qp::sync("hub"),
        paged(qp::hubcalls("hub")),
        qp::validators(),
        qp::proposals(None),
        qp::proposals(Some(3)),
    ] {
        let r = query(&p, &path.to_string());
        assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
    }
    // Served, with nothing stored under them here.
    for path in [qp::batch("hub", 1), qp::dkg()] {
        let r = query(&p, &path.to_string());
        assert_eq!(r.code, Code::NotFound, "{path}: {}", r.log);
    }
}

#[test]
fn identifiers_with_slashes_reach_their_record() {
    let p = setup();
    let r = query(
        &p,
        &qp::sla_route_window("u:1", "org/prov", "llama/3-70b", "/v1/chat", T0 / 60).to_string(),
    );
    assert_eq!(r.code, Code::Ok, "{}", r.log);
    let v: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
    assert_eq!(v["provider"], "org/prov");
    assert_eq!(v["model"], "llama/3-70b");
    assert_eq!(v["route"], "/v1/chat");
    assert_eq!(v["requests"], 1);
    // An identifier the chain refuses is a bad argument, not a wrong path.
    let r = query(&p, &qp::balance("a b?").to_string());
    assert_eq!(r.code, Code::BadArgument, "{}", r.log);
}

//! The events FinalizeBlock emits, read through the abci adapter's
//! response (block events and per-transaction events) in the in-process
//! driver: each with its exact attributes, at the height the settlement
//! timeline puts it. Expected values are worked out by hand from the
//! scripted usage below.

use std::collections::BTreeMap;

use tally_settlement::bls::deal;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_settlement::Code;
use tally_tests::driver::Net;
use tally_tests::hub::Hub;
use tally_tests::traffic::{gateway_key, Traffic};
use tendermint_proto::v0_38::abci::Event;

const CHAIN: &str = "tally-events";
const T0: i64 = 1_800_000_000; // a 60 s window boundary
const W0: i64 = T0 / 60;

/// A net of four with a threshold key (t = 3); with `wrong_group` the
/// genesis group key is not the one the public shares interpolate to.
fn setup(wrong_group: bool) -> (Net, Traffic) {
    let key = gateway_key(9);
    let traffic = Traffic::new(3, key.clone(), CHAIN, [2, 2, 1, 1]);
    let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 41; 64]).collect();
    let (pubs, shares) = deal(4, 3, &coeffs).expect("deal");
    let other: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 51; 64]).collect();
    let (other, _) = deal(4, 3, &other).expect("deal");
    let group = if wrong_group { other.group } else { pubs.group };
    let hexkey = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
    let state = serde_json::json!({
        "params": {"settlement_window_secs": 60, "hub_chain": "hub"},
        "gateways": [{"name": "gw", "pubkey": hex::encode(key.verifying_key().to_bytes())}],
        "allowances": tally_tests::traffic::allowances(&traffic.users, "gw"),
        "balances": traffic.users.iter().map(|u| serde_json::json!({"user": u, "amount": 1000})).collect::<Vec<_>>(),
        "dkg": {
            "threshold": 3,
            "group_key": hexkey(&group),
            "public_shares": pubs.shares.iter().map(hexkey).collect::<Vec<_>>(),
            "signers": tally_tests::driver::signers(4),
        },
    });
    let mut net = Net::in_memory(4, CHAIN, T0).expect("net");
    net.init(&state.to_string()).expect("init");
    net.set_signers(shares);
    (net, traffic)
}

fn rec(user: usize, provider: usize, outcome: Outcome, amount: u64) -> UsageRecord {
    UsageRecord {
        user: format!("user-{user}"),
        provider: format!("prov-{provider}"),
        model: "org/model-0".into(),
        route: "/v1/route-0".into(),
        outcome: outcome as i32,
        units: 5,
        amount,
        ..Default::default()
    }
}

/// The scripted usage: three routes, four requests, 13 credits owed to
/// three (provider, user) pairs.
fn usage() -> Vec<UsageRecord> {
    vec![
        rec(0, 0, Outcome::Ok, 7),
        rec(0, 0, Outcome::Transient, 0),
        rec(1, 1, Outcome::Ok, 4),
        rec(1, 0, Outcome::Cancel, 2),
    ]
}

/// One emitted event: height, whether it came from a transaction, type,
/// attributes.
#[derive(Debug)]
struct Seen {
    height: i64,
    from_tx: bool,
    kind: String,
    attrs: BTreeMap<String, String>,
}

fn seen(height: i64, from_tx: bool, e: &Event) -> Seen {
    Seen {
        height,
        from_tx,
        kind: e.r#type.clone(),
        attrs: e
            .attributes
            .iter()
            .map(|a| (a.key.clone(), a.value.clone()))
            .collect(),
    }
}

fn attrs(kv: &[(&str, String)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// Runs blocks 10 s apart from T0 to `until`, the usage in the first;
/// the hub's tip reaches 10 at T0 + 150. Returns every event seen.
fn run(net: &mut Net, traffic: &mut Traffic, until: i64) -> Vec<Seen> {
    let mut all = Vec::new();
    let tx = traffic.report(usage(), net.now as u64, 300);
    let mut txs = vec![tx];
    while net.now <= until {
        if net.now >= T0 + 150 {
            if let Some(h) = &mut net.hub {
                h.tip = 10;
            }
        }
        let out = net.block(std::mem::take(&mut txs), 10).expect("block");
        let h = out.block.height;
        all.extend(out.events.iter().map(|e| seen(h, false, e)));
        for r in &out.tx_results {
            assert_eq!(r.code, 0, "height {h}: {}", r.log);
            all.extend(r.events.iter().map(|e| seen(h, true, e)));
        }
    }
    all
}

fn only<'a>(all: &'a [Seen], kind: &str) -> &'a Seen {
    let v: Vec<&Seen> = all.iter().filter(|s| s.kind == kind).collect();
    assert_eq!(v.len(), 1, "{kind}: {v:?}");
    v[0]
}

/// window_closed, hub_calls_made and window_converted in the first block
/// of the next window; sync_start, batch_signed, hub_sync_end and
/// hub_deposits in the blocks the timeline puts them, each once, with
/// the attributes worked out by hand.
#[test]
fn settlement_events_carry_exact_attributes_at_the_right_heights() {
    let (mut net, mut traffic) = setup(false);
    let mut hub = Hub::default();
    hub.deposit(2, "user-0", 40);
    hub.deposit(5, "user-1", 25);
    net.hub = Some(hub);
    let all = run(&mut net, &mut traffic, T0 + 200);

    // Height h has time T0 + 10 (h - 1): height 7 is the first of window
    // W0 + 1.
    let closed = only(&all, "window_closed");
    assert_eq!((closed.height, closed.from_tx), (7, false));
    assert_eq!(
        closed.attrs,
        attrs(&[
            ("window", W0.to_string()),
            ("routes", "3".into()),
            ("requests", "4".into()),
            ("amount", "13".into()),
        ])
    );
    let made = only(&all, "hub_calls_made");
    assert_eq!((made.height, made.from_tx), (7, false));
    assert_eq!(
        made.attrs,
        attrs(&[
            ("window", W0.to_string()),
            ("calls", "3".into()),
            ("first_id", "1".into()),
            ("last_id", "3".into()),
        ])
    );
    let conv = only(&all, "window_converted");
    assert_eq!((conv.height, conv.from_tx), (7, false));
    assert_eq!(
        conv.attrs,
        attrs(&[("window", W0.to_string()), ("hub_calls", "3".into())])
    );
    // In that order within the block.
    let order: Vec<&str> = all
        .iter()
        .filter(|s| s.height == 7 && !s.from_tx)
        .map(|s| s.kind.as_str())
        .collect();
    assert_eq!(
        order,
        ["window_closed", "hub_calls_made", "window_converted"]
    );

    // The proposer of height 7 runs that block's start-of-block work
    // first, so the sync starts in the block that closed the window; the
    // partials ride in its extensions and are combined in height 8; the
    // relay sees the signed batch committed before height 9, the hub
    // settles it, and the result partials (extensions of 9) end the sync
    // in 10. The hub's tip reaches 10 before height 16: its partials (in
    // 16's extensions) credit the deposits in 17.
    let start = only(&all, "sync_start");
    let settlement = || ("retry_layer", "settlement".to_string());
    assert_eq!((start.height, start.from_tx), (7, true));
    assert_eq!(
        start.attrs,
        attrs(&[
            ("chain", "hub".into()),
            ("nonce", "1".into()),
            ("attempt", "1".into()),
            settlement(),
        ])
    );
    let signed = only(&all, "batch_signed");
    assert_eq!((signed.height, signed.from_tx), (8, true));
    assert_eq!(
        signed.attrs,
        attrs(&[("chain", "hub".into()), ("nonce", "1".into())])
    );
    let end = only(&all, "hub_sync_end");
    assert_eq!((end.height, end.from_tx), (10, true));
    assert_eq!(
        end.attrs,
        attrs(&[
            ("chain", "hub".into()),
            ("nonce", "1".into()),
            ("attempt", "1".into()),
            ("outcome", "settled".into()),
            settlement(),
        ])
    );
    let dep = only(&all, "hub_deposits");
    assert_eq!((dep.height, dep.from_tx), (17, true));
    assert_eq!(
        dep.attrs,
        attrs(&[
            ("chain", "hub".into()),
            ("from_height", "1".into()),
            ("to_height", "10".into()),
            ("deposits", "2".into()),
            ("more", "false".into()),
            ("credited", "65".into()),
        ])
    );
    assert!(all.iter().all(|s| s.kind != "combine_failed"));
}

/// A genesis whose group key does not match its public shares: t valid
/// partials combine to a signature the group key refuses, so FinalizeBlock
/// emits combine_failed (the batch digest and the reason) and the batch is
/// never signed.
#[test]
fn combine_failed_is_emitted_when_the_group_key_refuses_the_combination() {
    let (mut net, mut traffic) = setup(true);
    let all = run(&mut net, &mut traffic, T0 + 120);
    let start = only(&all, "sync_start");
    let failed: Vec<&Seen> = all.iter().filter(|s| s.kind == "combine_failed").collect();
    assert!(!failed.is_empty(), "no combine_failed: {all:?}");
    let r = net.nodes[0].app.query_path("/batch/hub/1");
    assert_eq!(r.code, Code::Ok);
    let b: serde_json::Value = serde_json::from_slice(&r.value).expect("json");
    assert_ne!(b["status"], "signed", "{b}");
    let f = failed[0];
    assert!(f.from_tx);
    assert_eq!(f.height, start.height + 1, "{failed:?}");
    assert_eq!(
        f.attrs,
        attrs(&[
            ("digest", b["digest"].as_str().expect("digest").to_string()),
            (
                "error",
                "combined signature does not verify against the group key".into()
            ),
        ])
    );
    assert!(all.iter().all(|s| s.kind != "batch_signed"));
}

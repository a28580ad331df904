//! Paths of the ABCI adapter and the settlement timeline that only a
//! test of their own reaches: CheckTx's clock (the last block's time),
//! PrepareProposal packing under `max_tx_bytes`, historical query heights,
//! a chain without a threshold key, hub deposit rules, late or stale hub
//! results, and the verified-signature cache vouching for nothing but the
//! body and key it verified. Expected values come from hand-worked
//! scenarios or small models written here.

use bytes::Bytes;
use tally_settlement::bls::deal;
use tally_settlement::proto::{HubResult, Outcome, UsageRecord};
use tally_settlement::Code;
use tally_tests::driver::Net;
use tally_tests::hub::Hub;
use tally_tests::traffic::{gateway_key, Traffic};
use tendermint_abci::Application;
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::{RequestCheckTx, RequestPrepareProposal, RequestQuery};

const CHAIN: &str = "tally-paths";
const T0: i64 = 1_800_000_000; // a 60 s window boundary

/// Genesis JSON funding `traffic`'s users, with a dealt threshold key
/// (t = 3 of 4) when `key` is set.
fn genesis(
    traffic: &Traffic,
    gw: &ed25519_dalek::SigningKey,
    key: bool,
) -> (String, Vec<tally_settlement::bls::SecretShare>) {
    let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 61; 64]).collect();
    let (pubs, shares) = deal(4, 3, &coeffs).expect("deal");
    let hexkey = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
    let mut state = serde_json::json!({
        "params": {"settlement_window_secs": 60, "hub_chain": "hub"},
        "gateways": [{"name": "gw", "pubkey": hex::encode(gw.verifying_key().to_bytes())}],
        "allowances": tally_tests::traffic::allowances(&traffic.users, "gw"),
        "balances": traffic.users.iter().map(|u| serde_json::json!({"user": u, "amount": 1000})).collect::<Vec<_>>(),
    });
    if key {
        state["dkg"] = serde_json::json!({
            "threshold": 3,
            "group_key": hexkey(&pubs.group),
            "public_shares": pubs.shares.iter().map(hexkey).collect::<Vec<_>>(),
            "signers": tally_tests::driver::signers(4),
        });
    }
    (state.to_string(), shares)
}

/// Four in-memory validators at `t0`, with a threshold key if `key`.
fn net(t0: i64, key: bool) -> (Net, Traffic) {
    let gw = gateway_key(7);
    let traffic = Traffic::new(13, gw.clone(), CHAIN, [2, 2, 1, 1]);
    let (state, shares) = genesis(&traffic, &gw, key);
    let mut net = Net::in_memory(4, CHAIN, t0).expect("net");
    net.init(&state).expect("init");
    if key {
        net.set_signers(shares);
    }
    (net, traffic)
}

fn query(net: &Net, path: &str) -> serde_json::Value {
    let r = net.nodes[0].app.query_path(path);
    assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
    serde_json::from_slice(&r.value).expect("json")
}

fn paid(user: usize, provider: usize, amount: u64) -> UsageRecord {
    UsageRecord {
        user: format!("user-{user}"),
        provider: format!("prov-{provider}"),
        model: "org/model-0".into(),
        route: "/v1/route-0".into(),
        outcome: Outcome::Ok as i32,
        units: 1,
        amount,
        ..Default::default()
    }
}

fn check(net: &Net, tx: &[u8]) -> u32 {
    let r = net.nodes[0].app.check_tx(RequestCheckTx {
        tx: Bytes::copy_from_slice(tx),
        r#type: 0,
    });
    r.code
}

fn wall_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// CheckTx judges expiry by the last committed block's time, not the
/// wall clock: a report still valid at that time passes although the wall
/// clock is past its expiry, a report valid by the wall clock but expired
/// at that time is refused, and the verdict moves with the next block.
#[test]
fn check_tx_judges_expiry_by_the_last_block_time() {
    // Block time in the past of the wall clock.
    let t = 1_700_000_000i64;
    assert!(wall_clock() > t as u64 + 1000);
    let (mut past, mut traffic) = net(t, false);
    past.block(Vec::new(), 100).expect("block"); // last block time t
    let r = traffic.report(vec![paid(0, 0, 1)], t as u64, 60);
    assert_eq!(
        check(&past, &r),
        Code::Ok.value(),
        "valid at the last block time"
    );
    past.block(Vec::new(), 10).expect("block"); // last block time t + 100
    assert_eq!(
        check(&past, &r),
        Code::ReportExpired.value(),
        "expired at the new last block time"
    );

    // Block time in the future of the wall clock.
    assert!(wall_clock() + 1000 < T0 as u64);
    let (mut future, mut traffic) = net(T0, false);
    future.block(Vec::new(), 10).expect("block");
    let r = traffic.report(vec![paid(0, 0, 1)], wall_clock(), 300);
    assert_eq!(
        check(&future, &r),
        Code::ReportExpired.value(),
        "valid by the wall clock only"
    );
}

/// Query answers only the latest height (or 0, meaning latest): any other
/// height, past or future, is refused with `bad_argument` and says so.
#[test]
fn query_serves_only_the_latest_height() {
    let (mut net, _) = net(T0, false);
    for _ in 0..3 {
        net.block(Vec::new(), 10).expect("block");
    }
    let q = |height: i64| {
        net.nodes[0].app.query(RequestQuery {
            data: Bytes::new(),
            path: "/params".into(),
            height,
            prove: false,
        })
    };
    for h in [0, 3] {
        let r = q(h);
        assert_eq!(r.code, Code::Ok.value(), "height {h}: {}", r.log);
        assert_eq!(r.height, 3);
        assert!(!r.value.is_empty());
    }
    for h in [1, 2, 4, -1] {
        let r = q(h);
        assert_eq!(r.code, Code::BadArgument.value(), "height {h}");
        assert_eq!(r.height, 3);
        assert!(r.value.is_empty());
        assert!(r.log.contains("only the latest height (3)"), "{}", r.log);
    }
}

/// PrepareProposal puts the due system transaction first and then packs
/// mempool reports greedily in mempool order, skipping any that would
/// pass `max_tx_bytes` (a later smaller one still gets in) and bytes
/// ProcessProposal would refuse; the proposal never exceeds the limit.
#[test]
fn prepare_proposal_packs_under_max_tx_bytes_with_system_txs_first() {
    let (mut net, mut traffic) = net(T0, true);
    net.block(
        vec![traffic.report(vec![paid(0, 0, 5), paid(1, 1, 3)], T0 as u64, 300)],
        10,
    )
    .expect("block");
    while net.now < T0 + 60 {
        net.block(Vec::new(), 10).expect("block");
    }
    // The next block closes the window: a SyncTxStart is due in it.
    let now = net.now as u64;
    let small = traffic.report(vec![paid(0, 0, 1)], now, 300);
    let big = traffic.report((0..30).map(|_| paid(1, 0, 1)).collect(), now, 300);
    let small2 = traffic.report(vec![paid(1, 1, 1), paid(0, 1, 1)], now, 300);
    assert!(big.len() > small.len() + small2.len());
    let garbage = vec![0xde, 0xad];
    let mempool = [small.clone(), garbage, big.clone(), small2.clone()];
    let prepare = |max: i64| -> Vec<Vec<u8>> {
        net.nodes[0]
            .app
            .prepare_proposal(RequestPrepareProposal {
                max_tx_bytes: max,
                txs: mempool.iter().cloned().map(Bytes::from).collect(),
                local_last_commit: None,
                misbehavior: Vec::new(),
                height: net.height + 1,
                time: Some(Timestamp {
                    seconds: net.now,
                    nanos: 0,
                }),
                next_validators_hash: Bytes::new(),
                proposer_address: tally_tests::driver::address(0),
            })
            .txs
            .into_iter()
            .map(|t| t.to_vec())
            .collect()
    };
    let all = prepare(1 << 20);
    let sys = all[0].clone();
    assert!(matches!(
        tally_settlement::decode_tx(&sys).map(|t| t.sum),
        Ok(Some(tally_settlement::proto::tx::Sum::SyncStart(_)))
    ));
    assert_eq!(
        all,
        vec![sys.clone(), small.clone(), big.clone(), small2.clone()]
    );
    // The model: system tx first if it fits, then greedy over the
    // decodable mempool entries.
    let model = |max: usize| -> Vec<Vec<u8>> {
        let mut used = 0;
        let mut out = Vec::new();
        for t in [&sys, &small, &big, &small2] {
            if used + t.len() <= max {
                used += t.len();
                out.push(t.clone());
            }
        }
        out
    };
    let s = sys.len();
    for max in [
        s + small.len() + small2.len(),
        s + small.len() + big.len() - 1,
        s + big.len(),
        s,
        s - 1,
        small.len() + small2.len(),
        0,
    ] {
        let got = prepare(max as i64);
        assert_eq!(got, model(max), "max_tx_bytes {max}");
        assert!(got.iter().map(Vec::len).sum::<usize>() <= max);
    }
    // Spot checks of the model itself.
    assert_eq!(
        model(s + small.len() + small2.len()),
        vec![sys.clone(), small.clone(), small2.clone()]
    );
}

/// A genesis without a threshold key never syncs: closed windows turn into
/// hub calls that pile up, no SyncTxStart (or any system transaction) is
/// ever proposed, and no attempt is recorded.
#[test]
fn without_a_threshold_key_hub_calls_accumulate_and_nothing_syncs() {
    let (mut net, mut traffic) = net(T0, false);
    // Window 0: user-0 owes prov-0 5 and prov-1 2; window 1: user-1 owes
    // prov-0 4; window 2: user-0 owes prov-0 1. Four hub calls.
    let usage: [(i64, Vec<UsageRecord>); 3] = [
        (0, vec![paid(0, 0, 2), paid(0, 1, 2), paid(0, 0, 3)]),
        (60, vec![paid(1, 0, 4)]),
        (120, vec![paid(0, 0, 1)]),
    ];
    let mut next = 0;
    while net.now < T0 + 400 {
        let mut txs = Vec::new();
        if next < usage.len() && net.now >= T0 + usage[next].0 {
            txs.push(traffic.report(usage[next].1.clone(), net.now as u64, 300));
            next += 1;
        }
        let n = txs.len();
        let out = net.block(txs, 10).expect("block");
        assert_eq!(
            out.block.txs.len(),
            n,
            "height {}: a system tx",
            out.block.height
        );
        for r in &out.tx_results {
            assert_eq!(r.code, 0, "{}", r.log);
            assert!(
                r.events.iter().all(|e| e.r#type == "usage_report"),
                "{:?}",
                r.events
            );
        }
    }
    let calls = query(&net, "/hubcalls/hub");
    let calls: Vec<(String, String, u64)> = calls["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| {
            (
                c["user"].as_str().expect("user").to_string(),
                c["provider"].as_str().expect("provider").to_string(),
                c["amount"].as_u64().expect("amount"),
            )
        })
        .collect();
    let owed = |u: &str, p: &str, a: u64| (u.to_string(), p.to_string(), a);
    assert_eq!(
        calls,
        vec![
            owed("user-0", "prov-0", 5),
            owed("user-0", "prov-1", 2),
            owed("user-1", "prov-0", 4),
            owed("user-0", "prov-0", 1),
        ]
    );
    let st = query(&net, "/sync/hub");
    assert_eq!(st["attempts"], 0, "{st}");
    assert_eq!(st["pending_calls"], 4, "{st}");
    assert!(st["nonce"].is_null(), "{st}");
    assert_eq!(
        net.nodes[0].app.query_path("/batch/hub/1").code,
        Code::NotFound
    );
}

/// Runs a threshold net with `hub` until T0 + 200 and returns the
/// hub_deposits events seen.
fn deposits_run(hub: Hub) -> (Net, usize) {
    let (mut net, _) = net(T0, true);
    net.hub = Some(hub);
    if let Some(h) = &mut net.hub {
        h.tip = 10;
    }
    let mut events = 0;
    while net.now < T0 + 200 {
        let out = net.block(Vec::new(), 10).expect("block");
        events += out
            .tx_results
            .iter()
            .flat_map(|r| &r.events)
            .filter(|e| e.r#type == "hub_deposits")
            .count();
    }
    (net, events)
}

/// A hub range holding a deposit of zero credits, or one for a user name
/// the chain does not accept, is never signed: nothing of the range is
/// credited (not even its valid deposit) and the cursors stay put. The
/// same range without the bad deposit is credited once.
#[test]
fn deposits_of_zero_or_to_a_bad_user_are_refused() {
    let mut good = Hub::default();
    good.deposit(2, "user-0", 40);
    good.deposit(4, "user-1", 9);
    let (net, events) = deposits_run(good);
    assert_eq!(events, 1);
    assert_eq!(query(&net, "/balance/user-0")["balance"], 1040);
    assert_eq!(query(&net, "/balance/user-1")["balance"], 1009);
    let st = query(&net, "/sync/hub");
    assert_eq!(
        (st["hub_cursor"].as_u64(), st["next_deposit_seq"].as_u64()),
        (Some(11), Some(3)),
        "{st}"
    );

    for (user, amount) in [("user-1", 0), ("bad user!", 9)] {
        let mut hub = Hub::default();
        hub.deposit(2, "user-0", 40);
        hub.deposit(4, user, amount);
        let (net, events) = deposits_run(hub);
        assert_eq!(events, 0, "{user} {amount}");
        assert_eq!(query(&net, "/balance/user-0")["balance"], 1000);
        assert_eq!(query(&net, "/balance/user-1")["balance"], 1000);
        let st = query(&net, "/sync/hub");
        assert_eq!(
            (st["hub_cursor"].as_u64(), st["next_deposit_seq"].as_u64()),
            (Some(1), Some(1)),
            "{st}"
        );
    }
}

/// Hub results that do not match the running attempt change nothing: a
/// failure of an earlier attempt and a result for another nonce are
/// ignored. A late success of an earlier attempt settles the batch (the
/// hub did pay it).
#[test]
fn stale_hub_results_are_ignored_and_late_success_settles() {
    let (mut net, mut traffic) = net(T0, true);
    net.block(
        vec![traffic.report(vec![paid(0, 0, 5)], T0 as u64, 300)],
        10,
    )
    .expect("block");
    let mut ends = 0;
    fn step(net: &mut Net, ends: &mut usize, secs: i64) {
        let out = net.block(Vec::new(), secs).expect("block");
        *ends += out
            .tx_results
            .iter()
            .flat_map(|r| &r.events)
            .filter(|e| e.r#type == "hub_sync_end")
            .count();
    }
    // Attempt 1 starts at T0 + 60, gets no result and expires after 360 s.
    while query(&net, "/sync/hub")["attempts"] != 2 {
        assert!(net.now < T0 + 600, "no second attempt");
        step(&mut net, &mut ends, 30);
    }
    for _ in 0..3 {
        step(&mut net, &mut ends, 5);
    }
    let before = query(&net, "/sync/hub");
    assert_eq!(
        (before["nonce"].as_u64(), before["attempt"].as_u64()),
        (Some(1), Some(2)),
        "{before}"
    );
    let result = |nonce: u64, attempt: u32, settled: bool| HubResult {
        chain: "hub".into(),
        nonce,
        attempt,
        settled,
    };
    for r in [
        result(1, 1, false),
        result(2, 2, true),
        result(2, 2, false),
        result(1, 3, false),
    ] {
        for n in &net.nodes {
            n.app.hand_in(r.clone());
        }
        for _ in 0..3 {
            step(&mut net, &mut ends, 5);
        }
        let now = query(&net, "/sync/hub");
        for k in [
            "nonce",
            "attempt",
            "attempts",
            "failures",
            "settled_batches",
            "last_sync",
            "last_error",
        ] {
            assert_eq!(now[k], before[k], "{k} after {r:?}: {now}");
        }
    }
    assert_eq!(ends, 0);
    // The late success of attempt 1 is acted on.
    for n in &net.nodes {
        n.app.hand_in(result(1, 1, true));
    }
    for _ in 0..3 {
        step(&mut net, &mut ends, 5);
    }
    assert_eq!(ends, 1);
    let st = query(&net, "/sync/hub");
    assert_eq!(st["settled_batches"], 1, "{st}");
    assert_eq!(query(&net, "/batch/hub/1")["status"], "settled");
}

/// The node's verified-signature cache (`abci/src/sigcache.rs`) vouches
/// only for the exact body and key it verified. Every validator checks a
/// report at CheckTx (so each remembers its signature); then the same
/// signature over a changed body, and the same body and signature under
/// another registered gateway's key, are refused with `bad_signature` at
/// CheckTx and in a block, where the original lands and is counted once.
#[test]
fn a_cached_signature_vouches_for_no_other_body_or_key() {
    use prost::Message;
    use tally_settlement::proto::{tx::Sum, ReportUsage, SignedReport, Tx};

    let gw = gateway_key(7);
    let other = gateway_key(8);
    let mut traffic = Traffic::new(13, gw.clone(), CHAIN, [2, 2, 1, 1]);
    let (state, _) = genesis(&traffic, &gw, false);
    let mut state: serde_json::Value = serde_json::from_str(&state).expect("genesis json");
    state["gateways"].as_array_mut().expect("gateways").push(
        serde_json::json!({"name": "gw2", "pubkey": hex::encode(other.verifying_key().to_bytes())}),
    );
    let mut net = Net::in_memory(4, CHAIN, T0).expect("net");
    net.init(&state.to_string()).expect("init");
    net.block(Vec::new(), 1).expect("block");

    let good = traffic.report(vec![paid(0, 0, 5)], T0 as u64, 300);
    let signed = |tx: &[u8]| match Tx::decode(tx).expect("tx").sum {
        Some(Sum::Report(r)) => r,
        other => panic!("not a report: {other:?}"),
    };
    let wrap = |r: SignedReport| {
        Tx {
            sum: Some(Sum::Report(r)),
        }
        .encode_to_vec()
    };
    let original = signed(&good);
    let mut body = ReportUsage::decode(original.body.as_slice()).expect("body");
    body.records[0].amount = 500;
    let changed_body = wrap(SignedReport {
        body: body.encode_to_vec(),
        ..original.clone()
    });
    let other_key = wrap(SignedReport {
        gateway_key: other.verifying_key().to_bytes().to_vec(),
        ..original
    });

    for node in &net.nodes {
        let code = |tx: &[u8]| {
            node.app
                .check_tx(RequestCheckTx {
                    tx: Bytes::copy_from_slice(tx),
                    r#type: 0,
                })
                .code
        };
        assert_eq!(code(&good), Code::Ok.value(), "the original verifies");
        assert_eq!(code(&good), Code::Ok.value(), "and again, from the cache");
        assert_eq!(
            code(&changed_body),
            Code::BadSignature.value(),
            "the cached signature over a changed body"
        );
        assert_eq!(
            code(&other_key),
            Code::BadSignature.value(),
            "the cached signature under another gateway's key"
        );
    }
    let out = net
        .block(vec![changed_body, good, other_key], 1)
        .expect("block");
    let codes: Vec<u32> = out.tx_results.iter().map(|r| r.code).collect();
    assert_eq!(
        codes,
        [
            Code::BadSignature.value(),
            Code::Ok.value(),
            Code::BadSignature.value()
        ],
        "in the block: {:?}",
        out.tx_results.iter().map(|r| &r.log).collect::<Vec<_>>()
    );
    let user = query(&net, "/balance/user-0");
    assert_eq!(user["balance"], 1000 - 5, "charged once, the original's 5");
}

/// Blocks a four-validator net at genesis app `version` takes to credit a
/// burst of deposits split into 4-deposit messages: 70 in hub heights
/// 1..=10 (18 messages), 33 in 11..=20 (9) and none in 21..=30 (one
/// empty message), 28 messages in all. Also checks that every balance
/// ends as its genesis funds plus the hub's deposits and that the cursor ends past
/// the three ranges.
fn burst_blocks(version: u64) -> u64 {
    let gw = gateway_key(7);
    let traffic = Traffic::new(13, gw.clone(), CHAIN, [2, 2, 1, 1]);
    let (state, shares) = genesis(&traffic, &gw, true);
    let mut state: serde_json::Value = serde_json::from_str(&state).expect("json");
    state["params"]["max_block_deposits"] = 4.into();
    let mut net = Net::in_memory(4, CHAIN, T0).expect("net");
    net.genesis_version = version;
    net.init(&state.to_string()).expect("init");
    net.set_signers(shares);
    let mut hub = Hub::default();
    for i in 0..70u64 {
        hub.deposit(1 + i % 10, &format!("user-{}", i % 5), 1 + i);
    }
    for i in 0..33u64 {
        hub.deposit(11 + i % 10, &format!("user-{}", i % 3), 100 + i);
    }
    hub.tip = 30;
    let want: std::collections::BTreeMap<String, u64> = hub.deposited();
    net.hub = Some(hub);
    let mut blocks = 0;
    loop {
        net.block(Vec::new(), 1).expect("block");
        blocks += 1;
        let st = query(&net, "/sync/hub");
        if st["hub_cursor"].as_u64() == Some(31) {
            assert_eq!(st["next_deposit_seq"].as_u64(), Some(104), "{st}");
            break;
        }
        assert!(blocks < 400, "deposits not credited after 400 blocks: {st}");
    }
    for (user, amount) in want {
        let funded = state["balances"]
            .as_array()
            .expect("balances")
            .iter()
            .find(|b| b["user"] == user.as_str())
            .map_or(0, |b| b["amount"].as_u64().expect("amount"));
        let b = query(&net, &format!("/balance/{user}"));
        assert_eq!(b["balance"].as_u64(), Some(funded + amount), "{user}: {b}");
    }
    blocks
}

/// Before app version 5 the chain waits for one hub-block message at a
/// time, signed in one block and credited in the next: the 28 messages
/// take at least 56 blocks. From version 5 (ADR 0024) up to 16 are in
/// flight and each block credits up to max_block_messages = 8 of them, so
/// the same burst is credited within ceil(28 / 8) = 4 blocks of the
/// first signatures, plus the block those are signed in and one per
/// range boundary the relay has not built ahead yet: at most 8.
#[test]
fn deposit_messages_in_flight_credit_a_burst_in_a_few_blocks() {
    let one_at_a_time = burst_blocks(4);
    assert!(
        one_at_a_time >= 56,
        "version 4 took {one_at_a_time} blocks for 28 messages"
    );
    let in_flight = burst_blocks(5);
    eprintln!("28 deposit messages: version 4 {one_at_a_time} blocks, version 5 {in_flight}");
    assert!(
        in_flight <= 8,
        "version 5 took {in_flight} blocks for 28 messages (version 4: {one_at_a_time})"
    );
}

//! In-process ABCI driver: several app instances through CometBFT's call
//! sequence with a controllable clock. Deterministic and fast.

use std::collections::BTreeMap;

use tally_settlement::bls::{self, deal, PublicShares};
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_settlement::{Code, RouteId, RouteRecordView};
use tally_tests::driver::Net;
use tally_tests::hub::Hub;
use tally_tests::traffic::{app_state, gateway_key, Traffic};

const CHAIN: &str = "tally-driver";
const T0: i64 = 1_800_000_000;

/// 1,000 blocks of random traffic (valid and invalid) on four RocksDB-backed
/// validators holding a threshold key (t = 3), with the reference hub and
/// every validator's relay: system transactions, vote extensions and BLS
/// signing run all along. All app hashes agree at every height; a restart
/// from the RocksDB files mid-run and a crash between FinalizeBlock and
/// Commit both continue with the same hashes; batches are still signed
/// while one validator is down (t of the other three). Every report's
/// result, every route's counters, every balance and every hub payment
/// equal a model written here (not the implementation's counting code).
#[test]
fn thousand_blocks_agree_across_restarts() -> anyhow::Result<()> {
    const FUNDS: u64 = 200_000;
    let dir = tempfile::tempdir()?;
    let key = gateway_key(1);
    let mut traffic = Traffic::new(42, key.clone(), CHAIN, [6, 3, 2, 3]);
    let mut net = Net::on_rocksdb(4, dir.path(), CHAIN, T0)?;
    let pubs = threshold_genesis(&mut net, &key, &traffic.users, FUNDS)?;
    let mut hub = Hub::default();
    for (i, u) in traffic.users.iter().enumerate() {
        hub.deposit(3 + 7 * i as u64, u, 1_000 + i as u64);
    }
    net.hub = Some(hub);

    let mut model = Model::new(&traffic.users, FUNDS);
    // The replay candidate: the first report of the last block, and
    // whether the model accepted it.
    let mut replay: Option<(Vec<u8>, bool)> = None;
    let mut signed_while_down = 0;
    let mut batches_signed = 0;
    let mut expect: BTreeMap<Vec<u8>, Expect> = BTreeMap::new();
    for h in 1..=1000u64 {
        let now = net.now as u64;
        let mut txs: Vec<(Vec<u8>, Expect)> = Vec::new();
        for _ in 0..traffic.pick(0..4) {
            let n = traffic.pick(1..40);
            let recs = traffic.records(n, 20);
            let tx = traffic.report(recs.clone(), now, 120);
            txs.push((tx, Expect::Fresh(recs)));
        }
        // Some invalid traffic: a replayed report, garbage, an expired one.
        match h % 50 {
            7 => {
                if let Some((r, accepted)) = replay.take() {
                    let want = if accepted {
                        Code::DuplicateReport
                    } else {
                        Code::ReportExpired
                    };
                    txs.push((r, Expect::Code(want)));
                }
            }
            13 => txs.push((vec![0xde, 0xad], Expect::Dropped)),
            29 => {
                let recs = traffic.records(3, 1);
                let tx = traffic.report(recs, now - 200, 100);
                txs.push((tx, Expect::Code(Code::ReportExpired)));
            }
            _ => {}
        }
        let step = 1 + traffic.pick(0..3) as i64;
        if h == 400 {
            net.stop(2);
        }
        if h == 450 {
            net.restart(2)?;
        }
        let bytes: Vec<Vec<u8>> = txs.iter().map(|(t, _)| t.clone()).collect();
        if h == 700 {
            // Node 1 runs FinalizeBlock for the next block and crashes.
            net.crash_before_commit(1, bytes.clone())?;
        }
        if let Some(hub) = &mut net.hub {
            hub.tip = h;
        }
        for (t, e) in &txs {
            expect.insert(t.clone(), e.clone());
        }
        let out = net.block(bytes, step)?;
        assert_eq!(out.block.txs.len(), out.tx_results.len());
        // Every system transaction precedes every user transaction.
        let system: Vec<bool> = out
            .block
            .txs
            .iter()
            .map(|t| !expect.contains_key(t.as_ref()))
            .collect();
        assert!(
            system.windows(2).all(|w| w[0] || !w[1]),
            "height {h}: a system tx after a user tx"
        );
        let mut results: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
        for (tx, r) in out.block.txs.iter().zip(&out.tx_results) {
            let Some(e) = expect.get(tx.as_ref()) else {
                assert_eq!(r.code, 0, "height {h}: system tx refused: {}", r.log);
                continue;
            };
            let want = match e {
                Expect::Fresh(recs) => model.report(recs),
                Expect::Code(c) => *c,
                Expect::Dropped => panic!("height {h}: undecodable bytes proposed"),
            };
            assert_eq!(r.code, want.value(), "height {h}: {}", r.log);
            results.insert(tx.to_vec(), want == Code::Ok);
        }
        for (t, e) in &txs {
            assert_eq!(
                results.contains_key(t),
                !matches!(e, Expect::Dropped),
                "height {h}: a user tx was left out or garbage proposed"
            );
        }
        if let Some((t, _)) = txs.first() {
            replay = Some((t.clone(), results.get(t).copied().unwrap_or(false)));
        }
        for e in out.tx_results.iter().flat_map(|r| &r.events) {
            if e.r#type == "batch_signed" {
                batches_signed += 1;
                if (400..450).contains(&h) {
                    signed_while_down += 1;
                }
            }
        }
    }
    // Traffic stops; the last window closes and the relays settle
    // whatever is left.
    let mut idle = 0;
    loop {
        let st = query(&net, 0, "/sync/hub");
        let calls = query(&net, 0, "/hubcalls/hub");
        if idle >= 10
            && st["pending_calls"] == 0
            && st["nonce"].is_null()
            && calls["calls"].as_array().is_some_and(|c| c.is_empty())
        {
            break;
        }
        idle += 1;
        assert!(idle < 200, "not settled after {idle} idle blocks: {st}");
        let out = net.block(Vec::new(), 10)?;
        batches_signed += out
            .tx_results
            .iter()
            .flat_map(|r| &r.events)
            .filter(|e| e.r#type == "batch_signed")
            .count();
    }
    let heads = net.heads();
    assert!(
        heads.iter().all(|h| h == &heads[0]),
        "final heads differ: {heads:?}"
    );
    assert!(heads[0].0 > 1000);
    assert!(batches_signed >= 20, "{batches_signed} batches signed");
    assert!(
        signed_while_down > 0,
        "no batch was signed while node2 was down"
    );
    let hub = net.hub.clone().expect("hub");
    assert_eq!(hub.settled.len(), batches_signed, "each batch paid once");
    for b in hub.settled.values() {
        let digest: [u8; 32] = b.digest.as_slice().try_into()?;
        let sig = bls::parse_signature(&b.signature)?;
        assert!(pubs.verify_group(&bls::message(CHAIN, bls::Kind::Batch, &digest), &sig));
    }

    // Every node answers queries with exactly the model's totals.
    assert!(
        model.routes.len() > 50,
        "traffic touched {} routes",
        model.routes.len()
    );
    assert!(model.accepted > 1000, "{} reports accepted", model.accepted);
    let deposited = hub.deposited();
    for node in &net.nodes {
        for (id, c) in &model.routes {
            let path = tally_tests::traffic::route_path(id);
            let r = node.app.query_path(&path);
            assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
            let v: serde_json::Value = serde_json::from_slice(&r.value)?;
            let recs: Vec<RouteRecordView> = serde_json::from_value(v["records"].clone())?;
            let got = recs.iter().fold(ModelCounters::default(), |mut a, r| {
                a.requests += r.requests;
                a.ok += r.ok;
                a.cancel += r.cancel;
                a.rate_limit += r.rate_limit;
                a.auth += r.auth;
                a.transient += r.transient;
                a.client += r.client;
                a.unknown += r.unknown;
                a.units += r.units;
                a.amount += r.amount;
                a.fail_count += r.fail_count;
                a
            });
            assert_eq!(&got, c, "{path}");
        }
        // Balances: funds - usage + deposits.
        for u in &traffic.users {
            let want = model.balances[u] + deposited[u];
            let r = node.app.query_path(&format!("/balance/{u}"));
            let v: serde_json::Value = serde_json::from_slice(&r.value)?;
            assert_eq!(v["balance"], want, "balance of {u}");
        }
    }
    // The hub paid each (user, provider) exactly what the model charged.
    let paid: BTreeMap<_, _> = hub.paid.into_iter().filter(|(_, v)| *v > 0).collect();
    let owed: BTreeMap<_, _> = model.owed.into_iter().filter(|(_, v)| *v > 0).collect();
    assert_eq!(paid, owed, "hub payments vs the model's charges");
    Ok(())
}

/// What the test expects of one mempool transaction.
#[derive(Clone, Debug)]
enum Expect {
    /// A fresh, signed report of these records: the model decides.
    Fresh(Vec<UsageRecord>),
    /// Refused with this code.
    Code(Code),
    /// Never proposed (does not decode).
    Dropped,
}

/// One route's counters, as the design defines them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ModelCounters {
    requests: u64,
    ok: u64,
    cancel: u64,
    rate_limit: u64,
    auth: u64,
    transient: u64,
    client: u64,
    unknown: u64,
    units: u64,
    amount: u64,
    fail_count: u64,
}

/// The chain's books, kept by the test.
#[derive(Debug)]
struct Model {
    routes: BTreeMap<RouteId, ModelCounters>,
    balances: BTreeMap<String, u64>,
    owed: BTreeMap<(String, String), u64>,
    accepted: usize,
}

impl Model {
    fn new(users: &[String], funds: u64) -> Self {
        Self {
            routes: BTreeMap::new(),
            balances: users.iter().map(|u| (u.clone(), funds)).collect(),
            owed: BTreeMap::new(),
            accepted: 0,
        }
    }

    /// Applies a fresh report: all of it, or (a user short of credits)
    /// none of it.
    fn report(&mut self, recs: &[UsageRecord]) -> Code {
        let mut debit: BTreeMap<&str, u64> = BTreeMap::new();
        for r in recs {
            *debit.entry(&r.user).or_default() += r.amount;
        }
        if debit.iter().any(|(u, d)| self.balances[*u] < *d) {
            return Code::InsufficientBalance;
        }
        for (u, d) in debit {
            *self.balances.get_mut(u).expect("user") -= d;
        }
        for r in recs {
            let id = RouteId {
                user: r.user.clone(),
                provider: r.provider.clone(),
                model: r.model.clone(),
                route: r.route.clone(),
            };
            let c = self.routes.entry(id).or_default();
            c.requests += 1;
            c.units += r.units;
            c.amount += r.amount;
            match Outcome::try_from(r.outcome).expect("outcome") {
                Outcome::Ok => c.ok += 1,
                Outcome::Cancel => c.cancel += 1,
                Outcome::Client => c.client += 1,
                Outcome::RateLimit => {
                    c.rate_limit += 1;
                    c.fail_count += 1;
                }
                Outcome::Auth => {
                    c.auth += 1;
                    c.fail_count += 1;
                }
                Outcome::Transient => {
                    c.transient += 1;
                    c.fail_count += 1;
                }
                Outcome::Unknown => {
                    c.unknown += 1;
                    c.fail_count += 1;
                }
                Outcome::Unspecified => panic!("traffic never sends unspecified"),
            }
            *self
                .owed
                .entry((r.user.clone(), r.provider.clone()))
                .or_default() += r.amount;
        }
        self.accepted += 1;
        Code::Ok
    }
}

/// Writes a genesis with a dealt threshold key (t = 3 of the net's
/// validators, bound to their addresses) and the hub chain "hub", runs
/// InitChain and hands each node its share; returns the public shares.
fn threshold_genesis(
    net: &mut Net,
    key: &ed25519_dalek::SigningKey,
    users: &[String],
    funds: u64,
) -> anyhow::Result<PublicShares> {
    let n = net.nodes.len();
    let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 31; 64]).collect();
    let (pubs, shares) = deal(n as u32, 3, &coeffs)?;
    let hexkey = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
    let state = serde_json::json!({
        "params": {"settlement_window_secs": 60, "hub_chain": "hub", "max_batch_calls": 50},
        "gateways": [{"name": "gw-test", "pubkey": hex::encode(key.verifying_key().to_bytes())}],
        "allowances": tally_tests::traffic::allowances(users, "gw-test"),
        "balances": users.iter().map(|u| serde_json::json!({"user": u, "amount": funds})).collect::<Vec<_>>(),
        "dkg": {
            "threshold": 3,
            "group_key": hexkey(&pubs.group),
            "public_shares": pubs.shares.iter().map(hexkey).collect::<Vec<_>>(),
            "signers": tally_tests::driver::signers(n),
        },
    });
    net.init(&state.to_string())?;
    net.set_signers(shares);
    Ok(pubs)
}

fn query(net: &Net, i: usize, path: &str) -> serde_json::Value {
    let r = net.nodes[i].app.query_path(path);
    assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
    serde_json::from_slice(&r.value).expect("json")
}

/// The in-memory twin gives the same app hashes as RocksDB for the same
/// blocks.
#[test]
fn memory_and_rocksdb_nodes_agree() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let key = gateway_key(2);
    let mut t1 = Traffic::new(7, key.clone(), CHAIN, [3, 2, 2, 2]);
    let mut t2 = Traffic::new(7, key.clone(), CHAIN, [3, 2, 2, 2]);
    let state = app_state(&key, &t1.users, 10_000, 30);
    let mut mem = Net::in_memory(2, CHAIN, T0)?;
    let mut rocks = Net::on_rocksdb(2, dir.path(), CHAIN, T0)?;
    mem.init(&state)?;
    rocks.init(&state)?;
    for _ in 0..100 {
        let r1 = t1.records(10, 5);
        let r2 = t2.records(10, 5);
        let a = mem.block(vec![t1.report(r1, mem.now as u64, 60)], 2)?;
        let b = rocks.block(vec![t2.report(r2, rocks.now as u64, 60)], 2)?;
        assert_eq!(a.app_hash, b.app_hash);
    }
    Ok(())
}

/// An invalid genesis never reaches InitChain in the driver: the parser
/// refuses it with a message (tallyd start does the same before listening).
#[test]
fn genesis_errors_are_explained() {
    let e =
        tally_settlement::Genesis::parse(br#"{"params":{"max_report_records":5000}}"#).unwrap_err();
    assert!(e.to_string().contains("max_report_records"));
}

/// A local store fault while executing a block calls the halt hook (the
/// binaries exit with status 3) instead of answering an app hash; the app
/// then refuses consensus work. A read-only path answers code 16 instead.
#[test]
fn a_corrupt_store_halts_the_node() -> anyhow::Result<()> {
    use std::sync::Arc;

    use tally_abci::{Halt, HaltReason, TallyApp};
    use tally_store::{Kv, MemBackend, Pending};
    use tendermint_abci::Application;
    use tendermint_proto::google::protobuf::Timestamp;
    use tendermint_proto::v0_38::abci::{
        response_process_proposal::ProposalStatus, RequestCheckTx, RequestFinalizeBlock,
        RequestProcessProposal,
    };

    // Height 1 committed with genesis state and one corrupt integer.
    let backend = Arc::new(MemBackend::new());
    let mut p = Pending::open(backend.clone())?;
    tally_settlement::init_chain(&mut p, CHAIN, &tally_settlement::Genesis::default())?;
    p.put(tally_settlement::keys::CUR_WINDOW.to_vec(), vec![1, 2, 3]);
    p.commit(1)?;

    let (halt, halts) = Halt::recording();
    let app = TallyApp::new(backend, halt)?;
    let r = app.check_tx(RequestCheckTx {
        tx: b"garbage".to_vec().into(),
        ..Default::default()
    });
    assert_eq!(r.code, Code::MalformedTx.value(), "{}", r.log);
    assert!(halts.is_empty(), "a read-only path never halts");

    let r = app.finalize_block(RequestFinalizeBlock {
        height: 2,
        time: Some(Timestamp {
            seconds: T0 + 1,
            nanos: 0,
        }),
        ..Default::default()
    });
    assert!(r.app_hash.is_empty(), "no app hash from a broken node");
    let events = halts.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, HaltReason::StoreFailure);
    assert_eq!(events[0].reason.exit_code(), 3);
    assert_eq!(events[0].height, 2);
    assert_eq!(events[0].error, "stored integer is corrupt");
    assert!(app.halted());
    app.commit();
    assert_eq!(
        app.last_commit().height,
        1,
        "nothing of the block is written"
    );
    let r = app.process_proposal(RequestProcessProposal {
        height: 2,
        ..Default::default()
    });
    assert_eq!(r.status, ProposalStatus::Reject as i32);
    Ok(())
}

/// A genesis the app cannot read halts it with the genesis reason (exit
/// status 2 in the binaries).
#[test]
fn a_bad_genesis_halts_the_node() -> anyhow::Result<()> {
    use std::sync::Arc;

    use tally_abci::{Halt, HaltReason, TallyApp};
    use tally_store::MemBackend;
    use tendermint_abci::Application;
    use tendermint_proto::v0_38::abci::RequestInitChain;

    let (halt, halts) = Halt::recording();
    let app = TallyApp::new(Arc::new(MemBackend::new()), halt)?;
    let r = app.init_chain(RequestInitChain {
        chain_id: CHAIN.into(),
        app_state_bytes: br#"{"bogus":1}"#.to_vec().into(),
        ..Default::default()
    });
    assert!(r.consensus_params.is_none());
    let events = halts.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, HaltReason::BadGenesis);
    assert_eq!(events[0].reason.exit_code(), 2);
    assert!(events[0].error.contains("bogus"), "{}", events[0].error);
    Ok(())
}

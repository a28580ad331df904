//! Byzantine validators and proposers in the in-process driver (issue 10).
//!
//! Every scenario runs with n = 4 (f = 1, threshold 3) and n = 7 (f = 2,
//! threshold 5), the first f validators byzantine, over the same workload:
//! usage in three settlement windows and a hub with deposits, one range
//! holding 3 × max_block_deposits + 1 of them. Each must end the same way:
//! honest nodes committed every height with equal app hashes (the driver
//! checks), every batch was signed, paid by the hub exactly once and
//! settled, no calls are pending, the hub paid exactly the usage charged,
//! and every balance equals a model of the usage and deposits. Each
//! scenario then checks what it attacks: which extensions and proposals
//! honest nodes refused.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use prost::Message;
use tally_settlement::bls::{deal, Kind};
use tally_settlement::proto::{tx, ReportUsage, SyncTxStart, VoteExtension};
use tally_settlement::Code;
use tally_store::Pending;
use tally_tests::adversary::proposals::{
    conflicting_start, Conflicter, Forger, Omitter, Stuffer, FORGERIES, STUFFING,
};
use tally_tests::adversary::votes::{
    ForeignIndex, LyingRelay, Malformed, Oversize, Silent, MALFORMED, THIEF,
};
use tally_tests::adversary::{block_state, start_tx, Acts, Behaviour, Record};
use tally_tests::driver::Net;
use tally_tests::hub::Hub;
use tally_tests::traffic::{gateway_key, Traffic};

const CHAIN: &str = "tally-byzantine";
const T0: i64 = 1_800_000_000; // a 60 s window boundary
const FUNDS: u64 = 1_000_000;
/// Deposits per hub-block message in these genesis params.
const CAP: u64 = 4;

/// What a scenario puts on its byzantine nodes and how they lead.
struct Scenario {
    /// The behaviour of each byzantine node.
    make: fn(&Acts) -> Box<dyn Behaviour>,
    /// Whether a byzantine node leads a height (given whether a sync
    /// start is due in it); otherwise proposers go round-robin.
    lead: fn(i64, bool) -> bool,
    /// Bytes offered in every height's mempool as well.
    mempool_extra: Option<Vec<u8>>,
    /// The genesis app version (0: the default, 1).
    version: u64,
}

/// A finished scenario.
struct Run {
    net: Net,
    byz: Vec<usize>,
    acts: Vec<&'static str>,
    /// Hub blocks signed ahead of the deposit cursor and held.
    held: usize,
}

impl Run {
    fn record(&self) -> &Record {
        &self.net.record
    }

    fn honest(&self) -> Vec<usize> {
        (0..self.net.nodes.len())
            .filter(|i| !self.byz.contains(i))
            .collect()
    }

    /// Every extension a byzantine node altered was refused by every
    /// honest node; returns how many there were.
    fn byzantine_extensions_refused(&self) -> usize {
        let honest = self.honest();
        let mut n = 0;
        for e in &self.record().extensions {
            if self.byz.contains(&e.voter) && e.altered {
                n += 1;
                for h in &honest {
                    assert!(
                        e.rejected_by.contains(h),
                        "node{h} accepted node{}'s extension at height {}",
                        e.voter,
                        e.height
                    );
                }
            }
        }
        n
    }

    /// Every proposal a byzantine node altered was refused; returns how
    /// many there were.
    fn altered_proposals_refused(&self) -> usize {
        let altered: Vec<_> = self
            .record()
            .proposals
            .iter()
            .filter(|p| p.altered)
            .collect();
        for p in &altered {
            assert!(
                !p.rejected_by.is_empty(),
                "node{}'s altered proposal at height {} was accepted: {:?}",
                p.proposer,
                p.height,
                p.shape
            );
        }
        altered.len()
    }

    fn acted(&self, what: &str) -> bool {
        self.acts.contains(&what)
    }
}

fn query(net: &Net, i: usize, path: &str) -> serde_json::Value {
    let r = net.nodes[i].app.query_path(path);
    assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
    serde_json::from_slice(&r.value).expect("json")
}

/// `n` validators with threshold `n - f`.
fn setup(n: usize, version: u64) -> (Net, Traffic) {
    let f = (n - 1) / 3;
    let t = n - f;
    let key = gateway_key(4);
    let traffic = Traffic::new(11, key.clone(), CHAIN, [3, 2, 1, 2]);
    let coeffs: Vec<[u8; 64]> = (0..t as u8).map(|i| [i + 21; 64]).collect();
    let (pubs, shares) = deal(n as u32, t as u32, &coeffs).expect("deal");
    let hexkey = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
    let app_state = serde_json::json!({
        "params": {
            "settlement_window_secs": 60,
            "hub_chain": "hub",
            "max_batch_calls": 4,
            "max_block_deposits": CAP,
            "hub_block_range": 10,
        },
        "gateways": [{"name": "gw", "pubkey": hex::encode(key.verifying_key().to_bytes())}],
        "allowances": tally_tests::traffic::allowances(&traffic.users, "gw"),
        "balances": traffic.users.iter().map(|u| serde_json::json!({"user": u, "amount": FUNDS})).collect::<Vec<_>>(),
        "dkg": {
            "threshold": t,
            "group_key": hexkey(&pubs.group),
            "public_shares": pubs.shares.iter().map(hexkey).collect::<Vec<_>>(),
            "signers": tally_tests::driver::signers(n),
        },
    });
    let mut net = Net::in_memory(n, CHAIN, T0).expect("net");
    net.genesis_version = version;
    net.init(&app_state.to_string()).expect("init");
    net.set_signers(shares);
    (net, traffic)
}

/// The hub's finalized height at `now`: a range of ten more heights one
/// block (5 s) before each window boundary, so hub-block partials ride in
/// the blocks that start syncs.
fn hub_tip(now: i64) -> u64 {
    10 * ((now - T0 + 5) / 60) as u64
}

/// The hub: two deposits in heights 1..=10, 3 × CAP + 1 in 11..=20 (the
/// burst), none in 21..=30, one in 31..=40.
fn hub(users: &[String]) -> Hub {
    let mut hub = Hub::default();
    hub.deposit(3, &users[0], 50);
    hub.deposit(7, &users[1], 70);
    for i in 0..3 * CAP + 1 {
        hub.deposit(11 + i % 10, &users[i as usize % users.len()], 1 + i);
    }
    hub.deposit(35, &users[2], 5);
    hub
}

/// The sync start an honest proposer would put in the next block, if one
/// is due (derived from node `i`'s committed state).
fn due_start(net: &Net, i: usize) -> Option<SyncTxStart> {
    let sim = next_block_state(net, i);
    tally_settlement::sync::next_sync_start(&sim, net.now as u64).expect("next_sync_start")
}

/// Node `i`'s committed state with the next block's start-of-block work.
fn next_block_state(net: &Net, i: usize) -> Pending {
    block_state(&net.nodes[i].app, net.height + 1, net.now).expect("block state")
}

fn run(n: usize, s: Scenario) -> Run {
    let f = (n - 1) / 3;
    // The byzantine nodes come first: their extensions lead every list of
    // votes, and they propose right before honest nodes.
    let byz: Vec<usize> = (0..f).collect();
    let (mut net, mut traffic) = setup(n, s.version);
    let acts = Acts::default();
    for &i in &byz {
        net.nodes[i].behaviour = Some((s.make)(&acts));
    }
    net.hub = Some(hub(&traffic.users));
    let honest = n - 1;

    // Usage in windows 0, 1 and 2; every report must be committed.
    let mut sent = 0usize;
    let mut charged: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut debits: BTreeMap<String, u64> = BTreeMap::new();
    let mut committed = 0usize;
    let mut led = 0usize;
    // Height of each batch's first start, and of its signing, by nonce.
    let mut started: BTreeMap<String, i64> = BTreeMap::new();
    let mut signed: BTreeMap<String, i64> = BTreeMap::new();
    let limit = T0 + 180 + 600;
    let mut held = 0usize;
    loop {
        let mut txs = Vec::new();
        if net.now < T0 + 180 {
            let recs = traffic.records(6, 9);
            txs.push(traffic.report(recs, net.now as u64, 300));
            sent += 1;
        }
        if let Some(x) = &s.mempool_extra {
            txs.push(x.clone());
        }
        if let Some(hub) = &mut net.hub {
            hub.tip = hub_tip(net.now);
        }
        let out = if (s.lead)(net.height + 1, due_start(&net, honest).is_some()) {
            led += 1;
            net.block_led_by(txs, 5, byz[led % byz.len()])
        } else {
            net.block(txs, 5)
        }
        .unwrap_or_else(|e| panic!("n={n} height {}: {e:#}", net.height + 1));
        for e in out.tx_results.iter().flat_map(|r| &r.events) {
            let nonce = e
                .attributes
                .iter()
                .find(|a| a.key == "nonce")
                .map(|a| a.value.clone());
            match (e.r#type.as_str(), nonce) {
                ("hub_block_held", _) => held += 1,
                ("sync_start", Some(x)) => {
                    started.entry(x).or_insert(out.block.height);
                }
                ("batch_signed", Some(x)) => {
                    signed.insert(x, out.block.height);
                }
                _ => {}
            }
        }
        for (t, r) in out.block.txs.iter().zip(&out.tx_results) {
            if let Ok(Some(tx::Sum::Report(sig))) = tally_settlement::decode_tx(t).map(|d| d.sum) {
                assert_eq!(r.code, 0, "report refused: {}", r.log);
                committed += 1;
                for rec in ReportUsage::decode(sig.body.as_slice())
                    .expect("body")
                    .records
                {
                    *charged.entry((rec.user.clone(), rec.provider)).or_default() += rec.amount;
                    *debits.entry(rec.user).or_default() += rec.amount;
                }
            }
        }
        let st = query(&net, honest, "/sync/hub");
        let done = net.now > T0 + 180
            && st["nonce"].is_null()
            && st["pending_calls"] == 0
            && st["hub_cursor"].as_u64() > Some(40);
        if done {
            break;
        }
        assert!(net.now < limit, "n={n}: not settled by {}: {st}", net.now);
    }
    assert_eq!(committed, sent, "every report sent was committed");
    // Ten more heights: nothing else happens, nobody stalls.
    for _ in 0..10 {
        net.block(Vec::new(), 5).expect("idle block");
    }

    // Every node (the byzantine ones run honest apps underneath) is at the
    // same head.
    let heads = net.heads();
    assert!(
        heads.iter().all(|x| x == &heads[0]),
        "heads differ: {heads:?}"
    );
    let hub = net.hub.clone().expect("hub");
    let st = query(&net, honest, "/sync/hub");
    assert!(
        hub.settled.len() >= 3,
        "{} batches settled",
        hub.settled.len()
    );
    assert_eq!(st["settled_batches"], hub.settled.len(), "{st}");
    // Each batch was signed within a few heights of its start, in its
    // first attempt (none expired): the byzantine nodes delayed, at most,
    // the heights they proposed.
    assert_eq!(
        st["attempts"],
        hub.settled.len(),
        "one attempt per batch: {st}"
    );
    let mut slowest = 0;
    for (nonce, h) in &started {
        let s = signed
            .get(nonce)
            .unwrap_or_else(|| panic!("batch {nonce} never signed"));
        slowest = slowest.max(s - h);
    }
    assert!(
        slowest <= 2 + f as i64 * 2,
        "a batch took {slowest} heights to sign"
    );
    assert_eq!(st["pending_calls"], 0, "{st}");
    assert_eq!(st["next_deposit_seq"], hub.deposits.len() + 1, "{st}");
    assert!(query(&net, honest, "/hubcalls/hub")["calls"]
        .as_array()
        .expect("calls")
        .is_empty());
    for nonce in hub.settled.keys() {
        let b = query(&net, honest, &format!("/batch/hub/{nonce}"));
        assert_eq!(b["status"], "settled", "{b}");
    }
    // The hub paid exactly what was charged, once.
    let nonzero = |m: &BTreeMap<(String, String), u64>| -> BTreeMap<(String, String), u64> {
        m.iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    assert_eq!(
        nonzero(&hub.paid),
        nonzero(&charged),
        "hub payments vs usage"
    );
    // Balances: funds - usage + deposits, each deposit credited once.
    let deposited = hub.deposited();
    for u in &traffic.users {
        let want =
            FUNDS - debits.get(u).copied().unwrap_or(0) + deposited.get(u).copied().unwrap_or(0);
        for i in 0..n {
            let got = query(&net, i, &format!("/balance/{u}"))["balance"].clone();
            assert_eq!(got, want, "node{i}: balance of {u}");
        }
    }
    assert_eq!(
        query(&net, honest, &format!("/balance/{THIEF}"))["balance"],
        0
    );
    // The burst range was carried as the relay splits it: 4, 4, 4, 1 (the
    // real deposits; forgeries aside).
    let mut bodies = BTreeSet::new();
    for b in &net.blocks {
        for t in &b.txs {
            if let Ok(Some(tx::Sum::Partials(p))) = tally_settlement::decode_tx(t).map(|d| d.sum) {
                for hb in p.hub_blocks {
                    let real = hb
                        .deposits
                        .iter()
                        .all(|d| hub.deposits.iter().any(|(_, x)| x == d));
                    if hb.from_height == 11 && real {
                        bodies.insert((hb.deposits[0].seq, hb.deposits.len(), hb.more));
                    }
                }
            }
        }
    }
    assert_eq!(
        bodies.into_iter().collect::<Vec<_>>(),
        vec![(3, 4, true), (7, 4, true), (11, 4, true), (15, 1, false)],
        "burst messages"
    );
    let (p50, p99, max) = net.record.process_times();
    eprintln!(
        "{} n={n}: {} heights, {} proposals refused, {} extensions refused, {} batches, at most {slowest} heights from start to signed; slowest honest ProcessProposal per proposal p50 {p50} us, p99 {p99} us, max {max} us",
        std::thread::current().name().unwrap_or("?"),
        net.height,
        net.record.rejected_proposals().count(),
        net.record.rejected_extensions().count(),
        hub.settled.len(),
    );
    let acts = acts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|a| a.2)
        .collect();
    Run {
        net,
        byz,
        acts,
        held,
    }
}

fn both(s: fn() -> Scenario, check: fn(&Run)) {
    for n in [4, 7] {
        let r = run(n, s());
        check(&r);
    }
}

fn votes(make: fn(&Acts) -> Box<dyn Behaviour>) -> Scenario {
    Scenario {
        make,
        lead: |_, _| false,
        mempool_extra: None,
        version: 0,
    }
}

fn leads(make: fn(&Acts) -> Box<dyn Behaviour>, lead: fn(i64, bool) -> bool) -> Scenario {
    Scenario {
        make,
        lead,
        mempool_extra: None,
        version: 0,
    }
}

/// Bogus partials under other validators' share indices: VerifyVoteExtension
/// refuses every such extension, so they never suppress a real signer.
#[test]
fn bogus_partials_under_foreign_indices() {
    both(
        || votes(|a| Box::new(ForeignIndex { acts: a.clone() })),
        |r| {
            let n = r.byzantine_extensions_refused();
            assert!(n as i64 >= r.net.height, "{n} refused extensions");
        },
    );
}

/// An extension one byte past max_vote_extension_bytes (decodable) is
/// refused by size.
#[test]
fn oversized_vote_extensions() {
    both(
        || votes(|a| Box::new(Oversize { acts: a.clone() })),
        |r| {
            let n = r.byzantine_extensions_refused();
            assert!(n as i64 >= r.net.height, "{n} refused extensions");
            let max = tally_settlement::Params::default().max_vote_extension_bytes as usize;
            assert!(r
                .record()
                .extensions
                .iter()
                .filter(|e| r.byz.contains(&e.voter))
                .all(|e| e.bytes == max + 1));
        },
    );
}

/// Malformed extensions of every kind are refused.
#[test]
fn malformed_vote_extensions() {
    both(
        || votes(|a| Box::new(Malformed::new(a))),
        |r| {
            let n = r.byzantine_extensions_refused();
            assert!(n as i64 >= r.net.height, "{n} refused extensions");
            for m in MALFORMED {
                assert!(r.acted(m), "never tried {m}");
            }
        },
    );
}

/// Validators that never sign: the other t still sign everything.
#[test]
fn validators_that_never_sign() {
    both(
        || votes(|_| Box::new(Silent)),
        |r| {
            assert_eq!(r.record().rejected_extensions().count(), 0);
            assert!(r
                .record()
                .extensions
                .iter()
                .filter(|e| r.byz.contains(&e.voter))
                .all(|e| e.bytes == 0));
        },
    );
}

/// A proposer stuffing SubmitPartials past every cap, with invalid or
/// duplicate partials: each such proposal is refused (over-cap ones
/// before any pairing, which the driver checks) and the next validator
/// proposes.
#[test]
fn proposer_stuffing_submit_partials() {
    both(
        || leads(|a| Box::new(Stuffer::new(a)), |h, _| h % 3 == 0),
        |r| {
            let n = r.altered_proposals_refused();
            assert!(n >= STUFFING.len(), "{n} stuffed proposals");
            for m in STUFFING {
                assert!(r.acted(m), "never tried {m}");
            }
            let over = r.record().proposals.iter().filter(|p| {
                p.shape.over(
                    &tally_settlement::Params {
                        max_block_deposits: CAP as u32,
                        ..Default::default()
                    },
                    r.net.nodes.len(),
                )
            });
            assert!(over.count() >= 3, "proposals past the caps");
        },
    );
}

/// A proposer leaving the partials out: valid, and the signatures come back
/// in later extensions.
#[test]
fn proposer_omitting_partials() {
    both(
        || leads(|a| Box::new(Omitter { acts: a.clone() }), |h, _| h % 2 == 0),
        |r| {
            assert_eq!(r.record().rejected_proposals().count(), 0);
            let omitted = r.record().proposals.iter().filter(|p| p.altered).count();
            assert!(
                omitted >= 3,
                "{omitted} proposals without partials committed"
            );
        },
    );
}

/// Forged, replayed and reordered system transactions are refused; a
/// system transaction in the mempool never reaches a block.
#[test]
fn forged_replayed_and_reordered_system_txs() {
    both(
        || Scenario {
            make: |a| Box::new(Forger::new(a)),
            lead: |h, due| due || h % 3 == 0,
            version: 0,
            mempool_extra: Some(
                start_tx(SyncTxStart {
                    chain: "hub".into(),
                    batch_nonce: 1,
                    call_ids: vec![1, 2],
                    digest: vec![7; 32],
                })
                .to_vec(),
            ),
        },
        |r| {
            let n = r.altered_proposals_refused();
            assert!(n >= FORGERIES.len(), "{n} forged proposals");
            for m in FORGERIES {
                assert!(r.acted(m), "never tried {m}");
            }
            let junk = start_tx(SyncTxStart {
                chain: "hub".into(),
                batch_nonce: 1,
                call_ids: vec![1, 2],
                digest: vec![7; 32],
            });
            assert!(r.net.blocks.iter().all(|b| !b.txs.contains(&junk)));
        },
    );
}

/// A proposer leading every height where a sync start is due, with a start
/// for another batch (other calls, or another nonce) and a digest of its
/// own: honest ExtendVote does not sign it and honest ProcessProposal
/// refuses it, so the next validator's honest start commits.
#[test]
fn proposer_with_a_conflicting_sync_start() {
    for n in [4, 7] {
        // First the probe: at the first due start, honest ExtendVote signs
        // the honest batch but not a conflicting one.
        let (mut net, mut traffic) = setup(n, 0);
        let recs = traffic.records(8, 9);
        net.block(vec![traffic.report(recs, net.now as u64, 300)], 5)
            .expect("block");
        let recs = traffic.records(8, 9);
        net.block(vec![traffic.report(recs, net.now as u64, 300)], 5)
            .expect("block");
        net.advance(60);
        let honest = due_start(&net, 0).expect("a start is due after the window");
        assert!(honest.call_ids.len() > 1, "{honest:?}");
        for other_calls in [true, false] {
            let (bad, _) = conflicting_start(&next_block_state(&net, 0), &honest, other_calls);
            assert_ne!(bad.digest, honest.digest);
            for i in 0..n {
                let signs = |txs: Vec<Bytes>| -> Vec<Vec<u8>> {
                    let e = VoteExtension::decode(net.probe_extension(i, &txs).as_slice())
                        .expect("ext");
                    e.partials
                        .into_iter()
                        .filter(|p| p.kind == Kind::Batch.value())
                        .map(|p| p.digest)
                        .collect()
                };
                assert_eq!(
                    signs(vec![start_tx(honest.clone())]),
                    vec![honest.digest.clone()]
                );
                assert!(
                    signs(vec![start_tx(bad.clone())]).is_empty(),
                    "node{i} signed {bad:?}"
                );
            }
        }
    }
    both(
        || Scenario {
            make: |a| Box::new(Conflicter::new(a)),
            lead: |_, due| due,
            mempool_extra: None,
            version: 0,
        },
        |r| {
            let n = r.altered_proposals_refused();
            assert!(n >= 3, "{n} conflicting starts");
            assert!(r.acted("other calls") && r.acted("other nonce"));
        },
    );
}

/// Byzantine relays forge every hub-block message (deposits redirected to
/// one user, amounts inflated) and their apps sign and propose them: the
/// forgeries never reach the threshold, the real burst is credited in
/// messages of max_block_deposits, each deposit exactly once.
#[test]
fn hub_deposit_burst_with_lying_relays() {
    both(
        || {
            leads(
                |a| Box::new(LyingRelay { acts: a.clone() }),
                |h, _| h % 3 != 0,
            )
        },
        check_lying_relays,
    );
}

/// The same at app version 5 (ADR 0024), where the lying relays forge
/// every message in flight after the cursor as well: a forgery ahead of
/// the cursor is never held or credited either.
#[test]
fn hub_deposit_burst_with_lying_relays_and_messages_in_flight() {
    both(
        || Scenario {
            version: tally_settlement::types::PIPELINE_VERSION,
            ..leads(
                |a| Box::new(LyingRelay { acts: a.clone() }),
                |h, _| h % 3 != 0,
            )
        },
        |r| {
            check_lying_relays(r);
            assert!(r.held > 0, "no message was signed ahead of the cursor");
        },
    );
}

fn check_lying_relays(r: &Run) {
    assert!(r.acted("forged deposits"));
    // The forgeries were signed and carried (stored below the
    // threshold), never credited (checked by the run).
    let forged = r.net.blocks.iter().any(|b| {
        b.txs.iter().any(|t| {
            matches!(tally_settlement::decode_tx(t).map(|d| d.sum),
                Ok(Some(tx::Sum::Partials(p))) if p.hub_blocks.iter().any(|hb| hb.deposits.iter().any(|d| d.user == THIEF)))
        })
    });
    assert!(forged, "a forged hub block was proposed");
}

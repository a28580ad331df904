//! Target 3: ProcessProposal and FinalizeBlock with arbitrary system
//! transactions. Proposals mix honest and mutated SyncTxStarts,
//! SubmitPartials built from real shares (good, foreign, misdirected and
//! junk signatures, out-of-range indices, wrong kinds, cut digests,
//! duplicates, bodies omitted, repeated or unreferenced, over every cap),
//! user reports and junk, in canonical order or perturbed. Properties: no
//! panic and no halt; the adapter's ProcessProposal, the state machine's
//! `verify_system` and the oracle (`oracle.rs`) agree on every proposal;
//! `check_shape` refuses exactly what the oracle's shape rules refuse; and
//! FinalizeBlock gives every transaction a documented code and stores
//! exactly the partials the oracle says.

use std::time::Instant;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::sample::Index;
use tally_settlement::proto::{tx, PartialSig, SubmitPartials, SyncTxStart};
use tally_settlement::{decode_tx, sync, verify_system, Block, Code, ExecError, KeyCache};
use tally_store::Pending;
use tally_tests::driver::address;
use tendermint_abci::Application;
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::{
    response_process_proposal::ProposalStatus, RequestProcessProposal,
};

use crate::env::{finalize_req, params, tx_bytes, Env, LAST_SYNC, N, NOW};
use crate::oracle::{self, Sim};

/// Block time where attempt 1 has expired, so a retry start is due.
const RETRY: u64 = LAST_SYNC + 361;

/// A SyncTxStart: the honest retry or a mutation of it.
#[derive(Clone, Debug)]
enum Start {
    Honest,
    NextNonce,
    DropCall,
    FlipDigest(Index),
    OtherChain,
    Empty,
}

/// A change to one generated partial.
#[derive(Clone, Debug)]
enum Tweak {
    Index(Index, u32),
    OtherSigner(Index, usize),
    OtherMessage(Index, usize),
    JunkSig(Index, Vec<u8>),
    Kind(Index, u32),
    CutDigest(Index),
    Duplicate(Index),
}

/// Which bodies a SubmitPartials carries.
#[derive(Clone, Debug)]
enum Bodies {
    /// Those of the referenced messages the chain does not hold.
    Auto,
    /// Those, and these pool messages' too.
    Plus(Vec<usize>),
    /// Those, less one.
    Minus(Index),
}

#[derive(Clone, Debug)]
struct Partials {
    /// (pool message, signer) pairs, shuffled.
    signed: Vec<(usize, usize)>,
    tweaks: Vec<Tweak>,
    bodies: Bodies,
}

#[derive(Clone, Debug)]
enum Item {
    Start(Start),
    Partials(Partials),
    /// A valid user report with this id byte.
    Report(u8),
    Junk(Vec<u8>),
}

/// A change to the canonical order.
#[derive(Clone, Debug)]
enum Perturb {
    Swap(Index, Index),
    Duplicate(Index),
    Insert(Index, Item),
}

#[derive(Clone, Debug)]
struct Proposal {
    retry: bool,
    items: Vec<Item>,
    perturb: Vec<Perturb>,
}

fn start() -> impl Strategy<Value = Start> {
    prop_oneof![
        6 => Just(Start::Honest),
        1 => Just(Start::NextNonce),
        1 => Just(Start::DropCall),
        1 => any::<Index>().prop_map(Start::FlipDigest),
        1 => Just(Start::OtherChain),
        1 => Just(Start::Empty),
    ]
}

fn partials(pool: usize) -> impl Strategy<Value = Partials> {
    let msg = prop_oneof![
        8 => prop::sample::select(vec![0usize, 1, 2, 3, 4, 5, 6]),
        2 => 0..pool,
    ];
    let signed = prop::collection::vec(
        (
            msg,
            prop::sample::subsequence((0..N).collect::<Vec<_>>(), 1..=N),
        ),
        0..=4,
    )
    .prop_map(|v| {
        v.into_iter()
            .flat_map(|(m, ss)| ss.into_iter().map(move |s| (m, s)))
            .collect::<Vec<_>>()
    })
    .prop_shuffle();
    let tweak = prop_oneof![
        (
            any::<Index>(),
            prop_oneof![Just(0u32), Just(N as u32 + 1), 1..=N as u32]
        )
            .prop_map(|(i, v)| Tweak::Index(i, v)),
        (any::<Index>(), 0..N).prop_map(|(i, s)| Tweak::OtherSigner(i, s)),
        (any::<Index>(), 0..pool).prop_map(|(i, m)| Tweak::OtherMessage(i, m)),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(i, b)| Tweak::JunkSig(i, b)),
        (any::<Index>(), 0u32..5).prop_map(|(i, k)| Tweak::Kind(i, k)),
        any::<Index>().prop_map(Tweak::CutDigest),
        any::<Index>().prop_map(Tweak::Duplicate),
    ];
    let tweaks = prop_oneof![
        3 => Just(Vec::new()),
        2 => prop::collection::vec(tweak, 1..4),
    ];
    let bodies = prop_oneof![
        6 => Just(Bodies::Auto),
        1 => prop::collection::vec(1..pool, 1..3).prop_map(Bodies::Plus),
        1 => any::<Index>().prop_map(Bodies::Minus),
    ];
    (signed, tweaks, bodies).prop_map(|(signed, tweaks, bodies)| Partials {
        signed,
        tweaks,
        bodies,
    })
}

fn proposal(pool: usize) -> impl Strategy<Value = Proposal> {
    let junk = prop::collection::vec(any::<u8>(), 0..64).prop_map(Item::Junk);
    let extra = prop_oneof![
        start().prop_map(Item::Start),
        partials(pool).prop_map(Item::Partials),
        any::<u8>().prop_map(Item::Report),
        junk,
    ];
    let perturb = prop_oneof![
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Perturb::Swap(a, b)),
        any::<Index>().prop_map(Perturb::Duplicate),
        (any::<Index>(), extra).prop_map(|(i, x)| Perturb::Insert(i, x)),
    ];
    (
        any::<bool>(),
        prop::option::weighted(0.4, start()),
        prop::option::weighted(0.9, partials(pool)),
        prop::collection::vec(any::<u8>(), 0..3),
        prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(perturb, 1..3)],
    )
        .prop_map(|(retry, s, p, reports, perturb)| {
            let mut items: Vec<Item> = Vec::new();
            items.extend(s.map(Item::Start));
            items.extend(p.map(Item::Partials));
            items.extend(reports.into_iter().map(Item::Report));
            Proposal {
                retry,
                items,
                perturb,
            }
        })
}

fn build_start(env: &Env, s: &Start) -> SyncTxStart {
    let mut out = env.start.clone();
    match s {
        Start::Honest => {}
        Start::NextNonce => out.batch_nonce += 1,
        Start::DropCall => {
            out.call_ids.pop();
        }
        Start::FlipDigest(i) => {
            let at = i.index(out.digest.len());
            out.digest[at] ^= 1;
        }
        Start::OtherChain => out.chain = "hub2".into(),
        Start::Empty => out = SyncTxStart::default(),
    }
    out
}

fn build_partials(env: &Env, p: &Partials) -> SubmitPartials {
    let mut out: Vec<PartialSig> = p.signed.iter().map(|&(m, s)| env.good(m, s)).collect();
    for t in &p.tweaks {
        if out.is_empty() {
            break;
        }
        let n = out.len();
        match t {
            Tweak::Index(i, v) => out[i.index(n)].index = *v,
            Tweak::OtherSigner(i, s) => {
                let q = &mut out[i.index(n)];
                if let Some(m) = env
                    .msgs
                    .iter()
                    .position(|x| x.digest.as_slice() == q.digest)
                {
                    q.signature = env.msgs[m].sigs[*s].to_vec();
                }
            }
            Tweak::OtherMessage(i, m) => {
                let q = &mut out[i.index(n)];
                let signer = (q.index as usize).clamp(1, N) - 1;
                q.signature = env.msgs[*m].sigs[signer].to_vec();
            }
            Tweak::JunkSig(i, b) => out[i.index(n)].signature = b.clone(),
            Tweak::Kind(i, k) => out[i.index(n)].kind = *k,
            Tweak::CutDigest(i) => {
                out[i.index(n)].digest.pop();
            }
            Tweak::Duplicate(i) => {
                let q = out[i.index(n)].clone();
                out.push(q);
            }
        }
    }
    // Bodies of the referenced messages the chain does not hold.
    let mut carry: Vec<usize> = Vec::new();
    for &(m, _) in &p.signed {
        if env.stored[m].is_empty() && !carry.contains(&m) {
            carry.push(m);
        }
    }
    match &p.bodies {
        Bodies::Auto => {}
        Bodies::Plus(extra) => carry.extend(extra.iter().copied()),
        Bodies::Minus(i) => {
            if !carry.is_empty() {
                carry.remove(i.index(carry.len()));
            }
        }
    }
    SubmitPartials {
        partials: out,
        hub_results: carry
            .iter()
            .filter_map(|&m| env.msgs[m].result.clone())
            .collect(),
        hub_blocks: carry
            .iter()
            .filter_map(|&m| env.msgs[m].block.clone())
            .collect(),
    }
}

fn build(env: &Env, p: &Proposal) -> Vec<Vec<u8>> {
    let mut items = p.items.clone();
    for x in &p.perturb {
        match x {
            Perturb::Swap(a, b) if !items.is_empty() => {
                let n = items.len();
                items.swap(a.index(n), b.index(n));
            }
            Perturb::Duplicate(i) if !items.is_empty() => {
                let it = items[i.index(items.len())].clone();
                items.push(it);
            }
            Perturb::Insert(i, it) => {
                let at = i.index(items.len() + 1);
                items.insert(at, it.clone());
            }
            _ => {}
        }
    }
    items
        .iter()
        .map(|it| match it {
            Item::Start(s) => tx_bytes(tx::Sum::SyncStart(build_start(env, s))),
            Item::Partials(p) => tx_bytes(tx::Sum::Partials(build_partials(env, p))),
            Item::Report(id) => env.report(vec![*id; 16], NOW + 100, 1),
            Item::Junk(b) => b.clone(),
        })
        .collect()
}

/// The oracle for ProcessProposal: system transactions first (at most
/// one start, then at most one SubmitPartials), each exactly what state
/// allows, every partial new, awaited and valid.
fn expect_accept(env: &Env, retry: bool, txs: &[Vec<u8>]) -> bool {
    let mut sim = Sim::committed(env, retry);
    let mut stage = 0;
    for t in txs {
        match decode_tx(t).map(|x| x.sum) {
            Err(_) | Ok(None) => return false,
            Ok(Some(tx::Sum::SyncStart(s))) => {
                if stage >= 1 || sim.running || s != env.start {
                    return false;
                }
                stage = 1;
                sim.running = true;
                sim.attempt += 1;
            }
            Ok(Some(tx::Sum::Partials(p))) => {
                if stage >= 2 || oracle::apply(env, &mut sim, &p, true).is_err() {
                    return false;
                }
                stage = 2;
            }
            Ok(Some(
                tx::Sum::Report(_)
                | tx::Sum::Allowance(_)
                | tx::Sum::Validator(_)
                | tx::Sum::User(_),
            )) => stage = 3,
        }
    }
    true
}

fn ts(secs: u64) -> Option<Timestamp> {
    Some(Timestamp {
        seconds: secs as i64,
        nanos: 0,
    })
}

#[test]
fn process_proposal_with_arbitrary_system_transactions() {
    let env = Env::new();
    let backend = env.app.committed_state().clone();
    let p = params();
    let mut runner = crate::runner(file!(), 4);
    let accepted = std::cell::Cell::new(0u32);
    let r = runner.run(&proposal(env.msgs.len()), |prop| {
        let txs = build(&env, &prop);
        let time = if prop.retry { RETRY } else { NOW + 1 };
        let want = expect_accept(&env, prop.retry, &txs);
        // The state machine.
        let mut sim =
            Pending::open(backend.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let refs: Vec<&[u8]> = txs.iter().map(Vec::as_slice).collect();
        let got = verify_system(
            &mut sim,
            &KeyCache::new(),
            &Block { height: 4, time },
            &refs,
        );
        if let Err(ExecError::Fatal(f)) = &got {
            return Err(TestCaseError::fail(format!("fatal: {f}")));
        }
        prop_assert_eq!(got.is_ok(), want, "verify_system: {:?}", got.err());
        // The adapter.
        let v = env.app.process_proposal(RequestProcessProposal {
            txs: txs.iter().cloned().map(Bytes::from).collect(),
            proposed_last_commit: None,
            misbehavior: Vec::new(),
            hash: Bytes::new(),
            height: 4,
            time: ts(time),
            next_validators_hash: Bytes::new(),
            proposer_address: address(1),
        });
        let status = if want {
            ProposalStatus::Accept
        } else {
            ProposalStatus::Reject
        };
        prop_assert_eq!(v.status, status as i32);
        // Shape: check_shape refuses exactly what the shape rules refuse.
        for t in &txs {
            if let Ok(Some(tx::Sum::Partials(sp))) = decode_tx(t).map(|x| x.sum) {
                let shape = sync::check_shape(&sp, &p, N);
                prop_assert_eq!(shape.is_ok(), oracle::shape_ok(&sp), "{:?}", shape.err());
            }
        }
        // FinalizeBlock (never committed: each case re-executes height 4).
        let fin = env.app.finalize_block(finalize_req(4, time, txs.clone()));
        prop_assert!(env.halts.is_empty(), "halted: {:?}", env.halts.events());
        prop_assert_eq!(fin.tx_results.len(), txs.len());
        let mut model = Sim::committed(&env, prop.retry);
        for (t, r) in txs.iter().zip(&fin.tx_results) {
            let code = Code::from_value(r.code);
            prop_assert!(
                code.is_some_and(|c| !matches!(
                    c,
                    Code::Internal | Code::UnknownPath | Code::BadArgument | Code::NotFound
                )),
                "undocumented code {} ({})",
                r.code,
                r.log
            );
            match decode_tx(t).map(|x| x.sum) {
                Err(_) | Ok(None) => prop_assert_eq!(code, Some(Code::MalformedTx)),
                Ok(Some(tx::Sum::SyncStart(s))) => {
                    let ok = !model.running && model.current && s == env.start;
                    if ok {
                        model.running = true;
                        model.attempt += 1;
                    }
                    let want = if ok { Code::Ok } else { Code::BadSystemTx };
                    prop_assert_eq!(code, Some(want), "{}", r.log);
                }
                Ok(Some(tx::Sum::Partials(sp))) => {
                    match oracle::apply(&env, &mut model, &sp, false) {
                        Err(()) => prop_assert_eq!(code, Some(Code::BadSystemTx), "{}", r.log),
                        Ok(n) => {
                            prop_assert_eq!(code, Some(Code::Ok), "{}", r.log);
                            let stored = format!("{n} partial signature(s) stored");
                            prop_assert!(
                                r.log.starts_with(&stored),
                                "want {stored:?}, got {:?}",
                                r.log
                            );
                        }
                    }
                }
                Ok(Some(
                    tx::Sum::Report(_)
                    | tx::Sum::Allowance(_)
                    | tx::Sum::Validator(_)
                    | tx::Sum::User(_),
                )) => {}
            }
        }
        if want {
            accepted.set(accepted.get() + 1);
        }
        Ok(())
    });
    crate::report("process_proposal", r);
    eprintln!("process_proposal: {} proposals accepted", accepted.get());
}

/// A proposer stuffing SubmitPartials: a thousand copies of good partials
/// and a body over the deposit cap are refused by `check_shape` before any
/// lookup or pairing. Times are printed for the record, never asserted.
#[test]
fn stuffed_submit_partials_are_refused_by_shape() {
    let env = Env::new();
    let p = params();
    let mut stuffed = SubmitPartials::default();
    for k in 0..1000 {
        stuffed.partials.push(env.good(k % 7, k % N));
    }
    let over_cap = SubmitPartials {
        partials: vec![env.good(10, 1)],
        hub_results: Vec::new(),
        hub_blocks: vec![env.msgs[10].block.clone().expect("block")],
    };
    // 1 MiB of empty partials (2 bytes each on the wire): decoding them
    // allocates ~28 MiB before the shape check counts them (noted in
    // docs/fuzzing.md; bounded by CometBFT's block size, not by a Tally cap).
    let empty = SubmitPartials {
        partials: vec![PartialSig::default(); 1 << 19],
        ..SubmitPartials::default()
    };
    for (what, tx) in [
        ("1000 partials", stuffed),
        ("5 deposits", over_cap),
        ("524288 empty partials", empty),
    ] {
        assert!(!oracle::shape_ok(&tx), "{what}");
        let t = Instant::now();
        let shape = sync::check_shape(&tx, &p, N);
        let shape_time = t.elapsed();
        assert!(shape.is_err(), "{what}: check_shape accepted it");
        let txs = vec![tx_bytes(tx::Sum::Partials(tx))];
        let t = Instant::now();
        let v = env.app.process_proposal(RequestProcessProposal {
            txs: txs.into_iter().map(Bytes::from).collect(),
            proposed_last_commit: None,
            misbehavior: Vec::new(),
            hash: Bytes::new(),
            height: 4,
            time: ts(NOW + 1),
            next_validators_hash: Bytes::new(),
            proposer_address: address(1),
        });
        assert_eq!(v.status, ProposalStatus::Reject as i32, "{what}");
        eprintln!(
            "{what}: check_shape {:?}, ProcessProposal {:?} (refused)",
            shape_time,
            t.elapsed()
        );
    }
    assert!(env.halts.is_empty());
}

//! Settlement sync edge cases, on the in-memory store.

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use prost::Message;
use tally_settlement::bls::{self, deal, Kind, SecretShare};
use tally_settlement::proto::{
    tx, HubBlock, HubDeposit, HubResult, Outcome, PartialSig, ReportUsage, SubmitPartials, Tx,
    UsageRecord,
};
use tally_settlement::sync::{self, result_digest, HubCursor};
use tally_settlement::{
    begin_block, sign_report, BatchStatus, Block, Code, GatewayEntry, Genesis, KeyEpoch,
};
use tally_store::{MemBackend, Pending};

const CHAIN: &str = "sync-test";
const T0: u64 = 1_800_000_000;

/// Runs a transaction; a local fault (impossible on the in-memory store)
/// fails the test.
fn deliver(kv: &mut impl tally_store::Kv, b: &Block, tx: &[u8]) -> tally_settlement::TxResult {
    tally_settlement::deliver_tx(kv, b, tx).expect("no local fault")
}

struct Env {
    kv: Pending,
    shares: Vec<SecretShare>,
    gw: SigningKey,
    height: u64,
    now: u64,
    next_id: u8,
}

impl Env {
    fn new() -> Self {
        Self::at(1, |_| {})
    }

    /// A chain at genesis app `version`, its genesis changed by `edit`.
    fn at(version: u64, edit: impl FnOnce(&mut Genesis)) -> Self {
        let gw = SigningKey::from_bytes(&[5; 32]);
        let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 40; 64]).collect();
        let (pubs, shares) = deal(4, 3, &coeffs).unwrap();
        let hexk = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
        let g = Genesis {
            gateways: vec![GatewayEntry {
                name: "gw".into(),
                pubkey: hex::encode(gw.verifying_key().to_bytes()),
            }],
            balances: vec![tally_settlement::BalanceEntry {
                user: "alice".into(),
                amount: 1000,
            }],
            allowances: vec![tally_settlement::AllowanceEntry {
                user: "alice".into(),
                gateway: "gw".into(),
                max_per_window: u64::MAX,
                expires_at: u64::MAX,
            }],
            dkg: Some(KeyEpoch {
                epoch: 0,
                threshold: 3,
                group_key: hexk(&pubs.group),
                public_shares: pubs.shares.iter().map(hexk).collect(),
                signers: (0..4u8).map(|i| hex::encode([i; 20])).collect(),
            }),
            ..Genesis::default()
        };
        let mut g = g;
        edit(&mut g);
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        tally_settlement::machine::init_chain_at(&mut kv, CHAIN, &g, version).unwrap();
        Env {
            kv,
            shares,
            gw,
            height: 0,
            now: T0,
            next_id: 1,
        }
    }

    fn block(&mut self, txs: Vec<Vec<u8>>, step: u64) -> Vec<(Code, String)> {
        self.height += 1;
        let b = Block {
            height: self.height,
            time: self.now,
        };
        begin_block(&mut self.kv, &b).unwrap();
        let mut all = Vec::new();
        if let Some(s) = sync::next_sync_start(&self.kv, self.now).unwrap() {
            all.push(
                Tx {
                    sum: Some(tx::Sum::SyncStart(s)),
                }
                .encode_to_vec(),
            );
        }
        all.extend(txs);
        let out = all
            .iter()
            .map(|t| {
                let r = deliver(&mut self.kv, &b, t);
                (r.code, r.log)
            })
            .collect();
        self.now += step;
        out
    }

    fn pay(&mut self, amount: u64) -> Vec<u8> {
        self.next_id += 1;
        sign_report(
            &self.gw,
            &ReportUsage {
                chain_id: CHAIN.into(),
                report_id: vec![self.next_id; 16],
                expires_at: self.now + 100,
                records: vec![UsageRecord {
                    user: "alice".into(),
                    provider: "p".into(),
                    model: "m".into(),
                    route: "r".into(),
                    outcome: Outcome::Ok as i32,
                    units: 1,
                    amount,
                    ..Default::default()
                }],
                route_calls: Vec::new(),
            },
        )
    }

    fn state(&self) -> tally_settlement::proto::SyncState {
        sync::sync_state(&self.kv, "hub").unwrap()
    }

    fn batch_partials(&self, signers: &[usize]) -> SubmitPartials {
        let st = self.state();
        let b = sync::batch(&self.kv, "hub", st.current_nonce)
            .unwrap()
            .unwrap();
        let d: [u8; 32] = b.digest.as_slice().try_into().unwrap();
        signers
            .iter()
            .map(|&i| PartialSig {
                epoch: 0,
                index: self.shares[i].index,
                kind: Kind::Batch.value(),
                digest: d.to_vec(),
                signature: self.shares[i]
                    .sign(&bls::message(CHAIN, Kind::Batch, &d))
                    .sig_bytes()
                    .to_vec(),
            })
            .collect::<Vec<PartialSig>>()
            .into_tx(None, None)
    }

    fn result_partials(&self, r: &HubResult, signers: &[usize]) -> SubmitPartials {
        let d = result_digest(r);
        signers
            .iter()
            .map(|&i| PartialSig {
                epoch: 0,
                index: self.shares[i].index,
                kind: Kind::HubResult.value(),
                digest: d.to_vec(),
                signature: self.shares[i]
                    .sign(&bls::message(CHAIN, Kind::HubResult, &d))
                    .sig_bytes()
                    .to_vec(),
            })
            .collect::<Vec<PartialSig>>()
            .into_tx(Some(r.clone()), None)
    }
}

/// Partials with the body they sign, as one SubmitPartials.
trait IntoTx {
    fn into_tx(self, r: Option<HubResult>, b: Option<HubBlock>) -> SubmitPartials;
}

impl IntoTx for Vec<PartialSig> {
    fn into_tx(self, r: Option<HubResult>, b: Option<HubBlock>) -> SubmitPartials {
        SubmitPartials {
            partials: self,
            hub_results: r.into_iter().collect(),
            hub_blocks: b.into_iter().collect(),
        }
    }
}

fn block_partials(env: &Env, b: &HubBlock, signers: &[usize]) -> SubmitPartials {
    let d = sync::block_digest(b);
    signers
        .iter()
        .map(|&i| PartialSig {
            epoch: 0,
            index: env.shares[i].index,
            kind: Kind::HubBlock.value(),
            digest: d.to_vec(),
            signature: env.shares[i]
                .sign(&bls::message(CHAIN, Kind::HubBlock, &d))
                .sig_bytes()
                .to_vec(),
        })
        .collect::<Vec<PartialSig>>()
        .into_tx(None, Some(b.clone()))
}

fn balance(env: &Env, user: &str) -> u64 {
    tally_settlement::balance(&env.kv, user).unwrap()
}

#[test]
fn hub_deposits_are_credited_once_over_consecutive_ranges() {
    let mut env = Env::new();
    let dep = |seq, user: &str, amount| HubDeposit {
        seq,
        user: user.into(),
        amount,
        pubkey: Vec::new(),
    };
    let b1 = HubBlock {
        chain: "hub".into(),
        from_height: 1,
        to_height: 10,
        deposits: vec![dep(1, "alice", 50), dep(2, "carol", 7)],
        more: false,
        deposit_count: 2,
    };
    env.block(vec![partials_tx(block_partials(&env, &b1, &[0, 1, 2]))], 1);
    assert_eq!(balance(&env, "alice"), 1050);
    assert_eq!(balance(&env, "carol"), 7);
    assert_eq!(
        sync::hub_cursor(&env.kv, "hub").unwrap(),
        HubCursor {
            height: 11,
            deposit_seq: 3
        }
    );
    // The same range again: not wanted any more, nothing credited twice.
    env.block(vec![partials_tx(block_partials(&env, &b1, &[1, 2, 3]))], 1);
    assert_eq!(balance(&env, "alice"), 1050);
    // A range that skips a deposit (seq 4 instead of 3) or starts elsewhere is refused.
    let gap = HubBlock {
        chain: "hub".into(),
        from_height: 11,
        to_height: 20,
        deposits: vec![dep(4, "alice", 1)],
        more: false,
        deposit_count: 4,
    };
    let off = HubBlock {
        chain: "hub".into(),
        from_height: 12,
        to_height: 21,
        deposits: vec![],
        more: false,
        deposit_count: 2,
    };
    env.block(
        vec![
            partials_tx(block_partials(&env, &gap, &[0, 1, 2])),
            partials_tx(block_partials(&env, &off, &[0, 1, 2])),
        ],
        1,
    );
    assert_eq!(
        sync::hub_cursor(&env.kv, "hub").unwrap(),
        HubCursor {
            height: 11,
            deposit_seq: 3
        }
    );
    // An empty range still moves the cursor.
    let empty = HubBlock {
        chain: "hub".into(),
        from_height: 11,
        to_height: 20,
        deposits: vec![],
        more: false,
        deposit_count: 2,
    };
    env.block(
        vec![partials_tx(block_partials(&env, &empty, &[0, 1, 3]))],
        1,
    );
    assert_eq!(
        sync::hub_cursor(&env.kv, "hub").unwrap(),
        HubCursor {
            height: 21,
            deposit_seq: 3
        }
    );
    assert_eq!(balance(&env, "alice"), 1050);
}

/// A lagging or lying hub node answers range 1..=10 with a short but
/// gap-free list (seq 1 of 2) and the hub's true count through height 10
/// (2): signed by t validators, the message is still not credited, and
/// the chain's own check says why. The complete list is credited.
#[test]
fn a_short_deposit_list_whose_count_does_not_match_is_not_credited() {
    let mut env = Env::new();
    let dep = |seq, user: &str, amount| HubDeposit {
        seq,
        user: user.into(),
        amount,
        pubkey: Vec::new(),
    };
    let short = HubBlock {
        chain: "hub".into(),
        from_height: 1,
        to_height: 10,
        deposits: vec![dep(1, "carol", 5)],
        more: false,
        deposit_count: 2,
    };
    let p = tally_settlement::params(&env.kv).unwrap();
    assert_eq!(
        sync::deposits::check_block(&env.kv, &p, &short).unwrap(),
        Err(sync::deposits::BlockRefusal::Count {
            count: 2,
            credited: 1,
            more: false
        })
    );
    let r = env.block(
        vec![partials_tx(block_partials(&env, &short, &[0, 1, 2]))],
        1,
    );
    assert_eq!(r.last().unwrap().0, Code::Ok, "{r:?}");
    assert!(r.last().unwrap().1.contains("0 partial"), "{r:?}");
    assert_eq!(balance(&env, "carol"), 0);
    assert_eq!(
        sync::hub_cursor(&env.kv, "hub").unwrap(),
        HubCursor {
            height: 1,
            deposit_seq: 1
        }
    );
    // The complete answer for the same range is credited.
    let full = HubBlock {
        deposits: vec![dep(1, "carol", 5), dep(2, "dave", 6)],
        ..short
    };
    env.block(
        vec![partials_tx(block_partials(&env, &full, &[0, 1, 2]))],
        1,
    );
    assert_eq!(balance(&env, "carol"), 5);
    assert_eq!(balance(&env, "dave"), 6);
    assert_eq!(
        sync::hub_cursor(&env.kv, "hub").unwrap(),
        HubCursor {
            height: 11,
            deposit_seq: 3
        }
    );
}

fn partials_tx(p: SubmitPartials) -> Vec<u8> {
    Tx {
        sum: Some(tx::Sum::Partials(p)),
    }
    .encode_to_vec()
}

/// Close the first window and form batch 1 (attempt 1).
fn formed(env: &mut Env) {
    let t = env.pay(7);
    assert_eq!(env.block(vec![t], 61)[0].0, Code::Ok);
    env.block(vec![], 1); // window closed: hub call, SyncTxStart
    assert_eq!(env.state().attempt, 1);
}

#[test]
fn batch_signature_and_settled_result_in_one_transaction() {
    let mut env = Env::new();
    formed(&mut env);
    let settled = HubResult {
        chain: "hub".into(),
        nonce: 1,
        attempt: 1,
        settled: true,
    };
    let mut p = env.result_partials(&settled, &[0, 1, 2]);
    p.partials.extend(env.batch_partials(&[0, 1, 2]).partials);
    let out = env.block(vec![partials_tx(p)], 1);
    assert!(out.iter().all(|(c, _)| *c == Code::Ok), "{out:?}");
    let st = env.state();
    assert_eq!(st.settled_batches, 1);
    assert_eq!(
        sync::batch(&env.kv, "hub", 1).unwrap().unwrap().status,
        BatchStatus::Settled.value()
    );
    // A second settled result (another attempt) is no longer wanted.
    let again = HubResult {
        attempt: 2,
        ..settled
    };
    let out = env.block(
        vec![partials_tx(env.result_partials(&again, &[0, 1, 2]))],
        1,
    );
    assert_eq!(out.last().unwrap().0, Code::Ok);
    assert_eq!(env.state().settled_batches, 1);
    // The settled batch's calls stay readable for settled_retention_windows
    // (default 1440 windows of 60 s): the body a relay would re-submit.
    let calls = |env: &Env| {
        let r = tally_settlement::query::query(&env.kv, "/batch/hub/1");
        let v: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
        v["calls"].as_array().unwrap().clone()
    };
    let kept = calls(&env);
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (kept[0]["user"].as_str(), kept[0]["amount"].as_u64()),
        (Some("alice"), Some(7))
    );
    assert_eq!(kept[0]["settled"], true);
    env.block(vec![], 60 * 1439);
    env.block(vec![], 1);
    assert_eq!(calls(&env)[0]["amount"], 7, "pruned a window early");
    env.block(vec![], 60);
    env.block(vec![], 1);
    let pruned = calls(&env);
    assert_eq!(pruned[0]["pruned"], true, "{pruned:?}");
    assert!(pruned[0]["user"].is_null());
}

#[test]
fn a_new_batch_forgets_the_last_batchs_failed_attempt() {
    let mut env = Env::new();
    formed(&mut env);
    let fail1 = HubResult {
        chain: "hub".into(),
        nonce: 1,
        attempt: 1,
        settled: false,
    };
    env.block(
        vec![partials_tx(env.result_partials(&fail1, &[0, 1, 2]))],
        61,
    );
    assert_eq!(env.state().failures, 1);
    env.block(vec![], 1); // cooldown over: attempt 2
    assert_eq!(env.state().attempt, 2);
    let ok = HubResult {
        chain: "hub".into(),
        nonce: 1,
        attempt: 2,
        settled: true,
    };
    env.block(vec![partials_tx(env.result_partials(&ok, &[1, 2, 3]))], 1);
    assert_eq!(env.state().settled_batches, 1);
    // Batch 2, attempt 1 fails: the failure must count (60 s cooldown).
    let t = env.pay(3);
    env.block(vec![t], 61);
    env.block(vec![], 1);
    let st = env.state();
    assert_eq!((st.current_nonce, st.attempt), (2, 1));
    let fail = HubResult {
        chain: "hub".into(),
        nonce: 2,
        attempt: 1,
        settled: false,
    };
    env.block(vec![partials_tx(env.result_partials(&fail, &[0, 2, 3]))], 1);
    assert_eq!(
        env.state().failures,
        2,
        "batch 2's first failure was ignored"
    );
}

#[test]
fn dkg_query_shows_which_validator_holds_each_share() {
    let env = Env::new();
    let r = tally_settlement::query::query(&env.kv, "/dkg");
    let v: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
    // Hand-written: share i+1 is bound to address [i; 20] in Env's genesis.
    assert_eq!(
        v["signers"],
        serde_json::json!([
            "0000000000000000000000000000000000000000",
            "0101010101010101010101010101010101010101",
            "0202020202020202020202020202020202020202",
            "0303030303030303030303030303030303030303"
        ])
    );
    let key = tally_settlement::dkg::state::active_key(&env.kv, &tally_settlement::KeyCache::new())
        .unwrap()
        .unwrap();
    assert_eq!(key.index_of(&[2u8; 20]), Some(3));
    assert_eq!(key.index_of(&[9u8; 20]), None);
}

/// App version 5 (ADR 0024): messages after the cursor are signed, held
/// and credited in order. Hub heights 1..=10 hold deposits 1..=5, split
/// at a cap of 2 into A = [1, 2] (more), B = [3, 4] (more) and C = [5];
/// heights 11..=20 hold D = [6]. Signed in the order D, C, A, B, nothing
/// is credited until A; A alone moves the cursor to deposit 3; B then
/// credits B, C and D at once. Slots that no honest relay builds are
/// refused; before version 5 only the message at the cursor is.
#[test]
fn messages_ahead_of_the_cursor_are_held_and_credited_in_order() {
    let dep = |seq, amount| HubDeposit {
        seq,
        user: "alice".into(),
        amount,
        pubkey: Vec::new(),
    };
    let msg = |from: u64, deposits: Vec<HubDeposit>, more, count| HubBlock {
        chain: "hub".into(),
        from_height: from,
        to_height: from + 9,
        deposits,
        more,
        deposit_count: count,
    };
    let a = msg(1, vec![dep(1, 1), dep(2, 2)], true, 5);
    let b = msg(1, vec![dep(3, 4), dep(4, 8)], true, 5);
    let c = msg(1, vec![dep(5, 16)], false, 5);
    let d = msg(11, vec![dep(6, 32)], false, 6);
    let cap2 = |g: &mut Genesis| g.params.max_block_deposits = 2;
    use sync::deposits::{check_slot, BlockRefusal, Slot};

    // Version 4: B is not the message at the cursor.
    let old = Env::at(4, cap2);
    let p = tally_settlement::params(&old.kv).unwrap();
    assert_eq!(check_slot(&old.kv, &p, &a).unwrap(), Ok(Slot::Next));
    assert!(check_slot(&old.kv, &p, &b).unwrap().is_err());

    let mut env = Env::at(5, cap2);
    let p = tally_settlement::params(&env.kv).unwrap();
    for (m, want) in [
        (&a, Slot::Next),
        (&b, Slot::Ahead),
        (&c, Slot::Ahead),
        (&d, Slot::Ahead),
    ] {
        assert_eq!(check_slot(&env.kv, &p, m).unwrap(), Ok(want), "{m:?}");
    }
    // In the cursor's range a message starts a whole number of caps past
    // the next deposit; ranges are aligned; 16 messages in flight at most.
    let misaligned = msg(1, vec![dep(2, 2), dep(3, 4)], true, 5);
    let off_range = msg(5, vec![dep(6, 32)], false, 6);
    let too_far = msg(1 + 16 * 10, vec![dep(6, 32)], false, 6);
    let too_many = msg(1, vec![dep(33, 1), dep(34, 1)], true, 40);
    for m in [&misaligned, &off_range, &too_far, &too_many] {
        assert!(
            matches!(
                check_slot(&env.kv, &p, m).unwrap(),
                Err(BlockRefusal::OutOfWindow { .. })
            ),
            "{m:?}"
        );
    }
    // A message ahead is still checked whole: its count must agree.
    let short = msg(11, vec![dep(6, 32)], false, 7);
    assert!(matches!(
        check_slot(&env.kv, &p, &short).unwrap(),
        Err(BlockRefusal::Count { .. })
    ));

    let cursor = |env: &Env| {
        let c = sync::hub_cursor(&env.kv, "hub").unwrap();
        (c.height, c.deposit_seq)
    };
    let sign = |env: &mut Env, m: &HubBlock| {
        let r = env.block(vec![partials_tx(block_partials(env, m, &[0, 1, 2]))], 1);
        let last = r.last().unwrap().clone();
        assert_eq!(last.0, Code::Ok, "{r:?}");
        last.1
    };
    for m in [&d, &c] {
        assert!(sign(&mut env, m).contains("3 partial"));
        assert_eq!((balance(&env, "alice"), cursor(&env)), (1000, (1, 1)));
    }
    // Held: no longer awaited, so partials for it are ignored.
    assert!(sign(&mut env, &d).contains("0 partial"));
    sign(&mut env, &a);
    assert_eq!((balance(&env, "alice"), cursor(&env)), (1003, (1, 3)));
    sign(&mut env, &b);
    assert_eq!((balance(&env, "alice"), cursor(&env)), (1063, (21, 7)));
    assert_eq!(
        sync::deposits::check_slot(&env.kv, &p, &d).unwrap(),
        Err(BlockRefusal::OutOfWindow {
            from: 11,
            first_seq: 6,
            cursor: 21,
            next_seq: 7,
            window: 16
        })
    );
    let held = tally_settlement::state::sync::held_block_count(&env.kv, "hub", 10).unwrap();
    assert_eq!(held, 0, "held messages are deleted once credited");
}

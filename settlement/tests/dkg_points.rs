//! The node's memory of validated G1 points
//! ([`VerifiedSignatures::valid_point`], used through
//! `tally_settlement::envelope::parse_public_key_with`) must never change an
//! answer: a DKG dealing or reveal checked through a memory that already
//! holds points (from CheckTx of this and other dealings) gets exactly the
//! code, log, events and app hash it gets with no memory at all, and is
//! accepted exactly when an independent check says it is well formed.
//!
//! The oracle is twofold: the same pipeline with [`VerifyAll`] (no memory:
//! every point decompressed and subgroup-checked, the code as it was before
//! the memory existed), and an independent computation of what a dealing
//! must be (every commitment point and every ephemeral key passes blst's
//! own `key_validate`, the lengths fit the ceremony) or a reveal (the share
//! is a scalar and `share·G1 = Σ C_k j^k`).
//!
//! Seen failing: with `parse_public_key_with` changed to remember a point
//! once it decompressed but before its subgroup check (`from_bytes`,
//! `insert_valid_point`, then `validate`), the dealings property fails,
//! shrunk to one dealing with its commitment point 0 moved off the
//! subgroup (`(Index(0), [CommitOffGroup(Index(0))])`): the second check
//! through the memory answers `Ok` ("dealing of dealer 1 for round 1
//! passes checks") where the oracle refuses ("commitment point 0: invalid
//! public key: BLST_POINT_NOT_IN_GROUP").

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use blst::min_pk::{AggregatePublicKey, PublicKey};
use ed25519_dalek::SigningKey;
use num_bigint::BigUint;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use tally_settlement::dkg::crypto::{scalar_from_bytes, scalar_to_bytes, verify_share, EncKey};
use tally_settlement::dkg::{self, state as st, Me};
use tally_settlement::proto::validator_msg::Sum;
use tally_settlement::proto::{Dealing, RevealedShare, ValidatorMsg};
use tally_settlement::types::TxResult;
use tally_settlement::{
    begin_block, check_tx_claim_with, deliver_tx_with, init_chain, Block, Code, Genesis, KeyCache,
    VerifiedSignatures, VerifyAll,
};
use tally_store::{MemBackend, Pending};

const CHAIN: &str = "points";
const N: usize = 5;

/// A remembering memory, as the node's (any length of bytes, no bound).
#[derive(Default)]
struct Memo {
    sigs: RefCell<BTreeSet<[u8; 32]>>,
    points: RefCell<HashMap<Vec<u8>, PublicKey>>,
}

impl VerifiedSignatures for Memo {
    fn contains(&self, id: &[u8; 32]) -> bool {
        self.sigs.borrow().contains(id)
    }
    fn insert(&self, id: [u8; 32]) {
        self.sigs.borrow_mut().insert(id);
    }
    fn valid_point(&self, bytes: &[u8]) -> Option<PublicKey> {
        self.points.borrow().get(bytes).copied()
    }
    fn insert_valid_point(&self, bytes: &[u8], point: &PublicKey) {
        self.points.borrow_mut().insert(bytes.to_vec(), *point);
    }
}

/// A chain of `N` validators running its first ceremony.
struct World {
    kv: Pending,
    height: u64,
    cons: Vec<SigningKey>,
    enc: Vec<EncKey>,
}

impl World {
    fn new() -> World {
        let cons: Vec<SigningKey> = (0..N)
            .map(|i| SigningKey::from_bytes(&[i as u8 + 1; 32]))
            .collect();
        let enc: Vec<EncKey> = (0..N)
            .map(|i| EncKey::from_ikm(&[i as u8 + 101; 32]).unwrap())
            .collect();
        let genesis: Genesis =
            serde_json::from_value(serde_json::json!({"params": {"dkg_phase_blocks": 3}})).unwrap();
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        init_chain(&mut kv, CHAIN, &genesis).unwrap();
        let vals: Vec<([u8; 32], u64)> = cons
            .iter()
            .map(|c| (c.verifying_key().to_bytes(), 10))
            .collect();
        dkg::init_validators(&mut kv, &vals).unwrap();
        World {
            kv,
            height: 0,
            cons,
            enc,
        }
    }

    fn block(&self, h: u64) -> Block {
        Block {
            height: h,
            time: 1_800_000_000 + h,
        }
    }

    /// Runs the next block with `txs` (each must pass) and commits it.
    fn step(&mut self, txs: &[Vec<u8>]) {
        let h = self.height + 1;
        let block = self.block(h);
        begin_block(&mut self.kv, &block).unwrap();
        for tx in txs {
            let r =
                deliver_tx_with(&mut self.kv, &block, tx, &VerifyAll, &KeyCache::new()).unwrap();
            assert_eq!(r.code, Code::Ok, "{}", r.log);
        }
        self.kv.commit(h).unwrap();
        self.height = h;
    }

    /// What each validator would send now, by validator.
    fn messages(&self) -> Vec<Vec<ValidatorMsg>> {
        (0..N)
            .map(|i| {
                let me = Me {
                    address: dkg::address_of(self.cons[i].verifying_key().as_bytes()),
                    enc: &self.enc[i],
                };
                dkg::next_messages(&self.kv, &me).unwrap()
            })
            .collect()
    }

    fn sign(&self, i: usize, sum: Sum) -> Vec<u8> {
        dkg::sign_validator_msg(
            &self.cons[i],
            &ValidatorMsg {
                chain_id: CHAIN.into(),
                sum: Some(sum),
            },
        )
    }

    /// Steps until some validator would send a message `want` picks,
    /// delivering everything else `keep` lets through on the way.
    fn run_until(&mut self, want: impl Fn(&Sum) -> bool, keep: impl Fn(usize, &Sum) -> bool) {
        for _ in 0..20 {
            let msgs = self.messages();
            if msgs
                .iter()
                .flatten()
                .any(|m| m.sum.as_ref().is_some_and(&want))
            {
                return;
            }
            let txs: Vec<Vec<u8>> = msgs
                .iter()
                .enumerate()
                .flat_map(|(i, ms)| ms.iter().map(move |m| (i, m)))
                .filter_map(|(i, m)| {
                    m.sum
                        .clone()
                        .filter(|s| keep(i, s))
                        .map(|s| self.sign(i, s))
                })
                .collect();
            self.step(&txs);
        }
        panic!("the ceremony never got there");
    }

    /// The result of `tx` checked (CheckTx) through `memo`.
    fn check(&self, tx: &[u8], memo: &dyn VerifiedSignatures) -> TxResult {
        check_tx_claim_with(&self.kv, tx, memo).unwrap().result
    }

    /// The result of `tx` run in the next block through `memo`, and the app
    /// hash it leaves; the state is left as it was.
    fn deliver(&mut self, tx: &[u8], memo: &dyn VerifiedSignatures) -> (TxResult, [u8; 32]) {
        let before = self.kv.changes().clone();
        let h = self.height + 1;
        let block = self.block(h);
        begin_block(&mut self.kv, &block).unwrap();
        let r = deliver_tx_with(&mut self.kv, &block, tx, memo, &KeyCache::new()).unwrap();
        let hash = self.kv.app_hash_at(h).unwrap();
        self.kv.set_changes(before);
        (r, hash)
    }
}

fn dealing_of(m: &ValidatorMsg) -> Option<Dealing> {
    match &m.sum {
        Some(Sum::Dealing(d)) => Some(d.clone()),
        _ => None,
    }
}

/// A point on the curve outside the prime-order subgroup: the first
/// compressed x = 1, 2, … that decompresses (a random curve point is in
/// G1 with probability 1/h, h the cofactor).
fn cofactor_point() -> PublicKey {
    (1u8..=255)
        .find_map(|x| {
            let mut b = [0u8; 48];
            b[0] = 0x80;
            b[47] = x;
            PublicKey::uncompress(&b)
                .ok()
                .filter(|p| p.validate().is_err())
        })
        .expect("half of all x are on the curve")
}

/// `p + Q`, Q off the subgroup: on the curve, outside the subgroup, so
/// blst decompresses it and `key_validate` refuses it.
fn off_subgroup(p: &[u8]) -> Vec<u8> {
    let p = PublicKey::uncompress(p).expect("a valid point");
    let mut sum = AggregatePublicKey::from_public_key(&p);
    sum.add_public_key(&cofactor_point(), false).unwrap();
    let out = sum.to_public_key().compress();
    assert!(PublicKey::uncompress(&out).is_ok());
    assert!(PublicKey::key_validate(&out).is_err());
    out.to_vec()
}

/// A change to an honest dealing.
#[derive(Clone, Debug)]
enum Corrupt {
    /// A commitment point moved off the subgroup.
    CommitOffGroup(Index),
    /// An ephemeral key moved off the subgroup.
    EphOffGroup(Index),
    /// A commitment point one byte short.
    CommitTruncated(Index),
    /// An ephemeral key one byte short.
    EphTruncated(Index),
    /// A commitment point replaced by the identity's encoding.
    CommitIdentity(Index),
    /// A commitment point in blst's 96-byte uncompressed form (valid).
    CommitUncompressed(Index),
    /// One bit of a commitment point flipped.
    CommitBit(Index, Index, u8),
    /// One bit of an ephemeral key flipped.
    EphBit(Index, Index, u8),
    /// A commitment point swapped for another dealer's (valid, wrong).
    CommitOther(Index, Index),
    /// A ciphertext byte flipped (a wrong share: the chain cannot tell).
    Ciphertext(Index, u8),
    /// A ciphertext one byte short.
    CiphertextTruncated(Index),
    /// The commitment one point short.
    CommitShort,
}

fn corrupt() -> impl Strategy<Value = Corrupt> {
    prop_oneof![
        any::<Index>().prop_map(Corrupt::CommitOffGroup),
        any::<Index>().prop_map(Corrupt::EphOffGroup),
        any::<Index>().prop_map(Corrupt::CommitTruncated),
        any::<Index>().prop_map(Corrupt::EphTruncated),
        any::<Index>().prop_map(Corrupt::CommitIdentity),
        any::<Index>().prop_map(Corrupt::CommitUncompressed),
        (any::<Index>(), any::<Index>(), 0u8..8).prop_map(|(a, b, c)| Corrupt::CommitBit(a, b, c)),
        (any::<Index>(), any::<Index>(), 0u8..8).prop_map(|(a, b, c)| Corrupt::EphBit(a, b, c)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Corrupt::CommitOther(a, b)),
        (any::<Index>(), 1u8..=255).prop_map(|(a, b)| Corrupt::Ciphertext(a, b)),
        any::<Index>().prop_map(Corrupt::CiphertextTruncated),
        Just(Corrupt::CommitShort),
    ]
}

fn apply(d: &mut Dealing, c: &Corrupt, all: &[Dealing]) {
    let n = d.commitment.len();
    let s = d.shares.len();
    match c {
        Corrupt::CommitOffGroup(k) => {
            let k = k.index(n);
            if let Ok(p) = PublicKey::key_validate(&d.commitment[k]) {
                d.commitment[k] = off_subgroup(&p.compress());
            }
        }
        Corrupt::EphOffGroup(j) => {
            let j = j.index(s);
            if let Ok(p) = PublicKey::key_validate(&d.shares[j].ephemeral) {
                d.shares[j].ephemeral = off_subgroup(&p.compress());
            }
        }
        Corrupt::CommitTruncated(k) => {
            d.commitment[k.index(n)].pop();
        }
        Corrupt::EphTruncated(j) => {
            d.shares[j.index(s)].ephemeral.pop();
        }
        Corrupt::CommitIdentity(k) => {
            let mut inf = vec![0u8; 48];
            inf[0] = 0xc0;
            d.commitment[k.index(n)] = inf;
        }
        Corrupt::CommitUncompressed(k) => {
            let k = k.index(n);
            if let Ok(p) = PublicKey::key_validate(&d.commitment[k]) {
                d.commitment[k] = p.serialize().to_vec();
            }
        }
        Corrupt::CommitBit(k, b, bit) => {
            let p = &mut d.commitment[k.index(n)];
            if !p.is_empty() {
                let at = b.index(p.len());
                p[at] ^= 1 << bit;
            }
        }
        Corrupt::EphBit(j, b, bit) => {
            let p = &mut d.shares[j.index(s)].ephemeral;
            if !p.is_empty() {
                let at = b.index(p.len());
                p[at] ^= 1 << bit;
            }
        }
        Corrupt::CommitOther(k, other) => {
            let k = k.index(n);
            let o = &all[other.index(all.len())];
            d.commitment[k] = o.commitment[k.min(o.commitment.len() - 1)].clone();
        }
        Corrupt::Ciphertext(j, x) => {
            if let Some(b) = d.shares[j.index(s)].ciphertext.first_mut() {
                *b ^= x;
            }
        }
        Corrupt::CiphertextTruncated(j) => {
            d.shares[j.index(s)].ciphertext.pop();
        }
        Corrupt::CommitShort => {
            d.commitment.pop();
        }
    }
}

/// The independent check of a dealing's form in a ceremony of threshold
/// `t` and `N` players that all registered keys: blst's own validation of
/// every point, and the lengths.
fn well_formed(d: &Dealing, t: usize) -> bool {
    d.commitment.len() == t
        && d.shares.len() == N
        && d.commitment
            .iter()
            .all(|p| PublicKey::key_validate(p).is_ok())
        && d.shares
            .iter()
            .all(|s| PublicKey::key_validate(&s.ephemeral).is_ok() && s.ciphertext.len() == 32)
}

#[test]
fn dealings_through_the_memory_get_the_answers_they_get_without_it() {
    let mut w = World::new();
    w.run_until(|s| matches!(s, Sum::Dealing(_)), |_, _| true);
    let c = st::ceremony(&w.kv).unwrap().unwrap();
    let t = c.threshold as usize;
    let msgs = w.messages();
    let honest: Vec<(usize, Dealing)> = msgs
        .iter()
        .enumerate()
        .filter_map(|(i, ms)| ms.iter().find_map(dealing_of).map(|d| (i, d)))
        .collect();
    assert_eq!(honest.len(), N);
    let all: Vec<Dealing> = honest.iter().map(|(_, d)| d.clone()).collect();
    let memo = Memo::default();
    // The mempool saw every honest dealing first.
    for (i, d) in &honest {
        let r = w.check(&w.sign(*i, Sum::Dealing(d.clone())), &memo);
        assert_eq!(r.code, Code::Ok, "{}", r.log);
    }
    assert!(!memo.points.borrow().is_empty());
    let w = RefCell::new(w);
    let mut runner = TestRunner::new(Config {
        cases: 128,
        ..Config::default()
    });
    let strategy = (any::<Index>(), prop::collection::vec(corrupt(), 0..3));
    let refused = RefCell::new(BTreeSet::new());
    runner
        .run(&strategy, |(who, changes)| {
            let (i, mut d) = honest[who.index(honest.len())].clone();
            for c in &changes {
                apply(&mut d, c, &all);
            }
            let tx = w.borrow().sign(i, Sum::Dealing(d.clone()));
            let oracle = w.borrow().check(&tx, &VerifyAll);
            // Twice through the memory: CheckTx fills it, then it answers.
            let first = w.borrow().check(&tx, &memo);
            let second = w.borrow().check(&tx, &memo);
            prop_assert_eq!(&first, &oracle);
            prop_assert_eq!(&second, &oracle);
            let want = well_formed(&d, t);
            prop_assert_eq!(
                oracle.code == Code::Ok,
                want,
                "{:?}: {}",
                changes,
                oracle.log
            );
            if !want {
                prop_assert_eq!(oracle.code, Code::BadDealing);
                refused.borrow_mut().insert(oracle.log.clone());
            }
            // FinalizeBlock: same code as CheckTx (and the same log for a
            // refusal), and the same result and app hash with the memory.
            let (plain, plain_hash) = w.borrow_mut().deliver(&tx, &VerifyAll);
            let (mem, mem_hash) = w.borrow_mut().deliver(&tx, &memo);
            prop_assert_eq!(plain.code, oracle.code);
            if !want {
                prop_assert_eq!(&plain.log, &oracle.log);
            }
            prop_assert_eq!(&mem, &plain);
            prop_assert_eq!(mem_hash, plain_hash);
            Ok(())
        })
        .unwrap();
    // The corruptions did reach the point checks.
    let logs: Vec<String> = refused.into_inner().into_iter().collect();
    for want in [
        "NOT_IN_GROUP",
        "BAD_ENCODING",
        "ephemeral key",
        "commitment point",
    ] {
        assert!(
            logs.iter().any(|l| l.contains(want)),
            "no refusal with {want}: {logs:?}"
        );
    }
}

#[test]
fn reveals_through_the_memory_get_the_answers_they_get_without_it() {
    // Player 2 (index 1) never acks, so every dealer reveals its share.
    let mut w = World::new();
    w.run_until(
        |s| matches!(s, Sum::Reveal(_)),
        |i, s| !(i == 1 && matches!(s, Sum::Ack(_))),
    );
    let c = st::ceremony(&w.kv).unwrap().unwrap();
    let memo = Memo::default();
    let msgs = w.messages();
    let mut checked = 0;
    for (i, ms) in msgs.iter().enumerate() {
        for m in ms {
            let Some(Sum::Reveal(rv)) = &m.sum else {
                continue;
            };
            let address = dkg::address_of(w.cons[i].verifying_key().as_bytes());
            let dealer = c
                .dealers
                .iter()
                .position(|d| d.address.as_slice() == address)
                .unwrap() as u32
                + 1;
            let dealing = st::dealing(&w.kv, c.round, dealer).unwrap().unwrap();
            let commitment: Vec<PublicKey> = dealing
                .commitment
                .iter()
                .map(|p| PublicKey::key_validate(p).unwrap())
                .collect();
            for s in &rv.shares {
                let v = scalar_from_bytes(&s.share).unwrap();
                // The honest share, then wrong ones: off by one, zero, not
                // below r, truncated.
                let shares = [
                    s.share.clone(),
                    scalar_to_bytes(&(&v + 1u32)).to_vec(),
                    scalar_to_bytes(&BigUint::default()).to_vec(),
                    vec![0xff; 32],
                    s.share[..31].to_vec(),
                ];
                for share in shares {
                    let mut one = rv.clone();
                    one.shares = vec![RevealedShare {
                        player: s.player,
                        share: share.clone(),
                    }];
                    let tx = w.sign(i, Sum::Reveal(one));
                    let oracle = w.check(&tx, &VerifyAll);
                    assert_eq!(w.check(&tx, &memo), oracle);
                    assert_eq!(w.check(&tx, &memo), oracle);
                    let want = scalar_from_bytes(&share)
                        .is_some_and(|x| verify_share(&commitment, s.player, &x));
                    assert_eq!(oracle.code == Code::Ok, want, "{}", oracle.log);
                    let (plain, plain_hash) = w.deliver(&tx, &VerifyAll);
                    let (mem, mem_hash) = w.deliver(&tx, &memo);
                    assert_eq!((mem, mem_hash), (plain, plain_hash));
                    checked += 1;
                }
            }
        }
    }
    // Every dealer (player 2's own dealing too) revealed player 2's share.
    assert_eq!(checked, 5 * N);
}

//! The byzantine limits of issue 10, one test per rejection reason, each
//! input breaking exactly one rule, with hand-computed expectations:
//! VerifyVoteExtension (`check_extension`), the SubmitPartials shape
//! (`check_shape`), strict and lenient `apply_partials` (through
//! `verify_system` and `deliver_tx`), the order of system transactions,
//! ExtendVote's re-derived start (`rederive_start`) and its caps
//! (`extension`), verify-then-dedupe (`collect_partials`), and hub blocks
//! split at `max_block_deposits` (`awaits_block`, `more`).

use std::sync::Arc;

use ed25519_dalek::SigningKey;
use prost::Message;
use tally_settlement::bls::{self, deal, Kind, SecretShare};
use tally_settlement::proto::{
    tx, HubBlock, HubDeposit, HubResult, Outcome, PartialSig, ReportUsage, SubmitPartials,
    SyncTxStart, Tx, UsageRecord, VoteExtension,
};
use tally_settlement::state::sync::{has_partial, stored_partials};
use tally_settlement::sync::deposits::awaits_block;
use tally_settlement::sync::{
    self, block_digest, check_extension, check_shape, collect_partials, result_digest,
    BadExtension, Bodies, HubCursor,
};
use tally_settlement::{
    begin_block, check_tx, init_chain, rederive_start, sign_report, verify_system, AllowanceEntry,
    BalanceEntry, Block, Code, ExecError, GatewayEntry, Genesis, KeyCache, KeyEpoch, Params,
};
use tally_store::{MemBackend, Pending};

const CHAIN: &str = "byz-test";
const T0: u64 = 1_800_000_000;

/// Consensus address of validator `i` (share index `i + 1`).
fn addr(i: u8) -> Vec<u8> {
    vec![i + 1; 20]
}

struct Env {
    kv: Pending,
    shares: Vec<SecretShare>,
    /// Shares of a second dealing: well-formed signatures that verify
    /// under no share of this chain.
    strangers: Vec<SecretShare>,
    gw: SigningKey,
    height: u64,
    now: u64,
}

impl Env {
    /// Four validators, t = 3, the given parameters.
    fn new(params: Params) -> Self {
        Self::with_dkg(params, true)
    }

    fn with_dkg(params: Params, dkg: bool) -> Self {
        let gw = SigningKey::from_bytes(&[5; 32]);
        let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 40; 64]).collect();
        let (pubs, shares) = deal(4, 3, &coeffs).unwrap();
        let other: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 70; 64]).collect();
        let (_, strangers) = deal(4, 3, &other).unwrap();
        let hexk = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
        let g = Genesis {
            params,
            gateways: vec![GatewayEntry {
                name: "gw".into(),
                pubkey: hex::encode(gw.verifying_key().to_bytes()),
            }],
            balances: vec![BalanceEntry {
                user: "alice".into(),
                amount: 1000,
            }],
            users: Vec::new(),
            allowances: vec![AllowanceEntry {
                user: "alice".into(),
                gateway: "gw".into(),
                max_per_window: u64::MAX,
                expires_at: u64::MAX,
            }],
            dkg: dkg.then(|| KeyEpoch {
                epoch: 0,
                threshold: 3,
                group_key: hexk(&pubs.group),
                public_shares: pubs.shares.iter().map(hexk).collect(),
                signers: (0..4u8).map(|i| hex::encode(addr(i))).collect(),
            }),
        };
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        init_chain(&mut kv, CHAIN, &g).unwrap();
        Env {
            kv,
            shares,
            strangers,
            gw,
            height: 0,
            now: T0,
        }
    }

    fn block_at(&self) -> Block {
        Block {
            height: self.height + 1,
            time: self.now,
        }
    }

    /// Runs a block: start-of-block work, the due sync start if `start`,
    /// then `txs` (FinalizeBlock's lenient path); returns each result.
    fn block(&mut self, txs: Vec<Vec<u8>>, step: u64) -> Vec<(Code, String)> {
        let b = self.block_at();
        self.height += 1;
        begin_block(&mut self.kv, &b).unwrap();
        let mut all = Vec::new();
        if let Some(s) = sync::next_sync_start(&self.kv, self.now).unwrap() {
            all.push(start_tx(s));
        }
        all.extend(txs);
        let out = all
            .iter()
            .map(|t| {
                let r = tally_settlement::deliver_tx(&mut self.kv, &b, t).unwrap();
                (r.code, r.log)
            })
            .collect();
        self.now += step;
        out
    }

    /// A copy of the current state to run proposals on.
    fn fork(&self) -> Pending {
        let mut p = Pending::open(self.kv.backend().clone()).unwrap();
        p.set_changes(self.kv.changes().clone());
        p
    }

    /// ProcessProposal's verdict on `txs` for the next block.
    fn verify(&self, txs: &[Vec<u8>]) -> Result<(), (Code, String)> {
        let refs: Vec<&[u8]> = txs.iter().map(Vec::as_slice).collect();
        match verify_system(&mut self.fork(), &KeyCache::new(), &self.block_at(), &refs) {
            Ok(()) => Ok(()),
            Err(ExecError::Rejected(r)) => Err((r.code, r.log)),
            Err(ExecError::Fatal(f)) => panic!("fatal: {f}"),
        }
    }

    fn pay(&self, id: u8, amount: u64) -> Vec<u8> {
        sign_report(
            &self.gw,
            &ReportUsage {
                chain_id: CHAIN.into(),
                report_id: vec![id; 16],
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

    /// Closes the first window: batch 1, attempt 1 starts at `T0 + 61`.
    fn formed(&mut self) -> SyncTxStart {
        let t = self.pay(1, 7);
        assert_eq!(self.block(vec![t], 61)[0].0, Code::Ok);
        let b = self.block_at();
        let mut sim = self.fork();
        begin_block(&mut sim, &b).unwrap();
        let s = sync::next_sync_start(&sim, b.time)
            .unwrap()
            .expect("a start");
        self.block(vec![], 1);
        assert_eq!(sync::sync_state(&self.kv, "hub").unwrap().attempt, 1);
        s
    }

    fn batch_digest(&self) -> [u8; 32] {
        let st = sync::sync_state(&self.kv, "hub").unwrap();
        let b = sync::batch(&self.kv, "hub", st.current_nonce)
            .unwrap()
            .unwrap();
        b.digest.as_slice().try_into().unwrap()
    }

    /// Validator `i`'s partial of (`kind`, `digest`).
    fn partial(&self, kind: Kind, digest: &[u8; 32], i: usize) -> PartialSig {
        sig_with(&self.shares[i], kind, digest)
    }

    /// A well-formed partial under validator `i`'s index that does not
    /// verify (signed with another dealing's share).
    fn bogus(&self, kind: Kind, digest: &[u8; 32], i: usize) -> PartialSig {
        sig_with(&self.strangers[i], kind, digest)
    }
}

fn sig_with(share: &SecretShare, kind: Kind, digest: &[u8; 32]) -> PartialSig {
    PartialSig {
        epoch: 0,
        index: share.index,
        kind: kind.value(),
        digest: digest.to_vec(),
        signature: share
            .sign(&bls::message(CHAIN, kind, digest))
            .sig_bytes()
            .to_vec(),
    }
}

fn start_tx(s: SyncTxStart) -> Vec<u8> {
    Tx {
        sum: Some(tx::Sum::SyncStart(s)),
    }
    .encode_to_vec()
}

fn partials_tx(p: SubmitPartials) -> Vec<u8> {
    Tx {
        sum: Some(tx::Sum::Partials(p)),
    }
    .encode_to_vec()
}

fn only(partials: Vec<PartialSig>) -> SubmitPartials {
    SubmitPartials {
        partials,
        ..SubmitPartials::default()
    }
}

fn ext(partials: Vec<PartialSig>) -> Vec<u8> {
    VoteExtension { partials }.encode_to_vec()
}

fn dep(seq: u64, amount: u64) -> HubDeposit {
    HubDeposit {
        seq,
        user: "carol".into(),
        amount,
        pubkey: Vec::new(),
    }
}

/// Hub range `from..=from+9` with `deposits`; its deposit count is the
/// last one's seq (one more with `more`), or 0 without deposits.
fn range(from: u64, deposits: Vec<HubDeposit>, more: bool) -> HubBlock {
    HubBlock {
        chain: "hub".into(),
        from_height: from,
        to_height: from + 9,
        deposit_count: deposits.last().map_or(0, |d| d.seq + u64::from(more)),
        deposits,
        more,
    }
}

fn malformed(position: usize, why: &'static str) -> Result<VoteExtension, BadExtension> {
    Err(BadExtension::Malformed { position, why })
}

// ---------------------------------------------------------------- check_extension

#[test]
fn extension_over_the_byte_cap_is_refused_before_decoding() {
    let env = Env::new(Params::default());
    // 4097 bytes that do not decode: the size is what refuses them.
    let big = vec![0xff; 4097];
    assert_eq!(
        check_extension(&env.kv, &KeyCache::new(), &addr(0), &big),
        Err(BadExtension::TooLarge {
            len: 4097,
            max: 4096
        })
    );
    // At the cap the same bytes are decoded (and refused as such).
    assert_eq!(
        check_extension(&env.kv, &KeyCache::new(), &addr(0), &big[..4096]),
        Err(BadExtension::Undecodable)
    );
}

#[test]
fn extension_that_does_not_decode_is_refused() {
    let env = Env::new(Params::default());
    assert_eq!(
        check_extension(&env.kv, &KeyCache::new(), &addr(0), &[0x0a, 0x05, 0x01]),
        Err(BadExtension::Undecodable)
    );
}

#[test]
fn extension_over_the_partial_cap_is_refused() {
    let env = Env::new(Params::default());
    // Nine distinct, well-formed partials under the sender's own index:
    // 9 x 139 = 1251 bytes, under the byte cap; one over the count cap.
    let nine: Vec<PartialSig> = (0..9u8)
        .map(|k| env.partial(Kind::Batch, &[k; 32], 0))
        .collect();
    assert_eq!(
        check_extension(
            &env.kv,
            &KeyCache::new(),
            &addr(0),
            &ext(nine[..8].to_vec())
        )
        .map(|e| e.partials.len()),
        Ok(8)
    );
    assert_eq!(
        check_extension(&env.kv, &KeyCache::new(), &addr(0), &ext(nine)),
        Err(BadExtension::TooManyPartials { count: 9, max: 8 })
    );
}

#[test]
fn extension_from_a_validator_without_a_share_is_refused() {
    let env = Env::new(Params::default());
    let one = ext(vec![env.partial(Kind::Batch, &[1; 32], 0)]);
    assert_eq!(
        check_extension(&env.kv, &KeyCache::new(), &[9; 20], &one),
        Err(BadExtension::NotASigner)
    );
    // An empty extension is always valid, from anyone.
    assert_eq!(
        check_extension(&env.kv, &KeyCache::new(), &[9; 20], &[]),
        Ok(VoteExtension::default())
    );
}

#[test]
fn partial_under_a_foreign_index_is_refused() {
    let env = Env::new(Params::default());
    // Validator 0 (index 1) sends validator 1's well-formed partial
    // (index 2) after a good one of its own.
    let e = ext(vec![
        env.partial(Kind::Batch, &[1; 32], 0),
        env.partial(Kind::Batch, &[2; 32], 1),
    ]);
    assert_eq!(
        check_extension(&env.kv, &KeyCache::new(), &addr(0), &e),
        Err(BadExtension::ForeignIndex { got: 2, own: 1 })
    );
    // The same bytes from validator 1 fail on its first partial instead.
    assert_eq!(
        check_extension(&env.kv, &KeyCache::new(), &addr(1), &e),
        Err(BadExtension::ForeignIndex { got: 1, own: 2 })
    );
}

#[test]
fn partial_of_an_unknown_kind_is_refused() {
    let env = Env::new(Params::default());
    for kind in [0, 5] {
        let mut q = env.partial(Kind::Batch, &[1; 32], 0);
        q.kind = kind;
        assert_eq!(
            check_extension(&env.kv, &KeyCache::new(), &addr(0), &ext(vec![q])),
            malformed(0, "unknown kind"),
            "kind {kind}"
        );
    }
}

#[test]
fn partial_over_a_digest_that_is_not_32_bytes_is_refused() {
    let env = Env::new(Params::default());
    for len in [0, 31, 33] {
        let mut q = env.partial(Kind::Batch, &[1; 32], 0);
        q.digest = vec![1; len];
        assert_eq!(
            check_extension(&env.kv, &KeyCache::new(), &addr(0), &ext(vec![q])),
            malformed(0, "digest is not 32 bytes"),
            "{len} bytes"
        );
    }
}

#[test]
fn extension_signing_one_message_twice_is_refused() {
    let env = Env::new(Params::default());
    let q = env.partial(Kind::HubResult, &[3; 32], 0);
    let other_kind = env.partial(Kind::HubBlock, &[3; 32], 0);
    // The same digest under two kinds is two messages.
    assert!(check_extension(
        &env.kv,
        &KeyCache::new(),
        &addr(0),
        &ext(vec![q.clone(), other_kind])
    )
    .is_ok());
    assert_eq!(
        check_extension(
            &env.kv,
            &KeyCache::new(),
            &addr(0),
            &ext(vec![q.clone(), q])
        ),
        malformed(1, "signs a message twice")
    );
}

#[test]
fn partial_whose_signature_is_not_a_point_is_refused() {
    let env = Env::new(Params::default());
    let mut infinity = vec![0u8; 96];
    infinity[0] = 0xc0;
    for sig in [vec![0u8; 96], infinity, vec![1; 95], Vec::new()] {
        let mut q = env.partial(Kind::Batch, &[1; 32], 0);
        q.signature = sig.clone();
        assert_eq!(
            check_extension(&env.kv, &KeyCache::new(), &addr(0), &ext(vec![q])),
            malformed(0, "signature is not a valid G2 point"),
            "{}",
            hex::encode(&sig)
        );
    }
    // A valid point that does not verify passes: no pairings here, and it
    // can only ever count against its sender's own index.
    let bogus = env.bogus(Kind::Batch, &[1; 32], 0);
    assert!(check_extension(&env.kv, &KeyCache::new(), &addr(0), &ext(vec![bogus])).is_ok());
}

// ---------------------------------------------------------------- check_shape

/// 8 messages x 4 signers: exactly at every default cap.
fn full_shape(env: &Env) -> SubmitPartials {
    let mut tx = SubmitPartials::default();
    for k in 0..8u64 {
        let r = HubResult {
            chain: "hub".into(),
            nonce: k,
            attempt: 1,
            settled: true,
        };
        let d = result_digest(&r);
        tx.hub_results.push(r);
        for i in 0..4 {
            tx.partials.push(env.partial(Kind::HubResult, &d, i));
        }
    }
    tx
}

#[test]
fn shape_at_the_caps_passes() {
    let env = Env::new(Params::default());
    let p = Params::default();
    assert!(check_shape(&full_shape(&env), &p, 4).is_ok());
    let b = range(1, (1..=256).map(|s| dep(s, 1)).collect(), true);
    let d = block_digest(&b);
    let tx = SubmitPartials {
        partials: vec![env.partial(Kind::HubBlock, &d, 0)],
        hub_results: Vec::new(),
        hub_blocks: vec![b],
    };
    assert!(check_shape(&tx, &p, 4).is_ok());
}

#[test]
fn shape_refuses_more_partials_than_messages_times_signers() {
    let env = Env::new(Params::default());
    let mut tx = full_shape(&env);
    // A 33rd partial: a fifth index on the first message.
    let mut q = tx.partials[0].clone();
    q.index = 5;
    tx.partials.push(q);
    assert_eq!(
        check_shape(&tx, &Params::default(), 4).unwrap_err(),
        "33 partials, at most 32 (max_block_messages 8 x 4 signers)"
    );
}

#[test]
fn shape_refuses_more_bodies_than_max_block_messages() {
    let env = Env::new(Params::default());
    let mut tx = full_shape(&env);
    let r = HubResult {
        chain: "hub".into(),
        nonce: 99,
        attempt: 1,
        settled: false,
    };
    tx.hub_results.push(r);
    assert_eq!(
        check_shape(&tx, &Params::default(), 4).unwrap_err(),
        "9 message bodies, at most 8"
    );
}

#[test]
fn shape_refuses_a_hub_block_over_the_deposit_cap() {
    let env = Env::new(Params::default());
    let b = range(1, (1..=257).map(|s| dep(s, 1)).collect(), false);
    let d = block_digest(&b);
    let tx = SubmitPartials {
        partials: vec![env.partial(Kind::HubBlock, &d, 0)],
        hub_results: Vec::new(),
        hub_blocks: vec![b],
    };
    assert_eq!(
        check_shape(&tx, &Params::default(), 4).unwrap_err(),
        "hub block 1..10 carries 257 deposits, at most 256"
    );
}

#[test]
fn shape_refuses_a_body_carried_twice() {
    let env = Env::new(Params::default());
    let r = HubResult {
        chain: "hub".into(),
        nonce: 1,
        attempt: 1,
        settled: true,
    };
    let tx = SubmitPartials {
        partials: vec![env.partial(Kind::HubResult, &result_digest(&r), 0)],
        hub_results: vec![r.clone(), r],
        hub_blocks: Vec::new(),
    };
    assert_eq!(
        check_shape(&tx, &Params::default(), 4).unwrap_err(),
        "a hub result body appears twice"
    );
    let b = range(1, vec![dep(1, 1)], false);
    let tx = SubmitPartials {
        partials: vec![env.partial(Kind::HubBlock, &block_digest(&b), 0)],
        hub_results: Vec::new(),
        hub_blocks: vec![b.clone(), b],
    };
    assert_eq!(
        check_shape(&tx, &Params::default(), 4).unwrap_err(),
        "a hub block body appears twice"
    );
}

#[test]
fn shape_refuses_two_partials_of_one_signer_for_one_digest() {
    let env = Env::new(Params::default());
    // Even when the first is bogus and the second good: a proposer must
    // not carry both (ProcessProposal refuses the block).
    let d = [4; 32];
    let tx = only(vec![
        env.bogus(Kind::Batch, &d, 1),
        env.partial(Kind::Batch, &d, 1),
    ]);
    assert_eq!(
        check_shape(&tx, &Params::default(), 4).unwrap_err(),
        "partial of signer 2 appears twice for one digest"
    );
}

#[test]
fn shape_refuses_more_messages_than_max_block_messages() {
    let env = Env::new(Params::default());
    let nine: Vec<PartialSig> = (0..9u8)
        .map(|k| env.partial(Kind::Batch, &[k; 32], 0))
        .collect();
    assert!(check_shape(&only(nine[..8].to_vec()), &Params::default(), 4).is_ok());
    assert_eq!(
        check_shape(&only(nine), &Params::default(), 4).unwrap_err(),
        "partials for 9 messages, at most 8"
    );
}

#[test]
fn shape_refuses_a_body_no_partial_of_its_kind_signs() {
    let env = Env::new(Params::default());
    let r = HubResult {
        chain: "hub".into(),
        nonce: 1,
        attempt: 1,
        settled: true,
    };
    let d = result_digest(&r);
    // Signed under the wrong kind: still unreferenced.
    let tx = SubmitPartials {
        partials: vec![env.partial(Kind::HubBlock, &d, 0)],
        hub_results: vec![r],
        hub_blocks: Vec::new(),
    };
    assert_eq!(
        check_shape(&tx, &Params::default(), 4).unwrap_err(),
        format!(
            "body {} is not signed by any partial of its kind",
            hex::encode(d)
        )
    );
}

// ------------------------------------------------------ apply_partials, strict and lenient

fn bad_system(r: Result<(), (Code, String)>, log: &str) {
    match r {
        Err((Code::BadSystemTx, l)) => assert!(l.contains(log), "{l:?} lacks {log:?}"),
        other => panic!("want bad_system_tx containing {log:?}, got {other:?}"),
    }
}

#[test]
fn submit_partials_without_a_threshold_key_is_refused() {
    let mut env = Env::with_dkg(Params::default(), false);
    let tx = partials_tx(only(vec![env.partial(Kind::Batch, &[1; 32], 0)]));
    bad_system(
        env.verify(std::slice::from_ref(&tx)),
        "the chain has no threshold key",
    );
    let out = env.block(vec![tx], 1);
    assert_eq!(out[0].0, Code::BadSystemTx, "{}", out[0].1);
}

#[test]
fn shape_violations_refuse_the_whole_transaction_in_both_modes() {
    let mut env = Env::new(Params::default());
    env.formed();
    let d = env.batch_digest();
    // A good partial of signer 3 and a duplicate of signer 2.
    let tx = partials_tx(only(vec![
        env.partial(Kind::Batch, &d, 2),
        env.bogus(Kind::Batch, &d, 1),
        env.partial(Kind::Batch, &d, 1),
    ]));
    bad_system(
        env.verify(std::slice::from_ref(&tx)),
        "SubmitPartials refused: partial of signer 2",
    );
    let out = env.block(vec![tx], 1);
    assert_eq!(out[0].0, Code::BadSystemTx, "{}", out[0].1);
    assert!(stored_partials(&env.kv, &d).unwrap().is_empty());
}

#[test]
fn partial_for_a_message_nobody_waits_for_rejects_strictly_and_is_ignored_leniently() {
    let mut env = Env::new(Params::default());
    env.formed();
    let d = env.batch_digest();
    let tx = partials_tx(only(vec![
        env.partial(Kind::Batch, &d, 0),
        env.partial(Kind::Batch, &[0x5a; 32], 1),
    ]));
    bad_system(
        env.verify(std::slice::from_ref(&tx)),
        "partial of signer 2 is not for a message",
    );
    let out = env.block(vec![tx], 1);
    assert_eq!(
        out[0],
        (
            Code::Ok,
            "1 partial signature(s) stored, 1 ignored".to_string()
        )
    );
}

#[test]
fn partial_under_an_index_without_a_share_rejects_strictly() {
    let mut env = Env::new(Params::default());
    env.formed();
    let d = env.batch_digest();
    // Index 5 of 4 (signed with a fifth share of another dealing).
    let mut q = env.bogus(Kind::Batch, &d, 0);
    q.index = 5;
    let tx = partials_tx(only(vec![env.partial(Kind::Batch, &d, 0), q]));
    bad_system(
        env.verify(std::slice::from_ref(&tx)),
        "partial of signer 5 is not for a message",
    );
    assert_eq!(
        env.block(vec![tx], 1)[0].1,
        "1 partial signature(s) stored, 1 ignored"
    );
}

#[test]
fn partial_already_stored_rejects_strictly_and_is_ignored_leniently() {
    let mut env = Env::new(Params::default());
    env.formed();
    let d = env.batch_digest();
    let first = partials_tx(only(vec![env.partial(Kind::Batch, &d, 0)]));
    assert_eq!(
        env.block(vec![first.clone()], 1)[0].1,
        "1 partial signature(s) stored, 0 ignored"
    );
    bad_system(
        env.verify(std::slice::from_ref(&first)),
        "or already stored",
    );
    assert_eq!(
        env.block(vec![first], 1)[0].1,
        "0 partial signature(s) stored, 1 ignored"
    );
}

#[test]
fn hub_result_without_its_body_rejects_strictly() {
    let mut env = Env::new(Params::default());
    env.formed();
    let r = HubResult {
        chain: "hub".into(),
        nonce: 1,
        attempt: 1,
        settled: true,
    };
    let d = result_digest(&r);
    let bare = only(vec![env.partial(Kind::HubResult, &d, 0)]);
    bad_system(
        env.verify(&[partials_tx(bare.clone())]),
        "partial of signer 1 is not for a message",
    );
    let carried = SubmitPartials {
        hub_results: vec![r],
        ..bare
    };
    assert_eq!(env.verify(&[partials_tx(carried)]), Ok(()));
}

#[test]
fn invalid_signature_rejects_strictly_and_only_it_is_dropped_leniently() {
    let mut env = Env::new(Params::default());
    env.formed();
    let d = env.batch_digest();
    let tx = partials_tx(only(vec![
        env.partial(Kind::Batch, &d, 0),
        env.bogus(Kind::Batch, &d, 1),
    ]));
    bad_system(env.verify(std::slice::from_ref(&tx)), "do not verify");
    assert_eq!(
        env.block(vec![tx], 1)[0].1,
        "1 partial signature(s) stored, 1 ignored"
    );
    assert!(has_partial(&env.kv, &d, 1).unwrap());
    assert!(!has_partial(&env.kv, &d, 2).unwrap());
}

#[test]
fn a_bogus_partial_never_displaces_the_good_one_of_its_index() {
    let mut env = Env::new(Params::default());
    env.formed();
    let d = env.batch_digest();
    // FinalizeBlock: a bogus partial of signer 2 is dropped, not stored,
    // so signer 2's good partial in the next transaction is still new.
    let out = env.block(
        vec![
            partials_tx(only(vec![env.bogus(Kind::Batch, &d, 1)])),
            partials_tx(only(vec![env.partial(Kind::Batch, &d, 1)])),
        ],
        1,
    );
    assert_eq!(out[0].1, "0 partial signature(s) stored, 1 ignored");
    assert_eq!(out[1].1, "1 partial signature(s) stored, 0 ignored");
    let stored = stored_partials(&env.kv, &d).unwrap();
    assert_eq!(stored, vec![(2, env.partial(Kind::Batch, &d, 1).signature)]);
    // PrepareProposal: validator 2's extension seen twice, the bogus copy
    // first; the good partial is the one carried.
    let votes = vec![
        (addr(2), ext(vec![env.bogus(Kind::Batch, &d, 2)])),
        (addr(2), ext(vec![env.partial(Kind::Batch, &d, 2)])),
    ];
    let got = collect_partials(&env.kv, &KeyCache::new(), CHAIN, &votes, &Bodies::default())
        .unwrap()
        .expect("partials");
    assert_eq!(got.partials, vec![env.partial(Kind::Batch, &d, 2)]);
    // And a bogus partial under another validator's index never gets in.
    let foreign = vec![(addr(3), ext(vec![env.bogus(Kind::Batch, &d, 0)]))];
    assert_eq!(
        collect_partials(
            &env.kv,
            &KeyCache::new(),
            CHAIN,
            &foreign,
            &Bodies::default()
        )
        .unwrap(),
        None
    );
}

// ---------------------------------------------------------------- verify_system order

#[test]
fn system_transactions_out_of_order_are_refused() {
    let mut env = Env::new(Params::default());
    let start = env.formed();
    let d = env.batch_digest();
    // Attempt 1 expires: at T0 + 62 + 360 the retry start is due.
    env.now = T0 + 61 + 361;
    let s = start_tx(start.clone());
    let p = partials_tx(only(vec![env.partial(Kind::Batch, &d, 0)]));
    let user = env.pay(2, 1);
    assert_eq!(env.verify(&[s.clone(), p.clone(), user.clone()]), Ok(()));
    bad_system(
        env.verify(&[p.clone(), s.clone()]),
        "tx 1: sync start out of place",
    );
    bad_system(
        env.verify(&[s.clone(), s.clone()]),
        "tx 1: sync start out of place",
    );
    bad_system(
        env.verify(&[p.clone(), p.clone()]),
        "tx 1: SubmitPartials out of place",
    );
    bad_system(
        env.verify(&[user.clone(), s]),
        "tx 1: sync start out of place",
    );
    bad_system(env.verify(&[user, p]), "tx 1: SubmitPartials out of place");
    // Undecodable bytes are malformed, not skipped.
    assert_eq!(
        env.verify(&[vec![0xff, 0xff]]).map_err(|e| e.0),
        Err(Code::MalformedTx)
    );
}

#[test]
fn sync_start_that_state_does_not_allow_is_refused() {
    let mut env = Env::new(Params::default());
    let start = env.formed();
    // Attempt 1 still runs.
    bad_system(
        env.verify(&[start_tx(start.clone())]),
        "no sync may start now",
    );
    env.now = T0 + 61 + 361;
    let mut nonce = start.clone();
    nonce.batch_nonce = 2;
    let mut digest = start.clone();
    digest.digest[31] ^= 1;
    let mut calls = start.clone();
    calls.call_ids.push(2);
    for other in [nonce, digest, calls] {
        bad_system(env.verify(&[start_tx(other)]), "does not match state");
    }
    assert_eq!(env.verify(&[start_tx(start)]), Ok(()));
}

// ---------------------------------------------------------------- rederive_start

#[test]
fn extend_vote_signs_only_the_start_it_derives_itself() {
    let mut env = Env::new(Params::default());
    let start = env.formed();
    env.now = T0 + 61 + 361;
    let b = env.block_at();
    let derive = |proposed: &[SyncTxStart]| rederive_start(&mut env.fork(), &b, proposed).unwrap();
    assert_eq!(derive(std::slice::from_ref(&start)), Some(start.clone()));
    assert_eq!(derive(&[]), None);
    assert_eq!(derive(&[start.clone(), start.clone()]), None);
    let mut forged = start.clone();
    forged.call_ids.push(99);
    assert_eq!(derive(&[forged]), None);
    let mut other = start.clone();
    other.digest[0] ^= 1;
    assert_eq!(derive(&[other]), None);
    // Before attempt 1 expires nothing is due: nothing to sign.
    let early = Block {
        height: b.height,
        time: T0 + 100,
    };
    assert_eq!(
        rederive_start(&mut env.fork(), &early, &[start]).unwrap(),
        None
    );
}

// ---------------------------------------------------------------- extension caps

/// A relay inbox of `n` hub results for the current attempt and empty
/// hub blocks, all distinct (only one of each is awaited).
fn inbox(n: u64) -> (Vec<HubResult>, Vec<HubBlock>) {
    let results = (0..n)
        .map(|k| HubResult {
            chain: "hub".into(),
            nonce: 1,
            attempt: 1,
            settled: k % 2 == 0,
        })
        .collect();
    let blocks = (0..n)
        .map(|k| range(1 + k * 10, Vec::new(), false))
        .collect();
    (results, blocks)
}

#[test]
fn honest_extension_stops_at_max_extension_partials() {
    let p = Params {
        max_extension_partials: 2,
        ..Params::default()
    };
    let mut env = Env::new(p);
    env.formed();
    let (results, blocks) = inbox(4);
    // Awaited: the batch, both results of attempt 1, hub range 1..10.
    let e = sync::extension(
        &env.kv,
        &KeyCache::new(),
        CHAIN,
        &env.shares[0],
        0,
        None,
        &results,
        &blocks,
    )
    .unwrap();
    let d = env.batch_digest();
    assert_eq!(
        e.partials,
        vec![
            env.partial(Kind::Batch, &d, 0),
            env.partial(Kind::HubResult, &result_digest(&results[0]), 0),
        ]
    );
    assert!(check_extension(&env.kv, &KeyCache::new(), &addr(0), &e.encode_to_vec()).is_ok());
}

#[test]
fn honest_extension_stops_at_max_vote_extension_bytes() {
    let p = Params {
        max_vote_extension_bytes: 512,
        ..Params::default()
    };
    let mut env = Env::new(p);
    env.formed();
    let (results, blocks) = inbox(4);
    // Four partials are awaited; each takes 139 bytes in the extension,
    // so 3 (417 bytes) fit in 512 and a fourth (556) does not.
    let e = sync::extension(
        &env.kv,
        &KeyCache::new(),
        CHAIN,
        &env.shares[1],
        0,
        None,
        &results,
        &blocks,
    )
    .unwrap();
    assert_eq!(e.partials.len(), 3);
    let bytes = e.encode_to_vec();
    assert_eq!(bytes.len(), 417);
    assert_eq!(e.partials[2].digest, result_digest(&results[1]).to_vec());
    assert!(check_extension(&env.kv, &KeyCache::new(), &addr(1), &bytes).is_ok());
}

// ---------------------------------------------------------------- hub blocks and `more`

fn cap2() -> Params {
    Params {
        max_block_deposits: 2,
        ..Params::default()
    }
}

fn awaited(env: &Env, b: &HubBlock) -> bool {
    awaits_block(&env.kv, &cap2(), b, &block_digest(b)).unwrap()
}

#[test]
fn hub_block_must_be_full_when_more_is_set() {
    let env = Env::new(cap2());
    assert!(awaited(&env, &range(1, vec![dep(1, 1), dep(2, 1)], true)));
    assert!(!awaited(&env, &range(1, vec![dep(1, 1)], true)));
    assert!(!awaited(&env, &range(1, Vec::new(), true)));
    assert!(awaited(&env, &range(1, vec![dep(1, 1)], false)));
    assert!(awaited(&env, &range(1, Vec::new(), false)));
    assert!(!awaited(
        &env,
        &range(1, vec![dep(1, 1), dep(2, 1), dep(3, 1)], false)
    ));
}

#[test]
fn hub_block_off_the_cursor_or_with_bad_deposits_is_not_awaited() {
    let env = Env::new(cap2());
    let good = range(1, vec![dep(1, 1)], false);
    assert!(awaited(&env, &good));
    let cases: Vec<(&str, HubBlock)> = vec![
        (
            "other chain",
            HubBlock {
                chain: "hub2".into(),
                ..good.clone()
            },
        ),
        ("starts later", range(2, vec![dep(1, 1)], false)),
        (
            "wrong length",
            HubBlock {
                to_height: 11,
                ..good.clone()
            },
        ),
        ("sequence gap", range(1, vec![dep(2, 1)], false)),
        (
            "count above the list (a short answer)",
            HubBlock {
                deposit_count: 2,
                ..good.clone()
            },
        ),
        (
            "count below the list",
            HubBlock {
                deposit_count: 0,
                ..good.clone()
            },
        ),
        (
            "more without a further deposit counted",
            HubBlock {
                deposit_count: 2,
                ..range(1, vec![dep(1, 1), dep(2, 1)], true)
            },
        ),
        ("zero amount", range(1, vec![dep(1, 0)], false)),
        (
            "bad user",
            range(
                1,
                vec![HubDeposit {
                    seq: 1,
                    user: "a b".into(),
                    amount: 1,
                    pubkey: Vec::new(),
                }],
                false,
            ),
        ),
    ];
    for (what, b) in cases {
        assert!(!awaited(&env, &b), "{what}");
    }
    // The right body under another digest.
    assert!(!awaits_block(&env.kv, &cap2(), &good, &[0; 32]).unwrap());
}

#[test]
fn deposit_burst_split_into_full_more_messages_is_credited_once() {
    let mut env = Env::new(cap2());
    // Five deposits in hub range 1..10, cap 2: [1,2]+more, [3,4]+more, [5].
    // Every part carries the range's count, 5.
    let parts = [
        range(1, vec![dep(1, 10), dep(2, 20)], true),
        range(1, vec![dep(3, 30), dep(4, 40)], true),
        range(1, vec![dep(5, 50)], false),
    ]
    .map(|b| HubBlock {
        deposit_count: 5,
        ..b
    });
    let signed = |env: &Env, b: &HubBlock| {
        let d = block_digest(b);
        partials_tx(SubmitPartials {
            partials: (0..3).map(|i| env.partial(Kind::HubBlock, &d, i)).collect(),
            hub_results: Vec::new(),
            hub_blocks: vec![b.clone()],
        })
    };
    let balance = |env: &Env| tally_settlement::balance(&env.kv, "carol").unwrap();
    let cursor = |env: &Env| sync::hub_cursor(&env.kv, "hub").unwrap();
    // The last part before the others is not awaited.
    let early = signed(&env, &parts[2]);
    env.block(vec![early], 1);
    assert_eq!(balance(&env), 0);
    let first = signed(&env, &parts[0]);
    env.block(vec![first.clone()], 1);
    assert_eq!(balance(&env), 30);
    assert_eq!(
        cursor(&env),
        HubCursor {
            height: 1,
            deposit_seq: 3
        }
    );
    // Replayed: nothing more.
    env.block(vec![first], 1);
    assert_eq!(balance(&env), 30);
    let second = signed(&env, &parts[1]);
    let last = signed(&env, &parts[2]);
    env.block(vec![second.clone(), last], 1);
    assert_eq!(balance(&env), 150);
    assert_eq!(
        cursor(&env),
        HubCursor {
            height: 11,
            deposit_seq: 6
        }
    );
    env.block(vec![second], 1);
    assert_eq!(balance(&env), 150);
}

// ---------------------------------------------------------------- CheckTx size

#[test]
fn check_tx_refuses_an_oversized_system_transaction_by_length() {
    let env = Env::new(Params {
        max_tx_bytes: 1024,
        ..Params::default()
    });
    // 8 partials: 8 x 139 + 3 = 1115 bytes.
    let big = partials_tx(only(
        (0..8u8)
            .map(|k| env.partial(Kind::Batch, &[k; 32], 0))
            .collect(),
    ));
    assert_eq!(big.len(), 1115);
    let r = check_tx(&env.kv, &big).unwrap();
    assert_eq!(
        (r.code, r.log.as_str()),
        (
            Code::TxTooLarge,
            "transaction is 1115 bytes, at most 1024 allowed"
        )
    );
    let small = partials_tx(only(vec![env.partial(Kind::Batch, &[0; 32], 0)]));
    assert_eq!(
        check_tx(&env.kv, &small).unwrap().code,
        Code::SystemTxFromMempool
    );
}

// ------------------------------------------------- sizes, before anything is decoded

#[test]
fn oversized_proposed_transactions_are_refused_by_length() {
    let env = Env::new(Params::default());
    // Hand-computed bound for 4 signers and default caps:
    // 8 messages x (4 x 192 + 256 x 96 + 256) = 204,800 payload bytes.
    let p = Params::default();
    assert_eq!(tally_settlement::tx::system_tx_bound(&p, 4, 3, 1), 204_800);
    // From app version 3 a deposit may carry a 32-byte key: 8 messages of
    // 4 x 192 + 256 x 130 + 256 bytes.
    assert_eq!(tally_settlement::tx::system_tx_bound(&p, 4, 3, 3), 274_432);
    // 150,000 empty partials: 300,000 payload bytes, under max_tx_bytes
    // (1 MiB) but over the bound; decoding them would allocate ~30x that.
    let stuffed = partials_tx(SubmitPartials {
        partials: vec![PartialSig::default(); 150_000],
        ..SubmitPartials::default()
    });
    assert!(stuffed.len() < 1 << 20);
    bad_system(
        env.verify(&[stuffed]),
        "tx 0: system transaction payload is 300000 bytes, at most 204800",
    );
    // Anything over max_tx_bytes, whatever it is, is too large.
    let huge = vec![0u8; (1 << 20) + 1];
    match env.verify(&[env.pay(3, 1), huge]) {
        Err((Code::TxTooLarge, l)) => assert!(l.starts_with("tx 1: "), "{l}"),
        other => panic!("want tx_too_large, got {other:?}"),
    }
}

#[test]
fn peek_payload_reads_the_envelope_without_decoding() {
    use tally_settlement::tx::peek_payload;
    // Hand-encoded: field 3 (0x1a), length 2, two bytes.
    assert_eq!(peek_payload(&[0x1a, 0x02, 0x00, 0x00]), Some((3, 2)));
    // Two payload fields: the last wins, as protobuf decodes a oneof.
    assert_eq!(peek_payload(&[0x12, 0x01, 0x00, 0x1a, 0x00]), Some((3, 0)));
    // A length past the end, or a truncated varint: not an envelope.
    assert_eq!(peek_payload(&[0x1a, 0x05, 0x00]), None);
    assert_eq!(peek_payload(&[0x1a, 0x80]), None);
    // A varint field only: no payload.
    assert_eq!(peek_payload(&[0x08, 0x01]), None);
}

//! The state every target runs against: one `TallyApp` on an in-memory
//! store, four threshold signers (t = 3), small caps so that fuzzed inputs
//! cross them often, and three committed blocks: a usage report, the window
//! close with its SyncTxStart (batch 1 pending, attempt 1), and a
//! SubmitPartials storing signer 1's partials of the batch and of one hub
//! block (so the chain holds that block's body and "already stored" is a
//! reachable rejection).
//!
//! Also the pool of messages the proposal target signs, each with what the
//! oracle needs to know about it, and every signer's good signature on it;
//! digests and signed bytes come from `spec` (the layouts of
//! `docs/signing.md`), not from the state machine.

use std::sync::Arc;

use bytes::Bytes;
use ed25519_dalek::SigningKey;
use prost::Message;
use tally_abci::{Halt, HaltLog, TallyApp};
use tally_settlement::bls::{deal, Kind, SecretShare};
use tally_settlement::proto::{
    tx, HubBlock, HubDeposit, HubResult, Outcome, PartialSig, ReportUsage, SubmitPartials,
    SyncTxStart, Tx, UsageRecord,
};
use tally_settlement::{
    sign_report, AllowanceEntry, BalanceEntry, GatewayEntry, Genesis, KeyEpoch, Params,
};
use tally_store::MemBackend;
use tally_tests::driver::{address, signers};
use tendermint_abci::Application;
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::{
    RequestFinalizeBlock, RequestInitChain, RequestPrepareProposal,
};

use crate::spec::{self, block_digest, result_digest};

/// Chain id.
pub const CHAIN: &str = "tally-fuzz";
/// Genesis time, a 60 s window boundary.
pub const T0: u64 = 1_800_000_000;
/// Validators.
pub const N: usize = 4;
/// Threshold.
pub const T: usize = 3;
/// The epoch of the dealt key (a test dealer's key is epoch 0).
pub const EPOCH: u64 = 0;
/// Time of block 2, where attempt 1 of batch 1 started.
pub const LAST_SYNC: u64 = T0 + 61;
/// Time of the last committed block (3): CheckTx's "now".
pub const NOW: u64 = T0 + 62;

/// The fuzzing parameters: every cap small, so fuzzed inputs cross it.
pub fn params() -> Params {
    Params {
        max_tx_bytes: 4096,
        max_block_deposits: 4,
        max_vote_extension_bytes: 512,
        max_extension_partials: 4,
        max_block_messages: 3,
        ..Params::default()
    }
}

/// A pool message before it is signed: kind, digest, body.
type Entry = (Kind, [u8; 32], Option<HubResult>, Option<HubBlock>);

/// One message of the pool.
#[derive(Clone, Debug)]
pub struct Msg {
    /// Its kind.
    pub kind: Kind,
    /// Its digest.
    pub digest: [u8; 32],
    /// The hub result it signs, if any.
    pub result: Option<HubResult>,
    /// The hub block it signs, if any.
    pub block: Option<HubBlock>,
    /// Signer `i`'s (index `i + 1`) good signature.
    pub sigs: Vec<[u8; 96]>,
}

/// The committed chain and what the targets need to build inputs.
pub struct Env {
    /// The app, with its committed state.
    pub app: TallyApp,
    /// What its halt hook recorded.
    pub halts: HaltLog,
    /// The signers' shares (share index `i + 1` at `i`).
    pub shares: Vec<SecretShare>,
    /// The gateway's key.
    pub gw: SigningKey,
    /// The pending batch's honest retry start.
    pub start: SyncTxStart,
    /// The message pool; index 0 is the pending batch.
    pub msgs: Vec<Msg>,
    /// Signer indices (1-based) with a partial stored, per message.
    pub stored: Vec<Vec<u32>>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Env { .. }")
    }
}

fn ts(secs: u64) -> Option<Timestamp> {
    Some(Timestamp {
        seconds: secs as i64,
        nanos: 0,
    })
}

/// FinalizeBlock's request for `txs` at `height` and `time`.
pub fn finalize_req(height: i64, time: u64, txs: Vec<Vec<u8>>) -> RequestFinalizeBlock {
    RequestFinalizeBlock {
        txs: txs.into_iter().map(Bytes::from).collect(),
        decided_last_commit: None,
        misbehavior: Vec::new(),
        hash: Bytes::new(),
        height,
        time: ts(time),
        next_validators_hash: Bytes::new(),
        proposer_address: address(0),
    }
}

/// The transaction bytes of a payload.
pub fn tx_bytes(sum: tx::Sum) -> Vec<u8> {
    Tx { sum: Some(sum) }.encode_to_vec()
}

fn dep(seq: u64, user: &str, amount: u64) -> HubDeposit {
    HubDeposit {
        seq,
        user: user.into(),
        amount,
        pubkey: Vec::new(),
    }
}

/// Hub range `from..=from+9` with `deposits`; its deposit count is the
/// last one's seq (one more with `more`), or 0 without deposits.
fn hub_block(from: u64, deposits: Vec<HubDeposit>, more: bool) -> HubBlock {
    HubBlock {
        chain: "hub".into(),
        from_height: from,
        to_height: from + 9,
        deposit_count: deposits.last().map_or(0, |d| d.seq + u64::from(more)),
        deposits,
        more,
    }
}

fn result(nonce: u64, attempt: u32, settled: bool) -> HubResult {
    HubResult {
        chain: "hub".into(),
        nonce,
        attempt,
        settled,
    }
}

impl Env {
    /// Genesis, then blocks 1..=3 committed.
    pub fn new() -> Self {
        let gw = SigningKey::from_bytes(&[7; 32]);
        let coeffs: Vec<[u8; 64]> = (0..T as u8).map(|i| [i + 90; 64]).collect();
        let (pubs, shares) = deal(N as u32, T as u32, &coeffs).expect("deal");
        let hexk = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
        let genesis = Genesis {
            params: params(),
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
            dkg: Some(KeyEpoch {
                epoch: EPOCH,
                threshold: T as u32,
                group_key: hexk(&pubs.group),
                public_shares: pubs.shares.iter().map(hexk).collect(),
                signers: signers(N),
            }),
        };
        let (halt, halts) = Halt::recording();
        let app = TallyApp::new(Arc::new(MemBackend::new()), halt).expect("app");
        app.init_chain(RequestInitChain {
            time: ts(T0),
            chain_id: CHAIN.into(),
            consensus_params: None,
            validators: Vec::new(),
            app_state_bytes: serde_json::to_vec(&genesis).expect("json").into(),
            initial_height: 1,
        });
        let mut env = Env {
            app,
            halts,
            shares,
            gw,
            start: SyncTxStart::default(),
            msgs: Vec::new(),
            stored: Vec::new(),
        };
        // 1: alice pays 7.
        let pay = env.report(vec![1; 16], T0 + 100, 7);
        env.commit(1, T0, vec![pay]);
        // 2: the window closes; the proposer adds the SyncTxStart.
        let prep = env.app.prepare_proposal(RequestPrepareProposal {
            max_tx_bytes: 1 << 20,
            txs: Vec::new(),
            local_last_commit: None,
            misbehavior: Vec::new(),
            height: 2,
            time: ts(LAST_SYNC),
            next_validators_hash: Bytes::new(),
            proposer_address: address(0),
        });
        let start = match Tx::decode(prep.txs.first().expect("a sync start").as_ref()) {
            Ok(Tx {
                sum: Some(tx::Sum::SyncStart(s)),
            }) => s,
            other => panic!("block 2 should start a sync, got {other:?}"),
        };
        env.commit(2, LAST_SYNC, prep.txs.iter().map(|t| t.to_vec()).collect());
        let batch: [u8; 32] = start.digest.as_slice().try_into().expect("32 bytes");
        env.start = start;
        env.build_pool(batch);
        // 3: signer 1's partials of the batch and of hub block 4 (body
        // carried, so the chain holds it from now on).
        let first = SubmitPartials {
            partials: vec![env.good(0, 0), env.good(4, 0)],
            hub_results: Vec::new(),
            hub_blocks: vec![env.msgs[4].block.clone().expect("a block")],
        };
        let r = env.commit(3, NOW, vec![tx_bytes(tx::Sum::Partials(first))]);
        assert!(r.starts_with("2 partial"), "block 3: {r}");
        env.stored = vec![Vec::new(); env.msgs.len()];
        env.stored[0].push(1);
        env.stored[4].push(1);
        env
    }

    /// Finalizes and commits `txs`; returns the last transaction's log.
    fn commit(&self, height: i64, time: u64, txs: Vec<Vec<u8>>) -> String {
        let r = self.app.finalize_block(finalize_req(height, time, txs));
        assert!(
            self.halts.is_empty(),
            "setup halted: {:?}",
            self.halts.events()
        );
        let last = r.tx_results.last().map(|t| (t.code, t.log.clone()));
        if let Some((code, log)) = &last {
            assert_eq!(*code, 0, "setup block {height}: {log}");
        }
        self.app.commit();
        last.map(|l| l.1).unwrap_or_default()
    }

    /// A valid signed report by the gateway: alice pays `amount`.
    pub fn report(&self, id: Vec<u8>, expires_at: u64, amount: u64) -> Vec<u8> {
        sign_report(
            &self.gw,
            &ReportUsage {
                chain_id: CHAIN.into(),
                report_id: id,
                expires_at,
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

    /// Signer `signer`'s (index `signer + 1`) good partial of message `m`.
    pub fn good(&self, m: usize, signer: usize) -> PartialSig {
        let msg = &self.msgs[m];
        PartialSig {
            epoch: 0,
            index: signer as u32 + 1,
            kind: msg.kind.value(),
            digest: msg.digest.to_vec(),
            signature: msg.sigs[signer].to_vec(),
        }
    }

    /// The message pool. What the chain waits for (before this block's
    /// own actions): 0 batch, 1 settled result of attempt 1, 2 failed
    /// result of attempt 1 (only while attempt 1 is current), 3 settled
    /// result of attempt 2 (only after a retry start), 4-6 three
    /// alternatives for hub range 1..=10. Never: 7 the next range, 8 a
    /// result of batch 2, 9 an unknown batch, 10 a block over the deposit
    /// cap, 11 `more` without a full block, 12 a zero deposit.
    fn build_pool(&mut self, batch: [u8; 32]) {
        let full: Vec<HubDeposit> = (1..=4).map(|s| dep(s, "alice", s)).collect();
        let over: Vec<HubDeposit> = (1..=5).map(|s| dep(s, "bob", 1)).collect();
        let mut pool: Vec<Entry> = vec![(Kind::Batch, batch, None, None)];
        for r in [result(1, 1, true), result(1, 1, false), result(1, 2, true)] {
            pool.push((Kind::HubResult, result_digest(&r), Some(r), None));
        }
        let blocks = [
            hub_block(1, vec![dep(1, "alice", 5), dep(2, "bob", 3)], false),
            hub_block(1, Vec::new(), false),
            hub_block(1, full.clone(), true),
        ];
        for b in blocks {
            pool.push((Kind::HubBlock, block_digest(&b), None, Some(b)));
        }
        let next = hub_block(11, Vec::new(), false);
        pool.push((Kind::HubBlock, block_digest(&next), None, Some(next)));
        let r2 = result(2, 1, true);
        pool.push((Kind::HubResult, result_digest(&r2), Some(r2), None));
        pool.push((Kind::Batch, [0x5a; 32], None, None));
        for b in [
            hub_block(1, over, false),
            hub_block(1, full[..3].to_vec(), true),
            hub_block(1, vec![dep(1, "alice", 0)], false),
        ] {
            pool.push((Kind::HubBlock, block_digest(&b), None, Some(b)));
        }
        self.msgs = pool
            .into_iter()
            .map(|(kind, digest, result, block)| {
                let m = spec::message(CHAIN, kind.value(), &digest);
                Msg {
                    kind,
                    digest,
                    result,
                    block,
                    sigs: self.shares.iter().map(|s| s.sign(&m).sig_bytes()).collect(),
                }
            })
            .collect();
    }
}

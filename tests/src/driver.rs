//! Runs N [`TallyApp`]s through CometBFT's ABCI++ call sequence in one
//! process: PrepareProposal on the proposer, ProcessProposal on all,
//! ExtendVote / VerifyVoteExtension, FinalizeBlock, Commit. Time is the
//! driver's clock, moved only by the test. Every block checks that all
//! nodes computed the same app hash.
//!
//! Byzantine nodes ([`Node::behaviour`], see [`crate::adversary`]) are
//! modelled the way CometBFT treats them: a vote extension a node's
//! VerifyVoteExtension refuses does not count that precommit at that node
//! (and is left out of its `local_last_commit` when it proposes next); a
//! height fails only if an honest node counts 2/3 or less of the voting
//! power. A proposal honest nodes refuse is a failed round: the next live
//! validator proposes at the same height. Honest nodes must agree on every
//! proposal, never refuse an unaltered extension or proposal, and refuse
//! every proposal past the SubmitPartials caps. Everything is recorded in
//! [`Net::record`]. With [`Net::hub`] set, every node's relay hands in
//! what it sees before each height ([`crate::hub`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use tally_abci::{Halt, HaltLog, TallyApp};

use crate::adversary::{Behaviour, Ctx, ExtensionRecord, ProposalRecord, Record, Shape};
use crate::hub::Hub;
use tally_settlement::bls::SecretShare;
use tally_store::{Backend, MemBackend, RocksBackend};
use tendermint_abci::Application;
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::{
    response_process_proposal::ProposalStatus, response_verify_vote_extension::VerifyStatus,
    ExecTxResult, ExtendedCommitInfo, ExtendedVoteInfo, RequestExtendVote, RequestFinalizeBlock,
    RequestInfo, RequestInitChain, RequestPrepareProposal, RequestProcessProposal,
    RequestVerifyVoteExtension, ResponseFinalizeBlock, Validator,
};

/// CometBFT's default block size limit for transactions, roughly.
pub const MAX_TX_BYTES: i64 = 4 << 20;

/// Where a node keeps its state.
#[derive(Debug)]
enum Storage {
    Memory(Arc<MemBackend>),
    Rocks(PathBuf),
}

/// One validator: an app and its storage.
#[derive(Debug)]
pub struct Node {
    /// The application.
    pub app: TallyApp,
    storage: Storage,
    /// Whether it takes part in blocks (a stopped node misses them).
    pub up: bool,
    /// Its threshold key share, kept across restarts.
    pub share: Option<SecretShare>,
    /// Replaces its vote extension (a faulty validator), if set.
    pub tamper: Option<fn(Vec<u8>) -> Vec<u8>>,
    /// Replaces its honest behaviour (a byzantine validator), if set.
    pub behaviour: Option<Box<dyn Behaviour>>,
    /// What its halt hook recorded (a real node would have exited).
    pub halts: HaltLog,
}

impl Node {
    fn open(storage: Storage) -> Result<Self> {
        let backend: Arc<dyn Backend> = match &storage {
            Storage::Memory(m) => m.clone(),
            Storage::Rocks(p) => Arc::new(RocksBackend::open(p)?),
        };
        let (halt, halts) = Halt::recording();
        Ok(Self {
            app: TallyApp::new(backend, halt)?,
            storage,
            up: true,
            share: None,
            tamper: None,
            behaviour: None,
            halts,
        })
    }
}

impl Node {
    /// Whether the node runs unmodified (no tamper, no behaviour).
    pub fn honest(&self) -> bool {
        self.tamper.is_none() && self.behaviour.is_none()
    }

    /// Fails if the node asked to halt (a real node would have exited).
    fn ensure_running(&self, i: usize) -> Result<()> {
        ensure!(
            self.halts.is_empty(),
            "node{i} halted: {:?}",
            self.halts.events()
        );
        Ok(())
    }
}

/// A block as decided: what every node must finalize.
#[derive(Clone, Debug)]
pub struct Decided {
    /// Height.
    pub height: i64,
    /// Header time, unix seconds.
    pub time: i64,
    /// Transactions.
    pub txs: Vec<Bytes>,
}

/// The outcome of one height.
#[derive(Debug)]
pub struct Outcome {
    /// The block.
    pub block: Decided,
    /// The app hash every live node agreed on.
    pub app_hash: Vec<u8>,
    /// Per transaction results (from the first live node).
    pub tx_results: Vec<ExecTxResult>,
}

/// A network of in-process validators.
#[derive(Debug)]
pub struct Net {
    /// The validators.
    pub nodes: Vec<Node>,
    /// Chain id.
    pub chain_id: String,
    /// Last decided height.
    pub height: i64,
    /// The clock: unix seconds of the next block header.
    pub now: i64,
    /// Every decided block, for replay.
    pub blocks: Vec<Decided>,
    /// App hash after each height (index = height - 1).
    pub hashes: Vec<Vec<u8>>,
    /// The hub and every node's relay, if modelled.
    pub hub: Option<Hub>,
    /// Every proposal and vote extension, with who refused it.
    pub record: Record,
    last_votes: Vec<Vote>,
    genesis: (i64, String),
}

/// A precommit of the last height, and the nodes that refused its
/// extension (they do not count it).
#[derive(Clone, Debug)]
struct Vote {
    voter: usize,
    info: ExtendedVoteInfo,
    refused_by: Vec<usize>,
}

fn ts(secs: i64) -> Option<Timestamp> {
    Some(Timestamp {
        seconds: secs,
        nanos: 0,
    })
}

/// Consensus address of node `i` (20 bytes of `i`).
pub fn address(i: usize) -> Bytes {
    Bytes::from(vec![i as u8; 20])
}

/// The genesis `dkg.signers` of an `n`-node net: share `i + 1` is bound to
/// node `i`'s consensus address.
pub fn signers(n: usize) -> Vec<String> {
    (0..n).map(|i| hex::encode(address(i))).collect()
}

impl Net {
    /// `n` validators on in-memory stores.
    pub fn in_memory(n: usize, chain_id: &str, now: i64) -> Result<Self> {
        let nodes = (0..n)
            .map(|_| Node::open(Storage::Memory(Arc::new(MemBackend::new()))))
            .collect::<Result<_>>()?;
        Ok(Self::with_nodes(nodes, chain_id, now))
    }

    /// `n` validators on RocksDB stores under `dir`.
    pub fn on_rocksdb(n: usize, dir: &std::path::Path, chain_id: &str, now: i64) -> Result<Self> {
        let nodes = (0..n)
            .map(|i| Node::open(Storage::Rocks(dir.join(format!("node{i}")))))
            .collect::<Result<_>>()?;
        Ok(Self::with_nodes(nodes, chain_id, now))
    }

    fn with_nodes(nodes: Vec<Node>, chain_id: &str, now: i64) -> Self {
        Self {
            nodes,
            chain_id: chain_id.into(),
            height: 0,
            now,
            blocks: Vec::new(),
            hashes: Vec::new(),
            hub: None,
            record: Record::default(),
            last_votes: Vec::new(),
            genesis: (now, String::new()),
        }
    }

    /// Runs Info and InitChain on every node with `app_state` JSON.
    pub fn init(&mut self, app_state: &str) -> Result<()> {
        self.genesis = (self.now, app_state.to_string());
        for i in 0..self.nodes.len() {
            self.init_node(i)?;
        }
        Ok(())
    }

    fn init_node(&self, i: usize) -> Result<()> {
        let (time, app_state) = &self.genesis;
        {
            let node = &self.nodes[i];
            let info = node.app.info(RequestInfo::default());
            ensure!(info.last_block_height == 0, "node{i} is not fresh");
            let r = node.app.init_chain(RequestInitChain {
                time: ts(*time),
                chain_id: self.chain_id.clone(),
                consensus_params: None,
                validators: Vec::new(),
                app_state_bytes: Bytes::copy_from_slice(app_state.as_bytes()),
                initial_height: 1,
            });
            let abci = r.consensus_params.and_then(|p| p.abci);
            ensure!(
                abci.map(|a| a.vote_extensions_enable_height) == Some(1),
                "InitChain must enable vote extensions at height 1"
            );
        }
        Ok(())
    }

    /// Gives node `i` the threshold share `shares[i]`.
    pub fn set_signers(&mut self, shares: Vec<SecretShare>) {
        for (node, share) in self.nodes.iter_mut().zip(shares) {
            node.app.set_signer(share.clone());
            node.share = Some(share);
        }
    }

    /// Advances the clock by `secs`.
    pub fn advance(&mut self, secs: i64) {
        self.now += secs;
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes.iter().enumerate().filter(|(_, n)| n.up)
    }

    /// Runs one height with `txs` offered by the proposer's mempool; the
    /// clock then moves by `step` seconds.
    pub fn block(&mut self, txs: Vec<Vec<u8>>, step: i64) -> Result<Outcome> {
        self.block_inner(txs, step, None, None)
    }

    /// Like [`Net::block`], but node `crash` dies after its FinalizeBlock
    /// and before its Commit, restarts from its files and replays the block.
    pub fn block_crashing(
        &mut self,
        txs: Vec<Vec<u8>>,
        step: i64,
        crash: usize,
    ) -> Result<Outcome> {
        self.block_inner(txs, step, Some(crash), None)
    }

    /// Like [`Net::block`], but node `leader` proposes in round 0 (the
    /// validators after it in later rounds): a test picks the heights a
    /// byzantine proposer leads.
    pub fn block_led_by(&mut self, txs: Vec<Vec<u8>>, step: i64, leader: usize) -> Result<Outcome> {
        self.block_inner(txs, step, None, Some(leader))
    }

    fn block_inner(
        &mut self,
        txs: Vec<Vec<u8>>,
        step: i64,
        crash: Option<usize>,
        leader: Option<usize>,
    ) -> Result<Outcome> {
        let height = self.height + 1;
        let time = self.now;
        let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
        ensure!(!live.is_empty(), "no live validator");
        self.relay(&live)?;
        let mempool: Vec<Bytes> = txs.into_iter().map(Bytes::from).collect();
        let (proposer, txs) = self.propose(height, time, &live, leader, &mempool)?;
        let votes = self.vote(height, time, &live, proposer, &txs)?;
        let decided = Decided { height, time, txs };
        let mut first: Option<ResponseFinalizeBlock> = None;
        for &i in &live {
            let r = self.nodes[i].app.finalize_block(finalize_request(&decided));
            self.nodes[i].ensure_running(i)?;
            if let Some(f) = &first {
                if f.app_hash != r.app_hash {
                    bail!(
                        "app hash mismatch at height {height}: node{} {} vs node{i} {}",
                        live[0],
                        hex::encode(&f.app_hash),
                        hex::encode(&r.app_hash)
                    );
                }
            } else {
                first = Some(r);
            }
        }
        for &i in &live {
            if Some(i) != crash {
                self.nodes[i].app.commit();
            }
            self.nodes[i].ensure_running(i)?;
        }
        let first = first.context("no live node")?;
        self.height = height;
        self.now += step;
        self.last_votes = votes;
        self.blocks.push(decided.clone());
        self.hashes.push(first.app_hash.to_vec());
        if let Some(i) = crash {
            self.restart(i)?;
        }
        Ok(Outcome {
            block: decided,
            app_hash: first.app_hash.to_vec(),
            tx_results: first.tx_results,
        })
    }

    /// Every live node's relay hands in what it sees on the hub.
    fn relay(&mut self, live: &[usize]) -> Result<()> {
        let Some(mut hub) = self.hub.take() else {
            return Ok(());
        };
        let result = (|| {
            for &i in live {
                let items = hub.relay(self.nodes[i].app.committed_state())?;
                let items = self
                    .with_behaviour(i, self.height + 1, 0, &[], &[], |b, ctx| {
                        b.relay(ctx, items.clone())
                    })
                    .unwrap_or(items);
                for item in items {
                    self.nodes[i].app.hand_in(item);
                }
            }
            Ok(())
        })();
        self.hub = Some(hub);
        result
    }

    /// Runs `f` with node `i`'s behaviour, if it has one.
    #[allow(clippy::too_many_arguments)]
    fn with_behaviour<T>(
        &mut self,
        i: usize,
        height: i64,
        round: usize,
        txs: &[Bytes],
        votes: &[(Vec<u8>, Vec<u8>)],
        f: impl FnOnce(&mut dyn Behaviour, &Ctx<'_>) -> T,
    ) -> Option<T> {
        let mut b = self.nodes[i].behaviour.take()?;
        let ctx = Ctx {
            height,
            round,
            time: self.now,
            node: i,
            n: self.nodes.len(),
            chain_id: &self.chain_id,
            app: &self.nodes[i].app,
            share: self.nodes[i].share.as_ref(),
            txs,
            votes,
            history: &self.blocks,
        };
        let out = f(b.as_mut(), &ctx);
        self.nodes[i].behaviour = Some(b);
        Some(out)
    }

    /// The last commit as node `p` holds it: the precommits whose
    /// extension it accepted.
    fn local_last_commit(&self, p: usize) -> Vec<ExtendedVoteInfo> {
        self.last_votes
            .iter()
            .filter(|v| v.voter == p || !v.refused_by.contains(&p))
            .map(|v| v.info.clone())
            .collect()
    }

    /// The SubmitPartials caps (params and number of share holders) from
    /// the first honest node's committed state, if the chain signs.
    fn caps(&self, live: &[usize]) -> Result<Option<(tally_settlement::Params, usize)>> {
        let Some(&i) = live.iter().find(|&&i| self.nodes[i].honest()) else {
            return Ok(None);
        };
        let kv = self.nodes[i].app.committed_state();
        let p = tally_settlement::params(kv)?;
        Ok(tally_settlement::sync::dkg(kv)?.map(|k| (p, k.shares.shares.len())))
    }

    /// Rounds of proposals at `height` until honest nodes accept one;
    /// returns the proposer and its block.
    fn propose(
        &mut self,
        height: i64,
        time: i64,
        live: &[usize],
        leader: Option<usize>,
        mempool: &[Bytes],
    ) -> Result<(usize, Vec<Bytes>)> {
        let first = match leader {
            Some(l) => live
                .iter()
                .position(|&i| i == l)
                .with_context(|| format!("leader node{l} is not live"))?,
            None => height as usize % live.len(),
        };
        let caps = self.caps(live)?;
        for round in 0..live.len() {
            let proposer = live[(first + round) % live.len()];
            let commit = self.local_last_commit(proposer);
            let prep = self.nodes[proposer]
                .app
                .prepare_proposal(RequestPrepareProposal {
                    max_tx_bytes: MAX_TX_BYTES,
                    txs: mempool.to_vec(),
                    local_last_commit: Some(ExtendedCommitInfo {
                        round: 0,
                        votes: commit.clone(),
                    }),
                    misbehavior: Vec::new(),
                    height,
                    time: ts(time),
                    next_validators_hash: Bytes::new(),
                    proposer_address: address(proposer),
                });
            let votes: Vec<(Vec<u8>, Vec<u8>)> = commit
                .iter()
                .map(|v| {
                    let a = v.validator.as_ref().map(|x| x.address.to_vec());
                    (a.unwrap_or_default(), v.vote_extension.to_vec())
                })
                .collect();
            let honest = prep.txs;
            let txs = self
                .with_behaviour(proposer, height, round, mempool, &votes, |b, ctx| {
                    b.proposal(ctx, honest.clone())
                })
                .unwrap_or_else(|| honest.clone());
            let altered = txs != honest;
            let shape = Shape::of(&txs);
            if !altered {
                ensure!(
                    shape.bytes as i64 <= MAX_TX_BYTES,
                    "proposal exceeds max_tx_bytes"
                );
            }
            let (mut accepted_by, mut rejected_by, mut micros) =
                (Vec::new(), Vec::new(), Vec::new());
            for &i in live {
                let t0 = Instant::now();
                let r = self.nodes[i].app.process_proposal(RequestProcessProposal {
                    txs: txs.clone(),
                    proposed_last_commit: None,
                    misbehavior: Vec::new(),
                    hash: Bytes::new(),
                    height,
                    time: ts(time),
                    next_validators_hash: Bytes::new(),
                    proposer_address: address(proposer),
                });
                let took = t0.elapsed().as_micros();
                self.nodes[i].ensure_running(i)?;
                // A byzantine node's own answer is outvoted.
                if !self.nodes[i].honest() {
                    continue;
                }
                micros.push((i, took));
                if r.status == ProposalStatus::Accept as i32 {
                    accepted_by.push(i);
                } else {
                    rejected_by.push(i);
                }
            }
            ensure!(
                accepted_by.is_empty() || rejected_by.is_empty(),
                "honest nodes disagree on node{proposer}'s proposal at height {height} round {round}: accepted by {accepted_by:?}, rejected by {rejected_by:?}"
            );
            if let Some((p, signers)) = &caps {
                ensure!(
                    !shape.over(p, *signers) || accepted_by.is_empty(),
                    "node{proposer}'s proposal at height {height} is past the caps ({shape:?}) and was accepted"
                );
            }
            ensure!(
                altered || rejected_by.is_empty(),
                "node{proposer}'s honest proposal at height {height} was rejected by {rejected_by:?}"
            );
            let accepted = rejected_by.is_empty();
            self.record.proposals.push(ProposalRecord {
                height,
                round,
                proposer,
                altered,
                rejected_by,
                shape,
                process_micros: micros,
                txs: txs.clone(),
            });
            if accepted {
                return Ok((proposer, txs));
            }
        }
        bail!("every proposal at height {height} was rejected")
    }

    /// Precommits with vote extensions for the block `txs`: every live
    /// node extends its vote and every other node verifies it. Fails if an
    /// unaltered extension is refused or an honest node counts 2/3 or less
    /// of the voting power.
    fn vote(
        &mut self,
        height: i64,
        time: i64,
        live: &[usize],
        proposer: usize,
        txs: &[Bytes],
    ) -> Result<Vec<Vote>> {
        let mut votes = Vec::new();
        for &i in live {
            let honest = self.nodes[i]
                .app
                .extend_vote(RequestExtendVote {
                    hash: Bytes::new(),
                    height,
                    time: ts(time),
                    txs: txs.to_vec(),
                    proposed_last_commit: None,
                    misbehavior: Vec::new(),
                    next_validators_hash: Bytes::new(),
                    proposer_address: address(proposer),
                })
                .vote_extension
                .to_vec();
            let mut ext = honest.clone();
            if let Some(f) = self.nodes[i].tamper {
                ext = f(ext);
            }
            let ext = self
                .with_behaviour(i, height, 0, txs, &[], |b, ctx| {
                    b.extension(ctx, ext.clone())
                })
                .unwrap_or(ext);
            let mut refused_by = Vec::new();
            for &j in live {
                if j == i {
                    continue;
                }
                let v = self.nodes[j]
                    .app
                    .verify_vote_extension(RequestVerifyVoteExtension {
                        hash: Bytes::new(),
                        validator_address: address(i),
                        height,
                        vote_extension: Bytes::from(ext.clone()),
                    });
                if v.status != VerifyStatus::Accept as i32 {
                    refused_by.push(j);
                }
            }
            let altered = ext != honest;
            ensure!(
                altered || refused_by.is_empty(),
                "node{i}'s honest vote extension at height {height} was refused by {refused_by:?}"
            );
            self.record.extensions.push(ExtensionRecord {
                height,
                voter: i,
                altered,
                bytes: ext.len(),
                rejected_by: refused_by.clone(),
            });
            votes.push(Vote {
                voter: i,
                info: ExtendedVoteInfo {
                    validator: Some(Validator {
                        address: address(i),
                        power: 10,
                    }),
                    vote_extension: Bytes::from(ext),
                    extension_signature: Bytes::new(),
                    block_id_flag: 2,
                },
                refused_by,
            });
        }
        let total = self.nodes.len();
        for &j in live {
            if !self.nodes[j].honest() {
                continue;
            }
            let counted = votes.iter().filter(|v| !v.refused_by.contains(&j)).count();
            ensure!(
                3 * counted > 2 * total,
                "node{j} counts {counted} of {total} precommits at height {height}: no commit"
            );
        }
        Ok(votes)
    }

    /// What node `i`'s ExtendVote answers for a block `txs` at the next
    /// height (a probe: nothing is recorded or committed).
    pub fn probe_extension(&self, i: usize, txs: &[Bytes]) -> Vec<u8> {
        self.nodes[i]
            .app
            .extend_vote(RequestExtendVote {
                hash: Bytes::new(),
                height: self.height + 1,
                time: ts(self.now),
                txs: txs.to_vec(),
                proposed_last_commit: None,
                misbehavior: Vec::new(),
                next_validators_hash: Bytes::new(),
                proposer_address: Bytes::new(),
            })
            .vote_extension
            .to_vec()
    }

    /// Stops node `i`: it misses blocks until [`Net::restart`].
    pub fn stop(&mut self, i: usize) {
        self.nodes[i].up = false;
    }

    /// Restarts node `i` from its stored files (a process restart), then
    /// replays the blocks it missed, the way CometBFT's handshake and block
    /// sync would, checking each app hash against the network's.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let storage = match &self.nodes[i].storage {
            Storage::Memory(m) => Storage::Memory(Arc::new(m.snapshot())),
            Storage::Rocks(p) => Storage::Rocks(p.clone()),
        };
        let share = self.nodes[i].share.clone();
        let tamper = self.nodes[i].tamper;
        let behaviour = self.nodes[i].behaviour.take();
        // Drop the old instance first: RocksDB allows one opener.
        let placeholder = Node::open(Storage::Memory(Arc::new(MemBackend::new())))?;
        drop(std::mem::replace(&mut self.nodes[i], placeholder));
        self.nodes[i] = Node::open(storage)?;
        self.nodes[i].tamper = tamper;
        self.nodes[i].behaviour = behaviour;
        if let Some(s) = share {
            self.nodes[i].app.set_signer(s.clone());
            self.nodes[i].share = Some(s);
        }
        let info = self.nodes[i].app.info(RequestInfo::default());
        let from = info.last_block_height;
        ensure!(from <= self.height, "node{i} is ahead of the network");
        if from == 0 {
            // Nothing committed yet: CometBFT runs InitChain again.
            self.init_node(i)?;
        }
        if from > 0 {
            ensure!(
                info.last_block_app_hash.as_ref() == self.hashes[from as usize - 1].as_slice(),
                "node{i} restarted with an app hash the network did not have at {from}"
            );
        }
        for h in from + 1..=self.height {
            let b = self.blocks[h as usize - 1].clone();
            let r = self.nodes[i].app.finalize_block(finalize_request(&b));
            ensure!(
                r.app_hash.as_ref() == self.hashes[h as usize - 1].as_slice(),
                "node{i} replayed height {h} to a different app hash"
            );
            self.nodes[i].app.commit();
            self.nodes[i].ensure_running(i)?;
        }
        self.nodes[i].up = true;
        Ok(())
    }

    /// Node `i` executes the next block (FinalizeBlock) but dies before its
    /// Commit: nothing of that block may survive the restart.
    pub fn crash_before_commit(&mut self, i: usize, txs: Vec<Vec<u8>>) -> Result<()> {
        let b = Decided {
            height: self.height + 1,
            time: self.now,
            txs: txs.into_iter().map(Bytes::from).collect(),
        };
        self.nodes[i].app.finalize_block(finalize_request(&b));
        self.restart(i)?;
        let info = self.nodes[i].app.info(RequestInfo::default());
        ensure!(
            info.last_block_height == self.height,
            "an uncommitted block survived the crash"
        );
        Ok(())
    }

    /// Last committed (height, app hash) of every node.
    pub fn heads(&self) -> Vec<(i64, Vec<u8>)> {
        self.nodes
            .iter()
            .map(|n| {
                let info = n.app.info(RequestInfo::default());
                (info.last_block_height, info.last_block_app_hash.to_vec())
            })
            .collect()
    }
}

fn finalize_request(b: &Decided) -> RequestFinalizeBlock {
    RequestFinalizeBlock {
        txs: b.txs.clone(),
        decided_last_commit: None,
        misbehavior: Vec::new(),
        hash: Bytes::new(),
        height: b.height,
        time: ts(b.time),
        next_validators_hash: Bytes::new(),
        proposer_address: Bytes::new(),
    }
}

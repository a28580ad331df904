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

mod cometbft;
mod dkg;
mod rounds;
pub mod statesync;

pub use cometbft::{CometSet, MAX_TOTAL_VOTING_POWER};
pub use dkg::{consensus_key, enc_key, round_key, DkgFilter};

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use tally_abci::{Halt, HaltLog, TallyApp};
use tally_settlement::bls::SecretShare;
use tally_store::{Backend, MemBackend, RocksBackend};
use tendermint_abci::Application;
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::{
    Event, ExecTxResult, ExtendedVoteInfo, RequestFinalizeBlock, RequestInfo, RequestInitChain,
    ResponseFinalizeBlock,
};
use tendermint_proto::v0_38::types::{ConsensusParams, VersionParams};

use crate::adversary::{Behaviour, Record};
use crate::hub::Hub;

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
    /// Its CometBFT consensus key (keyed nets, see [`Net::keyed`]).
    pub consensus: Option<ed25519_dalek::SigningKey>,
    /// Its DKG encryption key (keyed nets).
    pub enc: Option<tally_settlement::dkg::crypto::EncKey>,
    /// Whether it is in CometBFT's validator set now (proposes and
    /// votes); a node that is not still follows the chain.
    pub member: bool,
    /// Its shares of on-chain keys, by epoch.
    pub epoch_shares: Vec<(u64, SecretShare)>,
    /// Rewrites or drops its DKG messages (a byzantine dealer), if set.
    pub dkg_filter: Option<DkgFilter>,
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
            consensus: None,
            enc: None,
            member: true,
            epoch_shares: Vec::new(),
            dkg_filter: None,
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
    /// Block-level events of FinalizeBlock (from the first live node).
    pub events: Vec<Event>,
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
    /// Snapshot stores of the nodes that serve them.
    served: Vec<(usize, Arc<statesync::MemSnapshots>)>,
    /// Honest nodes send their DKG messages with every block (keyed nets).
    pub auto_dkg: bool,
    /// Validator updates FinalizeBlock returned, by the height CometBFT
    /// applies them (H + 2).
    pending_updates: Vec<(i64, Vec<tendermint_proto::v0_38::abci::ValidatorUpdate>)>,
    /// CometBFT's genesis validators (keyed nets).
    genesis_validators: Vec<tendermint_proto::v0_38::abci::ValidatorUpdate>,
    /// DKG transactions already offered (each is sent once).
    dkg_sent: std::collections::BTreeSet<Vec<u8>>,
    /// CometBFT's next validator set, checked against every update list
    /// (keyed nets; see [`cometbft`]).
    pub comet: Option<CometSet>,
    /// The app version each decided header carried (index = height - 1),
    /// as CometBFT sets it: InitChain's, then a FinalizeBlock's
    /// `consensus_param_updates.version.app` from the next height on.
    pub app_versions: Vec<u64>,
    /// The app version the next header carries.
    pub header_version: u64,
    /// The app version genesis starts at (CometBFT's
    /// `consensus_params.version.app`; 0: not set, version 1). Set it
    /// before [`Net::init`].
    pub genesis_version: u64,
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
            served: Vec::new(),
            auto_dkg: false,
            pending_updates: Vec::new(),
            genesis_validators: Vec::new(),
            dkg_sent: Default::default(),
            comet: None,
            app_versions: Vec::new(),
            header_version: 0,
            genesis_version: 0,
        }
    }

    /// Runs Info and InitChain on every node with `app_state` JSON.
    pub fn init(&mut self, app_state: &str) -> Result<()> {
        self.genesis = (self.now, app_state.to_string());
        for i in 0..self.nodes.len() {
            self.header_version = self.init_node(i)?;
        }
        Ok(())
    }

    /// InitChain on node `i`; the app version its consensus params set.
    fn init_node(&self, i: usize) -> Result<u64> {
        let (time, app_state) = &self.genesis;
        {
            let node = &self.nodes[i];
            let info = node.app.info(RequestInfo::default());
            ensure!(info.last_block_height == 0, "node{i} is not fresh");
            let r = node.app.init_chain(RequestInitChain {
                time: ts(*time),
                chain_id: self.chain_id.clone(),
                consensus_params: (self.genesis_version > 0).then(|| ConsensusParams {
                    version: Some(VersionParams {
                        app: self.genesis_version,
                    }),
                    ..Default::default()
                }),
                validators: self.genesis_validators.clone(),
                app_state_bytes: Bytes::copy_from_slice(app_state.as_bytes()),
                initial_height: 1,
            });
            let version = r.consensus_params.as_ref().and_then(|p| p.version);
            let abci = r.consensus_params.and_then(|p| p.abci);
            ensure!(
                abci.map(|a| a.vote_extensions_enable_height) == Some(1),
                "InitChain must enable vote extensions at height 1"
            );
            let version = version
                .map(|v| v.app)
                .context("InitChain sets no app version")?;
            // Info answers the default (1) before InitChain; InitChain sets
            // genesis's version.
            let want = self.genesis_version.max(1);
            ensure!(
                info.app_version == 1 && version == want,
                "Info answers app version {} before InitChain, InitChain sets {version} (genesis {want})",
                info.app_version
            );
            Ok(version)
        }
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

    /// The up validators: they propose and vote.
    fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.up && n.member)
    }

    /// Every up node, validator or not: each runs every block.
    fn followers(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].up)
            .collect()
    }

    /// Node `i`'s consensus address: from its key in a keyed net, else
    /// [`address`].
    pub fn addr(&self, i: usize) -> Bytes {
        match &self.nodes[i].consensus {
            Some(k) => Bytes::copy_from_slice(&tally_settlement::dkg::address_of(
                k.verifying_key().as_bytes(),
            )),
            None => address(i),
        }
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
        self.apply_updates(height);
        let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
        ensure!(!live.is_empty(), "no live validator");
        self.relay(&live)?;
        let mut txs = txs;
        if self.auto_dkg {
            txs.extend(self.dkg_messages()?);
        }
        let mempool: Vec<Bytes> = txs.into_iter().map(Bytes::from).collect();
        let live_all = self.followers();
        let (proposer, txs) = self.propose(height, time, &live, leader, &mempool)?;
        let votes = self.vote(height, time, &live, proposer, &txs)?;
        let decided = Decided { height, time, txs };
        let mut first: Option<ResponseFinalizeBlock> = None;
        for &i in &live_all {
            let r = self.nodes[i].app.finalize_block(finalize_request(&decided));
            self.nodes[i].ensure_running(i)?;
            if let Some(f) = &first {
                if f.app_hash != r.app_hash {
                    bail!(
                        "app hash mismatch at height {height}: node{} {} vs node{i} {}",
                        live_all[0],
                        hex::encode(&f.app_hash),
                        hex::encode(&r.app_hash)
                    );
                }
            } else {
                first = Some(r);
            }
        }
        for &i in &live_all {
            if Some(i) != crash {
                self.nodes[i].app.commit();
            }
            self.nodes[i].ensure_running(i)?;
        }
        let first = first.context("no live node")?;
        if let Some(set) = self.comet.as_mut() {
            set.apply(&first.validator_updates).with_context(|| {
                format!("CometBFT refuses the validator updates of height {height} (CONSENSUS FAILURE on every node)")
            })?;
        }
        if !first.validator_updates.is_empty() {
            self.pending_updates
                .push((height + 2, first.validator_updates.clone()));
        }
        self.app_versions.push(self.header_version);
        if let Some(v) = first
            .consensus_param_updates
            .as_ref()
            .and_then(|p| p.version.as_ref())
        {
            self.header_version = v.app;
        }
        if self.auto_dkg {
            self.derive_shares(&live_all)?;
        }
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
            events: first.events,
        })
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
        let consensus = self.nodes[i].consensus.take();
        let enc = self.nodes[i].enc.take();
        let member = self.nodes[i].member;
        let epoch_shares = std::mem::take(&mut self.nodes[i].epoch_shares);
        let dkg_filter = self.nodes[i].dkg_filter;
        // Drop the old instance first: RocksDB allows one opener.
        let placeholder = Node::open(Storage::Memory(Arc::new(MemBackend::new())))?;
        drop(std::mem::replace(&mut self.nodes[i], placeholder));
        self.nodes[i] = Node::open(storage)?;
        self.nodes[i].tamper = tamper;
        self.nodes[i].behaviour = behaviour;
        self.nodes[i].consensus = consensus;
        self.nodes[i].enc = enc;
        self.nodes[i].member = member;
        self.nodes[i].epoch_shares = epoch_shares;
        self.nodes[i].dkg_filter = dkg_filter;
        if let Some(s) = share {
            self.nodes[i].app.set_signer(s.clone());
            self.nodes[i].share = Some(s);
        }
        for (e, s) in std::mem::take(&mut self.nodes[i].epoch_shares) {
            self.nodes[i].app.add_signer(e, s.clone());
            self.nodes[i].epoch_shares.push((e, s));
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
        self.ensure_app_version(i)?;
        if self.auto_dkg {
            self.derive_shares(&[i])?;
        }
        Ok(())
    }

    /// The app version the header of height `h` carries (decided, or the
    /// next one).
    pub fn header_version_at(&self, h: i64) -> u64 {
        usize::try_from(h - 1)
            .ok()
            .and_then(|i| self.app_versions.get(i).copied())
            .unwrap_or(self.header_version)
    }

    /// Node `i`'s Info must answer the app version of the next header:
    /// what CometBFT's state sync checks, and what the node runs next.
    pub fn ensure_app_version(&self, i: usize) -> Result<()> {
        let info = self.nodes[i].app.info(RequestInfo::default());
        let want = self.header_version_at(info.last_block_height + 1);
        ensure!(
            info.app_version == want,
            "node{i} at height {} answers app version {}, the next header carries {want}",
            info.last_block_height,
            info.app_version
        );
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

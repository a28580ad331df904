//! Byzantine validators and proposers for the in-process driver, in the
//! style of commonware's consensus mocks (equivocator, conflicter,
//! nuller): small, swappable test doubles that replace one node's honest
//! output at chosen heights while its [`TallyApp`] keeps running honest
//! code underneath.
//!
//! A node's [`Behaviour`] sees what the honest app produced and returns
//! what the node sends instead: its vote extension ([`votes`]), its block
//! proposal ([`proposals`]), or what its relay hands in. The driver
//! ([`crate::driver`]) models CometBFT around them: a refused extension
//! does not count that precommit at the refusing node, a proposal refused
//! by honest nodes is a failed round and the next validator proposes, and
//! every step is recorded ([`Record`]) so tests can assert which
//! extensions and proposals were refused, and how much work each honest
//! node was handed.

pub mod proposals;
pub mod votes;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prost::Message;
use tally_abci::{HandIn, TallyApp};
use tally_settlement::bls::{self, Kind, SecretShare};
use tally_settlement::proto::{tx, PartialSig, SubmitPartials, SyncTxStart};
use tally_settlement::sync::BatchStatus;

/// One node's replacement of honest behaviour. Every hook gets what the
/// honest app produced and returns what the node sends instead; the
/// defaults are honest.
pub trait Behaviour: std::fmt::Debug + Send {
    /// The vote extension this node sends instead of `honest`.
    fn extension(&mut self, _ctx: &Ctx<'_>, honest: Vec<u8>) -> Vec<u8> {
        honest
    }

    /// The block this node proposes instead of `honest` (what its app's
    /// PrepareProposal returned).
    fn proposal(&mut self, _ctx: &Ctx<'_>, honest: Vec<Bytes>) -> Vec<Bytes> {
        honest
    }

    /// What this node's relay hands in instead of `honest`.
    fn relay(&mut self, _ctx: &Ctx<'_>, honest: Vec<HandIn>) -> Vec<HandIn> {
        honest
    }
}

/// What a behaviour may look at: the node, the height, its app (committed
/// state), its share, and the chain so far.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// Height being decided.
    pub height: i64,
    /// Consensus round at that height (0 unless earlier proposals failed).
    pub round: usize,
    /// Block time.
    pub time: i64,
    /// This node's position (its share index is `node + 1`).
    pub node: usize,
    /// Number of validators.
    pub n: usize,
    /// Chain id.
    pub chain_id: &'a str,
    /// The node's app.
    pub app: &'a TallyApp,
    /// The node's threshold share, if it has one.
    pub share: Option<&'a SecretShare>,
    /// The block being voted on (extensions), or the mempool offered to
    /// the proposer (proposals).
    pub txs: &'a [Bytes],
    /// The last commit's vote extensions as this node holds them
    /// (consensus address, bytes).
    pub votes: &'a [(Vec<u8>, Vec<u8>)],
    /// Every block decided so far.
    pub history: &'a [crate::driver::Decided],
}

impl Ctx<'_> {
    /// The digest of the batch the chain waits a signature on, if any.
    pub fn awaited_batch(&self) -> Option<[u8; 32]> {
        let kv = self.app.committed_state();
        let p = tally_settlement::params(kv).ok()?;
        let st = tally_settlement::sync::sync_state(kv, &p.hub_chain).ok()?;
        let b = tally_settlement::sync::batch(kv, &p.hub_chain, st.current_nonce).ok()??;
        (b.status == BatchStatus::Pending.value())
            .then(|| b.digest.as_slice().try_into().ok())
            .flatten()
    }

    /// A well-formed partial under this node's own index: a valid
    /// signature of (`kind`, `digest`) with its share. Index 0 and an
    /// arbitrary point if the node holds no share.
    pub fn own_partial(&self, kind: Kind, digest: [u8; 32]) -> PartialSig {
        let (index, signature) = match self.share {
            Some(s) => (
                s.index,
                s.sign(&bls::message(self.chain_id, kind, &digest))
                    .sig_bytes()
                    .to_vec(),
            ),
            None => (0, vec![0u8; 96]),
        };
        PartialSig {
            epoch: 0,
            index,
            kind: kind.value(),
            digest: digest.to_vec(),
            signature,
        }
    }

    /// Committed state with this block's start-of-block work applied (a
    /// throwaway overlay): what the block's transactions run on.
    pub fn block_state(&self) -> Option<tally_store::Pending> {
        block_state(self.app, self.height, self.time)
    }

    /// Chain parameters from committed state (defaults if unreadable).
    pub fn params(&self) -> tally_settlement::Params {
        tally_settlement::params(self.app.committed_state()).unwrap_or_default()
    }
}

/// `app`'s committed state with the start-of-block work of the block at
/// `height` and `time` applied, as a throwaway overlay.
pub fn block_state(app: &TallyApp, height: i64, time: i64) -> Option<tally_store::Pending> {
    let mut sim = tally_store::Pending::open(app.committed_state().clone()).ok()?;
    let block = tally_settlement::Block {
        height: height as u64,
        time: time as u64,
    };
    tally_settlement::begin_block(&mut sim, &block).ok()?;
    Some(sim)
}

/// A digest nobody waits for, different for each `seed`.
pub fn junk_digest(seed: u64) -> [u8; 32] {
    let mut d = [0xa5u8; 32];
    d[..8].copy_from_slice(&seed.to_be_bytes());
    d
}

/// A signature that is a valid point but signs something else: `share`'s
/// signature of an unrelated message.
pub fn wrong_signature(share: &SecretShare) -> Vec<u8> {
    share.sign(b"not the message").sig_bytes().to_vec()
}

/// A block's transactions, split into its system transactions and the
/// rest, as decoded values.
#[derive(Clone, Debug, Default)]
pub struct Parts {
    /// The SyncTxStart, if any (the first one).
    pub start: Option<SyncTxStart>,
    /// The SubmitPartials, if any (the first one).
    pub partials: Option<SubmitPartials>,
    /// Every other transaction, in order.
    pub user: Vec<Bytes>,
}

impl Parts {
    /// Splits `txs`.
    pub fn of(txs: &[Bytes]) -> Self {
        let mut out = Self::default();
        for t in txs {
            match tally_settlement::decode_tx(t).ok().and_then(|d| d.sum) {
                Some(tx::Sum::SyncStart(s)) if out.start.is_none() => out.start = Some(s),
                Some(tx::Sum::Partials(p)) if out.partials.is_none() => out.partials = Some(p),
                _ => out.user.push(t.clone()),
            }
        }
        out
    }

    /// The block in PrepareProposal's order: start, partials, the rest.
    pub fn block(&self) -> Vec<Bytes> {
        let mut out = Vec::new();
        if let Some(s) = &self.start {
            out.push(start_tx(s.clone()));
        }
        if let Some(p) = &self.partials {
            out.push(partials_tx(p.clone()));
        }
        out.extend(self.user.iter().cloned());
        out
    }
}

/// A SyncTxStart transaction.
pub fn start_tx(s: SyncTxStart) -> Bytes {
    Bytes::from(tally_settlement::tx::encode_sync_start(s))
}

/// A SubmitPartials transaction.
pub fn partials_tx(p: SubmitPartials) -> Bytes {
    Bytes::from(tally_settlement::tx::encode_partials(p))
}

/// What a block's SubmitPartials transactions ask of every node that
/// checks them: the quantities the shape caps bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// SubmitPartials transactions.
    pub submits: usize,
    /// Partials, over all of them.
    pub partials: usize,
    /// Distinct (kind, digest) pairs the partials sign.
    pub digests: usize,
    /// Hub result and hub block bodies carried.
    pub bodies: usize,
    /// Most deposits in one hub block body.
    pub max_deposits: usize,
    /// Encoded bytes of the whole proposal.
    pub bytes: usize,
}

impl Shape {
    /// The shape of `txs`.
    pub fn of(txs: &[Bytes]) -> Self {
        let mut s = Shape {
            bytes: txs.iter().map(|t| t.len()).sum(),
            ..Shape::default()
        };
        let mut digests = BTreeSet::new();
        for t in txs {
            if let Some(tx::Sum::Partials(p)) =
                tally_settlement::decode_tx(t).ok().and_then(|d| d.sum)
            {
                s.submits += 1;
                s.partials += p.partials.len();
                for q in &p.partials {
                    digests.insert((q.kind, q.digest.clone()));
                }
                s.bodies += p.hub_results.len() + p.hub_blocks.len();
                let most = p.hub_blocks.iter().map(|b| b.deposits.len()).max();
                s.max_deposits = s.max_deposits.max(most.unwrap_or(0));
            }
        }
        s.digests = digests.len();
        s
    }

    /// Whether this exceeds the caps of `p` for a chain with `signers`
    /// share holders (what ProcessProposal must refuse before any
    /// pairing).
    pub fn over(&self, p: &tally_settlement::Params, signers: usize) -> bool {
        let msgs = p.max_block_messages as usize;
        self.partials > msgs * signers
            || self.digests > msgs
            || self.bodies > msgs
            || self.max_deposits > p.max_block_deposits as usize
    }
}

/// One proposal honest nodes checked (any round).
#[derive(Clone, Debug)]
pub struct ProposalRecord {
    /// Height.
    pub height: i64,
    /// Round (0 first).
    pub round: usize,
    /// Proposer.
    pub proposer: usize,
    /// Whether its behaviour changed what its app prepared.
    pub altered: bool,
    /// Honest nodes that refused it (all or none of them).
    pub rejected_by: Vec<usize>,
    /// What its SubmitPartials asked of each node.
    pub shape: Shape,
    /// ProcessProposal wall time per honest node, microseconds (for
    /// reporting only).
    pub process_micros: Vec<(usize, u128)>,
    /// The transactions.
    pub txs: Vec<Bytes>,
}

/// One precommit's vote extension and who refused it.
#[derive(Clone, Debug)]
pub struct ExtensionRecord {
    /// Height.
    pub height: i64,
    /// Sender.
    pub voter: usize,
    /// Whether its behaviour changed what its app produced.
    pub altered: bool,
    /// Size in bytes.
    pub bytes: usize,
    /// Nodes whose VerifyVoteExtension refused it.
    pub rejected_by: Vec<usize>,
}

/// Everything the driver observed, for assertions.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// Every proposal checked, in order.
    pub proposals: Vec<ProposalRecord>,
    /// Every vote extension sent, in order.
    pub extensions: Vec<ExtensionRecord>,
}

impl Record {
    /// Proposals honest nodes refused.
    pub fn rejected_proposals(&self) -> impl Iterator<Item = &ProposalRecord> {
        self.proposals.iter().filter(|p| !p.rejected_by.is_empty())
    }

    /// Extensions some node refused.
    pub fn rejected_extensions(&self) -> impl Iterator<Item = &ExtensionRecord> {
        self.extensions.iter().filter(|e| !e.rejected_by.is_empty())
    }

    /// (p50, p99, max) of the slowest honest ProcessProposal per proposal,
    /// in microseconds.
    pub fn process_times(&self) -> (u128, u128, u128) {
        let mut worst: Vec<u128> = self
            .proposals
            .iter()
            .filter_map(|p| p.process_micros.iter().map(|x| x.1).max())
            .collect();
        if worst.is_empty() {
            return (0, 0, 0);
        }
        worst.sort_unstable();
        let at = |q: usize| worst[(worst.len() - 1) * q / 100];
        (at(50), at(99), at(100))
    }
}

/// What a byzantine behaviour did, for tests to check every attack was
/// tried: (height, node, attack name).
pub type Acts = Arc<Mutex<Vec<(i64, usize, &'static str)>>>;

/// Records an act.
pub fn act(acts: &Acts, ctx: &Ctx<'_>, what: &'static str) {
    acts.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((ctx.height, ctx.node, what));
}

/// Decodes a vote extension, or an empty one.
pub fn decode_extension(bytes: &[u8]) -> tally_settlement::proto::VoteExtension {
    tally_settlement::proto::VoteExtension::decode(bytes).unwrap_or_default()
}

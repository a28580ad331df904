//! One height's consensus rounds with byzantine nodes, as CometBFT runs
//! them: the relays' hand-ins, proposals until honest nodes accept one
//! (a refused proposal is a failed round; the next validator proposes),
//! and precommits whose extensions each node verifies (a refused one is
//! not counted by that node, nor put in its next `local_last_commit`).

use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{
    response_process_proposal::ProposalStatus, response_verify_vote_extension::VerifyStatus,
    ExtendedCommitInfo, ExtendedVoteInfo, RequestExtendVote, RequestPrepareProposal,
    RequestProcessProposal, RequestVerifyVoteExtension, Validator,
};

use super::{ts, Net, Vote, MAX_TX_BYTES};
use crate::adversary::{Behaviour, Ctx, ExtensionRecord, ProposalRecord, Shape};

impl Net {
    /// Every live node's relay hands in what it sees on the hub.
    pub(super) fn relay(&mut self, live: &[usize]) -> Result<()> {
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
        let key = tally_settlement::dkg::state::active_key_record(kv)?;
        Ok(key.map(|k| (p, k.public_shares.len())))
    }

    /// Rounds of proposals at `height` until honest nodes accept one;
    /// returns the proposer and its block.
    pub(super) fn propose(
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
                    proposer_address: self.addr(proposer),
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
                    proposer_address: self.addr(proposer),
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
    pub(super) fn vote(
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
                    proposer_address: self.addr(proposer),
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
                        validator_address: self.addr(i),
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
                        address: self.addr(i),
                        power: 10,
                    }),
                    vote_extension: Bytes::from(ext),
                    extension_signature: Bytes::new(),
                    block_id_flag: 2,
                },
                refused_by,
            });
        }
        let total = self.nodes.iter().filter(|n| n.member).count();
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
}

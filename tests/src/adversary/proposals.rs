//! Byzantine proposers: what they propose instead of what their app's
//! PrepareProposal returned.
//!
//! - [`Stuffer`]: a SubmitPartials past a cap or with a bad partial
//!   (too many digests, partials or bodies, an over-full hub block, an
//!   invalid signature, a duplicate).
//! - [`Omitter`]: leaves the SubmitPartials out (valid: the partials come
//!   back in later extensions).
//! - [`Forger`]: forged, replayed or reordered system transactions.
//! - [`Conflicter`]: a SyncTxStart for a different batch than the honest
//!   one (other calls, or another nonce), with a digest consistent with
//!   its own batch.

use bytes::Bytes;
use tally_settlement::bls::Kind;
use tally_settlement::proto::{
    tx, HubBlock, HubCall, HubDeposit, HubResult, PartialSig, SubmitPartials, SyncTxStart,
};
use tally_settlement::sync::{self, batch_digest, block_digest, result_digest};

use super::{act, junk_digest, partials_tx, wrong_signature, Acts, Behaviour, Ctx, Parts};

/// The stuffed SubmitPartials [`Stuffer`] cycles through.
pub const STUFFING: [&str; 6] = [
    "too many digests",
    "too many partials",
    "invalid signature",
    "duplicate partial",
    "over-cap deposits",
    "too many bodies",
];

/// Replaces the block's SubmitPartials with a stuffed one, a different
/// kind of stuffing at each of its proposals (see [`STUFFING`]).
#[derive(Debug, Default)]
pub struct Stuffer {
    /// What was done.
    pub acts: Acts,
    next: usize,
}

impl Stuffer {
    /// A fresh one that logs to `acts`.
    pub fn new(acts: &Acts) -> Self {
        Self {
            acts: acts.clone(),
            ..Self::default()
        }
    }
}

impl Behaviour for Stuffer {
    fn proposal(&mut self, ctx: &Ctx<'_>, honest: Vec<Bytes>) -> Vec<Bytes> {
        let what = STUFFING[self.next % STUFFING.len()];
        self.next += 1;
        let p = ctx.params();
        let msgs = p.max_block_messages as u64;
        let mut parts = Parts::of(&honest);
        let batch = ctx.awaited_batch().unwrap_or_else(|| junk_digest(7));
        // The honest partials, or one of this node's own on the batch.
        let mut base = parts.partials.clone().unwrap_or_default();
        if base.partials.is_empty() {
            base.partials.push(ctx.own_partial(Kind::Batch, batch));
        }
        let stuffed = match what {
            "too many digests" => SubmitPartials {
                partials: (0..=msgs)
                    .map(|i| ctx.own_partial(Kind::Batch, junk_digest(1000 + i)))
                    .collect(),
                ..Default::default()
            },
            "too many partials" => {
                let q = ctx.own_partial(Kind::Batch, batch);
                SubmitPartials {
                    partials: (1..=(msgs as u32) * (ctx.n as u32) + 1)
                        .map(|index| PartialSig { index, ..q.clone() })
                        .collect(),
                    ..Default::default()
                }
            }
            "invalid signature" => {
                if let (Some(first), Some(share)) = (base.partials.first_mut(), ctx.share) {
                    first.signature = wrong_signature(share);
                }
                base
            }
            "duplicate partial" => {
                let first = base.partials[0].clone();
                base.partials.push(first);
                base
            }
            "over-cap deposits" => {
                let kv = ctx.app.committed_state();
                let cursor = sync::hub_cursor(kv, &p.hub_chain).unwrap_or(sync::HubCursor {
                    height: 1,
                    deposit_seq: 1,
                });
                let b = HubBlock {
                    chain: p.hub_chain.clone(),
                    from_height: cursor.height,
                    to_height: cursor.height + p.hub_block_range - 1,
                    deposits: (0..=p.max_block_deposits as u64)
                        .map(|i| HubDeposit {
                            seq: cursor.deposit_seq + i,
                            user: "user-0".into(),
                            amount: 1,
                        })
                        .collect(),
                    more: true,
                };
                base.partials
                    .push(ctx.own_partial(Kind::HubBlock, block_digest(&b)));
                base.hub_blocks.push(b);
                base
            }
            _ => {
                let results: Vec<HubResult> = (0..=msgs)
                    .map(|i| HubResult {
                        chain: p.hub_chain.clone(),
                        nonce: 1000 + i,
                        attempt: 1,
                        settled: true,
                    })
                    .collect();
                SubmitPartials {
                    partials: results
                        .iter()
                        .map(|r| ctx.own_partial(Kind::HubResult, result_digest(r)))
                        .collect(),
                    hub_results: results,
                    hub_blocks: Vec::new(),
                }
            }
        };
        act(&self.acts, ctx, what);
        parts.partials = Some(stuffed);
        parts.block()
    }
}

/// Leaves the SubmitPartials out of its proposals.
#[derive(Debug, Default)]
pub struct Omitter {
    /// What was done.
    pub acts: Acts,
}

impl Behaviour for Omitter {
    fn proposal(&mut self, ctx: &Ctx<'_>, honest: Vec<Bytes>) -> Vec<Bytes> {
        let mut parts = Parts::of(&honest);
        if parts.partials.take().is_some() {
            act(&self.acts, ctx, "omitted partials");
        }
        parts.block()
    }
}

/// The system-transaction forgeries [`Forger`] tries, those that need the
/// rarest blocks first.
pub const FORGERIES: [&str; 6] = [
    "partials before start",
    "system tx after user tx",
    "replayed start",
    "replayed partials",
    "two SubmitPartials",
    "forged start",
];

/// At each of its proposals, the forgery it has tried least among those
/// the block allows (ties: the first in [`FORGERIES`]); a forged start
/// always applies.
#[derive(Debug, Default)]
pub struct Forger {
    /// What was done.
    pub acts: Acts,
    used: [usize; FORGERIES.len()],
}

/// The last committed system transaction of each kind.
fn last_committed(ctx: &Ctx<'_>) -> (Option<SyncTxStart>, Option<SubmitPartials>) {
    let (mut s, mut p) = (None, None);
    for b in ctx.history.iter().rev() {
        for t in &b.txs {
            match tally_settlement::decode_tx(t).ok().and_then(|d| d.sum) {
                Some(tx::Sum::SyncStart(x)) if s.is_none() => s = Some(x),
                Some(tx::Sum::Partials(x)) if p.is_none() => p = Some(x),
                _ => {}
            }
        }
        if s.is_some() && p.is_some() {
            break;
        }
    }
    (s, p)
}

impl Forger {
    /// A fresh one that logs to `acts`.
    pub fn new(acts: &Acts) -> Self {
        Self {
            acts: acts.clone(),
            ..Self::default()
        }
    }
}

impl Behaviour for Forger {
    fn proposal(&mut self, ctx: &Ctx<'_>, honest: Vec<Bytes>) -> Vec<Bytes> {
        let parts = Parts::of(&honest);
        let (old_start, old_partials) = last_committed(ctx);
        let system = parts.start.is_some() || parts.partials.is_some();
        let applies = |i: usize| match FORGERIES[i] {
            "replayed start" => old_start.is_some() && old_start != parts.start,
            "replayed partials" => old_partials.is_some() && old_partials != parts.partials,
            "partials before start" => parts.start.is_some() && parts.partials.is_some(),
            "system tx after user tx" => system && !parts.user.is_empty(),
            "two SubmitPartials" => parts.partials.is_some(),
            _ => true,
        };
        let Some(i) = (0..FORGERIES.len())
            .filter(|i| applies(*i))
            .min_by_key(|i| (self.used[*i], *i))
        else {
            return honest;
        };
        self.used[i] += 1;
        act(&self.acts, ctx, FORGERIES[i]);
        let mut out = parts.clone();
        match FORGERIES[i] {
            "forged start" => {
                out.start = Some(SyncTxStart {
                    chain: ctx.params().hub_chain,
                    batch_nonce: 1_000_000 + ctx.height as u64,
                    call_ids: vec![1],
                    digest: junk_digest(ctx.height as u64).to_vec(),
                });
                out.block()
            }
            "replayed start" => {
                out.start = old_start;
                out.block()
            }
            "replayed partials" => {
                out.partials = old_partials;
                out.block()
            }
            "partials before start" => {
                let mut b = honest;
                b.swap(0, 1);
                b
            }
            "system tx after user tx" => {
                let mut b: Vec<Bytes> = parts.user.clone();
                out.user.clear();
                b.extend(out.block());
                b
            }
            _ => {
                let mut b = honest;
                let copy = parts.partials.clone().map(partials_tx);
                let at = usize::from(parts.start.is_some()) + 1;
                b.splice(at..at, copy);
                b
            }
        }
    }
}

/// Replaces the honest SyncTxStart, when its proposal has one, with one
/// for another batch: other calls, or the same calls under another nonce,
/// alternately; the digest is the batch digest of its own batch.
#[derive(Debug, Default)]
pub struct Conflicter {
    /// What was done.
    pub acts: Acts,
    next: usize,
}

/// A start for another batch than `honest`: with `other_calls`, its
/// calls without the last (when it has more than one), else the same
/// calls under the next nonce; its digest is its own batch's digest (the
/// calls are read from `kv`). Returns the start and which change it made.
pub fn conflicting_start(
    kv: &impl tally_store::KvRead,
    honest: &SyncTxStart,
    other_calls: bool,
) -> (SyncTxStart, &'static str) {
    let mut nonce = honest.batch_nonce;
    let mut ids = honest.call_ids.clone();
    let what = if other_calls && ids.len() > 1 {
        ids.pop();
        "other calls"
    } else {
        nonce += 1;
        "other nonce"
    };
    let calls: Vec<HubCall> = ids
        .iter()
        .filter_map(|id| sync::hub_call(kv, *id).ok().flatten())
        .collect();
    let start = SyncTxStart {
        digest: batch_digest(&honest.chain, nonce, &calls).to_vec(),
        chain: honest.chain.clone(),
        batch_nonce: nonce,
        call_ids: ids,
    };
    (start, what)
}

impl Conflicter {
    /// A fresh one that logs to `acts`.
    pub fn new(acts: &Acts) -> Self {
        Self {
            acts: acts.clone(),
            ..Self::default()
        }
    }
}

impl Behaviour for Conflicter {
    fn proposal(&mut self, ctx: &Ctx<'_>, honest: Vec<Bytes>) -> Vec<Bytes> {
        let mut parts = Parts::of(&honest);
        let Some(s) = parts.start.clone() else {
            return honest;
        };
        let (forged, what) = conflicting_start(ctx.app.committed_state(), &s, self.next.is_multiple_of(2));
        self.next += 1;
        act(&self.acts, ctx, what);
        parts.start = Some(forged);
        parts.block()
    }
}

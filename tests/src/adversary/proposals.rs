//! Byzantine proposers: what they propose instead of what their app's
//! PrepareProposal returned.
//!
//! - [`Stuffer`]: a SubmitPartials past a cap or with a bad partial
//!   (too many messages or partials, an over-full hub block, an invalid
//!   signature, a duplicate, a body nothing signs), over forged hub blocks
//!   the chain recognises as awaited.
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
use tally_settlement::sync::{self, batch_digest, block_digest};

use super::{act, junk_digest, partials_tx, wrong_signature, Acts, Behaviour, Ctx, Parts};

/// The stuffed SubmitPartials [`Stuffer`] cycles through. Each breaks
/// exactly one rule and is otherwise acceptable where it can be: the
/// messages it signs are forged hub blocks for the range the chain waits
/// on (well-formed, so recognised as awaited), with valid partials, so
/// only the rule named refuses them.
pub const STUFFING: [&str; 6] = [
    "too many messages",
    "too many partials",
    "invalid signature",
    "duplicate partial",
    "over-cap deposits",
    "unreferenced body",
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

/// A hub block for the range the chain waits on, from its deposit cursor:
/// `count` deposits to `user-0` (amounts from `seed`), with `more` as
/// given, and a deposit count that fits them. Well-formed, so the chain
/// recognises it as awaited; no hub ever produced it.
pub fn forged_block(ctx: &Ctx<'_>, seed: u64, count: u64, more: bool) -> HubBlock {
    let p = ctx.params();
    let cursor =
        sync::hub_cursor(ctx.app.committed_state(), &p.hub_chain).unwrap_or(sync::HubCursor {
            height: 1,
            deposit_seq: 1,
        });
    HubBlock {
        chain: p.hub_chain.clone(),
        from_height: cursor.height,
        to_height: cursor.height + p.hub_block_range - 1,
        deposits: (0..count)
            .map(|i| HubDeposit {
                seq: cursor.deposit_seq + i,
                user: "user-0".into(),
                amount: 1 + seed + i,
                pubkey: Vec::new(),
            })
            .collect(),
        more,
        deposit_count: cursor.deposit_seq - 1 + count + u64::from(more),
    }
}

/// A SubmitPartials carrying `blocks` with this node's valid partial on
/// each.
fn signed_blocks(ctx: &Ctx<'_>, blocks: Vec<HubBlock>) -> SubmitPartials {
    SubmitPartials {
        partials: blocks
            .iter()
            .map(|b| ctx.own_partial(Kind::HubBlock, block_digest(b)))
            .collect(),
        hub_results: Vec::new(),
        hub_blocks: blocks,
    }
}

impl Behaviour for Stuffer {
    fn proposal(&mut self, ctx: &Ctx<'_>, honest: Vec<Bytes>) -> Vec<Bytes> {
        let what = STUFFING[self.next % STUFFING.len()];
        self.next += 1;
        let p = ctx.params();
        let msgs = p.max_block_messages as u64;
        let mut parts = Parts::of(&honest);
        let seed = 1000 * ctx.height as u64;
        let stuffed = match what {
            "too many messages" => signed_blocks(
                ctx,
                (0..=msgs)
                    .map(|i| forged_block(ctx, seed + i, 1, false))
                    .collect(),
            ),
            "too many partials" => {
                let mut sp = signed_blocks(ctx, vec![forged_block(ctx, seed, 1, false)]);
                let q = sp.partials[0].clone();
                sp.partials = (1..=(msgs as u32) * (ctx.n as u32) + 1)
                    .map(|index| PartialSig { index, ..q.clone() })
                    .collect();
                sp
            }
            "invalid signature" => {
                let mut sp = signed_blocks(ctx, vec![forged_block(ctx, seed, 1, false)]);
                if let Some(share) = ctx.share {
                    sp.partials[0].signature = wrong_signature(share);
                }
                sp
            }
            "duplicate partial" => {
                let mut sp = signed_blocks(ctx, vec![forged_block(ctx, seed, 1, false)]);
                let q = sp.partials[0].clone();
                sp.partials.push(q);
                sp
            }
            "over-cap deposits" => signed_blocks(
                ctx,
                vec![forged_block(
                    ctx,
                    seed,
                    p.max_block_deposits as u64 + 1,
                    false,
                )],
            ),
            _ => {
                let mut sp = parts.partials.clone().unwrap_or_default();
                sp.hub_results.push(HubResult {
                    chain: p.hub_chain.clone(),
                    nonce: seed,
                    attempt: 1,
                    settled: true,
                });
                sp
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
/// calls under the next nonce; its digest is its own batch's digest, over
/// the calls read from `kv`, which must hold the block's start-of-block
/// work (the window close that makes them; see [`super::block_state`]).
/// Returns the start and which change it made.
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
        .map(|id| {
            sync::hub_call(kv, *id)
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("hub call {id} of the start is not in state"))
        })
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
        let Some(sim) = ctx.block_state() else {
            return honest;
        };
        let (forged, what) = conflicting_start(&sim, &s, self.next.is_multiple_of(2));
        self.next += 1;
        act(&self.acts, ctx, what);
        parts.start = Some(forged);
        parts.block()
    }
}

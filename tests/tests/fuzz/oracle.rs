//! The proposal target's oracle: what ProcessProposal (strict) and
//! FinalizeBlock (lenient) must do with a SubmitPartials, computed from the
//! rules of ADR 0006 (settlement sync), ADR 0010 (byzantine limits) and
//! `docs/signing.md` on a small model of the chain state, without the state
//! machine's code (digests from `spec`, the doc's layouts) and without
//! pairings (a BLS signature is unique, so a partial is valid exactly when
//! its bytes are the signer's good signature from the pool). Each check
//! names the rule it implements.

use std::collections::BTreeSet;

use tally_settlement::bls::Kind;
use tally_settlement::proto::{HubBlock, SubmitPartials};

use crate::env::{params, Env, N, T};
use crate::spec::{block_digest, result_digest};

/// The parts of the state the messages depend on.
#[derive(Clone, Debug)]
pub struct Sim {
    /// The batch awaits its signature.
    pub batch_pending: bool,
    /// Batch 1 is the current batch (no settled result yet).
    pub current: bool,
    /// Current attempt.
    pub attempt: u32,
    /// Last attempt known to have failed.
    pub failed_attempt: u32,
    /// A sync attempt runs (no SyncTxStart allowed).
    pub running: bool,
    /// Hub cursor: next height.
    pub height: u64,
    /// Hub cursor: next deposit sequence number.
    pub seq: u64,
    /// Signer indices with a partial stored, per pool message.
    pub stored: Vec<Vec<u32>>,
    /// Pool messages the chain holds as pending (with their bodies).
    pub held: Vec<bool>,
}

impl Sim {
    /// Committed state, at a block time where attempt 1 still runs
    /// (`retry == false`) or has expired.
    pub fn committed(env: &Env, retry: bool) -> Self {
        Sim {
            stored: env.stored.clone(),
            held: env.stored.iter().map(|s| !s.is_empty()).collect(),
            batch_pending: true,
            current: true,
            attempt: 1,
            failed_attempt: 0,
            running: !retry,
            height: 1,
            seq: 1,
        }
    }

    /// signing.md 3.3: the chain accepts partials only for the range at
    /// its cursor, deposits numbered consecutively from its next sequence
    /// number, at most `max_block_deposits` and exactly that many when
    /// `more`; `deposit_count` equals what is credited after the message
    /// (`more` = 0) or exceeds it (`more` = 1). DESIGN (hub events): a
    /// deposit credits a positive amount to an identifier.
    fn block_awaited(&self, b: &HubBlock) -> bool {
        let cap = params().max_block_deposits as usize;
        let sized = if b.more {
            b.deposits.len() == cap
        } else {
            b.deposits.len() <= cap
        };
        b.chain == "hub"
            && b.from_height == self.height
            && b.to_height == self.height + 9
            && sized
            && b.deposits.iter().enumerate().all(|(i, d)| {
                d.seq == self.seq + i as u64
                    && d.amount > 0
                    && !d.user.is_empty()
                    && d.user.bytes().all(|c| c.is_ascii_alphanumeric())
            })
            && {
                // The hub's count: exactly what is credited after this
                // message when it is the range's last, more when `more`.
                let credited = self.seq - 1 + b.deposits.len() as u64;
                if b.more {
                    b.deposit_count > credited
                } else {
                    b.deposit_count == credited
                }
            }
    }

    /// Whether the chain now waits for pool message `m`. ADR 0006: a
    /// batch while it is current and unsigned; a `settled` result of any
    /// attempt up to the current one (an earlier attempt may settle late),
    /// a `failed` result only of the current attempt and only once; a hub
    /// block per [`Self::block_awaited`].
    pub fn awaited(&self, env: &Env, m: usize) -> bool {
        let msg = &env.msgs[m];
        match msg.kind {
            Kind::Batch => self.current && self.batch_pending && m == 0,
            Kind::HubResult => msg.result.as_ref().is_some_and(|r| {
                let attempt_ok = if r.settled {
                    r.attempt <= self.attempt
                } else {
                    r.attempt == self.attempt && self.failed_attempt < r.attempt
                };
                self.current && r.chain == "hub" && r.nonce == 1 && attempt_ok
            }),
            Kind::HubBlock => msg.block.as_ref().is_some_and(|b| self.block_awaited(b)),
            // The fuzzed state never holds a re-keyed key waiting for its
            // rotation (rotations: tests/tests/dkg_rotation.rs).
            Kind::KeyRotation => false,
        }
    }

    /// Message `m` reached the threshold: what acting on it changes
    /// (ADR 0006: a batch becomes signed; `settled` ends the batch, `failed`
    /// backdates `last_sync` so the sync still counts as running; a hub
    /// block moves the deposit sequence, and the cursor with the range's
    /// last message).
    fn act(&mut self, env: &Env, m: usize) {
        let msg = &env.msgs[m];
        match msg.kind {
            Kind::KeyRotation => {}
            Kind::Batch => self.batch_pending = false,
            Kind::HubResult => match &msg.result {
                Some(r) if r.settled => {
                    self.current = false;
                    self.attempt = 0;
                }
                Some(r) => {
                    self.failed_attempt = r.attempt;
                    // last_sync backdated by 300 s of a 360 s window.
                    self.running = true;
                }
                None => {}
            },
            Kind::HubBlock => {
                if let Some(b) = &msg.block {
                    if let Some(d) = b.deposits.last() {
                        self.seq = d.seq + 1;
                    }
                    if !b.more {
                        self.height = b.to_height + 1;
                    }
                }
            }
        }
    }
}

/// The shape rules of ADR 0010 (decision 5, "shape before work", and the
/// limits table): each body carried once, every deposit list within
/// `max_block_deposits`, one partial per (message, signer), at most
/// `max_block_messages` messages and `max_block_messages × n` partials, and
/// every carried body referenced by a partial (decision 1: bodies travel
/// once, with the partials that sign them).
pub fn shape_ok(tx: &SubmitPartials) -> bool {
    let p = params();
    let msgs = p.max_block_messages as usize;
    let mut bodies: BTreeSet<(u32, [u8; 32])> = BTreeSet::new();
    for r in &tx.hub_results {
        if !bodies.insert((Kind::HubResult.value(), result_digest(r))) {
            return false;
        }
    }
    for b in &tx.hub_blocks {
        if b.deposits.len() > p.max_block_deposits as usize
            || !bodies.insert((Kind::HubBlock.value(), block_digest(b)))
        {
            return false;
        }
    }
    let mut pairs = BTreeSet::new();
    let mut messages = BTreeSet::new();
    for q in &tx.partials {
        if !pairs.insert((q.digest.clone(), q.index)) {
            return false;
        }
        messages.insert((q.kind, q.digest.clone()));
    }
    tx.partials.len() <= msgs * N
        && bodies.len() == tx.hub_results.len() + tx.hub_blocks.len()
        && bodies.len() <= msgs
        && messages.len() <= msgs
        && bodies
            .iter()
            .all(|(k, d)| messages.contains(&(*k, d.to_vec())))
}

/// A partial's share index and signature bytes.
type Signed = (u32, Vec<u8>);

/// What applying `tx` on `sim` gives: `Err` if the transaction is refused
/// (`strict`: any partial that is not new, awaited and valid; always: a
/// shape violation), else how many partials are stored. Updates `sim`.
pub fn apply(env: &Env, sim: &mut Sim, tx: &SubmitPartials, strict: bool) -> Result<usize, ()> {
    if !shape_ok(tx) {
        return Err(());
    }
    let carried: BTreeSet<[u8; 32]> = tx
        .hub_results
        .iter()
        .map(result_digest)
        .chain(tx.hub_blocks.iter().map(block_digest))
        .collect();
    // Recognised, parsed and fresh partials, grouped by message. ADR 0006:
    // a partial counts only for a message the chain waits for, whose body
    // is a batch's (in state), carried here or held with earlier partials
    // (ADR 0010 decision 1); its index must be a share's (signing.md 6:
    // zero or unknown indices are refused), new for that message, and its
    // signature a G2 point in the subgroup. ProcessProposal (strict)
    // refuses the block for any other partial; FinalizeBlock skips it.
    let mut groups: Vec<(usize, Vec<Signed>)> = Vec::new();
    for q in &tx.partials {
        let m = env
            .msgs
            .iter()
            .position(|x| x.kind.value() == q.kind && x.digest.as_slice() == q.digest);
        let ok = m.filter(|&m| {
            let msg = &env.msgs[m];
            let has_body = msg.kind == Kind::Batch || carried.contains(&msg.digest) || sim.held[m];
            sim.awaited(env, m)
                && has_body
                && (1..=N as u32).contains(&q.index)
                && !sim.stored[m].contains(&q.index)
                && blst::min_pk::Signature::sig_validate(&q.signature, true).is_ok()
        });
        match ok {
            Some(m) => match groups.iter_mut().find(|g| g.0 == m) {
                Some(g) => g.1.push((q.index, q.signature.clone())),
                None => groups.push((m, vec![(q.index, q.signature.clone())])),
            },
            None if strict => return Err(()),
            None => {}
        }
    }
    groups.sort_by_key(|(m, _)| (env.msgs[*m].kind.value(), env.msgs[*m].digest));
    let mut stored = 0;
    for (m, partials) in groups {
        if !sim.awaited(env, m) {
            continue;
        }
        // ADR 0010 decision 4: verify, then de-duplicate; a bad partial
        // refuses a proposal (strict) and is dropped in FinalizeBlock.
        let valid = |(i, sig): &Signed| env.msgs[m].sigs[*i as usize - 1].as_slice() == sig;
        if strict && !partials.iter().all(valid) {
            return Err(());
        }
        let mut good: Vec<u32> = Vec::new();
        for p in partials.iter().filter(|p| valid(p)) {
            if !good.contains(&p.0) {
                good.push(p.0);
            }
        }
        stored += good.len();
        sim.stored[m].extend(good);
        sim.held[m] = true;
        if sim.stored[m].len() >= T {
            // ADR 0006: at t partials they are combined and acted on, and
            // the message's partials and body are deleted.
            sim.stored[m].clear();
            sim.held[m] = false;
            sim.act(env, m);
        }
    }
    Ok(stored)
}

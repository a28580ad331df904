//! Validator transactions, planned against state then applied: dealings,
//! acks and reveals of the running ceremony, and validator-set proposals
//! and approvals. A plan reads only; `apply` writes what the plan checked.
//!
//! Who may send what:
//! - a ceremony key: a player of the running round, before `keys_end`,
//!   once, with a proof of possession over (chain, round, its address);
//! - a dealing: a dealer of the running round, from `keys_end` until
//!   `deal_end`, once, with one share per player: encrypted to the
//!   player's ceremony key, or empty for a player that registered none;
//! - an ack: a player of the round that registered a key, for a dealing
//!   on chain, before `ack_end`, once per dealing;
//! - a reveal: the dealing's dealer, from `ack_end` until `end`, only for
//!   players with a key that did not ack, each share checked against the
//!   commitment;
//! - a proposal or approval: a current validator (voting power > 0).
//!
//! The height a message is checked at is the last block begun: in
//! FinalizeBlock the block itself, in CheckTx the last committed block (a
//! message accepted there may still miss its window and be refused when
//! it lands).
//!
//! # The cost of a dealing, and why its points are checked one by one
//!
//! A dealing's check is almost all curve arithmetic: each of its `t`
//! commitment points and its (up to) `n` ephemeral keys is decompressed (a
//! square root in Fp) and subgroup-checked (Scott's endomorphism test, two
//! 64-bit scalar multiplications), 167 points at n = 100, and that was
//! about 97% of the dealing block (1.2 to 1.5 s at n = 100 for its 100
//! dealings, `scripts/bench.sh dkg`). The
//! points are parsed through the node's memory ([`VerifiedSignatures`],
//! [`parse_public_key_with`]): CheckTx, when the dealing reaches the
//! mempool, decompresses and checks each point once and remembers it, and
//! the mempool rechecks and FinalizeBlock find it there. The answer is the
//! same with or without the memory, since validity depends on the bytes
//! alone; nothing probabilistic is involved, and a node that never saw the
//! dealings (block sync, or a proposer's dealings that were never
//! gossiped) does the full work and reaches the same result.
//!
//! The subgroup checks are not batched on purpose. A random linear
//! combination `Σ c_i P_i` tested once for membership would accept a
//! point outside the subgroup with probability at least 1/3, whatever the
//! `c_i`: G1's cofactor is `3 · 11² · 10177² · 859267² · 52437899²`, and
//! a dealer can add the point `(0, 2)` of order 3 to a commitment point,
//! which the combination loses whenever `3 | c_i`. With coefficients a
//! byzantine proposer or dealer can grind (any derived from block data),
//! that is three tries, and repeating the combination until the bound is
//! negligible (≈ 64 times for 2^-100) costs more than checking each point.

use tally_store::{Kv, KvRead};

use super::crypto::{scalar_from_bytes, verify_pop, verify_share};
use super::msg::{key_context, Opened};
use super::proposal::{accept_if_enough, current_validator, plan_proposal, proposal_event};
use super::state::{self as st};
use super::types::ProposalStatus;
use crate::bls::parse_public_key;
use crate::codes::Code;
use crate::envelope::parse_public_key_with;
use crate::envelope::VerifiedSignatures;
use crate::error::{reject, ExecError};
use crate::proto::{validator_msg::Sum, Ceremony, Dealing, DkgKey, DkgReveal, Proposal};
use crate::state::chain::chain_id;
use crate::types::{Event, TxResult};

/// A checked validator transaction.
#[derive(Debug)]
pub enum ValidatorPlan {
    /// Store a player's ceremony key: round, player, key.
    Key(u64, u32, Vec<u8>),
    /// Store a dealing under the dealer's position.
    Dealing(u32, Dealing),
    /// Record acks: round, dealers, player.
    Ack(u64, Vec<u32>, u32),
    /// Record reveals: round, dealer, (player, share).
    Reveal(u64, u32, Vec<(u32, Vec<u8>)>),
    /// Open a proposal.
    Propose(Box<Proposal>),
    /// Add an approval (the proposal with it added).
    Approve(Box<Proposal>),
}

impl ValidatorPlan {
    /// A one-line description for CheckTx.
    pub fn describe(&self) -> String {
        match self {
            ValidatorPlan::Key(r, p, _) => format!("ceremony key of player {p}, round {r}"),
            ValidatorPlan::Dealing(d, x) => format!("dealing of dealer {d} for round {}", x.round),
            ValidatorPlan::Ack(r, d, p) => {
                format!("ack of player {p} for {} dealing(s), round {r}", d.len())
            }
            ValidatorPlan::Reveal(r, d, s) => {
                format!("{} share(s) revealed by dealer {d}, round {r}", s.len())
            }
            ValidatorPlan::Propose(p) => format!("validator-set proposal (action {})", p.action),
            ValidatorPlan::Approve(p) => format!("approval of proposal {}", p.id),
        }
    }

    /// Writes the change and returns the accepted result.
    pub fn apply(self, kv: &mut impl Kv) -> Result<TxResult, ExecError> {
        Ok(match self {
            ValidatorPlan::Key(r, p, key) => {
                st::put_ceremony_key(kv, r, p, &key);
                let ev = Event::new(
                    "dkg_key",
                    [("round", r.to_string()), ("player", p.to_string())],
                );
                TxResult::ok(format!("ceremony key of player {p} stored"), vec![ev])
            }
            ValidatorPlan::Dealing(pos, d) => {
                st::put_dealing(kv, pos, &d);
                let ev = Event::new(
                    "dkg_dealing",
                    [("round", d.round.to_string()), ("dealer", pos.to_string())],
                );
                TxResult::ok(format!("dealing {pos} stored"), vec![ev])
            }
            ValidatorPlan::Ack(r, ds, p) => {
                for d in &ds {
                    st::put_ack(kv, r, *d, p);
                }
                TxResult::ok(
                    format!("player {p} acked {} dealing(s)", ds.len()),
                    Vec::new(),
                )
            }
            ValidatorPlan::Reveal(r, d, shares) => {
                for (p, s) in &shares {
                    st::put_reveal(kv, r, d, *p, s);
                }
                let ev = Event::new(
                    "dkg_reveal",
                    [
                        ("round", r.to_string()),
                        ("dealer", d.to_string()),
                        ("shares", shares.len().to_string()),
                    ],
                );
                TxResult::ok(format!("{} share(s) revealed", shares.len()), vec![ev])
            }
            ValidatorPlan::Propose(mut p) => {
                p.id = st::next_proposal_id(kv)?;
                let events = decide(kv, &mut p)?;
                let mut r = TxResult::ok(format!("proposal {} opened", p.id), events);
                r.data = p.id.to_be_bytes().to_vec();
                r
            }
            ValidatorPlan::Approve(mut p) => {
                let events = decide(kv, &mut p)?;
                TxResult::ok(format!("proposal {} approved", p.id), events)
            }
        })
    }
}

/// Stores `p` after counting its approvals; a governance proposal that is
/// accepted is carried out at once ([`crate::gov::enact`]). Returns the
/// proposal's event and the governance one.
fn decide(kv: &mut impl Kv, p: &mut Proposal) -> Result<Vec<Event>, ExecError> {
    accept_if_enough(kv, p)?;
    let upgrade = crate::gov::enact(kv, p, st::last_height(kv)?)?;
    st::put_proposal(kv, p);
    let mut events = vec![proposal_event(p)];
    events.extend(upgrade);
    Ok(events)
}

/// Plans an opened validator transaction ([`super::msg::open`]) at the
/// last block begun. G1 points of dealings and of the commitments reveals
/// are checked against are parsed through `memo` (the node's memory of
/// points it validated, [`parse_public_key_with`]): same answers, each
/// point's decompression and subgroup check done once per node.
pub fn plan_validator_tx(
    kv: &impl KvRead,
    o: &Opened,
    memo: &dyn VerifiedSignatures,
) -> Result<ValidatorPlan, ExecError> {
    let chain = chain_id(kv)?;
    let height = st::last_height(kv)?;
    match o.msg.sum.clone() {
        Some(Sum::Key(k)) => plan_key(kv, &chain, height, o, k),
        Some(Sum::Dealing(d)) => plan_dealing(kv, height, o, d, memo),
        Some(Sum::Ack(a)) => {
            let c = running(kv, a.round)?;
            if height >= c.ack_end {
                return Err(phase(format!(
                    "acks of round {} ended at height {}",
                    c.round, c.ack_end
                )));
            }
            let p = player_pos(&c, o)?;
            if st::ceremony_key(kv, c.round, p)?.is_none() {
                return Err(phase(format!(
                    "player {p} registered no key in round {}: it holds no share to ack",
                    c.round
                )));
            }
            if a.dealers.is_empty() || !a.dealers.windows(2).all(|w| w[0] < w[1]) {
                return Err(reject(
                    Code::MalformedTx,
                    "an ack lists 1 or more dealers, ascending, each once",
                ));
            }
            for &d in &a.dealers {
                if d == 0 || !st::has_dealing(kv, c.round, d)? {
                    return Err(phase(format!("no dealing {d} in round {}", c.round)));
                }
                if st::has_ack(kv, c.round, d, p)? {
                    return Err(reject(
                        Code::DkgDuplicate,
                        format!("ack of dealing {d} already recorded"),
                    ));
                }
            }
            Ok(ValidatorPlan::Ack(c.round, a.dealers, p))
        }
        Some(Sum::Reveal(r)) => plan_reveal(kv, height, o, r, memo),
        Some(Sum::Propose(p)) => {
            plan_proposal(kv, height, o, p).map(|p| ValidatorPlan::Propose(Box::new(p)))
        }
        Some(Sum::Approve(a)) => {
            current_validator(kv, o)?;
            let mut p = st::proposal(kv, a.proposal)?
                .ok_or_else(|| reject(Code::BadProposal, format!("no proposal {}", a.proposal)))?;
            if st::proposal_status(&p)? != ProposalStatus::Open {
                return Err(reject(
                    Code::BadProposal,
                    format!("proposal {} is not open (status {})", p.id, p.status),
                ));
            }
            if p.approvals.iter().any(|x| x.as_slice() == o.address) {
                return Err(reject(Code::DkgDuplicate, "already approved"));
            }
            p.approvals.push(o.address.to_vec());
            Ok(ValidatorPlan::Approve(Box::new(p)))
        }
        None => Err(reject(
            Code::MalformedTx,
            "validator message has no payload",
        )),
    }
}

fn phase(why: String) -> ExecError {
    reject(Code::DkgPhase, why)
}

/// The running ceremony, which must be of `round`.
fn running(kv: &impl KvRead, round: u64) -> Result<Ceremony, ExecError> {
    let c = st::ceremony(kv)?.ok_or_else(|| phase("no DKG ceremony is running".into()))?;
    if c.round != round {
        return Err(phase(format!(
            "round {round} is not the running round {}",
            c.round
        )));
    }
    Ok(c)
}

fn dealer_pos(c: &Ceremony, o: &Opened) -> Result<u32, ExecError> {
    c.dealers
        .iter()
        .position(|d| d.address.as_slice() == o.address)
        .map(|i| i as u32 + 1)
        .ok_or_else(|| {
            reject(
                Code::NotValidator,
                "the sender is not a dealer of this round",
            )
        })
}

fn player_pos(c: &Ceremony, o: &Opened) -> Result<u32, ExecError> {
    c.players
        .iter()
        .position(|p| p.address.as_slice() == o.address)
        .map(|i| i as u32 + 1)
        .ok_or_else(|| {
            reject(
                Code::NotValidator,
                "the sender is not a player of this round",
            )
        })
}

fn plan_key(
    kv: &impl KvRead,
    chain: &str,
    height: u64,
    o: &Opened,
    k: DkgKey,
) -> Result<ValidatorPlan, ExecError> {
    let c = running(kv, k.round)?;
    if height >= c.keys_end {
        return Err(phase(format!(
            "ceremony keys of round {} ended at height {}",
            c.round, c.keys_end
        )));
    }
    let p = player_pos(&c, o)?;
    if st::ceremony_key(kv, c.round, p)?.is_some() {
        return Err(reject(
            Code::DkgDuplicate,
            format!(
                "player {p} already registered its key for round {}",
                c.round
            ),
        ));
    }
    let bad = |why: String| reject(Code::BadDealing, why);
    let key = parse_public_key(&k.enc_key).map_err(|e| bad(format!("ceremony key: {e}")))?;
    // The pairing last, after every cheap check.
    if !verify_pop(&key, &key_context(chain, c.round, &o.address), &k.pop) {
        return Err(bad(
            "the ceremony key's proof of possession does not verify".into(),
        ));
    }
    Ok(ValidatorPlan::Key(c.round, p, k.enc_key))
}

fn plan_dealing(
    kv: &impl KvRead,
    height: u64,
    o: &Opened,
    d: Dealing,
    memo: &dyn VerifiedSignatures,
) -> Result<ValidatorPlan, ExecError> {
    let c = running(kv, d.round)?;
    if height < c.keys_end || height >= c.deal_end {
        return Err(phase(format!(
            "dealings of round {} are taken at heights {}..{}",
            c.round, c.keys_end, c.deal_end
        )));
    }
    let pos = dealer_pos(&c, o)?;
    if st::dealing(kv, c.round, pos)?.is_some() {
        return Err(reject(
            Code::DkgDuplicate,
            "this dealer already dealt in this round",
        ));
    }
    let bad = |why: String| reject(Code::BadDealing, why);
    if d.commitment.len() != c.threshold as usize {
        return Err(bad(format!(
            "commitment has {} points, the threshold is {}",
            d.commitment.len(),
            c.threshold
        )));
    }
    if d.shares.len() != c.players.len() {
        return Err(bad(format!(
            "{} encrypted shares for {} players",
            d.shares.len(),
            c.players.len()
        )));
    }
    for (k, p) in d.commitment.iter().enumerate() {
        parse_public_key_with(p, memo).map_err(|e| bad(format!("commitment point {k}: {e}")))?;
    }
    for (i, s) in d.shares.iter().enumerate() {
        let j = i as u32 + 1;
        if st::ceremony_key(kv, c.round, j)?.is_none() {
            if !s.ephemeral.is_empty() || !s.ciphertext.is_empty() {
                return Err(bad(format!(
                    "share {j}: player {j} registered no key, its share must be empty"
                )));
            }
            continue;
        }
        parse_public_key_with(&s.ephemeral, memo)
            .map_err(|e| bad(format!("share {j}: ephemeral key: {e}")))?;
        if s.ciphertext.len() != 32 {
            return Err(bad(format!("share {j}: ciphertext is not 32 bytes")));
        }
    }
    Ok(ValidatorPlan::Dealing(pos, d))
}

fn plan_reveal(
    kv: &impl KvRead,
    height: u64,
    o: &Opened,
    r: DkgReveal,
    memo: &dyn VerifiedSignatures,
) -> Result<ValidatorPlan, ExecError> {
    let c = running(kv, r.round)?;
    if height < c.ack_end || height >= c.end {
        return Err(phase(format!(
            "reveals of round {} are taken at heights {}..{}",
            c.round, c.ack_end, c.end
        )));
    }
    let d = dealer_pos(&c, o)?;
    let dealing = st::dealing(kv, c.round, d)?
        .ok_or_else(|| phase("the sender has no dealing in this round".into()))?;
    let commitment = st::commitment_with(&dealing, memo)?;
    if r.shares.is_empty() || r.shares.len() > c.players.len() {
        return Err(reject(
            Code::BadDealing,
            "a reveal carries 1..=players shares",
        ));
    }
    let mut out: Vec<(u32, Vec<u8>)> = Vec::with_capacity(r.shares.len());
    for s in &r.shares {
        let p = s.player;
        if p == 0 || p as usize > c.players.len() || out.iter().any(|(q, _)| *q == p) {
            return Err(reject(
                Code::BadDealing,
                format!("player {p} is out of range or repeated"),
            ));
        }
        if st::has_ack(kv, c.round, d, p)? {
            return Err(reject(
                Code::BadDealing,
                format!("player {p} acked; its share stays secret"),
            ));
        }
        if st::ceremony_key(kv, c.round, p)?.is_none() {
            return Err(reject(
                Code::BadDealing,
                format!("player {p} registered no key; its share stays unknown"),
            ));
        }
        if st::reveal(kv, c.round, d, p)?.is_some() {
            return Err(reject(
                Code::DkgDuplicate,
                format!("share of player {p} already revealed"),
            ));
        }
        let v = scalar_from_bytes(&s.share).ok_or_else(|| {
            reject(
                Code::BadDealing,
                format!("share of player {p} is not a scalar"),
            )
        })?;
        if !verify_share(&commitment, p, &v) {
            return Err(reject(
                Code::BadDealing,
                format!("revealed share of player {p} does not match the commitment"),
            ));
        }
        out.push((p, s.share.clone()));
    }
    Ok(ValidatorPlan::Reveal(c.round, d, out))
}

//! Validator transactions, planned against state then applied: dealings,
//! acks and reveals of the running ceremony, and validator-set proposals
//! and approvals. A plan reads only; `apply` writes what the plan checked.
//!
//! Who may send what:
//! - a dealing: a dealer of the running round, before `deal_end`, once;
//! - an ack: a player of the round, for a dealing on chain, before
//!   `ack_end`, once per dealing;
//! - a reveal: the dealing's dealer, from `ack_end` until `end`, only for
//!   players that did not ack, each share checked against the commitment;
//! - a proposal or approval: a current validator (voting power > 0).
//!
//! The height a message is checked at is the last block begun: in
//! FinalizeBlock the block itself, in CheckTx the last committed block (a
//! message accepted there may still miss its window and be refused when
//! it lands).

use blst::min_pk::PublicKey;
use ed25519_dalek::VerifyingKey;
use tally_store::{Kv, KvRead};

use super::crypto::{scalar_from_bytes, verify_pop, verify_share};
use super::msg::{pop_context, Opened};
use super::state::{self as st, MAX_VALIDATORS, STATUS_ACCEPTED, STATUS_OPEN};
use crate::bls::parse_public_key;
use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::proto::{validator_msg::Sum, Ceremony, Dealing, DkgReveal, Proposal, ValidatorProposal};
use crate::state::chain::chain_id;
use crate::state::sync::threshold_key;
use crate::types::{Event, TxResult};

/// Open proposals one validator may have at once.
pub const MAX_OPEN_PER_PROPOSER: usize = 4;
/// Open proposals in all.
pub const MAX_OPEN: usize = 32;
/// Proposal actions.
pub const ADD: u32 = 1;
/// Remove a validator.
pub const REMOVE: u32 = 2;
/// Change a validator's power and/or encryption key (and reshare).
pub const UPDATE: u32 = 3;

/// A checked validator transaction.
#[derive(Debug)]
pub enum ValidatorPlan {
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
                accept_if_enough(kv, &mut p)?;
                st::put_proposal(kv, &p);
                let ev = proposal_event(&p);
                let mut r = TxResult::ok(format!("proposal {} opened", p.id), vec![ev]);
                r.data = p.id.to_be_bytes().to_vec();
                r
            }
            ValidatorPlan::Approve(mut p) => {
                accept_if_enough(kv, &mut p)?;
                st::put_proposal(kv, &p);
                let ev = proposal_event(&p);
                TxResult::ok(format!("proposal {} approved", p.id), vec![ev])
            }
        })
    }
}

fn proposal_event(p: &Proposal) -> Event {
    Event::new(
        "validator_proposal",
        [
            ("id", p.id.to_string()),
            ("status", p.status.to_string()),
            ("approvals", p.approvals.len().to_string()),
        ],
    )
}

/// Marks `p` accepted when its approvers hold more than 2/3 of the
/// current voting power.
fn accept_if_enough(kv: &impl KvRead, p: &mut Proposal) -> Result<(), ExecError> {
    let vals = st::validators(kv)?;
    let total: u128 = vals.iter().map(|(_, v)| u128::from(v.power)).sum();
    let approved: u128 = vals
        .iter()
        .filter(|(a, _)| p.approvals.iter().any(|x| x.as_slice() == a.as_slice()))
        .map(|(_, v)| u128::from(v.power))
        .sum();
    if p.status == STATUS_OPEN && total > 0 && approved * 3 > total * 2 {
        p.status = STATUS_ACCEPTED;
    }
    Ok(())
}

/// Plans an opened validator transaction ([`super::msg::open`]) at the
/// last block begun.
pub fn plan_validator_tx(kv: &impl KvRead, o: &Opened) -> Result<ValidatorPlan, ExecError> {
    let chain = chain_id(kv)?;
    let height = st::last_height(kv)?;
    match o.msg.sum.clone() {
        Some(Sum::Dealing(d)) => plan_dealing(kv, height, o, d),
        Some(Sum::Ack(a)) => {
            let c = running(kv, a.round)?;
            if height >= c.ack_end {
                return Err(phase(format!(
                    "acks of round {} ended at height {}",
                    c.round, c.ack_end
                )));
            }
            let p = player_pos(&c, o)?;
            if a.dealers.is_empty() || !a.dealers.windows(2).all(|w| w[0] < w[1]) {
                return Err(reject(
                    Code::MalformedTx,
                    "an ack lists 1 or more dealers, ascending, each once",
                ));
            }
            for &d in &a.dealers {
                if d == 0 || st::dealing(kv, c.round, d)?.is_none() {
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
        Some(Sum::Reveal(r)) => plan_reveal(kv, height, o, r),
        Some(Sum::Propose(p)) => plan_proposal(kv, &chain, height, o, p),
        Some(Sum::Approve(a)) => {
            current_validator(kv, o)?;
            let mut p = st::proposal(kv, a.proposal)?
                .ok_or_else(|| reject(Code::NotFound, format!("no proposal {}", a.proposal)))?;
            if p.status != STATUS_OPEN {
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

fn current_validator(kv: &impl KvRead, o: &Opened) -> Result<(), ExecError> {
    match st::validator(kv, &o.address)? {
        Some(v) if v.power > 0 => Ok(()),
        _ => Err(reject(
            Code::NotValidator,
            "the sender is not a current validator",
        )),
    }
}

fn plan_dealing(
    kv: &impl KvRead,
    height: u64,
    o: &Opened,
    d: Dealing,
) -> Result<ValidatorPlan, ExecError> {
    let c = running(kv, d.round)?;
    if height >= c.deal_end {
        return Err(phase(format!(
            "dealings of round {} ended at height {}",
            c.round, c.deal_end
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
    let mut first: Option<PublicKey> = None;
    for (k, p) in d.commitment.iter().enumerate() {
        let pk = parse_public_key(p).map_err(|e| bad(format!("commitment point {k}: {e}")))?;
        first.get_or_insert(pk);
    }
    for (j, s) in d.shares.iter().enumerate() {
        parse_public_key(&s.ephemeral)
            .map_err(|e| bad(format!("share {}: ephemeral key: {e}", j + 1)))?;
        if s.ciphertext.len() != 32 {
            return Err(bad(format!("share {}: ciphertext is not 32 bytes", j + 1)));
        }
    }
    if c.kind == super::RESHARE {
        // A reshare deals the dealer's current share: the commitment's
        // constant term must be its public share in the current key.
        let key = threshold_key(kv)?.ok_or_else(|| phase("no key to reshare".into()))?;
        let idx = c.dealers[pos as usize - 1].share_index;
        let want = key.shares.share(idx).map(|p| p.compress());
        if first.map(|f| f.compress()) != want {
            return Err(bad(format!(
                "commitment does not start with the dealer's public share {idx}"
            )));
        }
    }
    Ok(ValidatorPlan::Dealing(pos, d))
}

fn plan_reveal(
    kv: &impl KvRead,
    height: u64,
    o: &Opened,
    r: DkgReveal,
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
    let commitment = st::commitment(&dealing)?;
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

fn plan_proposal(
    kv: &impl KvRead,
    chain: &str,
    height: u64,
    o: &Opened,
    p: ValidatorProposal,
) -> Result<ValidatorPlan, ExecError> {
    current_validator(kv, o)?;
    let bad = |why: String| reject(Code::BadProposal, why);
    let key: [u8; 32] = p
        .pubkey
        .as_slice()
        .try_into()
        .map_err(|_| bad("the validator key is not 32 bytes".into()))?;
    VerifyingKey::from_bytes(&key).map_err(|_| bad("not a valid ed25519 key".into()))?;
    let addr = super::msg::address_of(&key);
    let existing = st::validator(kv, &addr)?;
    let vals = st::validators(kv)?;
    let check_enc = |required: bool| -> Result<(), ExecError> {
        if p.enc_key.is_empty() && !required {
            return Ok(());
        }
        let ek = parse_public_key(&p.enc_key).map_err(|e| bad(format!("encryption key: {e}")))?;
        if !verify_pop(&ek, &pop_context(chain, &key), &p.enc_pop) {
            return Err(bad(
                "the encryption key's proof of possession does not verify".into(),
            ));
        }
        Ok(())
    };
    match p.action {
        ADD => {
            if existing.is_some() {
                return Err(bad("already a validator".into()));
            }
            if vals.len() >= MAX_VALIDATORS {
                return Err(bad(format!(
                    "the set already has {MAX_VALIDATORS} validators"
                )));
            }
            if p.power == 0 {
                return Err(bad("power must be above 0".into()));
            }
            check_enc(true)?;
        }
        REMOVE => {
            if existing.is_none() {
                return Err(bad("not a validator".into()));
            }
            if vals.len() <= 1 {
                return Err(bad("the last validator cannot be removed".into()));
            }
            if p.power != 0 || !p.enc_key.is_empty() || !p.enc_pop.is_empty() {
                return Err(bad("a removal carries no power or key".into()));
            }
        }
        UPDATE => {
            if existing.is_none() {
                return Err(bad("not a validator".into()));
            }
            if p.power == 0 {
                return Err(bad("power must be above 0 (remove instead)".into()));
            }
            check_enc(false)?;
        }
        other => return Err(bad(format!("unknown action {other}"))),
    }
    if p.power > (i64::MAX as u64) / 8 {
        return Err(bad("power is too large".into()));
    }
    let open = st::open_proposals(kv)?;
    if open.len() >= MAX_OPEN {
        return Err(bad(format!("{MAX_OPEN} proposals are open already")));
    }
    if open
        .iter()
        .filter(|q| q.proposer.as_slice() == o.address)
        .count()
        >= MAX_OPEN_PER_PROPOSER
    {
        return Err(bad(format!(
            "the sender has {MAX_OPEN_PER_PROPOSER} proposals open already"
        )));
    }
    if open.iter().any(|q| {
        q.action == p.action && q.pubkey == p.pubkey && q.power == p.power && q.enc_key == p.enc_key
    }) {
        return Err(reject(
            Code::DkgDuplicate,
            "the same proposal is already open",
        ));
    }
    Ok(ValidatorPlan::Propose(Box::new(Proposal {
        id: 0,
        action: p.action,
        pubkey: p.pubkey,
        power: p.power,
        enc_key: p.enc_key,
        proposer: o.address.to_vec(),
        height,
        status: STATUS_OPEN,
        approvals: vec![o.address.to_vec()],
        reason: String::new(),
        applied_height: 0,
    })))
}

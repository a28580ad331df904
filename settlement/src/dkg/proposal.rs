//! Validator-set proposals: who may propose what ([`plan_proposal`]), the
//! limits on open proposals, and acceptance once approvers hold more than
//! 2/3 of the current voting power ([`accept_if_enough`]). The
//! transactions that carry them are planned and applied in
//! [`super::tx`]; accepted proposals are carried out (re-keyed, or
//! applied at once without a key) by [`super::ceremony`].
//!
//! Actions: `add` and `remove` name a validator (`pubkey`; an addition
//! carries the common `power`); `rekey` and `recover` name none and make a
//! fresh key for the same set (ADR 0018); `upgrade` and `cancel_upgrade`
//! carry an upgrade plan, `params` a parameter change and `gateway` a
//! gateway change; these governance actions are carried out when accepted
//! ([`crate::gov`], ADR 0019 and 0020).

use ed25519_dalek::VerifyingKey;
use tally_store::KvRead;

use super::msg::{address_of, Opened};
use super::rules::check_change;
use super::state::{self as st};
use super::types::{ProposalAction, ProposalStatus};
use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::gov::Payload;
use crate::proto::{Proposal, ValidatorProposal};
use crate::types::Event;

/// Open proposals one validator may have at once.
pub const MAX_OPEN_PER_PROPOSER: usize = 4;
/// Open proposals in all.
pub const MAX_OPEN: usize = 32;
/// How far ahead of the current height a proposal's `valid_until_height`
/// may be.
pub const MAX_VALIDITY_BLOCKS: u64 = 1000;

/// The `validator_proposal` event of a proposal opened or approved.
pub fn proposal_event(p: &Proposal) -> Event {
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
pub fn accept_if_enough(kv: &impl KvRead, p: &mut Proposal) -> Result<(), ExecError> {
    let vals = st::validators(kv)?;
    let total: u128 = vals.iter().map(|(_, v)| u128::from(v.power)).sum();
    let approved: u128 = vals
        .iter()
        .filter(|(a, _)| p.approvals.iter().any(|x| x.as_slice() == a.as_slice()))
        .map(|(_, v)| u128::from(v.power))
        .sum();
    let open = st::proposal_status(p)? == ProposalStatus::Open;
    if open && total > 0 && approved * 3 > total * 2 {
        p.status = ProposalStatus::Accepted.into();
    }
    Ok(())
}

/// Refuses a sender that is not a current validator (voting power > 0).
pub fn current_validator(kv: &impl KvRead, o: &Opened) -> Result<(), ExecError> {
    match st::validator(kv, &o.address)? {
        Some(v) if v.power > 0 => Ok(()),
        _ => Err(reject(
            Code::NotValidator,
            "the sender is not a current validator",
        )),
    }
}

fn bad(why: String) -> ExecError {
    reject(Code::BadProposal, why)
}

/// The proposal `p` of the current validator `o` would open at `height`
/// (id 0: the id is taken when it is applied), if the change fits the
/// current set and the limits on open proposals.
pub fn plan_proposal(
    kv: &impl KvRead,
    height: u64,
    o: &Opened,
    p: ValidatorProposal,
) -> Result<Proposal, ExecError> {
    current_validator(kv, o)?;
    if p.valid_until_height < height {
        return Err(bad(format!(
            "the proposal was valid until height {}, this is {height}",
            p.valid_until_height
        )));
    }
    if p.valid_until_height - height > MAX_VALIDITY_BLOCKS {
        return Err(bad(format!(
            "valid_until_height {} is more than {MAX_VALIDITY_BLOCKS} blocks ahead of {height}",
            p.valid_until_height
        )));
    }
    let action = ProposalAction::try_from(p.action)
        .map_err(|_| bad(format!("unknown action {}", p.action)))?;
    let payload = Payload {
        upgrade: p.upgrade.as_ref(),
        params: p.params.as_ref(),
        gateway: p.gateway.as_ref(),
        slo: p.slo.as_ref(),
    };
    if action.is_governance() {
        if !p.pubkey.is_empty() || p.power != 0 {
            return Err(bad(format!("a {} names no validator", action.name())));
        }
        crate::gov::check(kv, height, action, payload)?.map_err(bad)?;
    } else if let Some(why) = payload.misfit(action) {
        return Err(bad(why));
    }
    let address = if action.has_target() {
        let key: [u8; 32] = p
            .pubkey
            .as_slice()
            .try_into()
            .map_err(|_| bad("the validator key is not 32 bytes".into()))?;
        VerifyingKey::from_bytes(&key).map_err(|_| bad("not a valid ed25519 key".into()))?;
        address_of(&key)
    } else if !p.pubkey.is_empty() {
        return Err(bad(format!("a {} names no validator", action.name())));
    } else {
        [0; 20]
    };
    if action != ProposalAction::Add && p.power != 0 {
        return Err(bad(format!("a {} carries no power", action.name())));
    }
    if !action.is_governance() {
        check_change(&st::validators(kv)?, action, &address, p.power).map_err(bad)?;
    }
    check_open(kv, o, &p)?;
    Ok(Proposal {
        id: 0,
        action: p.action,
        pubkey: p.pubkey,
        power: p.power,
        proposer: o.address.to_vec(),
        height,
        status: ProposalStatus::Open.into(),
        approvals: vec![o.address.to_vec()],
        reason: String::new(),
        applied_height: 0,
        upgrade: p.upgrade,
        params: p.params,
        gateway: p.gateway,
        slo: p.slo,
    })
}

/// The limits on open proposals (in all, per proposer) and no duplicate
/// of an open one.
fn check_open(kv: &impl KvRead, o: &Opened, p: &ValidatorProposal) -> Result<(), ExecError> {
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
        q.action == p.action
            && q.pubkey == p.pubkey
            && q.power == p.power
            && q.upgrade == p.upgrade
            && q.params == p.params
            && q.gateway == p.gateway
    }) {
        return Err(reject(
            Code::DkgDuplicate,
            "the same proposal is already open",
        ));
    }
    Ok(())
}

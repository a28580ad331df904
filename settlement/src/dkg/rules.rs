//! The validator-set rules every change must keep, checked when a
//! proposal is opened **and again when it runs** (ADR 0017).
//!
//! A proposal is checked against the set of the block that opens it, but
//! it runs later: after more approvals, after another change ran, after a
//! reshare. Between the two the set may have moved, so an accepted
//! proposal could otherwise ask CometBFT for something it refuses (remove
//! a validator that already left, an empty set, a total power above its
//! cap), and CometBFT stops every node at that height for good. So:
//!
//! - [`check_change`] is the app's own rule for one proposal against the
//!   current set: the target's membership fits the action, the next set is
//!   not empty and has at most [`MAX_VALIDATORS`] members, and **every
//!   validator has the same power** (see below), at most [`MAX_POWER`].
//!   It runs when a proposal is planned and when it is started, and the
//!   proposal is refused with the reason if it no longer holds.
//! - [`check_updates`] is CometBFT 0.38's own check of `validator_updates`
//!   (`ValidatorSet.UpdateWithChangeSet`: no duplicate, no negative power,
//!   no power above [`MAX_TOTAL_VOTING_POWER`], no removal of a
//!   non-member, not empty, total at most the cap), run on every update
//!   list right before FinalizeBlock can return it. A list it refuses is
//!   never returned: the proposal is refused instead.
//!
//! **Equal powers.** Threshold shares count heads while consensus counts
//! power; with unequal powers a threshold of shares is not a threshold of
//! power. Tally has no stake, so the chain keeps every validator at one
//! common power (genesis sets it; an addition carries it; nothing else
//! changes a power) and then `t = n − ⌊(n − 1)/3⌋` shares are
//! exactly "more than 2/3 of the power". ADR 0017 has the arithmetic.

use tally_store::Kv;

use super::msg::address_of;
use super::state::{self as st, MAX_VALIDATORS};
use super::types::{ProposalAction, ProposalStatus};
use crate::error::Fatal;
use crate::proto::{Proposal, ValidatorRecord};
use crate::types::Event;

/// CometBFT's `MaxTotalVotingPower` (`i64::MAX / 8`).
pub const MAX_TOTAL_VOTING_POWER: u64 = (i64::MAX as u64) / 8;

/// The largest power a validator may have: a full set of
/// [`MAX_VALIDATORS`] at this power stays within CometBFT's cap.
pub const MAX_POWER: u64 = MAX_TOTAL_VOTING_POWER / MAX_VALIDATORS as u64;

/// The power every validator of `set` has, `None` for an empty set or one
/// whose powers differ.
pub fn common_power(set: &[([u8; 20], ValidatorRecord)]) -> Option<u64> {
    let first = set.first()?.1.power;
    set.iter().all(|(_, v)| v.power == first).then_some(first)
}

/// Whether a change of `action` to the validator at `address` with
/// `power` fits the current `set` (ascending by address, powers > 0).
/// A re-key or recovery names no validator (`address` and `power` are not
/// read) and fits any set that is not empty.
pub fn check_change(
    set: &[([u8; 20], ValidatorRecord)],
    action: ProposalAction,
    address: &[u8; 20],
    power: u64,
) -> Result<(), String> {
    let member = set.iter().any(|(a, _)| a == address);
    let hex = || hex::encode(address);
    let size_after = match action {
        ProposalAction::Add if member => return Err(format!("{} is already a validator", hex())),
        ProposalAction::Add => set.len() + 1,
        ProposalAction::Remove if !member => return Err(format!("{} is not a validator", hex())),
        ProposalAction::Remove => set.len() - 1,
        ProposalAction::Rekey | ProposalAction::Recover if set.is_empty() => {
            return Err("there is no validator set to re-key".into())
        }
        ProposalAction::Rekey | ProposalAction::Recover => return Ok(()),
        ProposalAction::Upgrade
        | ProposalAction::CancelUpgrade
        | ProposalAction::Params
        | ProposalAction::Gateway
        | ProposalAction::Slo => return Err(format!("a {} changes no validator", action.name())),
    };
    if size_after == 0 {
        return Err("the last validator cannot be removed".into());
    }
    if size_after > MAX_VALIDATORS {
        return Err(format!(
            "the set would have {size_after} validators, at most {MAX_VALIDATORS}"
        ));
    }
    if action == ProposalAction::Remove {
        return Ok(());
    }
    if power == 0 || power > MAX_POWER {
        return Err(format!("power must be 1..={MAX_POWER}, not {power}"));
    }
    let others: Vec<_> = set.iter().filter(|(a, _)| a != address).cloned().collect();
    match common_power(&others) {
        Some(p) if p != power => Err(format!(
            "every validator has power {p}: a change to {power} would make powers unequal"
        )),
        _ => Ok(()),
    }
}

/// CometBFT 0.38's check of the `validator_updates` a block returns,
/// against the set they apply to (`set`: address and power of every
/// current member). `Err` names the rule CometBFT would stop on.
pub fn check_updates(set: &[([u8; 20], u64)], updates: &[([u8; 20], u64)]) -> Result<(), String> {
    let mut seen: Vec<&[u8; 20]> = Vec::with_capacity(updates.len());
    for (a, power) in updates {
        if seen.contains(&a) {
            return Err(format!("duplicate update for {}", hex::encode(a)));
        }
        seen.push(a);
        if *power > MAX_TOTAL_VOTING_POWER {
            return Err(format!(
                "power {power} of {} is above CometBFT's maximum {MAX_TOTAL_VOTING_POWER}",
                hex::encode(a)
            ));
        }
    }
    let mut after: Vec<([u8; 20], u64)> = set.to_vec();
    for (a, power) in updates {
        let at = after.iter().position(|(x, _)| x == a);
        match (at, *power) {
            (None, 0) => return Err(format!("cannot remove {}: not a validator", hex::encode(a))),
            (Some(i), 0) => {
                after.remove(i);
            }
            (Some(i), p) => after[i].1 = p,
            (None, p) => after.push((*a, p)),
        }
    }
    if after.is_empty() {
        return Err("the validator set would be empty".into());
    }
    let total: u128 = after.iter().map(|(_, p)| u128::from(*p)).sum();
    if total > u128::from(MAX_TOTAL_VOTING_POWER) {
        return Err(format!(
            "total power {total} would be above CometBFT's maximum {MAX_TOTAL_VOTING_POWER}"
        ));
    }
    Ok(())
}

/// The validator update `p` makes: none for a re-key or recovery.
pub fn update_of(p: &Proposal) -> Result<Option<ValidatorRecord>, Fatal> {
    let power = match st::proposal_action(p)? {
        ProposalAction::Add => p.power,
        ProposalAction::Remove => 0,
        ProposalAction::Rekey
        | ProposalAction::Recover
        | ProposalAction::Upgrade
        | ProposalAction::CancelUpgrade
        | ProposalAction::Params
        | ProposalAction::Gateway
        | ProposalAction::Slo => return Ok(None),
    };
    Ok(Some(ValidatorRecord {
        pubkey: p.pubkey.clone(),
        power,
    }))
}

/// Closes accepted proposal `p` as refused with `why` (it no longer fits
/// the set it would run on).
pub fn refuse(kv: &mut impl Kv, p: &mut Proposal, why: String) -> Result<Option<Event>, Fatal> {
    p.status = ProposalStatus::Refused.into();
    p.reason = why;
    st::put_proposal(kv, p);
    Ok(Some(proposal_closed(p)))
}

/// CometBFT's check of `update` (none: nothing to check) against `set`,
/// the set it applies to (the stored set: changes reach it only through
/// this module, one at a time, so it is CometBFT's next set whenever an
/// update is made).
pub fn check_update(
    set: &[([u8; 20], ValidatorRecord)],
    update: Option<&ValidatorRecord>,
) -> Result<(), String> {
    let Some(update) = update else {
        return Ok(());
    };
    let powers: Vec<([u8; 20], u64)> = set.iter().map(|(a, v)| (*a, v.power)).collect();
    check_updates(&powers, &[(address_of(&update.pubkey), update.power)])
}

/// The `validator_proposal` event of a proposal that closed.
pub fn proposal_closed(p: &Proposal) -> Event {
    Event::new(
        "validator_proposal",
        [
            ("id", p.id.to_string()),
            ("status", p.status.to_string()),
            ("reason", p.reason.clone()),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(power: u64) -> ValidatorRecord {
        ValidatorRecord {
            pubkey: vec![0; 32],
            power,
        }
    }

    fn set(n: u8, power: u64) -> Vec<([u8; 20], ValidatorRecord)> {
        (1..=n).map(|i| ([i; 20], rec(power))).collect()
    }

    #[test]
    fn membership_must_fit_the_action() {
        let s = set(4, 10);
        assert!(check_change(&s, ProposalAction::Remove, &[9; 20], 0).is_err());
        assert!(check_change(&s, ProposalAction::Add, &[1; 20], 10).is_err());
        assert!(check_change(&s, ProposalAction::Add, &[9; 20], 10).is_ok());
        assert!(check_change(&s, ProposalAction::Remove, &[4; 20], 0).is_ok());
        for whole in [ProposalAction::Rekey, ProposalAction::Recover] {
            assert!(check_change(&s, whole, &[0; 20], 0).is_ok());
            assert!(check_change(&[], whole, &[0; 20], 0).is_err());
        }
    }

    #[test]
    fn powers_stay_equal_and_capped() {
        let s = set(4, 10);
        assert!(check_change(&s, ProposalAction::Add, &[9; 20], 11).is_err());
        assert!(check_change(&s, ProposalAction::Add, &[9; 20], 0).is_err());
        let one = set(1, MAX_POWER);
        assert!(check_change(&one, ProposalAction::Add, &[9; 20], MAX_POWER).is_ok());
        assert!(check_change(&one, ProposalAction::Add, &[9; 20], MAX_POWER + 1).is_err());
        assert!(check_change(&one, ProposalAction::Remove, &[1; 20], 0).is_err());
    }

    #[test]
    fn the_set_size_is_capped() {
        let full: Vec<_> = (0..MAX_VALIDATORS)
            .map(|i| {
                let mut a = [0u8; 20];
                a[..8].copy_from_slice(&(i as u64).to_be_bytes());
                (a, rec(1))
            })
            .collect();
        assert!(check_change(&full, ProposalAction::Add, &[0xff; 20], 1).is_err());
        assert!(check_change(&full[1..], ProposalAction::Add, &[0xff; 20], 1).is_ok());
    }

    // The figures below are CometBFT's, computed by hand from
    // `types/validator_set.go` (v0.38): MaxTotalVotingPower is
    // 9223372036854775807 / 8 = 1152921504606846975.
    #[test]
    fn cometbft_rules_on_update_lists() {
        assert_eq!(MAX_TOTAL_VOTING_POWER, 1_152_921_504_606_846_975);
        let s: Vec<([u8; 20], u64)> = (1..=4u8).map(|i| ([i; 20], 10)).collect();
        assert!(
            check_updates(&s, &[([9; 20], 0)]).is_err(),
            "removal of a non-member"
        );
        assert!(
            check_updates(&s, &[([4; 20], 0), ([4; 20], 0)]).is_err(),
            "duplicate"
        );
        let all: Vec<_> = s.iter().map(|(a, _)| (*a, 0)).collect();
        assert!(check_updates(&s, &all).is_err(), "empty set");
        assert!(
            check_updates(&s, &[([1; 20], 1_152_921_504_606_846_975)]).is_err(),
            "the issue's reproduction: 3 x 10 + the maximum"
        );
        assert!(check_updates(&s, &[([1; 20], 1_152_921_504_606_846_975 - 30)]).is_ok());
        assert!(check_updates(&s, &[([9; 20], 1_152_921_504_606_846_976)]).is_err());
        assert!(check_updates(&s, &[([4; 20], 0), ([9; 20], 10)]).is_ok());
        assert!(check_updates(&s, &[]).is_ok());
    }
}

//! Validator-set changes that would stop CometBFT for good (issue 26),
//! through the in-process driver. The driver checks every
//! `validator_updates` list against its own model of CometBFT 0.38's rules
//! (`tally_tests::driver::CometSet`, written from CometBFT's Go source, not
//! from the app's rules): a list CometBFT refuses fails the test at that
//! height, as it would stop every real node. Each test here reached such a
//! list before accepted proposals were checked again when they run.

use anyhow::{ensure, Context, Result};
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::Code;
use tally_tests::dkgnet::DkgNet;

fn form(n: usize) -> Result<DkgNet> {
    let mut net = DkgNet::new(n, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    Ok(net)
}

/// Approves `id` from `voters` (skipping refusals by non-members) until it
/// is no longer open.
fn approve_all(net: &mut DkgNet, id: u64, voters: &[usize]) -> Result<()> {
    for &v in voters {
        if net.status(id)? != ProposalStatus::Open {
            break;
        }
        let code = net.approve(v, id)?;
        ensure!(
            matches!(code, Code::Ok | Code::DkgDuplicate),
            "approval by {v}: {code:?}"
        );
    }
    ensure!(
        net.status(id)? == ProposalStatus::Accepted,
        "proposal {id} not accepted"
    );
    Ok(())
}

#[test]
fn a_second_removal_opened_before_the_first_activates_is_refused() -> Result<()> {
    let mut net = form(5)?;
    let (code, first) = net.propose(0, ProposalAction::Remove, 4, 0)?;
    ensure!(code == Code::Ok, "{code:?}");
    approve_all(&mut net, first, &[1, 2, 3])?;
    net.until(40, |s| Ok(s.status(first)? == ProposalStatus::Applied))?;
    // Applied at h; CometBFT (and the app) drop node 4 at h + 2. A
    // removal opened now still finds it in the set.
    let (code, second) = net.propose(0, ProposalAction::Remove, 4, 0)?;
    ensure!(code == Code::Ok, "the window closed early: {code:?}");
    approve_all(&mut net, second, &[1, 2, 3])?;
    net.until(10, |s| Ok(s.status(second)? != ProposalStatus::Accepted))
        .context("the second removal never ran")?;
    ensure!(net.status(second)? == ProposalStatus::Refused);
    let members: Vec<usize> = (0..5).filter(|&i| net.net.nodes[i].member).collect();
    ensure!(members == vec![0, 1, 2, 3], "members {members:?}");
    // The chain goes on.
    let before = net.settled();
    net.until(60, |s| Ok(s.settled() > before))?;
    Ok(())
}

/// With a key, the second removal's reshare could never finalise (no
/// players) and failed three rounds before it was refused; the halt this
/// guards is on the no-key path (`settlement/tests/dkg_recheck.rs`). Here:
/// it is refused at once and the last validator stays.
#[test]
fn two_removals_accepted_together_never_empty_the_set() -> Result<()> {
    let mut net = form(2)?;
    let (code, a) = net.propose(0, ProposalAction::Remove, 1, 0)?;
    ensure!(code == Code::Ok, "{code:?}");
    let (code, b) = net.propose(1, ProposalAction::Remove, 0, 0)?;
    ensure!(code == Code::Ok, "{code:?}");
    approve_all(&mut net, a, &[1])?;
    approve_all(&mut net, b, &[0])?;
    net.until(60, |s| Ok(s.status(b)? != ProposalStatus::Accepted))?;
    ensure!(
        net.status(a)? == ProposalStatus::Applied,
        "the first removal did not run"
    );
    ensure!(
        net.status(b)? == ProposalStatus::Refused,
        "the second removal ran"
    );
    ensure!(net.net.nodes[0].member, "the last validator left");
    let p = tally_settlement::dkg::state::proposal(net.net.nodes[0].app.committed_state(), b)?
        .context("proposal")?;
    ensure!(
        p.reason.contains("last validator"),
        "refused for {:?}",
        p.reason
    );
    Ok(())
}

#[test]
fn the_largest_power_a_proposal_could_carry_is_refused() -> Result<()> {
    // The reproduction (`--update --power 1152921504606846975` on
    // a set of 4 x 10); updates are gone (ADR 0018), so the same power on
    // an addition.
    let mut net = form(4)?;
    let newcomer = net.net.add_node()?;
    let (code, _) = net.propose(0, ProposalAction::Add, newcomer, 1_152_921_504_606_846_975)?;
    ensure!(code == Code::BadProposal, "{code:?}");
    net.until(5, |_| Ok(false)).err();
    ensure!(net.net.nodes[..4].iter().all(|n| n.member));
    ensure!(!net.net.nodes[newcomer].member, "the newcomer joined");
    Ok(())
}

/// Drops every DKG message: a validator that votes but never deals.
fn silent(
    _: tally_settlement::proto::ValidatorMsg,
) -> Option<tally_settlement::proto::ValidatorMsg> {
    None
}

/// A first key that cannot form (two of four validators never deal: two
/// dealers, threshold 3) used to restart forever and keep every accepted
/// proposal waiting. Now the failed round yields: removals of the two
/// silent validators apply, and the key forms with the two that deal.
#[test]
fn a_first_key_that_keeps_failing_yields_to_removals_of_the_silent() -> Result<()> {
    let mut net = DkgNet::new(4, 3)?;
    net.net.nodes[2].dkg_filter = Some(silent);
    net.net.nodes[3].dkg_filter = Some(silent);
    net.until(25, |_| Ok(false)).err();
    ensure!(net.key(0)?.is_none(), "a key formed with two dealers");
    for gone in [3, 2] {
        let (code, id) = net.propose(0, ProposalAction::Remove, gone, 0)?;
        ensure!(code == Code::Ok, "{code:?}");
        let voters: Vec<usize> = (0..4)
            .filter(|&v| v != 0 && net.net.nodes[v].member)
            .collect();
        approve_all(&mut net, id, &voters)?;
        net.until(20, |s| Ok(s.status(id)? == ProposalStatus::Applied))
            .with_context(|| format!("the removal of node {gone} never ran"))?;
    }
    net.until(30, |s| Ok(s.key(0)?.is_some()))
        .context("no key with the two validators that deal")?;
    let key = net.key(0)?.context("key")?;
    ensure!(
        key.signers.len() == 2 && key.shares.threshold == 2,
        "{:?}",
        key.signers
    );
    Ok(())
}

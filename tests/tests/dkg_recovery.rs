//! The governed re-key path (ADR 0018), through the in-process driver:
//! two of four validators lose their disks (shares and round keys), so
//! fewer than `t = 3` signers of the key remain. No batch can be signed,
//! and no ordinary re-key can hand the hub a new key (its rotation needs
//! the old key's signature). A `recover` proposal, approved by more than
//! 2/3 of the power, makes a fresh key for the same set that activates
//! without that signature; the rotation it leaves is marked governed, and
//! the hub takes it only from its governors. Then batches settle again,
//! under the new key only.

use anyhow::{ensure, Context, Result};
use tally_settlement::dkg::state as dst;
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::Code;
use tally_tests::dkgnet::DkgNet;
use tally_tests::driver::enc_key;

fn approve_all(net: &mut DkgNet, id: u64, voters: &[usize]) -> Result<()> {
    for &v in voters {
        if net.status(id)? != ProposalStatus::Open {
            break;
        }
        ensure!(net.approve(v, id)? == Code::Ok, "approval by {v}");
    }
    ensure!(
        net.status(id)? == ProposalStatus::Accepted,
        "{id} not accepted"
    );
    Ok(())
}

/// Node `i` loses its disk: its shares and round keys are gone; it comes
/// back with fresh randomness (a new seed for its round keys).
fn lose_disk(net: &mut DkgNet, i: usize) {
    let node = &mut net.net.nodes[i];
    node.app.retire_signers_below(u64::MAX);
    node.epoch_shares.clear();
    node.enc = Some(enc_key(100 + i));
}

#[test]
fn a_recovery_replaces_a_key_too_few_signers_hold_and_the_governors_hand_it_over() -> Result<()> {
    let mut net = DkgNet::new(4, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    let old_group = net.pin_hub()?;
    net.until(60, |s| Ok(s.settled() >= 1))?;
    lose_disk(&mut net, 1);
    lose_disk(&mut net, 2);

    // Two signers of three needed: nothing settles any more.
    let stuck = net.settled();
    net.until(40, |_| Ok(false)).err();
    ensure!(net.settled() == stuck, "a batch settled with two signers");

    // An ordinary re-key makes a key, but its rotation is never signed.
    let (code, rekey) = net.propose(0, ProposalAction::Rekey, 0, 0)?;
    ensure!(code == Code::Ok, "{code:?}");
    approve_all(&mut net, rekey, &[1, 2, 3])?;
    net.until(40, |s| {
        Ok(dst::rotation(s.net.nodes[0].app.committed_state(), 1)?.is_some())
    })?;
    net.until(20, |_| Ok(false)).err();
    let kv = net.net.nodes[0].app.committed_state();
    let waiting = dst::rotation(kv, 1)?.context("rotation 1")?;
    ensure!(waiting.signature.is_empty(), "signed by two signers");
    ensure!(net.epoch()? == 1, "the unsigned key activated");

    // The recovery: accepted by 3 of 4, it takes the waiting rotation's
    // place (nonce 1 again), makes a fresh key and activates it unsigned.
    let (code, recover) = net.propose(0, ProposalAction::Recover, 0, 0)?;
    ensure!(code == Code::Ok, "{code:?}");
    approve_all(&mut net, recover, &[1, 2, 3])?;
    // Epoch 2 was the dropped key's: the recovered key is epoch 3.
    net.until(40, |s| Ok(s.epoch()? == 3))?;
    ensure!(
        net.status(rekey)? == ProposalStatus::Refused,
        "the re-key ran"
    );
    ensure!(net.status(recover)? == ProposalStatus::Applied);
    let kv = net.net.nodes[0].app.committed_state();
    let r = dst::rotation(kv, 1)?.context("rotation 1")?;
    ensure!(r.governed && r.signature.is_empty(), "{r:?}");
    ensure!(dst::rotation(kv, 2)?.is_none(), "a second rotation");
    let new_group = net.key(0)?.context("key")?.shares.group.compress().to_vec();
    ensure!(r.group_key == new_group && new_group != old_group);
    // Every validator, the two with new disks too, holds a share again.
    for i in 0..4 {
        ensure!(
            net.net.nodes[i].epoch_shares.iter().any(|(e, _)| *e == 3),
            "node{i} has no share of the recovered key"
        );
    }

    // The hub still holds the old key: the re-signed batch is refused
    // until its governors accept the recovered key; then it settles.
    net.until(15, |_| Ok(false)).err();
    ensure!(net.settled() == stuck, "settled before the governors acted");
    let refused = net.net.hub.as_ref().map_or(0, |h| h.refused);
    ensure!(refused > 0, "no batch under the new key reached the hub");
    let kv = net.net.nodes[0].app.committed_state().clone();
    net.net.hub.as_mut().context("hub")?.govern(&kv, 1)?;
    net.until(60, |s| Ok(s.settled() > stuck))?;
    Ok(())
}

#[test]
fn a_recovery_is_a_proposal_like_any_other() -> Result<()> {
    let mut net = DkgNet::new(4, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    // It names no validator and carries no power; two are not accepted.
    let (code, _) = net.propose(0, ProposalAction::Recover, 0, 10)?;
    ensure!(code == Code::BadProposal, "{code:?}");
    let (code, id) = net.propose(0, ProposalAction::Recover, 0, 0)?;
    ensure!(code == Code::Ok, "{code:?}");
    let (code, _) = net.propose(1, ProposalAction::Recover, 0, 0)?;
    ensure!(code == Code::DkgDuplicate, "{code:?}");
    // 2 of 4 is not more than 2/3: still open.
    ensure!(net.approve(1, id)? == Code::Ok);
    ensure!(net.status(id)? == ProposalStatus::Open);
    Ok(())
}

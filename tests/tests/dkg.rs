//! The on-chain DKG, validator-set proposals and reshares through the
//! in-process driver (keyed validators, CometBFT's call sequence, app
//! hashes checked at every height). Oracles are apart from the DKG code:
//! the group key is rebuilt by adding the qualified dealers' commitments
//! with blst's own aggregation, and every key is checked by signing with
//! the validators' derived shares through the BLS module's Lagrange
//! combination and verifying against the group key.

use anyhow::{ensure, Context, Result};
use blst::min_pk::{AggregatePublicKey, PublicKey};
use tally_settlement::bls::{self, parse_public_key, Kind, Partial};
use tally_settlement::dkg::state as dst;
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::proto::{validator_msg::Sum, ValidatorMsg};
use tally_settlement::Code;
use tally_tests::dkgnet::{DkgNet, CHAIN};

/// Blocks to form a key with phases of 3 blocks (9) and a margin.
const FORM: usize = 14;

fn qualified_of_last(net: &DkgNet) -> Result<Vec<u32>> {
    let c = dst::last_ceremony(net.net.nodes[0].app.committed_state())?.context("no ceremony")?;
    Ok(c.qualified)
}

/// Oracle: the group key of a fresh DKG is the sum of the qualified
/// dealings' constant-term commitments (blst aggregation), and the
/// validators' derived shares sign: any `t` partials combine (BLS module)
/// into a signature the group key verifies.
fn check_fresh_key(net: &DkgNet) -> Result<()> {
    let kv = net.net.nodes[0].app.committed_state();
    let key = net.key(0)?.context("no key")?;
    let c = dst::last_ceremony(kv)?.context("no ceremony")?;
    let mut firsts: Vec<PublicKey> = Vec::new();
    for d in &c.qualified {
        let dealing = dst::dealing(kv, c.round, *d)?.context("dealing")?;
        firsts.push(parse_public_key(&dealing.commitment[0])?);
    }
    let refs: Vec<&PublicKey> = firsts.iter().collect();
    let sum = AggregatePublicKey::aggregate(&refs, false).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    ensure!(
        sum.to_public_key().compress() == key.shares.group.compress(),
        "group key is not the sum of the qualified dealings' constant terms"
    );
    check_signs(net)
}

/// Every member holds its share of the active key, and any `t` of them
/// combine into a signature the group key verifies.
fn check_signs(net: &DkgNet) -> Result<()> {
    let key = net.key(0)?.context("no key")?;
    let epoch = key.record.epoch;
    let msg = bls::message(CHAIN, Kind::Batch, &[9; 32]);
    let mut parts: Vec<Partial> = Vec::new();
    for (i, n) in net.net.nodes.iter().enumerate() {
        if !n.member {
            continue;
        }
        let (_, s) = n
            .epoch_shares
            .iter()
            .find(|(e, _)| *e == epoch)
            .with_context(|| format!("node{i} has no share of epoch {epoch}"))?;
        let p = s.sign(&msg);
        ensure!(
            key.shares.verify_partial(&msg, &p),
            "node{i}'s share does not match its public share"
        );
        parts.push(p);
    }
    let t = key.shares.threshold as usize;
    for w in [0, parts.len() - t] {
        let sig = key.shares.combine(&msg, &parts[w..w + t])?;
        ensure!(
            key.shares.verify_group(&msg, &sig),
            "combined signature does not verify"
        );
    }
    Ok(())
}

fn form(n: usize) -> Result<DkgNet> {
    let mut net = DkgNet::new(n, 3)?;
    let took = net.until(FORM, |s| Ok(s.epoch()? == 1))?;
    ensure!(took <= 11, "the key took {took} blocks");
    Ok(net)
}

#[test]
fn a_clean_dkg_forms_a_key_every_validator_holds() -> Result<()> {
    for n in [4, 7] {
        let mut net = form(n)?;
        ensure!(
            qualified_of_last(&net)?.len() == n,
            "n = {n}: not every dealer qualified"
        );
        let key = net.key(0)?.context("key")?;
        ensure!(
            key.shares.threshold == (n - (n - 1) / 3) as u32,
            "threshold"
        );
        check_fresh_key(&net).with_context(|| format!("n = {n}"))?;
        // Batches sign with the new key and settle on the hub.
        net.pin_hub()?;
        net.until(60, |s| Ok(s.settled() >= 1))?;
    }
    Ok(())
}

/// Flips a byte of the encrypted share for player 2 in a dealing.
fn corrupt_player_2(m: ValidatorMsg) -> Option<ValidatorMsg> {
    let mut m = m;
    if let Some(Sum::Dealing(d)) = m.sum.as_mut() {
        d.shares[1].ciphertext[0] ^= 1;
    }
    Some(m)
}

/// Also never reveals.
fn corrupt_and_hide(m: ValidatorMsg) -> Option<ValidatorMsg> {
    match m.sum {
        Some(Sum::Reveal(_)) => None,
        _ => corrupt_player_2(m),
    }
}

fn dealer_position(net: &DkgNet, node: usize) -> Result<u32> {
    let kv = net.net.nodes[0].app.committed_state();
    let c = dst::last_ceremony(kv)?.context("ceremony")?;
    let a = net.net.addr(node);
    let p = c
        .dealers
        .iter()
        .position(|d| d.address == a.as_ref())
        .context("not a dealer")?;
    Ok(p as u32 + 1)
}

#[test]
fn a_dealer_with_a_bad_share_that_reveals_it_stays_qualified() -> Result<()> {
    for n in [4, 7] {
        let mut net = DkgNet::new(n, 3)?;
        net.net.nodes[0].dkg_filter = Some(corrupt_player_2);
        net.until(FORM, |s| Ok(s.epoch()? == 1))?;
        let d = dealer_position(&net, 0)?;
        let c = dst::last_ceremony(net.net.nodes[0].app.committed_state())?.context("c")?;
        let revealed = dst::reveal(net.net.nodes[0].app.committed_state(), c.round, d, 2)?;
        ensure!(
            revealed.is_some(),
            "n = {n}: the bad share was not revealed"
        );
        ensure!(
            c.qualified.contains(&d),
            "n = {n}: the revealing dealer was dropped"
        );
        ensure!(
            c.qualified.len() == n,
            "n = {n}: {} qualified",
            c.qualified.len()
        );
        check_fresh_key(&net)?;
    }
    Ok(())
}

#[test]
fn a_dealer_that_never_reveals_is_dropped() -> Result<()> {
    for n in [4, 7] {
        let mut net = DkgNet::new(n, 3)?;
        net.net.nodes[0].dkg_filter = Some(corrupt_and_hide);
        net.until(FORM, |s| Ok(s.epoch()? == 1))?;
        let d = dealer_position(&net, 0)?;
        let q = qualified_of_last(&net)?;
        ensure!(!q.contains(&d), "n = {n}: the silent dealer qualified");
        ensure!(q.len() == n - 1, "n = {n}: {} qualified", q.len());
        check_fresh_key(&net)?;
    }
    Ok(())
}

#[test]
fn a_player_offline_for_the_whole_ceremony_gets_its_share_from_the_chain() -> Result<()> {
    for n in [4, 7] {
        let mut net = DkgNet::new(n, 3)?;
        let off = n - 1;
        net.net.stop(off);
        net.until(FORM, |s| Ok(s.epoch()? == 1))?;
        ensure!(
            net.net.nodes[off].epoch_shares.is_empty(),
            "offline node has a share"
        );
        ensure!(
            qualified_of_last(&net)?.len() == n - 1,
            "n = {n}: every online dealer qualifies"
        );
        // Back: it replays the blocks and derives its share from the
        // revealed values on chain.
        net.net.restart(off)?;
        ensure!(
            net.net.nodes[off].epoch_shares.iter().any(|(e, _)| *e == 1),
            "n = {n}: the returning node derived no share"
        );
        check_signs(&net)?;
        net.pin_hub()?;
        net.until(60, |s| Ok(s.settled() >= 1))?;
    }
    Ok(())
}

#[test]
fn approvals_below_two_thirds_of_the_power_do_not_accept() -> Result<()> {
    for n in [4, 7] {
        let mut net = form(n)?;
        let newcomer = net.net.add_node()?;
        let (code, id) = net.propose(0, ProposalAction::Add, newcomer, 10)?;
        ensure!(code == Code::Ok, "{code:?}");
        // Up to 2/3 of the power exactly: still open.
        let needed = 2 * n / 3 + 1; // approvers for more than 2/3
        for v in 1..needed - 1 {
            ensure!(net.approve(v, id)? == Code::Ok);
        }
        ensure!(
            net.status(id)? == ProposalStatus::Open,
            "n = {n}: accepted with {} of {n}",
            needed - 1
        );
        ensure!(
            net.approve(1, id)? == Code::DkgDuplicate,
            "a second approval counted"
        );
        ensure!(
            net.approve(newcomer, id)? == Code::NotValidator,
            "a non-validator approved"
        );
        // A proposal that does not exist is a refused transaction, not a
        // query's "not found".
        ensure!(
            net.approve(1, id + 100)? == Code::BadProposal,
            "an approval of a missing proposal"
        );
        for _ in 0..20 {
            net.block(true, Vec::new())?;
        }
        ensure!(
            net.status(id)? == ProposalStatus::Open && net.epoch()? == 1,
            "n = {n}: a change happened"
        );
        ensure!(net.approve(needed - 1, id)? == Code::Ok);
        ensure!(
            net.status(id)? == ProposalStatus::Accepted,
            "n = {n}: not accepted with {needed} of {n}"
        );
    }
    Ok(())
}

#[test]
fn grow_to_seven_and_shrink_to_four_keeping_the_group_key() -> Result<()> {
    let mut net = form(4)?;
    let group = net.pin_hub()?;
    net.until(60, |s| Ok(s.settled() >= 1))?;
    let mut members: Vec<usize> = (0..4).collect();
    let mut epochs = vec![net.epoch()?];
    for _ in 0..3 {
        let i = net.net.add_node()?;
        members.push(i);
        net.change(ProposalAction::Add, i, &group, &members)?;
        epochs.push(net.epoch()?);
        check_signs(&net)?;
        let before = net.settled();
        net.until(60, |s| Ok(s.settled() > before))
            .with_context(|| format!("no batch settled with {} validators", members.len()))?;
    }
    for gone in [6, 5, 4] {
        members.retain(|&m| m != gone);
        net.change(ProposalAction::Remove, gone, &group, &members)?;
        epochs.push(net.epoch()?);
        check_signs(&net)?;
        let before = net.settled();
        net.until(60, |s| Ok(s.settled() > before))
            .with_context(|| format!("no batch settled with {} validators", members.len()))?;
    }
    ensure!(epochs == (1..=7).collect::<Vec<u64>>(), "epochs {epochs:?}");
    Ok(())
}

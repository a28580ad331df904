//! The on-chain DKG, validator-set proposals and reshares through the
//! in-process driver (keyed validators, CometBFT's call sequence, app
//! hashes checked at every height). Oracles are apart from the DKG code:
//! the group key is rebuilt by adding the qualified dealers' commitments
//! with blst's own aggregation, and every key is checked by signing with
//! the validators' derived shares through the BLS module's Lagrange
//! combination and verifying against the group key.

use anyhow::{ensure, Context, Result};
use blst::min_pk::{AggregatePublicKey, PublicKey};
use tally_settlement::bls::{self, parse_public_key, Kind, Partial, SecretShare};
use tally_settlement::dkg::key::ThresholdKey;
use tally_settlement::dkg::state as dst;
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::proto::{validator_msg::Sum, ValidatorMsg};
use tally_settlement::Code;
use tally_tests::dkgnet::{DkgNet, CHAIN};

/// Blocks to form a key with four phases of 3 blocks (12) and a margin.
const FORM: usize = 17;

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
    // Four phases of 3 blocks from height 1: finalised at the start of 13.
    ensure!(took <= 13, "the key took {took} blocks");
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

/// Round keys registered so far in the running ceremony.
fn keys_registered(net: &DkgNet) -> Result<u64> {
    let kv = net.net.nodes[0].app.committed_state();
    Ok(match dst::ceremony(kv)? {
        Some(c) => dst::round_counts(kv, c.round)?[0],
        None => 0,
    })
}

#[test]
fn a_player_offline_after_its_key_gets_its_share_from_the_chain() -> Result<()> {
    for n in [4, 7] {
        let mut net = DkgNet::new(n, 3)?;
        let off = n - 1;
        // Its round key lands, then it goes: it never deals nor acks.
        net.until(FORM, |s| Ok(keys_registered(s)? == n as u64))?;
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
        // values revealed for it, with the round key it still holds.
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

/// A player that registers no round key gets no share of that key (ADR
/// 0018): nothing is encrypted to it and nothing revealed for it, so its
/// share stays unknown to everyone; the key forms from the others and
/// signs without it.
#[test]
fn a_player_offline_for_the_whole_ceremony_holds_no_share_of_that_key() -> Result<()> {
    for n in [4, 7] {
        let mut net = DkgNet::new(n, 3)?;
        let off = n - 1;
        net.net.stop(off);
        net.until(FORM, |s| Ok(s.epoch()? == 1))?;
        let kv = net.net.nodes[0].app.committed_state();
        let last = dst::last_ceremony(kv)?.context("last ceremony")?;
        ensure!(
            dst::ceremony_key(kv, last.round, off as u32 + 1)?.is_none(),
            "n = {n}: the offline node has a round key on chain"
        );
        for d in 1..=n as u32 {
            ensure!(
                dst::reveal(kv, last.round, d, off as u32 + 1)?.is_none(),
                "n = {n}: a share of the keyless player was revealed"
            );
            if let Some(dealing) = dst::dealing(kv, last.round, d)? {
                let s = &dealing.shares[off];
                ensure!(
                    s.ephemeral.is_empty() && s.ciphertext.is_empty(),
                    "n = {n}: dealer {d} encrypted a share to a keyless player"
                );
            }
        }
        net.net.restart(off)?;
        ensure!(
            net.net.nodes[off].epoch_shares.is_empty(),
            "n = {n}: the keyless player derived a share"
        );
        net.pin_hub()?;
        net.until(60, |s| Ok(s.settled() >= 1))?;
    }
    Ok(())
}

#[test]
fn approvals_below_two_thirds_of_the_power_do_not_accept() -> Result<()> {
    // n = 3 and 6: 2 of 3 and 4 of 6 are exactly 2/3 (open); 3 and 5 accept.
    for n in [3, 4, 6, 7] {
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

/// The old committee's shares of `old` (by node) sign a batch message:
/// `t` of them still make a signature `old` verifies (the oracle works),
/// and the hub, holding the newest key, refuses it.
fn old_committee_refused(net: &DkgNet, old: &ThresholdKey, shares: &[SecretShare]) -> Result<()> {
    let msg = bls::message(CHAIN, Kind::Batch, &[7; 32]);
    let t = old.shares.threshold as usize;
    ensure!(
        shares.len() >= t,
        "{} old shares for threshold {t}",
        shares.len()
    );
    let parts: Vec<Partial> = shares.iter().take(t).map(|s| s.sign(&msg)).collect();
    let sig = old.shares.combine(&msg, &parts)?;
    ensure!(
        old.shares.verify_group(&msg, &sig),
        "the old committee's signature"
    );
    let held = net
        .net
        .hub
        .as_ref()
        .and_then(|h| h.pinned_group.clone())
        .context("pinned hub")?;
    let mut hub_key = old.shares.clone();
    hub_key.group = parse_public_key(&held)?;
    ensure!(
        !hub_key.verify_group(&msg, &sig),
        "the hub still takes a signature of the past committee"
    );
    Ok(())
}

/// Members' shares of the active key (node order).
fn shares_of(net: &DkgNet, key: &ThresholdKey) -> Vec<SecretShare> {
    net.net
        .nodes
        .iter()
        .filter_map(|n| {
            n.epoch_shares
                .iter()
                .find(|(e, _)| *e == key.record.epoch)
                .map(|(_, s)| s.clone())
        })
        .collect()
}

#[test]
fn grow_to_seven_and_shrink_to_four_rotating_the_key_each_time() -> Result<()> {
    let mut net = form(4)?;
    let mut group = net.pin_hub()?;
    net.until(60, |s| Ok(s.settled() >= 1))?;
    let mut members: Vec<usize> = (0..4).collect();
    let mut epochs = vec![net.epoch()?];
    let mut keys = vec![group.clone()];
    let changes: Vec<(ProposalAction, Option<usize>)> = vec![
        (ProposalAction::Add, None),
        (ProposalAction::Add, None),
        (ProposalAction::Add, None),
        (ProposalAction::Remove, Some(6)),
        (ProposalAction::Remove, Some(5)),
        (ProposalAction::Remove, Some(4)),
    ];
    for (action, gone) in changes {
        let old = net.key(0)?.context("key")?;
        let old_shares = shares_of(&net, &old);
        let target = match gone {
            Some(g) => {
                members.retain(|&m| m != g);
                g
            }
            None => {
                let i = net.net.add_node()?;
                members.push(i);
                i
            }
        };
        group = net.change(action, target, &group, &members)?;
        keys.push(group.clone());
        epochs.push(net.epoch()?);
        check_fresh_key(&net)?;
        let before = net.settled();
        net.until(60, |s| Ok(s.settled() > before))
            .with_context(|| format!("no batch settled with {} validators", members.len()))?;
        let hub = net.net.hub.as_ref().context("hub")?;
        ensure!(
            hub.pinned_group.as_deref() == Some(group.as_slice()),
            "the hub did not rotate"
        );
        old_committee_refused(&net, &old, &old_shares)?;
    }
    ensure!(epochs == (1..=7).collect::<Vec<u64>>(), "epochs {epochs:?}");
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    ensure!(distinct.len() == keys.len(), "a group key came back");
    let hub = net.net.hub.as_ref().context("hub")?;
    let nonces: Vec<u64> = hub.rotations.iter().map(|(n, _)| *n).collect();
    ensure!(
        nonces == (1..=6).collect::<Vec<u64>>(),
        "rotations {nonces:?}"
    );
    // Every batch settled once, nonces in order (the hub checks the order).
    let settled: Vec<u64> = hub.settled.keys().copied().collect();
    ensure!(settled == (1..=settled.len() as u64).collect::<Vec<_>>());
    Ok(())
}

/// A batch the old key signed while the hub was unreachable is still
/// unsettled when the set changes: the new key signs it again, and once
/// the hub is back it applies the rotation first and settles the batch
/// once, under the key it then holds (the new one; the old signature no
/// longer verifies there).
#[test]
fn a_batch_pending_across_a_rotation_settles_once_under_the_new_key() -> Result<()> {
    let mut net = form(4)?;
    let first = net.pin_hub()?;
    net.until(60, |s| Ok(s.settled() >= 1))?;
    let hub = net.net.hub.take().context("hub")?;
    let current = |s: &DkgNet| -> Result<Option<tally_settlement::proto::BatchRecord>> {
        let kv = s.net.nodes[0].app.committed_state();
        let st = tally_settlement::sync::sync_state(kv, "hub")?;
        Ok(tally_settlement::sync::batch(kv, "hub", st.current_nonce)?)
    };
    let settled_before = hub.settled.len() as u64;
    net.until(60, |s| {
        Ok(current(s)?.is_some_and(|b| {
            b.nonce > settled_before && b.status == tally_settlement::BatchStatus::Signed.value()
        }))
    })?;
    let old = current(&net)?.context("batch")?;
    let i = net.net.add_node()?;
    let new_group = net.change(ProposalAction::Add, i, &first, &[0, 1, 2, 3, i])?;
    // The switch happened with the hub away: the batch is signed again
    // (or waits for it) by the new key.
    let again = current(&net)?.context("batch")?;
    ensure!(again.nonce == old.nonce, "another batch is current");
    ensure!(
        again.signature != old.signature,
        "the old key's signature is still the batch's"
    );
    net.net.hub = Some(hub);
    net.until(60, |s| {
        Ok(s.net
            .hub
            .as_ref()
            .is_some_and(|h| h.settled.contains_key(&old.nonce)))
    })?;
    let h = net.net.hub.as_ref().context("hub")?;
    ensure!(
        h.pinned_group.as_deref() == Some(new_group.as_slice()),
        "the hub did not rotate"
    );
    let paid = h.settled.get(&old.nonce).context("settled")?;
    ensure!(
        paid.signature != old.signature,
        "settled under the old key after the rotation"
    );
    let settled: Vec<u64> = h.settled.keys().copied().collect();
    ensure!(
        settled == (1..=settled.len() as u64).collect::<Vec<_>>(),
        "{settled:?}"
    );
    Ok(())
}

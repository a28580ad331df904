//! A reference hub chain and every validator's relay, in process, for the
//! driver ([`crate::driver::Net::hub`]).
//!
//! The hub holds deposits at hub heights and settles signed batches: it
//! checks the batch digest against the batch's calls and the group
//! signature against the chain's group key, pays each call once, and
//! refuses nonces out of order. Each validator's relay reads only its own
//! node's committed state, like the real relay: it submits a signed batch
//! and hands in `HubResult { settled: true }` once the hub shows the nonce
//! settled, and hands in the next hub-block message of the range at the
//! chain's deposit cursor, split at `max_block_deposits` by
//! [`deposit_message`], an oracle written apart from the relay's, with the
//! hub's cumulative deposit count through the range's end.

use std::collections::BTreeMap;

use anyhow::{ensure, Context, Result};
use tally_abci::HandIn;
use tally_settlement::bls::{self, Kind};
use tally_settlement::proto::{BatchRecord, HubBlock, HubDeposit, HubResult};
use tally_settlement::sync;
use tally_settlement::BatchStatus;
use tally_store::KvRead;

/// The hub chain.
#[derive(Clone, Debug, Default)]
pub struct Hub {
    /// Its finalized height: ranges up to here are handed in.
    pub tip: u64,
    /// Every deposit, with the hub height it is in.
    pub deposits: Vec<(u64, HubDeposit)>,
    /// Batches settled, by nonce.
    pub settled: BTreeMap<u64, BatchRecord>,
    /// Credits paid out, by (user, provider).
    pub paid: BTreeMap<(String, String), u64>,
    /// The group key the hub holds (compressed), if pinned: it was set
    /// up with it and changes it only through a key rotation the held key
    /// signed, never by reading the chain's current key, as a real hub.
    pub pinned_group: Option<Vec<u8>>,
    /// Key rotations applied (nonce, new group key), in order.
    pub rotations: Vec<(u64, Vec<u8>)>,
    /// Signed batches the hub refused: not signed by the key it held.
    pub refused: u64,
}

impl Hub {
    /// A deposit of `amount` for `user` at hub `height`; returns its
    /// sequence number.
    pub fn deposit(&mut self, height: u64, user: &str, amount: u64) -> u64 {
        self.deposit_keyed(height, user, amount, Vec::new())
    }

    /// A deposit that carries `pubkey` (ADR 0020: it binds the user's key
    /// on the chain if it is the deposit that first funds the user).
    pub fn deposit_keyed(&mut self, height: u64, user: &str, amount: u64, pubkey: Vec<u8>) -> u64 {
        let seq = self.deposits.len() as u64 + 1;
        self.deposits.push((
            height,
            HubDeposit {
                seq,
                user: user.into(),
                amount,
                pubkey,
            },
        ));
        seq
    }

    /// Credits withdrawals paid out to `user` (calls of kind 1: paid with
    /// no provider).
    pub fn withdrawn(&self, user: &str) -> u64 {
        self.paid
            .get(&(user.to_string(), String::new()))
            .copied()
            .unwrap_or(0)
    }

    /// The hub's cumulative deposit count through `height`: every deposit
    /// at or below it.
    pub fn count_through(&self, height: u64) -> u64 {
        self.deposits.iter().filter(|(h, _)| *h <= height).count() as u64
    }

    /// Credits deposited for each user.
    pub fn deposited(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (_, d) in &self.deposits {
            *m.entry(d.user.clone()).or_default() += d.amount;
        }
        m
    }

    /// What an honest relay of the validator whose committed state is
    /// `kv` hands in now (submitting a signed batch to the hub first).
    pub fn relay(&mut self, kv: &impl KvRead) -> Result<Vec<HandIn>> {
        let p = tally_settlement::params(kv)?;
        let chain = p.hub_chain.clone();
        let st = sync::sync_state(kv, &chain)?;
        let mut out = Vec::new();
        if st.current_nonce != 0 {
            let b = sync::batch(kv, &chain, st.current_nonce)?.context("current batch")?;
            // A batch under the key the hub holds settles before any
            // rotation; one under a newer key after the rotations.
            let signed = b.status == BatchStatus::Signed.value();
            if signed && !self.settled.contains_key(&b.nonce) && !self.settle(kv, b.clone())? {
                self.rotate(kv)?;
                if !self.settle(kv, b)? {
                    self.refused += 1;
                }
            }
            if self.settled.contains_key(&st.current_nonce) {
                out.push(HandIn::Result(HubResult {
                    chain: chain.clone(),
                    nonce: st.current_nonce,
                    attempt: st.attempt,
                    settled: true,
                }));
            }
        }
        self.rotate(kv)?;
        let cursor = sync::hub_cursor(kv, &chain)?;
        let version = tally_settlement::state::chain::app_version(kv)?;
        // Before app version 3 honest relays leave keys out.
        let keyed = version >= tally_settlement::types::GROWTH_VERSION;
        // From app version 5 the chain waits for the messages after the
        // cursor's too (ADR 0024): twice max_block_messages of them.
        let window = if version >= tally_settlement::types::PIPELINE_VERSION {
            2 * p.max_block_messages as usize
        } else {
            1
        };
        let (mut from, mut next_seq, mut built) = (cursor.height, cursor.deposit_seq, 0);
        while built < window {
            let to = from + p.hub_block_range - 1;
            if self.tip < to {
                break;
            }
            let all: Vec<HubDeposit> = self
                .deposits
                .iter()
                .filter(|(h, _)| (from..=to).contains(h))
                .map(|(_, d)| HubDeposit {
                    pubkey: if keyed { d.pubkey.clone() } else { Vec::new() },
                    ..d.clone()
                })
                .collect();
            loop {
                let (deposits, more) =
                    deposit_message(all.clone(), next_seq, p.max_block_deposits as usize);
                next_seq = deposits.last().map_or(next_seq, |d| d.seq + 1);
                out.push(HandIn::Block(HubBlock {
                    chain: chain.clone(),
                    from_height: from,
                    to_height: to,
                    deposits,
                    more,
                    deposit_count: self.count_through(to),
                }));
                built += 1;
                if !more || built >= window {
                    break;
                }
            }
            next_seq = self.count_through(to) + 1;
            from = to + 1;
        }
        Ok(out)
    }

    /// Applies the chain's signed key rotations the hub does not have, in
    /// nonce order, each only if the key the hub holds signed it (pinned
    /// hubs only).
    fn rotate(&mut self, kv: &impl KvRead) -> Result<()> {
        let Some(held) = self.pinned_group.clone() else {
            return Ok(());
        };
        let mut held = held;
        let next = self.rotations.last().map_or(1, |(n, _)| n + 1);
        let chain_id = tally_settlement::chain_id(kv)?;
        for r in tally_settlement::dkg::state::rotations(kv, next, 100)? {
            if r.signature.is_empty() {
                break;
            }
            let digest = sync::rotation_digest(&r.hub, r.nonce, r.epoch, &r.group_key);
            let key = bls::parse_public_key(&held)?;
            let sig = bls::parse_signature(&r.signature)?;
            let msg = bls::message(&chain_id, Kind::KeyRotation, &digest);
            let ok =
                blst::BLST_ERROR::BLST_SUCCESS == sig.verify(true, &msg, bls::DST, &[], &key, true);
            ensure!(
                ok,
                "hub: rotation {} is not signed by the key it holds",
                r.nonce
            );
            held = r.group_key.clone();
            self.rotations.push((r.nonce, r.group_key));
        }
        self.pinned_group = Some(held);
        Ok(())
    }

    /// The hub's governors accept the chain's governed rotation `nonce`
    /// (a recovery, ADR 0018) after checking it against the chain: the
    /// hub holds its key from now. It must be the next rotation the hub
    /// lacks.
    pub fn govern(&mut self, kv: &impl KvRead, nonce: u64) -> Result<()> {
        let next = self.rotations.last().map_or(1, |(n, _)| n + 1);
        ensure!(
            nonce == next,
            "hub: rotation {nonce} governed, {next} expected"
        );
        let r = tally_settlement::dkg::state::rotation(kv, nonce)?.context("no such rotation")?;
        ensure!(r.governed, "hub: rotation {nonce} is not a governed one");
        self.pinned_group = Some(r.group_key.clone());
        self.rotations.push((r.nonce, r.group_key));
        Ok(())
    }

    /// The hub executes signed batch `b`: the next nonce, its digest over
    /// its calls, a group signature that verifies under the key the hub
    /// holds (`false`, nothing paid, if not); each call paid once.
    fn settle(&mut self, kv: &impl KvRead, b: BatchRecord) -> Result<bool> {
        let want = self.settled.keys().last().map_or(1, |n| n + 1);
        ensure!(
            b.nonce == want,
            "hub: nonce {} submitted, {want} expected",
            b.nonce
        );
        let mut calls = Vec::new();
        for id in &b.call_ids {
            calls.push(sync::hub_call(kv, *id)?.context("hub call of a signed batch")?);
        }
        let digest = sync::batch_digest(&b.chain, b.nonce, &calls);
        ensure!(
            digest.as_slice() == b.digest,
            "hub: batch digest does not match its calls"
        );
        let key = tally_settlement::dkg::state::active_key(kv, &tally_settlement::KeyCache::new())?
            .context("threshold key")?;
        let mut shares = key.shares;
        if let Some(g) = &self.pinned_group {
            shares.group = bls::parse_public_key(g)?;
        }
        let sig = bls::parse_signature(&b.signature)?;
        let chain_id = tally_settlement::chain_id(kv)?;
        let verifies = shares.verify_group(&bls::message(&chain_id, Kind::Batch, &digest), &sig);
        if !verifies && self.pinned_group.is_none() {
            anyhow::bail!("hub: group signature of batch {} does not verify", b.nonce);
        }
        if !verifies {
            return Ok(false);
        }
        for c in calls {
            // A withdrawal (kind 1) has no provider: paid to the user.
            ensure!(
                c.kind == 0 || (c.kind == 1 && c.provider.is_empty()),
                "hub: call {} of kind {} to {:?}",
                c.id,
                c.kind,
                c.provider
            );
            *self.paid.entry((c.user, c.provider)).or_default() += c.amount;
        }
        self.settled.insert(b.nonce, b);
        Ok(true)
    }
}

/// The next hub-block message of a range holding `all`: the deposits from
/// sequence number `next_seq` on, at most `cap`, and whether more follow.
pub fn deposit_message(all: Vec<HubDeposit>, next_seq: u64, cap: usize) -> (Vec<HubDeposit>, bool) {
    let mut left: Vec<HubDeposit> = all.into_iter().filter(|d| d.seq >= next_seq).collect();
    left.sort_by_key(|d| d.seq);
    if left.len() > cap {
        left.truncate(cap);
        (left, true)
    } else {
        (left, false)
    }
}

//! A keyed driver net with traffic and the hub, for the on-chain DKG,
//! proposal and reshare tests (`tests/tests/dkg.rs`, `tests/tests/interop.rs`).

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use tally_settlement::dkg::key::ThresholdKey;
use tally_settlement::dkg::state as dst;
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::proto::{
    validator_msg::Sum, ProposalApproval, UpgradePlan, ValidatorMsg, ValidatorProposal,
};
use tally_settlement::Code;

use crate::driver::{Net, Outcome};
use crate::hub::Hub;
use crate::traffic::{gateway_key, Traffic};

/// Chain id of the DKG tests.
pub const CHAIN: &str = "tally-dkg";
/// Genesis time.
pub const T0: i64 = 1_800_000_000;
/// Seconds between blocks.
pub const STEP: i64 = 5;

/// The key of traffic user `user` (registered in genesis): it signs the
/// user's allowance changes.
pub fn user_key(user: &str) -> SigningKey {
    let mut seed = [0x55u8; 32];
    for (i, b) in user.bytes().enumerate().take(32) {
        seed[i] ^= b;
    }
    SigningKey::from_bytes(&seed)
}

/// A keyed net, its traffic and what it settled.
#[derive(Debug)]
pub struct DkgNet {
    /// The net (hub set).
    pub net: Net,
    /// Seeded usage reports.
    pub traffic: Traffic,
    /// Every tx result of the last block, with its tx.
    pub last: Option<Outcome>,
}

impl DkgNet {
    /// `n` keyed validators, phases of `phase` blocks, no dealer key: the
    /// key comes from the on-chain DKG. The hub has deposits for every
    /// user.
    pub fn new(n: usize, phase: u64) -> Result<Self> {
        Self::new_at(n, phase, 0)
    }

    /// [`DkgNet::new`] with genesis at app version `version` (0: not set,
    /// version 1).
    pub fn new_at(n: usize, phase: u64, version: u64) -> Result<Self> {
        let key = gateway_key(3);
        let traffic = Traffic::new(11, key.clone(), CHAIN, [4, 2, 2, 2]);
        let mut net = Net::keyed(n, CHAIN, T0)?;
        net.genesis_version = version;
        let state = serde_json::json!({
            "params": {
                "settlement_window_secs": 60, "hub_chain": "hub", "max_batch_calls": 50,
                "dkg_phase_blocks": phase,
            },
            "gateways": [{"name": "gw-test", "pubkey": hex::encode(key.verifying_key().to_bytes())}],
            "allowances": crate::traffic::allowances(&traffic.users, "gw-test"),
            "balances": traffic.users.iter().map(|u| serde_json::json!({"user": u, "amount": 100_000})).collect::<Vec<_>>(),
            "users": traffic.users.iter().map(|u| serde_json::json!({"name": u, "pubkey": hex::encode(user_key(u).verifying_key().to_bytes())})).collect::<Vec<_>>(),
        });
        net.init(&state.to_string())?;
        let mut hub = Hub::default();
        for (i, u) in traffic.users.iter().enumerate() {
            hub.deposit(2 + i as u64, u, 1_000);
        }
        net.hub = Some(hub);
        Ok(Self {
            net,
            traffic,
            last: None,
        })
    }

    /// One block with a usage report (when `usage`) and `extra` txs.
    pub fn block(&mut self, usage: bool, extra: Vec<Vec<u8>>) -> Result<&Outcome> {
        let mut txs = extra;
        if usage {
            let recs = self.traffic.records(5, 20);
            txs.push(self.traffic.report(recs, self.net.now as u64, 120));
        }
        let o = self.net.block(txs, STEP)?;
        Ok(self.last.insert(o))
    }

    /// Blocks (with usage) until `done`, at most `max`; the blocks it took.
    pub fn until(
        &mut self,
        max: usize,
        mut done: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<usize> {
        for k in 1..=max {
            self.block(true, Vec::new())?;
            if done(self)? {
                return Ok(k);
            }
        }
        anyhow::bail!(
            "condition not met in {max} blocks (height {})",
            self.net.height
        )
    }

    /// The active key, as node `i` has it.
    pub fn key(&self, i: usize) -> Result<Option<ThresholdKey>> {
        Ok(tally_settlement::dkg::state::active_key(
            self.net.nodes[i].app.committed_state(),
            &tally_settlement::KeyCache::new(),
        )?)
    }

    /// The active key's epoch (0: none yet).
    pub fn epoch(&self) -> Result<u64> {
        Ok(self.key(0)?.map(|k| k.record.epoch).unwrap_or(0))
    }

    /// Batches the hub settled.
    pub fn settled(&self) -> usize {
        self.net.hub.as_ref().map_or(0, |h| h.settled.len())
    }

    /// Pins the hub to the active key's group key (as a real hub's genesis).
    pub fn pin_hub(&mut self) -> Result<Vec<u8>> {
        let g = self
            .key(0)?
            .context("no key")?
            .shares
            .group
            .compress()
            .to_vec();
        if let Some(h) = self.net.hub.as_mut() {
            h.pinned_group = Some(g.clone());
        }
        Ok(g)
    }

    fn signing(&self, i: usize) -> Result<SigningKey> {
        self.net.nodes[i].consensus.clone().context("keyed node")
    }

    fn send(&mut self, from: usize, sum: Sum) -> Result<(Code, Vec<u8>, String)> {
        let m = ValidatorMsg {
            chain_id: CHAIN.into(),
            sum: Some(sum),
        };
        let tx = tally_settlement::dkg::sign_validator_msg(&self.signing(from)?, &m);
        let o = self.block(false, vec![tx.clone()])?;
        let pos = o
            .block
            .txs
            .iter()
            .position(|t| t.as_ref() == tx.as_slice())
            .context("the tx was not included")?;
        let r = &o.tx_results[pos];
        let code = Code::from_value(r.code).context("unknown code")?;
        Ok((code, r.data.to_vec(), r.log.clone()))
    }

    /// Node `from` proposes `action` of node `target` with `power`;
    /// returns the result code and the proposal id.
    pub fn propose(
        &mut self,
        from: usize,
        action: ProposalAction,
        target: usize,
        power: u64,
    ) -> Result<(Code, u64)> {
        let t = self.signing(target)?;
        let pk = t.verifying_key().to_bytes();
        let (code, data, _) = self.send(
            from,
            Sum::Propose(ValidatorProposal {
                action: action.into(),
                pubkey: if action.has_target() {
                    pk.to_vec()
                } else {
                    Vec::new()
                },
                power,
                valid_until_height: self.net.height as u64 + 10,
                ..Default::default()
            }),
        )?;
        let id = <[u8; 8]>::try_from(data.as_slice())
            .map(u64::from_be_bytes)
            .unwrap_or(0);
        Ok((code, id))
    }

    /// Node `from` proposes an upgrade action with `plan`; returns the
    /// result code, the proposal id (0 if refused) and the log.
    pub fn propose_upgrade(
        &mut self,
        from: usize,
        action: ProposalAction,
        plan: UpgradePlan,
    ) -> Result<(Code, u64, String)> {
        self.propose_gov(
            from,
            ValidatorProposal {
                action: action.into(),
                upgrade: Some(plan),
                ..ValidatorProposal::default()
            },
        )
    }

    /// Node `from` proposes governance proposal `p` (its validity is set
    /// here); returns the result code, the proposal id (0 if refused) and
    /// the log.
    pub fn propose_gov(
        &mut self,
        from: usize,
        p: ValidatorProposal,
    ) -> Result<(Code, u64, String)> {
        let (code, data, log) = self.send(
            from,
            Sum::Propose(ValidatorProposal {
                valid_until_height: self.net.height as u64 + 10,
                ..p
            }),
        )?;
        let id = <[u8; 8]>::try_from(data.as_slice())
            .map(u64::from_be_bytes)
            .unwrap_or(0);
        Ok((code, id, log))
    }

    /// Node `from` approves proposal `id`; returns the result code.
    pub fn approve(&mut self, from: usize, id: u64) -> Result<Code> {
        Ok(self
            .send(from, Sum::Approve(ProposalApproval { proposal: id }))?
            .0)
    }

    /// A proposal's status.
    pub fn status(&self, id: u64) -> Result<ProposalStatus> {
        let p =
            dst::proposal(self.net.nodes[0].app.committed_state(), id)?.context("no proposal")?;
        Ok(dst::proposal_status(&p)?)
    }

    /// Proposes a change from node 0 and approves it from the others in
    /// order until accepted; then runs until the new key is active and
    /// checks it is a new group key (not `group`, the one before) and the
    /// validators voting are `members`. Returns the new group key.
    pub fn change(
        &mut self,
        action: ProposalAction,
        target: usize,
        group: &[u8],
        members: &[usize],
    ) -> Result<Vec<u8>> {
        let proposer = *members
            .first()
            .filter(|&&m| m != target)
            .unwrap_or(&members[1]);
        let voters: Vec<usize> = (0..self.net.nodes.len())
            .filter(|&i| self.net.nodes[i].member)
            .collect();
        let before = self.epoch()?;
        let power = if action == ProposalAction::Remove {
            0
        } else {
            10
        };
        let (code, id) = self.propose(proposer, action, target, power)?;
        ensure!(code == Code::Ok, "proposal refused: {code:?}");
        for &v in voters.iter().filter(|&&v| v != proposer) {
            if self.status(id)? != ProposalStatus::Open {
                break;
            }
            ensure!(self.approve(v, id)? == Code::Ok, "approval refused");
        }
        ensure!(
            self.status(id)? != ProposalStatus::Open,
            "proposal {id} not accepted"
        );
        self.until(200, |s| Ok(s.epoch()? > before))?;
        let key = self.key(0)?.context("key")?;
        let new_group = key.shares.group.compress().to_vec();
        ensure!(new_group != group, "the group key did not change");
        let want: Vec<usize> = members.to_vec();
        let got: Vec<usize> = (0..self.net.nodes.len())
            .filter(|&i| self.net.nodes[i].member)
            .collect();
        ensure!(got == want, "validators {got:?}, want {want:?}");
        ensure!(
            key.signers.len() == members.len(),
            "{} signers",
            key.signers.len()
        );
        Ok(new_group)
    }
}

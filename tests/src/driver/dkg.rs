//! Keyed nets: validators with real CometBFT consensus keys and a seed
//! for their per-round DKG encryption keys ([`round_key`]), so the
//! on-chain DKG, proposals and re-keys run
//! through the driver. Each honest node sends what
//! [`tally_settlement::dkg::next_messages`] says after every block and
//! derives its share after every commit, as `tallyd`'s participant does;
//! validator updates take effect two heights after the block that
//! returned them, as in CometBFT.

use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use ed25519_dalek::SigningKey;
use tally_settlement::dkg::crypto::EncKey;
use tally_settlement::dkg::{self, Me};
use tally_settlement::proto::ValidatorMsg;
use tally_store::MemBackend;
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{RequestInfo, ValidatorUpdate};
use tendermint_proto::v0_38::crypto::{public_key::Sum, PublicKey};

use super::{finalize_request, CometSet, Net, Node, Storage};

/// Rewrites (or with `None` drops) a node's DKG message before it is
/// sent: a byzantine dealer or a silent player.
pub type DkgFilter = fn(ValidatorMsg) -> Option<ValidatorMsg>;

/// Node `i`'s consensus key (deterministic).
pub fn consensus_key(i: usize) -> SigningKey {
    SigningKey::from_bytes(&[i as u8 + 1; 32])
}

/// Node `i`'s seed for its round keys (deterministic).
pub fn enc_key(i: usize) -> EncKey {
    let ikm = [i as u8 + 101; 32];
    EncKey::from_ikm(&ikm).unwrap_or_else(|_| unreachable!("32-byte ikm"))
}

/// The encryption key a node with `seed` makes for ceremony `round`: a
/// different key every round, as `tallyd` makes a fresh one (ADR 0018),
/// but deterministic so runs repeat.
pub fn round_key(seed: &EncKey, round: u64) -> EncKey {
    let ikm = seed.seed(&[b"driver-round-key".as_slice(), &round.to_be_bytes()].concat());
    EncKey::from_ikm(&ikm).unwrap_or_else(|_| unreachable!("32-byte ikm"))
}

fn update(key: &SigningKey, power: i64) -> ValidatorUpdate {
    ValidatorUpdate {
        pub_key: Some(PublicKey {
            sum: Some(Sum::Ed25519(key.verifying_key().to_bytes().to_vec())),
        }),
        power,
    }
}

impl Net {
    /// `n` validators on in-memory stores with consensus keys and round-key
    /// seeds, power 10 each, sending their DKG messages with every block.
    pub fn keyed(n: usize, chain_id: &str, now: i64) -> Result<Self> {
        let mut net = Self::in_memory(n, chain_id, now)?;
        for i in 0..n {
            net.nodes[i].consensus = Some(consensus_key(i));
            net.nodes[i].enc = Some(enc_key(i));
        }
        net.genesis_validators = (0..n).map(|i| update(&consensus_key(i), 10)).collect();
        net.comet = Some(CometSet::new(&net.genesis_validators)?);
        net.auto_dkg = true;
        Ok(net)
    }

    /// Adds node `i = nodes.len()` with its keys, not a validator: it
    /// runs InitChain and replays every block (block sync), then follows.
    pub fn add_node(&mut self) -> Result<usize> {
        let i = self.nodes.len();
        let mut node = Node::open(Storage::Memory(Arc::new(MemBackend::new())))?;
        node.consensus = Some(consensus_key(i));
        node.enc = Some(enc_key(i));
        node.member = false;
        self.nodes.push(node);
        self.init_node(i)?;
        for h in 1..=self.height {
            let b = self.blocks[h as usize - 1].clone();
            let r = self.nodes[i].app.finalize_block(finalize_request(&b));
            anyhow::ensure!(
                r.app_hash.as_ref() == self.hashes[h as usize - 1].as_slice(),
                "node{i} replayed height {h} to a different app hash"
            );
            self.nodes[i].app.commit();
        }
        let info = self.nodes[i].app.info(RequestInfo::default());
        anyhow::ensure!(
            info.last_block_height == self.height,
            "node{i} did not catch up"
        );
        self.derive_shares(&[i])?;
        Ok(i)
    }

    /// Applies the validator updates CometBFT applies at `height`.
    pub(super) fn apply_updates(&mut self, height: i64) {
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending_updates)
            .into_iter()
            .partition(|(h, _)| *h <= height);
        self.pending_updates = later;
        for u in now.into_iter().flat_map(|(_, u)| u) {
            let key = match u.pub_key.and_then(|k| k.sum) {
                Some(Sum::Ed25519(b)) => b,
                _ => continue,
            };
            for n in &mut self.nodes {
                if n.consensus
                    .as_ref()
                    .map(|c| c.verifying_key().to_bytes().to_vec())
                    == Some(key.clone())
                {
                    n.member = u.power > 0;
                }
            }
        }
    }

    /// Every up node's DKG messages for the next block, signed, each sent
    /// once.
    pub(super) fn dkg_messages(&mut self) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for i in self.followers() {
            let (Some(c), Some(seed)) = (&self.nodes[i].consensus, &self.nodes[i].enc) else {
                continue;
            };
            let state = self.nodes[i].app.committed_state();
            let Some(round) = dkg::state::ceremony(state)?.map(|c| c.round) else {
                continue;
            };
            let enc = round_key(seed, round);
            let me = Me {
                address: dkg::address_of(c.verifying_key().as_bytes()),
                enc: &enc,
            };
            let msgs = dkg::next_messages(self.nodes[i].app.committed_state(), &me)?;
            for m in msgs {
                let m = match self.nodes[i].dkg_filter {
                    Some(f) => match f(m) {
                        Some(m) => m,
                        None => continue,
                    },
                    None => m,
                };
                let tx = dkg::sign_validator_msg(c, &m);
                if self.dkg_sent.contains(&tx) {
                    continue;
                }
                // Through CheckTx first, as `tallyd` sends it (CheckTx
                // judges at the last committed height): an honest
                // participant's message is never refused there.
                if self.nodes[i].dkg_filter.is_none() {
                    let r = tally_settlement::check_tx(state, &tx)?;
                    anyhow::ensure!(
                        r.code == tally_settlement::Code::Ok,
                        "CheckTx refused node{i}'s DKG message ({:?}): {}",
                        r.code,
                        r.log
                    );
                }
                self.dkg_sent.insert(tx.clone());
                out.push(tx);
            }
        }
        Ok(out)
    }

    /// Nodes `of` derive their shares of the newest key from the chain.
    pub(super) fn derive_shares(&mut self, of: &[usize]) -> Result<()> {
        for &i in of {
            let (Some(c), Some(seed)) = (&self.nodes[i].consensus, &self.nodes[i].enc) else {
                continue;
            };
            let state = self.nodes[i].app.committed_state();
            let Some(round) = dkg::state::last_ceremony(state)?.map(|c| c.round) else {
                continue;
            };
            let address = dkg::address_of(c.verifying_key().as_bytes());
            let got = match dkg::derive_share(state, &address, &round_key(seed, round)) {
                // Its disk was replaced since it registered (a new seed):
                // it cannot open its shares, as `tallyd` cannot.
                Err(dkg::participant::DeriveError::NotMyKey(_)) => None,
                other => other.with_context(|| format!("node{i} deriving its share"))?,
            };
            if let Some((e, s)) = got {
                if !self.nodes[i].epoch_shares.iter().any(|(x, _)| *x == e) {
                    self.nodes[i].app.add_signer(e, s.clone());
                    self.nodes[i].epoch_shares.push((e, s));
                }
            }
        }
        Ok(())
    }

    /// The consensus public key of node `i` (keyed nets).
    pub fn pubkey(&self, i: usize) -> Option<Bytes> {
        self.nodes[i]
            .consensus
            .as_ref()
            .map(|c| Bytes::copy_from_slice(c.verifying_key().as_bytes()))
    }
}

//! CometBFT 0.38's checks of the `validator_updates` FinalizeBlock returns,
//! written from its Go source (`state/execution.go`
//! `validateValidatorUpdates`, `types/validator_set.go`
//! `UpdateWithChangeSet`: `processChanges`, `verifyRemovals`,
//! `verifyUpdates`), independently of the app's own rules. A list this
//! model refuses is one real CometBFT stops on at that height with
//! `CONSENSUS FAILURE!!!`, on every node, for good: the driver fails the
//! test there.

use anyhow::{bail, Result};
use tendermint_proto::v0_38::abci::ValidatorUpdate;
use tendermint_proto::v0_38::crypto::public_key::Sum;

/// `types.MaxTotalVotingPower`.
pub const MAX_TOTAL_VOTING_POWER: i64 = i64::MAX / 8;

/// CometBFT's next validator set: ed25519 key and power of each member.
#[derive(Clone, Debug, Default)]
pub struct CometSet {
    members: Vec<(Vec<u8>, i64)>,
}

impl CometSet {
    /// The genesis set.
    pub fn new(genesis: &[ValidatorUpdate]) -> Result<Self> {
        let mut s = Self::default();
        s.apply(genesis)?;
        Ok(s)
    }

    /// The members and their powers.
    pub fn members(&self) -> &[(Vec<u8>, i64)] {
        &self.members
    }

    /// Applies `changes` the way CometBFT does, or fails with the error
    /// CometBFT would stop on (the set is then unchanged).
    pub fn apply(&mut self, changes: &[ValidatorUpdate]) -> Result<()> {
        let mut seen: Vec<Vec<u8>> = Vec::new();
        let mut parsed = Vec::with_capacity(changes.len());
        for u in changes {
            let Some(Sum::Ed25519(key)) = u.pub_key.as_ref().and_then(|k| k.sum.clone()) else {
                bail!("validator update with a key type other than ed25519");
            };
            if u.power < 0 {
                bail!("voting power can't be negative {}", u.power);
            }
            if u.power > MAX_TOTAL_VOTING_POWER {
                bail!(
                    "to prevent clipping/overflow, voting power can't be higher than {MAX_TOTAL_VOTING_POWER}, got {}",
                    u.power
                );
            }
            if seen.contains(&key.to_vec()) {
                bail!("duplicate entry in the change set");
            }
            seen.push(key.to_vec());
            parsed.push((key.to_vec(), u.power));
        }
        let mut next = self.members.clone();
        let mut removed: i64 = 0;
        for (k, p) in parsed.iter().filter(|(_, p)| *p == 0) {
            let Some(i) = next.iter().position(|(m, _)| m == k) else {
                bail!("failed to find validator {} to remove", hex::encode(k));
            };
            removed += next[i].1;
            next.remove(i);
            let _ = p;
        }
        let mut total: i64 = self.members.iter().map(|(_, p)| *p).sum::<i64>() - removed;
        for (k, p) in parsed.iter().filter(|(_, p)| *p > 0) {
            match next.iter_mut().find(|(m, _)| m == k) {
                Some(m) => {
                    total = total - m.1 + p;
                    m.1 = *p;
                }
                None => {
                    total = total.saturating_add(*p);
                    next.push((k.clone(), *p));
                }
            }
            if total > MAX_TOTAL_VOTING_POWER {
                bail!(
                    "total voting power of resulting valset exceeds max {MAX_TOTAL_VOTING_POWER}"
                );
            }
        }
        if next.is_empty() {
            bail!("applying the validator changes would result in empty set");
        }
        self.members = next;
        Ok(())
    }
}

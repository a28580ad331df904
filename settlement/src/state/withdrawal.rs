//! Users' withdrawals (ADR 0020): `wd/<user>\0<call id BE>` holds the
//! amount, the user's sequence, the window and height it was made in, and
//! the nonce of the batch that paid it (0 until then), as five big-endian
//! u64s.

use tally_store::{prefix_end, Kv, KvRead};

use crate::error::Fatal;
use crate::keys;

/// One withdrawal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WithdrawalRecord {
    /// Credits.
    pub amount: u64,
    /// The user's sequence it was signed with.
    pub sequence: u64,
    /// The settlement window it was made in.
    pub window: u64,
    /// The block it was made in.
    pub height: u64,
    /// The batch that paid it on the hub (0: not yet).
    pub settled_nonce: u64,
}

impl WithdrawalRecord {
    fn encode(&self) -> Vec<u8> {
        [
            self.amount,
            self.sequence,
            self.window,
            self.height,
            self.settled_nonce,
        ]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect()
    }

    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 40 {
            return None;
        }
        let at = |i: usize| u64::from_be_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        Some(Self {
            amount: at(0),
            sequence: at(1),
            window: at(2),
            height: at(3),
            settled_nonce: at(4),
        })
    }
}

/// The withdrawal `user` made as hub call `id`, if any.
pub fn withdrawal(
    kv: &impl KvRead,
    user: &str,
    id: u64,
) -> Result<Option<WithdrawalRecord>, Fatal> {
    match kv.get(&keys::withdrawal(user, id))? {
        None => Ok(None),
        Some(b) => WithdrawalRecord::decode(&b)
            .map(Some)
            .ok_or(Fatal::Corrupt("withdrawal")),
    }
}

/// Stores a withdrawal.
pub fn put_withdrawal(kv: &mut impl Kv, user: &str, id: u64, w: &WithdrawalRecord) {
    kv.put(keys::withdrawal(user, id), w.encode());
}

/// Up to `limit` of `user`'s withdrawals by call id, from `from` on.
pub fn withdrawals(
    kv: &impl KvRead,
    user: &str,
    from: u64,
    limit: usize,
) -> Result<Vec<(u64, WithdrawalRecord)>, Fatal> {
    let prefix = keys::withdrawal_prefix(user);
    let rows = kv.scan(&keys::withdrawal(user, from), &prefix_end(&prefix), limit)?;
    rows.into_iter()
        .map(|(k, v)| {
            let id = k
                .get(prefix.len()..)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
                .ok_or(Fatal::Corrupt("withdrawal key"))?;
            Ok((
                id,
                WithdrawalRecord::decode(&v).ok_or(Fatal::Corrupt("withdrawal"))?,
            ))
        })
        .collect()
}

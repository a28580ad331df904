//! Settlement-sync state: hub calls and the pending set, batches, each
//! hub chain's sync state and deposit cursor, and the partial signatures
//! stored while a message collects its threshold. (The threshold key they
//! are checked against is the DKG's: [`crate::dkg::state::active_key`].)

use prost::Message;
use tally_store::{prefix_end, Kv, KvRead};

use super::{load, put_u64, u64_or};
use crate::error::Fatal;
use crate::keys;
use crate::proto::{BatchRecord, HubBlock, HubCall, PendingMessage, SyncState};
use crate::types::{BatchStatus, HubCursor};

/// A hub chain's sync state (zeroes and nonce 1 before the first attempt).
pub fn sync_state(kv: &impl KvRead, chain: &str) -> Result<SyncState, Fatal> {
    Ok(
        load(kv, &keys::sync_state(chain), "sync state")?.unwrap_or(SyncState {
            next_nonce: 1,
            ..SyncState::default()
        }),
    )
}

/// Stores a hub chain's sync state.
pub fn put_sync_state(kv: &mut impl Kv, chain: &str, st: &SyncState) {
    kv.put(keys::sync_state(chain), st.encode_to_vec());
}

/// A batch by hub chain and nonce. A status no [`BatchStatus`] names is
/// corrupt.
pub fn batch(kv: &impl KvRead, chain: &str, nonce: u64) -> Result<Option<BatchRecord>, Fatal> {
    let b: Option<BatchRecord> = load(kv, &keys::batch(chain, nonce), "batch")?;
    match b {
        Some(b) if BatchStatus::try_from(b.status).is_err() => Err(Fatal::Corrupt("batch status")),
        b => Ok(b),
    }
}

/// A batch's status (stored batches always have a known one).
pub fn batch_status(b: &BatchRecord) -> Result<BatchStatus, Fatal> {
    BatchStatus::try_from(b.status).map_err(|_| Fatal::Corrupt("batch status"))
}

/// Stores a batch under `chain` and `nonce`.
pub fn put_batch(kv: &mut impl Kv, chain: &str, nonce: u64, b: &BatchRecord) {
    kv.put(keys::batch(chain, nonce), b.encode_to_vec());
}

/// A hub call by id (settled calls are deleted).
pub fn hub_call(kv: &impl KvRead, id: u64) -> Result<Option<HubCall>, Fatal> {
    load(kv, &keys::hub_call(id), "hub call")
}

/// Stores a new hub call and adds it to `chain`'s pending set.
pub fn put_pending_call(kv: &mut impl Kv, chain: &str, call: &HubCall) {
    kv.put(keys::hub_call(call.id), call.encode_to_vec());
    kv.put(keys::hub_pending(chain, call.id), keys::PRESENT.to_vec());
}

/// Takes a hub call out of `chain`'s pending set (it joined a batch).
pub fn unpend_call(kv: &mut impl Kv, chain: &str, id: u64) {
    kv.delete(keys::hub_pending(chain, id));
}

/// Deletes a settled hub call.
pub fn delete_hub_call(kv: &mut impl Kv, id: u64) {
    kv.delete(keys::hub_call(id));
}

/// Up to `limit` pending hub calls (not yet in a batch) after `after`, by
/// id.
pub fn pending_calls(
    kv: &impl KvRead,
    chain: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<HubCall>, Fatal> {
    let prefix = keys::hub_pending_prefix(chain);
    let start = match after {
        Some(id) => keys::hub_pending(chain, id.saturating_add(1)),
        None => prefix.clone(),
    };
    let rows = kv.scan(&start, &prefix_end(&prefix), limit)?;
    let mut out = Vec::with_capacity(rows.len());
    for (k, _) in rows {
        let id = keys::parse_hub_pending(&k, chain).ok_or(Fatal::Corrupt("pending index"))?;
        out.push(hub_call(kv, id)?.ok_or(Fatal::Corrupt("pending hub call"))?);
    }
    Ok(out)
}

/// The id the next hub call gets (1 at first).
pub fn next_call_id(kv: &impl KvRead) -> Result<u64, Fatal> {
    u64_or(kv, keys::NEXT_CALL_ID, 1)
}

/// Records the id the next hub call gets.
pub fn put_next_call_id(kv: &mut impl Kv, id: u64) {
    put_u64(kv, keys::NEXT_CALL_ID.to_vec(), id);
}

/// Where `chain`'s deposits continue (height 1, sequence 1 at first).
pub fn hub_cursor(kv: &impl KvRead, chain: &str) -> Result<HubCursor, Fatal> {
    Ok(HubCursor {
        height: u64_or(kv, &keys::hub_cursor(chain), 1)?,
        deposit_seq: u64_or(kv, &keys::deposit_seq(chain), 1)?,
    })
}

/// Moves `chain`'s deposit cursor to `height`.
pub fn put_hub_height(kv: &mut impl Kv, chain: &str, height: u64) {
    put_u64(kv, keys::hub_cursor(chain), height);
}

/// Sets the next deposit sequence number expected from `chain`.
pub fn put_deposit_seq(kv: &mut impl Kv, chain: &str, seq: u64) {
    put_u64(kv, keys::deposit_seq(chain), seq);
}

/// The threshold-signed hub block held at `(from_height, first_seq)` of
/// `chain`, if any (app version 5, ADR 0024).
pub fn held_block(
    kv: &impl KvRead,
    chain: &str,
    from_height: u64,
    first_seq: u64,
) -> Result<Option<HubBlock>, Fatal> {
    load(
        kv,
        &keys::hub_held(chain, from_height, first_seq),
        "held hub block",
    )
}

/// Holds the signed hub block `b` at `(from_height, first_seq)` until the
/// deposit cursor reaches it.
pub fn put_held_block(kv: &mut impl Kv, b: &HubBlock, first_seq: u64) {
    kv.put(
        keys::hub_held(&b.chain, b.from_height, first_seq),
        b.encode_to_vec(),
    );
}

/// Deletes `chain`'s held hub blocks below `(height, seq)`: the ones the
/// deposit cursor has reached or passed.
pub fn drop_held_blocks_below(kv: &mut impl Kv, chain: &str, height: u64, seq: u64) {
    kv.delete_range(
        keys::hub_held_prefix(chain),
        keys::hub_held(chain, height, seq),
    );
}

/// How many hub blocks `chain` holds ahead of its deposit cursor (at
/// most `limit`).
pub fn held_block_count(kv: &impl KvRead, chain: &str, limit: usize) -> Result<usize, Fatal> {
    Ok(kv.scan_prefix(&keys::hub_held_prefix(chain), limit)?.len())
}

/// Whether signer `index` has a partial stored for `digest`.
pub fn has_partial(kv: &impl KvRead, digest: &[u8], index: u32) -> Result<bool, Fatal> {
    Ok(kv.get(&keys::psig(digest, index))?.is_some())
}

/// Stores signer `index`'s partial (96 compressed bytes) for `digest`.
pub fn put_partial(kv: &mut impl Kv, digest: &[u8], index: u32, sig: &[u8]) {
    kv.put(keys::psig(digest, index), sig.to_vec());
}

/// Every stored partial of `digest`: signer index and signature bytes.
pub fn stored_partials(kv: &impl KvRead, digest: &[u8]) -> Result<Vec<(u32, Vec<u8>)>, Fatal> {
    let rows = kv.scan_prefix(&keys::psig_prefix(digest), usize::MAX)?;
    rows.into_iter()
        .map(|(k, v)| {
            keys::parse_psig_index(&k)
                .map(|i| (i, v))
                .ok_or(Fatal::Corrupt("psig key"))
        })
        .collect()
}

/// The message `digest`'s stored partials sign, if any are stored.
pub fn pending_message(kv: &impl KvRead, digest: &[u8]) -> Result<Option<PendingMessage>, Fatal> {
    load(kv, &keys::pmsg(digest), "pending message")
}

/// Records the message of `digest`'s first stored partials and when they
/// expire.
pub fn put_pending_message(kv: &mut impl Kv, digest: &[u8], m: &PendingMessage, expires: u64) {
    kv.put(keys::pmsg(digest), m.encode_to_vec());
    kv.put(keys::pexp(expires, digest), keys::PRESENT.to_vec());
}

/// Deletes `digest`'s partials, its message and its expiry entry (at
/// height `expires`).
pub fn delete_message(kv: &mut impl Kv, digest: &[u8], expires: u64) {
    kv.delete_prefix(&keys::psig_prefix(digest));
    kv.delete(keys::pmsg(digest));
    kv.delete(keys::pexp(expires, digest));
}

/// Deletes every stored partial signature (a new key epoch began: no
/// partial of the old key can ever combine with the new one's). The
/// messages and their expiry entries stay and expire as usual.
pub fn delete_all_partials(kv: &mut impl Kv) {
    kv.delete_range(keys::PSIG.to_vec(), prefix_end(keys::PSIG));
}

/// Deletes the partials and messages whose expiry is at or before
/// `height`: per message a range delete and a delete, then one range
/// delete of the expiry entries.
pub fn expire_messages_through(kv: &mut impl Kv, height: u64) -> Result<(), Fatal> {
    let start = keys::pexp_start();
    let end = keys::pexp_through(height);
    let mut digests = Vec::new();
    let mut bad = false;
    kv.for_each(&start, &end, &mut |k, _| {
        match keys::parse_pexp(k) {
            Some(d) => digests.push(d.to_vec()),
            None => bad = true,
        }
        !bad
    })?;
    if bad {
        return Err(Fatal::Corrupt("partial expiry key"));
    }
    if digests.is_empty() {
        return Ok(());
    }
    for d in &digests {
        kv.delete_prefix(&keys::psig_prefix(d));
        kv.delete(keys::pmsg(d));
    }
    kv.delete_range(start, end);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_store::{MemBackend, Pending};

    use super::*;

    #[test]
    fn corrupt_cursors_and_unknown_batch_statuses_are_fatal() {
        let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
        assert_eq!(
            hub_cursor(&kv, "hub").unwrap(),
            HubCursor {
                height: 1,
                deposit_seq: 1
            }
        );
        kv.put(keys::hub_cursor("hub"), vec![1]);
        assert!(matches!(
            hub_cursor(&kv, "hub"),
            Err(Fatal::Corrupt("integer"))
        ));
        let b = BatchRecord {
            status: 9,
            ..BatchRecord::default()
        };
        put_batch(&mut kv, "hub", 1, &b);
        assert!(matches!(
            batch(&kv, "hub", 1),
            Err(Fatal::Corrupt("batch status"))
        ));
    }
}

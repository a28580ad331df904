//! Settlement sync: closed windows become escrowed hub calls, batches are
//! threshold-signed through vote extensions, and each hub chain's attempts
//! follow `AsyncBatchState { last_sync, attempt }` with a backdated
//! `last_sync` on failure (the ~60 s cooldown).
//!
//! Everything here is deterministic and reads only state and block time.

use prost::Message;
use sha2::{Digest, Sha256};
use tally_store::{prefix_end, Kv, KvRead, StoreError};

use crate::bls::{self, Kind, Partial, PublicShares, SecretShare};
use crate::codes::{Code, Rejection};
use crate::genesis::{DkgGenesis, Params};
use crate::keys;
use crate::machine::{params, Block, Event, TxResult};
use crate::proto::{
    BatchRecord, HubBlock, HubCall, HubResult, PartialSig, PendingMessage, SubmitPartials,
    SyncState, SyncTxStart, VoteExtension,
};

/// Batch status values.
pub const BATCH_PENDING: u32 = 0;
/// The batch has its group signature.
pub const BATCH_SIGNED: u32 = 1;
/// The hub settled the batch.
pub const BATCH_SETTLED: u32 = 2;

/// Most partials one vote extension may carry.
pub const MAX_EXTENSION_PARTIALS: usize = 16;

pub(crate) const DKG: &[u8] = b"dkg";
const NEXT_CALL_ID: &[u8] = b"meta/next_call_id";
const HUB_CALL: &[u8] = b"hc/";
const HUB_PENDING: &[u8] = b"hcp/";
const BATCH: &[u8] = b"batch/";
const SYNC: &[u8] = b"sync/";
const PSIG: &[u8] = b"psig/";
const PMSG: &[u8] = b"pmsg/";
const PEXP: &[u8] = b"pexp/";
const HUB_CURSOR: &[u8] = b"hubcur/";
const DEPOSIT_SEQ: &[u8] = b"depseq/";

fn u64_at(kv: &impl KvRead, key: &[u8], default: u64) -> Result<u64, StoreError> {
    Ok(kv
        .get(key)?
        .and_then(|v| v.as_slice().try_into().ok().map(u64::from_be_bytes))
        .unwrap_or(default))
}

/// The next hub height a HubBlock must start at, and the next deposit
/// sequence number expected.
pub fn hub_cursor(kv: &impl KvRead, chain: &str) -> Result<(u64, u64), Rejection> {
    Ok((
        u64_at(kv, &keys::cat(&[HUB_CURSOR, chain.as_bytes()]), 1)?,
        u64_at(kv, &keys::cat(&[DEPOSIT_SEQ, chain.as_bytes()]), 1)?,
    ))
}

/// The digest validators sign for a hub block.
pub fn block_digest(b: &HubBlock) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tally/hub-block/v1");
    put_str(&mut h, &b.chain);
    h.update(b.from_height.to_be_bytes());
    h.update(b.to_height.to_be_bytes());
    h.update((b.deposits.len() as u64).to_be_bytes());
    for d in &b.deposits {
        h.update(d.seq.to_be_bytes());
        put_str(&mut h, &d.user);
        h.update(d.amount.to_be_bytes());
    }
    h.finalize().into()
}

fn hub_call_key(id: u64) -> Vec<u8> {
    keys::cat(&[HUB_CALL, &id.to_be_bytes()])
}
fn pending_prefix(chain: &str) -> Vec<u8> {
    keys::cat(&[HUB_PENDING, chain.as_bytes(), b"\0"])
}
fn pending_key(chain: &str, id: u64) -> Vec<u8> {
    keys::cat(&[&pending_prefix(chain), &id.to_be_bytes()])
}
fn batch_key(chain: &str, nonce: u64) -> Vec<u8> {
    keys::cat(&[BATCH, chain.as_bytes(), b"\0", &nonce.to_be_bytes()])
}
fn sync_key(chain: &str) -> Vec<u8> {
    keys::cat(&[SYNC, chain.as_bytes()])
}
/// `psig/<digest>/`: every stored partial of one message.
pub fn psig_prefix(digest: &[u8]) -> Vec<u8> {
    keys::cat(&[PSIG, digest, b"/"])
}
fn psig_key(digest: &[u8], index: u32) -> Vec<u8> {
    keys::cat(&[&psig_prefix(digest), &index.to_be_bytes()])
}
fn pmsg_key(digest: &[u8]) -> Vec<u8> {
    keys::cat(&[PMSG, digest])
}
fn pexp_key(height: u64, digest: &[u8]) -> Vec<u8> {
    keys::cat(&[PEXP, &height.to_be_bytes(), digest])
}

fn corrupt(what: &str) -> Rejection {
    Rejection::new(Code::Internal, format!("stored {what} is corrupt"))
}

fn load<M: Message + Default>(
    kv: &impl KvRead,
    key: &[u8],
    what: &str,
) -> Result<Option<M>, Rejection> {
    match kv.get(key)? {
        None => Ok(None),
        Some(b) => M::decode(b.as_slice()).map(Some).map_err(|_| corrupt(what)),
    }
}

/// The threshold key from genesis, if the chain has one.
pub fn dkg(kv: &impl KvRead) -> Result<Option<(DkgGenesis, PublicShares)>, Rejection> {
    match kv.get(DKG)? {
        None => Ok(None),
        Some(b) => parse_dkg(&b).map(Some),
    }
}

/// Parses the stored threshold key, remembering the last one parsed: the
/// key is written once at genesis and read on every proposal and vote
/// extension, and checking n public keys (curve points) costs milliseconds
/// each time. A pure memo of the stored bytes, so every node still derives
/// the same result from the same state.
fn parse_dkg(b: &[u8]) -> Result<(DkgGenesis, PublicShares), Rejection> {
    type Memo = Option<(Vec<u8>, DkgGenesis, PublicShares)>;
    static MEMO: std::sync::Mutex<Memo> = std::sync::Mutex::new(None);
    let mut memo = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((bytes, d, p)) = memo.as_ref() {
        if bytes.as_slice() == b {
            return Ok((d.clone(), p.clone()));
        }
    }
    let d: DkgGenesis = serde_json::from_slice(b).map_err(|_| corrupt("dkg"))?;
    let p = d.public_shares().map_err(|_| corrupt("dkg keys"))?;
    *memo = Some((b.to_vec(), d.clone(), p.clone()));
    Ok((d, p))
}

/// A hub chain's sync state (zeroes before the first attempt).
pub fn sync_state(kv: &impl KvRead, chain: &str) -> Result<SyncState, Rejection> {
    Ok(
        load(kv, &sync_key(chain), "sync state")?.unwrap_or(SyncState {
            next_nonce: 1,
            ..SyncState::default()
        }),
    )
}

/// A batch by nonce.
pub fn batch(kv: &impl KvRead, chain: &str, nonce: u64) -> Result<Option<BatchRecord>, Rejection> {
    load(kv, &batch_key(chain, nonce), "batch")
}

/// A hub call by id (settled calls are deleted).
pub fn hub_call(kv: &impl KvRead, id: u64) -> Result<Option<HubCall>, Rejection> {
    load(kv, &hub_call_key(id), "hub call")
}

/// Up to `limit` pending hub calls (not yet in a batch) after `after`.
pub fn pending_calls(
    kv: &impl KvRead,
    chain: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<HubCall>, Rejection> {
    let prefix = pending_prefix(chain);
    let start = match after {
        Some(id) => keys::cat(&[&prefix, &(id.saturating_add(1)).to_be_bytes()]),
        None => prefix.clone(),
    };
    let rows = kv.scan(&start, &prefix_end(&prefix), limit)?;
    let mut out = Vec::with_capacity(rows.len());
    for (k, _) in rows {
        let id = u64::from_be_bytes(
            k[prefix.len()..]
                .try_into()
                .map_err(|_| corrupt("pending index"))?,
        );
        out.push(hub_call(kv, id)?.ok_or_else(|| corrupt("pending hub call"))?);
    }
    Ok(out)
}

/// `is_hub_sync_running(now)`: an attempt exists and started (or was
/// backdated to) no more than `sync_window_secs` ago.
pub fn is_running(st: &SyncState, now: u64, p: &Params) -> bool {
    st.attempt > 0 && now.saturating_sub(st.last_sync) <= p.sync_window_secs
}

/// Earliest block time a new attempt may start, if one is running.
pub fn next_attempt_not_before(st: &SyncState, p: &Params) -> Option<u64> {
    (st.attempt > 0).then(|| {
        st.last_sync
            .saturating_add(p.sync_window_secs)
            .saturating_add(1)
    })
}

/// The digest validators sign for a batch (layout in `docs/signing.md`).
pub fn batch_digest(chain: &str, nonce: u64, calls: &[HubCall]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tally/batch/v1");
    put_str(&mut h, chain);
    h.update(nonce.to_be_bytes());
    h.update((calls.len() as u64).to_be_bytes());
    for c in calls {
        h.update(c.id.to_be_bytes());
        put_str(&mut h, &c.user);
        put_str(&mut h, &c.provider);
        h.update(c.amount.to_be_bytes());
        h.update(c.window.to_be_bytes());
    }
    h.finalize().into()
}

/// The digest validators sign for a hub result.
pub fn result_digest(r: &HubResult) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tally/hub-result/v1");
    put_str(&mut h, &r.chain);
    h.update(r.nonce.to_be_bytes());
    h.update(r.attempt.to_be_bytes());
    h.update([u8::from(r.settled)]);
    h.finalize().into()
}

fn put_str(h: &mut Sha256, s: &str) {
    h.update([s.len().min(255) as u8]);
    h.update(&s.as_bytes()[..s.len().min(255)]);
}

/// Stores the genesis threshold key.
pub(crate) fn init(kv: &mut impl Kv, d: &DkgGenesis) -> Result<(), Rejection> {
    let b = serde_json::to_vec(d).map_err(|e| Rejection::new(Code::Internal, e.to_string()))?;
    kv.put(DKG.to_vec(), b);
    Ok(())
}

/// Window `w` closed: what each user owes each provider becomes a hub call,
/// escrowed (the credits already left the user's balance).
pub(crate) fn close_window(kv: &mut impl Kv, w: u64, chain: &str) -> Result<u64, StoreError> {
    let prefix = keys::cat(&[keys::OWED, &w.to_be_bytes(), b"/"]);
    let rows = kv.scan(&prefix, &prefix_end(&prefix), usize::MAX)?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut next = kv
        .get(NEXT_CALL_ID)?
        .and_then(|v| v.as_slice().try_into().ok().map(u64::from_be_bytes))
        .unwrap_or(1);
    let mut made = 0;
    for (k, v) in rows {
        let rest = &k[prefix.len()..];
        let Some(sep) = rest.iter().position(|b| *b == 0) else {
            return Err(StoreError::Corrupt("owed key".into()));
        };
        let amount = u64::from_be_bytes(
            v.as_slice()
                .try_into()
                .map_err(|_| StoreError::Corrupt("owed amount".into()))?,
        );
        let call = HubCall {
            id: next,
            provider: String::from_utf8_lossy(&rest[..sep]).into_owned(),
            user: String::from_utf8_lossy(&rest[sep + 1..]).into_owned(),
            amount,
            window: w,
        };
        kv.put(hub_call_key(next), call.encode_to_vec());
        kv.put(pending_key(chain, next), Vec::new());
        next += 1;
        made += 1;
    }
    kv.put(NEXT_CALL_ID.to_vec(), next.to_be_bytes().to_vec());
    kv.delete_prefix(&prefix);
    Ok(made)
}

/// Partials of messages that never reached the threshold in
/// `partial_expiry_blocks` are deleted (range deletes).
pub(crate) fn expire_partials(kv: &mut impl Kv, height: u64) -> Result<(), StoreError> {
    let start = PEXP.to_vec();
    let end = keys::cat(&[PEXP, &height.saturating_add(1).to_be_bytes()]);
    let mut digests = Vec::new();
    kv.for_each(&start, &end, &mut |k, _| {
        digests.push(k[PEXP.len() + 8..].to_vec());
        true
    })?;
    if digests.is_empty() {
        return Ok(());
    }
    for d in &digests {
        kv.delete_prefix(&psig_prefix(d));
        kv.delete(pmsg_key(d));
    }
    kv.delete_range(start, end);
    Ok(())
}

/// What the proposer must put first in a block at `now`, if anything: a
/// new attempt for the unsettled batch, or a new batch of the oldest
/// pending calls. `None` while a sync runs or nothing is pending, or
/// without a threshold key.
pub fn next_sync_start(kv: &impl KvRead, now: u64) -> Result<Option<SyncTxStart>, Rejection> {
    if dkg(kv)?.is_none() {
        return Ok(None);
    }
    let p = params(kv)?;
    let chain = p.hub_chain.clone();
    let st = sync_state(kv, &chain)?;
    if is_running(&st, now, &p) {
        return Ok(None);
    }
    if st.current_nonce != 0 {
        let b = batch(kv, &chain, st.current_nonce)?.ok_or_else(|| corrupt("current batch"))?;
        return Ok(Some(SyncTxStart {
            chain,
            batch_nonce: b.nonce,
            call_ids: b.call_ids,
            digest: b.digest,
        }));
    }
    let calls = pending_calls(kv, &chain, None, p.max_batch_calls as usize)?;
    if calls.is_empty() {
        return Ok(None);
    }
    let nonce = st.next_nonce.max(1);
    Ok(Some(SyncTxStart {
        digest: batch_digest(&chain, nonce, &calls).to_vec(),
        chain,
        batch_nonce: nonce,
        call_ids: calls.iter().map(|c| c.id).collect(),
    }))
}

fn bad_system(msg: impl Into<String>) -> Rejection {
    Rejection::new(Code::BadSystemTx, msg)
}

/// FinalizeTx(SyncTxStart): `last_sync = now`, attempt recorded; a new
/// batch takes its calls out of the pending set, with the next nonce.
pub(crate) fn apply_start(
    kv: &mut impl Kv,
    block: &Block,
    tx: &SyncTxStart,
) -> Result<TxResult, Rejection> {
    let want = next_sync_start(kv, block.time)?.ok_or_else(|| {
        bad_system("no sync may start now (one is running, or nothing is pending)")
    })?;
    if &want != tx {
        return Err(bad_system(format!(
            "SyncTxStart does not match state: want nonce {} with {} calls",
            want.batch_nonce,
            want.call_ids.len()
        )));
    }
    let mut st = sync_state(kv, &tx.chain)?;
    if st.current_nonce == 0 {
        let mut total = 0u64;
        for id in &tx.call_ids {
            let c = hub_call(kv, *id)?.ok_or_else(|| corrupt("hub call"))?;
            total = total.saturating_add(c.amount);
            kv.delete(pending_key(&tx.chain, *id));
        }
        let b = BatchRecord {
            chain: tx.chain.clone(),
            nonce: tx.batch_nonce,
            call_ids: tx.call_ids.clone(),
            digest: tx.digest.clone(),
            status: BATCH_PENDING,
            signature: Vec::new(),
            formed_height: block.height,
            total,
        };
        kv.put(batch_key(&tx.chain, tx.batch_nonce), b.encode_to_vec());
        st.current_nonce = tx.batch_nonce;
        st.next_nonce = tx.batch_nonce + 1;
        st.attempt = 0;
        st.failed_attempt = 0;
    }
    st.attempt += 1;
    st.attempts_total += 1;
    st.last_sync = block.time;
    kv.put(sync_key(&tx.chain), st.encode_to_vec());
    Ok(TxResult {
        code: Code::Ok,
        log: format!(
            "sync attempt {} of batch {} on {} ({} calls)",
            st.attempt,
            tx.batch_nonce,
            tx.chain,
            tx.call_ids.len()
        ),
        events: vec![Event {
            kind: "sync_start".into(),
            attrs: vec![
                ("chain".into(), tx.chain.clone()),
                ("nonce".into(), tx.batch_nonce.to_string()),
                ("attempt".into(), st.attempt.to_string()),
                ("retry_layer".into(), "settlement".into()),
            ],
        }],
    })
}

/// A message the chain is waiting for: its kind, digest and signed bytes.
type Known = (Kind, [u8; 32], Vec<u8>);

/// Partials of one message being applied: kind, signed bytes, the hub
/// result (for results) and the partials.
type Group = (
    Kind,
    Vec<u8>,
    (Option<HubResult>, Option<HubBlock>),
    Vec<Partial>,
);

/// A partial's message, if the chain is waiting for it.
fn recognize(kv: &impl KvRead, chain_id: &str, p: &PartialSig) -> Result<Option<Known>, Rejection> {
    let Ok(digest) = <[u8; 32]>::try_from(p.digest.as_slice()) else {
        return Ok(None);
    };
    let params = params(kv)?;
    let st = sync_state(kv, &params.hub_chain)?;
    let kind = match p.kind {
        1 => {
            if st.current_nonce == 0 {
                return Ok(None);
            }
            let b = batch(kv, &params.hub_chain, st.current_nonce)?
                .ok_or_else(|| corrupt("current batch"))?;
            if b.status != BATCH_PENDING || b.digest != p.digest {
                return Ok(None);
            }
            Kind::Batch
        }
        2 => {
            let Some(r) = &p.hub_result else {
                return Ok(None);
            };
            let current =
                r.chain == params.hub_chain && st.current_nonce != 0 && r.nonce == st.current_nonce;
            let attempt_ok = if r.settled {
                r.attempt <= st.attempt
            } else {
                r.attempt == st.attempt && st.failed_attempt < r.attempt
            };
            if !current || !attempt_ok || result_digest(r) != digest {
                return Ok(None);
            }
            Kind::HubResult
        }
        3 => {
            let Some(b) = &p.hub_block else {
                return Ok(None);
            };
            let (cursor, next_seq) = hub_cursor(kv, &params.hub_chain)?;
            let fixed = b.chain == params.hub_chain
                && b.from_height == cursor
                && b.to_height == cursor + params.hub_block_range - 1;
            let gap_free = b.deposits.iter().enumerate().all(|(i, d)| {
                d.seq == next_seq + i as u64
                    && d.amount > 0
                    && crate::ident::check_party("user", &d.user).is_ok()
            });
            if !fixed || !gap_free || block_digest(b) != digest {
                return Ok(None);
            }
            Kind::HubBlock
        }
        _ => return Ok(None),
    };
    Ok(Some((kind, digest, bls::message(chain_id, kind, &digest))))
}

/// The partials a validator with `share` should sign now: the digest of a
/// batch in the block being voted on (`proposed`), the current unsigned
/// batch, and the hub results the relay observed (`observed`).
pub fn extension(
    kv: &impl KvRead,
    chain_id: &str,
    share: &SecretShare,
    proposed: &[SyncTxStart],
    observed: &[HubResult],
    blocks: &[HubBlock],
) -> Result<VoteExtension, Rejection> {
    let mut out = VoteExtension::default();
    let Some((_, pubs)) = dkg(kv)? else {
        return Ok(out);
    };
    if pubs.share(share.index).is_none() {
        return Ok(out);
    }
    let params = params(kv)?;
    let st = sync_state(kv, &params.hub_chain)?;
    let mut digests: Vec<[u8; 32]> = Vec::new();
    for s in proposed {
        if let Ok(d) = <[u8; 32]>::try_from(s.digest.as_slice()) {
            let signed =
                batch(kv, &s.chain, s.batch_nonce)?.is_some_and(|b| b.status != BATCH_PENDING);
            if !signed {
                digests.push(d);
            }
        }
    }
    if st.current_nonce != 0 {
        if let Some(b) = batch(kv, &params.hub_chain, st.current_nonce)? {
            if b.status == BATCH_PENDING {
                if let Ok(d) = <[u8; 32]>::try_from(b.digest.as_slice()) {
                    digests.push(d);
                }
            }
        }
    }
    digests.sort_unstable();
    digests.dedup();
    for d in digests {
        if kv.get(&psig_key(&d, share.index))?.is_some() {
            continue; // already on chain
        }
        let sig = share.sign(&bls::message(chain_id, Kind::Batch, &d));
        out.partials.push(PartialSig {
            index: share.index,
            kind: Kind::Batch as u32,
            digest: d.to_vec(),
            signature: sig.sig_bytes().to_vec(),
            hub_result: None,
            hub_block: None,
        });
    }
    for b in blocks {
        let d = block_digest(b);
        let p = PartialSig {
            index: share.index,
            kind: Kind::HubBlock as u32,
            digest: d.to_vec(),
            signature: Vec::new(),
            hub_result: None,
            hub_block: Some(b.clone()),
        };
        if recognize(kv, chain_id, &p)?.is_none() || kv.get(&psig_key(&d, share.index))?.is_some() {
            continue;
        }
        let sig = share.sign(&bls::message(chain_id, Kind::HubBlock, &d));
        out.partials.push(PartialSig {
            signature: sig.sig_bytes().to_vec(),
            ..p
        });
    }
    for r in observed {
        let d = result_digest(r);
        let p = PartialSig {
            index: share.index,
            kind: Kind::HubResult as u32,
            digest: d.to_vec(),
            signature: Vec::new(),
            hub_result: Some(r.clone()),
            hub_block: None,
        };
        if recognize(kv, chain_id, &p)?.is_none() || kv.get(&psig_key(&d, share.index))?.is_some() {
            continue;
        }
        let sig = share.sign(&bls::message(chain_id, Kind::HubResult, &d));
        out.partials.push(PartialSig {
            signature: sig.sig_bytes().to_vec(),
            ..p
        });
    }
    out.partials.truncate(MAX_EXTENSION_PARTIALS);
    Ok(out)
}

/// Structural check of a vote extension (VerifyVoteExtension): decodes,
/// at most [`MAX_EXTENSION_PARTIALS`] partials, indices in range, valid
/// points, 32-byte digests, known kinds.
pub fn extension_well_formed(kv: &impl KvRead, bytes: &[u8]) -> bool {
    if bytes.is_empty() {
        return true;
    }
    let Ok(ext) = VoteExtension::decode(bytes) else {
        return false;
    };
    if ext.partials.len() > MAX_EXTENSION_PARTIALS {
        return false;
    }
    let n = match dkg(kv) {
        Ok(Some((_, p))) => p.shares.len() as u32,
        _ => return ext.partials.is_empty(),
    };
    ext.partials.iter().all(|p| {
        (1..=n).contains(&p.index)
            && (1..=3).contains(&p.kind)
            && p.digest.len() == 32
            && Partial::from_bytes(p.index, &p.signature).is_ok()
    })
}

/// PrepareProposal: the valid, new partials among the last commit's vote
/// extensions, de-duplicated, as one system transaction (or `None`).
pub fn collect_partials(
    kv: &impl KvRead,
    chain_id: &str,
    extensions: &[Vec<u8>],
) -> Result<Option<SubmitPartials>, Rejection> {
    let Some((_, pubs)) = dkg(kv)? else {
        return Ok(None);
    };
    let mut by_digest: std::collections::BTreeMap<[u8; 32], (Vec<u8>, Vec<PartialSig>)> =
        Default::default();
    for e in extensions {
        let Ok(ext) = VoteExtension::decode(e.as_slice()) else {
            continue;
        };
        for p in ext.partials.into_iter().take(MAX_EXTENSION_PARTIALS) {
            let Some((_, digest, msg)) = recognize(kv, chain_id, &p)? else {
                continue;
            };
            if pubs.share(p.index).is_none() || kv.get(&psig_key(&digest, p.index))?.is_some() {
                continue;
            }
            let entry = by_digest.entry(digest).or_insert_with(|| (msg, Vec::new()));
            if entry.1.iter().all(|q| q.index != p.index) {
                entry.1.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for (_, (msg, ps)) in by_digest {
        let parsed: Vec<(PartialSig, Partial)> = ps
            .into_iter()
            .filter_map(|p| {
                Partial::from_bytes(p.index, &p.signature)
                    .ok()
                    .map(|q| (p, q))
            })
            .collect();
        let sigs: Vec<Partial> = parsed.iter().map(|(_, q)| q.clone()).collect();
        let bad = pubs.invalid_partials(&msg, &sigs);
        out.extend(
            parsed
                .into_iter()
                .enumerate()
                .filter(|(i, _)| !bad.contains(i))
                .map(|(_, (p, _))| p),
        );
    }
    Ok((!out.is_empty()).then_some(SubmitPartials { partials: out }))
}

/// FinalizeTx(SubmitPartials): stores each new valid partial under
/// `psig/<digest>/<index>`; at the threshold combines, verifies, acts and
/// range-deletes the message's partials. With `strict`, any partial that
/// is not valid and new refuses the whole transaction (ProcessProposal).
pub(crate) fn apply_partials(
    kv: &mut impl Kv,
    block: &Block,
    chain_id: &str,
    tx: &SubmitPartials,
    strict: bool,
) -> Result<TxResult, Rejection> {
    let (_, pubs) = dkg(kv)?.ok_or_else(|| bad_system("the chain has no threshold key"))?;
    let p = params(kv)?;
    let mut groups: std::collections::BTreeMap<[u8; 32], Group> = Default::default();
    let mut ignored = 0usize;
    for ps in &tx.partials {
        let known = recognize(kv, chain_id, ps)?;
        let parsed = Partial::from_bytes(ps.index, &ps.signature).ok();
        let fresh = match &known {
            Some((_, d, _)) => {
                kv.get(&psig_key(d, ps.index))?.is_none() && pubs.share(ps.index).is_some()
            }
            None => false,
        };
        match (known, parsed, fresh) {
            (Some((kind, d, msg)), Some(q), true) => {
                let g = groups.entry(d).or_insert_with(|| {
                    (
                        kind,
                        msg,
                        (ps.hub_result.clone(), ps.hub_block.clone()),
                        Vec::new(),
                    )
                });
                if g.3.iter().any(|x| x.index == q.index) {
                    if strict {
                        return Err(bad_system(format!(
                            "partial of signer {} appears twice",
                            q.index
                        )));
                    }
                    ignored += 1;
                } else {
                    g.3.push(q);
                }
            }
            _ => {
                if strict {
                    return Err(bad_system(format!(
                        "partial of signer {} is not for a message the chain is waiting for, or already stored",
                        ps.index
                    )));
                }
                ignored += 1;
            }
        }
    }
    let mut events = Vec::new();
    let mut stored = 0usize;
    // Batches first, then results; each message is checked again against
    // the state the previous ones left (acting on one can retire another).
    let mut ordered: Vec<([u8; 32], Group)> = groups.into_iter().collect();
    ordered.sort_by_key(|(d, g)| (g.0, *d));
    for (digest, (kind, msg, (hub_result, hub_block), parts)) in ordered {
        let rep = PartialSig {
            index: 0,
            kind: kind as u32,
            digest: digest.to_vec(),
            signature: Vec::new(),
            hub_result: hub_result.clone(),
            hub_block: hub_block.clone(),
        };
        if recognize(kv, chain_id, &rep)?.is_none() {
            ignored += parts.len();
            continue;
        }
        let bad = pubs.invalid_partials(&msg, &parts);
        if strict && !bad.is_empty() {
            return Err(bad_system(format!(
                "{} partial signature(s) do not verify",
                bad.len()
            )));
        }
        ignored += bad.len();
        for (i, q) in parts.iter().enumerate() {
            if !bad.contains(&i) {
                kv.put(psig_key(&digest, q.index), q.sig_bytes().to_vec());
                stored += 1;
            }
        }
        if kv.get(&pmsg_key(&digest))?.is_none() {
            let m = PendingMessage {
                kind: kind as u32,
                first_height: block.height,
                hub_result: hub_result.clone(),
                hub_block: hub_block.clone(),
            };
            kv.put(pmsg_key(&digest), m.encode_to_vec());
            kv.put(
                pexp_key(block.height + p.partial_expiry_blocks, &digest),
                Vec::new(),
            );
        }
        // Threshold reached?
        let rows = kv.scan_prefix(&psig_prefix(&digest), usize::MAX)?;
        if rows.len() < pubs.threshold as usize {
            continue;
        }
        let mut all = Vec::with_capacity(rows.len());
        for (k, v) in rows {
            let idx = u32::from_be_bytes(
                k[k.len() - 4..]
                    .try_into()
                    .map_err(|_| corrupt("psig key"))?,
            );
            all.push(Partial::from_bytes(idx, &v).map_err(|_| corrupt("stored partial"))?);
        }
        let sig = match pubs.combine(&msg, &all) {
            Ok(s) => s,
            Err(e) => {
                events.push(Event {
                    kind: "combine_failed".into(),
                    attrs: vec![
                        ("digest".into(), hex::encode(digest)),
                        ("error".into(), e.to_string()),
                    ],
                });
                continue;
            }
        };
        let pm: PendingMessage = load(kv, &pmsg_key(&digest), "pending message")?
            .ok_or_else(|| corrupt("pending message"))?;
        kv.delete_prefix(&psig_prefix(&digest));
        kv.delete(pmsg_key(&digest));
        kv.delete(pexp_key(pm.first_height + p.partial_expiry_blocks, &digest));
        match kind {
            Kind::Batch => events.extend(batch_signed(kv, &p, &digest, &sig.compress())?),
            Kind::HubResult => {
                if let Some(r) = hub_result {
                    events.push(hub_sync_end(kv, block, &p, &r)?);
                }
            }
            Kind::HubBlock => {
                if let Some(b) = hub_block {
                    events.push(credit_deposits(kv, &b)?);
                }
            }
        }
    }
    Ok(TxResult {
        code: Code::Ok,
        log: format!("{stored} partial signature(s) stored, {ignored} ignored"),
        events,
    })
}

fn batch_signed(
    kv: &mut impl Kv,
    p: &Params,
    digest: &[u8; 32],
    sig: &[u8],
) -> Result<Option<Event>, Rejection> {
    let st = sync_state(kv, &p.hub_chain)?;
    if st.current_nonce == 0 {
        return Ok(None);
    }
    let mut b =
        batch(kv, &p.hub_chain, st.current_nonce)?.ok_or_else(|| corrupt("current batch"))?;
    if b.digest != digest || b.status != BATCH_PENDING {
        return Ok(None);
    }
    b.status = BATCH_SIGNED;
    b.signature = sig.to_vec();
    kv.put(batch_key(&p.hub_chain, b.nonce), b.encode_to_vec());
    Ok(Some(Event {
        kind: "batch_signed".into(),
        attrs: vec![
            ("chain".into(), b.chain),
            ("nonce".into(), b.nonce.to_string()),
        ],
    }))
}

/// A hub block signed by t validators: its deposits are credited once and
/// the cursor moves past it (an empty range moves it too).
fn credit_deposits(kv: &mut impl Kv, b: &HubBlock) -> Result<Event, Rejection> {
    let mut credited = 0u64;
    for d in &b.deposits {
        let key = keys::balance(&d.user);
        let bal = crate::machine::balance(kv, &d.user)?.saturating_add(d.amount);
        kv.put(key, bal.to_be_bytes().to_vec());
        credited = credited.saturating_add(d.amount);
    }
    let next_seq = b.deposits.last().map(|d| d.seq + 1);
    kv.put(
        keys::cat(&[HUB_CURSOR, b.chain.as_bytes()]),
        (b.to_height + 1).to_be_bytes().to_vec(),
    );
    if let Some(n) = next_seq {
        kv.put(
            keys::cat(&[DEPOSIT_SEQ, b.chain.as_bytes()]),
            n.to_be_bytes().to_vec(),
        );
    }
    Ok(Event {
        kind: "hub_deposits".into(),
        attrs: vec![
            ("chain".into(), b.chain.clone()),
            ("from_height".into(), b.from_height.to_string()),
            ("to_height".into(), b.to_height.to_string()),
            ("deposits".into(), b.deposits.len().to_string()),
            ("credited".into(), credited.to_string()),
        ],
    })
}

/// HubSyncEnd(chain, ids, ok).
fn hub_sync_end(
    kv: &mut impl Kv,
    block: &Block,
    p: &Params,
    r: &HubResult,
) -> Result<Event, Rejection> {
    let mut st = sync_state(kv, &r.chain)?;
    st.last_result_at = block.time;
    let outcome;
    if r.settled {
        let mut b = batch(kv, &r.chain, r.nonce)?.ok_or_else(|| corrupt("settled batch"))?;
        for id in &b.call_ids {
            kv.delete(hub_call_key(*id));
        }
        b.status = BATCH_SETTLED;
        kv.put(batch_key(&r.chain, r.nonce), b.encode_to_vec());
        st.current_nonce = 0;
        st.attempt = 0;
        st.last_sync = block.time;
        st.settled_batches += 1;
        st.last_error.clear();
        outcome = "settled";
    } else {
        st.last_sync = block.time.saturating_sub(p.failure_backdate_secs);
        st.failures += 1;
        st.failed_attempt = r.attempt;
        st.last_error = format!(
            "attempt {} of batch {} failed on hub {}",
            r.attempt, r.nonce, r.chain
        );
        outcome = "failed";
    }
    kv.put(sync_key(&r.chain), st.encode_to_vec());
    Ok(Event {
        kind: "hub_sync_end".into(),
        attrs: vec![
            ("chain".into(), r.chain.clone()),
            ("nonce".into(), r.nonce.to_string()),
            ("attempt".into(), r.attempt.to_string()),
            ("outcome".into(), outcome.into()),
            ("retry_layer".into(), "settlement".into()),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored_dkg(seed: u8) -> (Vec<u8>, PublicShares) {
        let randomness: Vec<[u8; 64]> = (0..2).map(|i| [seed.wrapping_add(i); 64]).collect();
        let (pubs, _) = crate::bls::deal(3, 2, &randomness).unwrap();
        let d = DkgGenesis {
            threshold: 2,
            group_key: hex::encode(pubs.group.compress()),
            public_shares: pubs
                .shares
                .iter()
                .map(|k| hex::encode(k.compress()))
                .collect(),
        };
        (serde_json::to_vec(&d).unwrap(), pubs)
    }

    #[test]
    fn the_dkg_memo_follows_the_stored_bytes() {
        let (a, pubs_a) = stored_dkg(1);
        let (b, pubs_b) = stored_dkg(2);
        assert_ne!(pubs_a, pubs_b);
        for _ in 0..2 {
            assert_eq!(parse_dkg(&a).unwrap().1, pubs_a);
            assert_eq!(parse_dkg(&b).unwrap().1, pubs_b);
        }
        // Corrupt bytes are refused and do not poison the memo.
        assert!(parse_dkg(b"{}").is_err());
        let mut bad = a.clone();
        let at = bad.len() / 2;
        bad[at] ^= 1;
        assert!(parse_dkg(&bad).is_err() || parse_dkg(&bad).unwrap().1 != pubs_a);
        assert_eq!(parse_dkg(&a).unwrap().1, pubs_a);
    }
}

//! Vote extensions carry partial threshold signatures: ExtendVote signs
//! what the chain waits for ([`extension`]), VerifyVoteExtension checks
//! only the structure ([`extension_well_formed`]), and the next proposer
//! gathers the valid, new partials of the last commit's extensions into one
//! SubmitPartials system transaction ([`collect_partials`]).

use std::collections::BTreeMap;

use prost::Message;
use tally_store::KvRead;

use super::awaited::recognize;
use super::digest::{block_digest, result_digest};
use crate::bls::{self, Kind, Partial, SecretShare};
use crate::error::Fatal;
use crate::proto::{HubBlock, HubResult, PartialSig, SubmitPartials, SyncTxStart, VoteExtension};
use crate::state::chain::params;
use crate::state::sync::{batch, batch_status, has_partial, sync_state, threshold_key};
use crate::types::BatchStatus;

/// Most partials one vote extension may carry.
pub const MAX_EXTENSION_PARTIALS: usize = 16;

/// The partials a validator with `share` should sign now: the digest of a
/// batch in the block being voted on (`proposed`), the current unsigned
/// batch, the hub blocks (`blocks`) and hub results (`observed`) the relay
/// handed in, each only while the chain waits for it and this signer has
/// no partial stored for it.
pub fn extension(
    kv: &impl KvRead,
    chain_id: &str,
    share: &SecretShare,
    proposed: &[SyncTxStart],
    observed: &[HubResult],
    blocks: &[HubBlock],
) -> Result<VoteExtension, Fatal> {
    let mut out = VoteExtension::default();
    let Some(key) = threshold_key(kv)? else {
        return Ok(out);
    };
    if key.shares.share(share.index).is_none() {
        return Ok(out);
    }
    let params = params(kv)?;
    let st = sync_state(kv, &params.hub_chain)?;
    let mut digests: Vec<[u8; 32]> = Vec::new();
    for s in proposed {
        if let Ok(d) = <[u8; 32]>::try_from(s.digest.as_slice()) {
            let signed = match batch(kv, &s.chain, s.batch_nonce)? {
                Some(b) => batch_status(&b)? != BatchStatus::Pending,
                None => false,
            };
            if !signed {
                digests.push(d);
            }
        }
    }
    if st.current_nonce != 0 {
        if let Some(b) = batch(kv, &params.hub_chain, st.current_nonce)? {
            if batch_status(&b)? == BatchStatus::Pending {
                if let Ok(d) = <[u8; 32]>::try_from(b.digest.as_slice()) {
                    digests.push(d);
                }
            }
        }
    }
    digests.sort_unstable();
    digests.dedup();
    for d in digests {
        if has_partial(kv, &d, share.index)? {
            continue; // already on chain
        }
        let sig = share.sign(&bls::message(chain_id, Kind::Batch, &d));
        out.partials.push(PartialSig {
            index: share.index,
            kind: Kind::Batch.value(),
            digest: d.to_vec(),
            signature: sig.sig_bytes().to_vec(),
            hub_result: None,
            hub_block: None,
        });
    }
    for b in blocks {
        let unsigned = PartialSig {
            index: share.index,
            kind: Kind::HubBlock.value(),
            digest: block_digest(b).to_vec(),
            signature: Vec::new(),
            hub_result: None,
            hub_block: Some(b.clone()),
        };
        push_signed(kv, chain_id, share, unsigned, &mut out)?;
    }
    for r in observed {
        let unsigned = PartialSig {
            index: share.index,
            kind: Kind::HubResult.value(),
            digest: result_digest(r).to_vec(),
            signature: Vec::new(),
            hub_result: Some(r.clone()),
            hub_block: None,
        };
        push_signed(kv, chain_id, share, unsigned, &mut out)?;
    }
    out.partials.truncate(MAX_EXTENSION_PARTIALS);
    Ok(out)
}

/// Signs `unsigned` and adds it to `out` if the chain waits for its
/// message and this signer has no partial stored for it.
fn push_signed(
    kv: &impl KvRead,
    chain_id: &str,
    share: &SecretShare,
    unsigned: PartialSig,
    out: &mut VoteExtension,
) -> Result<(), Fatal> {
    let Some(a) = recognize(kv, chain_id, &unsigned)? else {
        return Ok(());
    };
    if has_partial(kv, &a.digest, share.index)? {
        return Ok(());
    }
    let sig = share.sign(&a.message);
    out.partials.push(PartialSig {
        signature: sig.sig_bytes().to_vec(),
        ..unsigned
    });
    Ok(())
}

/// Structural check of a vote extension (VerifyVoteExtension): decodes,
/// at most [`MAX_EXTENSION_PARTIALS`] partials, indices in range, valid
/// points, 32-byte digests, known kinds. Empty bytes pass; without a
/// threshold key (or if it cannot be read) only an empty extension passes.
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
    let n = match threshold_key(kv) {
        Ok(Some(key)) => key.shares.shares.len() as u32,
        _ => return ext.partials.is_empty(),
    };
    ext.partials.iter().all(|p| {
        (1..=n).contains(&p.index)
            && Kind::try_from(p.kind).is_ok()
            && p.digest.len() == 32
            && Partial::from_bytes(p.index, &p.signature).is_ok()
    })
}

/// The partials gathered for one message.
struct Harvest {
    /// The signed bytes.
    message: Vec<u8>,
    /// One partial per signer, first seen kept.
    partials: Vec<PartialSig>,
}

/// PrepareProposal: the valid, new partials among the last commit's vote
/// extensions, de-duplicated, as one system transaction (or `None`).
/// Undecodable extensions and partials the chain does not wait for are
/// skipped.
pub fn collect_partials(
    kv: &impl KvRead,
    chain_id: &str,
    extensions: &[Vec<u8>],
) -> Result<Option<SubmitPartials>, Fatal> {
    let Some(key) = threshold_key(kv)? else {
        return Ok(None);
    };
    let pubs = key.shares;
    let mut by_digest: BTreeMap<[u8; 32], Harvest> = BTreeMap::new();
    for e in extensions {
        let Ok(ext) = VoteExtension::decode(e.as_slice()) else {
            continue;
        };
        for p in ext.partials.into_iter().take(MAX_EXTENSION_PARTIALS) {
            let Some(a) = recognize(kv, chain_id, &p)? else {
                continue;
            };
            if pubs.share(p.index).is_none() || has_partial(kv, &a.digest, p.index)? {
                continue;
            }
            let h = by_digest.entry(a.digest).or_insert_with(|| Harvest {
                message: a.message,
                partials: Vec::new(),
            });
            if h.partials.iter().all(|q| q.index != p.index) {
                h.partials.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for h in by_digest.into_values() {
        let parsed: Vec<(PartialSig, Partial)> = h
            .partials
            .into_iter()
            .filter_map(|p| {
                Partial::from_bytes(p.index, &p.signature)
                    .ok()
                    .map(|q| (p, q))
            })
            .collect();
        let sigs: Vec<Partial> = parsed.iter().map(|(_, q)| q.clone()).collect();
        let bad = pubs.invalid_partials(&h.message, &sigs);
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

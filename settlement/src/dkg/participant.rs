//! What an honest validator sends during a ceremony, and how it derives
//! its share afterwards: pure functions of committed state and the
//! validator's own secrets, run by the node after each Commit (never
//! inside an ABCI call) and by the in-process driver.
//!
//! Each round a validator takes part in has its own encryption key (ADR
//! 0018): the node makes it fresh when the round starts, registers it in
//! the key phase and erases it once the round is over and its share is
//! derived, so a disk taken later opens no past dealing. A dealer's
//! polynomial and its encryption randomness come from that key and the
//! round ([`EncKey::seed`]), so a dealer that restarts mid-round deals the
//! same bytes again and can still reveal.

use blst::min_pk::PublicKey;
use num_bigint::BigUint;
use tally_store::KvRead;

use super::crypto::{
    combine_shares, encrypt, scalar_from_bytes, scalar_to_bytes, verify_share, EncKey, Poly,
};
use super::msg::{key_context, share_context};
use super::state as st;
use crate::bls::{parse_public_key, SecretShare};
use crate::error::Fatal;
use crate::proto::{
    validator_msg::Sum, Ceremony, Dealing, DkgAck, DkgKey, DkgReveal, EncryptedShare,
    RevealedShare, ValidatorMsg,
};
use crate::state::chain::chain_id;

/// Why a share could not be derived.
#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    /// The state could not be read.
    #[error(transparent)]
    State(#[from] Fatal),
    /// A ciphertext or revealed share meant for this validator does not
    /// match its dealer's commitment (the dealing should not have
    /// qualified: this validator did not ack it).
    #[error("dealing {0}: my share does not match the commitment")]
    BadShare(u32),
    /// The derived share's public key is not the one on chain.
    #[error("derived share does not match public share {0} of the key")]
    Mismatch(u32),
    /// The key given is not the one this validator registered for the
    /// round (its round key was lost).
    #[error("round {0}: the key given is not the one registered on chain")]
    NotMyKey(u64),
    /// Arithmetic failed.
    #[error("share arithmetic: {0}")]
    Crypto(String),
}

/// A validator's view of itself in the running round.
#[derive(Debug)]
pub struct Me<'a> {
    /// Its consensus address.
    pub address: [u8; 20],
    /// Its encryption key for the running round (made fresh for it).
    pub enc: &'a EncKey,
}

fn seed_label(chain: &str, round: u64, what: &[u8]) -> Vec<u8> {
    let mut l = chain.as_bytes().to_vec();
    l.push(0);
    l.extend_from_slice(&round.to_be_bytes());
    l.extend_from_slice(what);
    l
}

/// The dealer's polynomial for `c`: a fresh secret, derived from the
/// dealer's key for the round (so a restarted dealer deals the same
/// bytes).
pub fn polynomial(chain: &str, c: &Ceremony, me: &Me) -> Option<Poly> {
    let seed = me.enc.seed(&seed_label(chain, c.round, b"poly"));
    Poly::from_seed(c.threshold, &seed, None).ok()
}

/// This validator's dealing for the running round: a share for each
/// player that registered a key, encrypted to it, and an empty one for
/// each player that did not.
pub fn dealing(
    kv: &impl KvRead,
    chain: &str,
    c: &Ceremony,
    pos: u32,
    poly: &Poly,
    me: &Me,
) -> Result<Option<Dealing>, Fatal> {
    let commitment: Option<Vec<Vec<u8>>> = poly
        .commit()
        .ok()
        .map(|c| c.iter().map(|p| p.compress().to_vec()).collect());
    let Some(commitment) = commitment else {
        return Ok(None);
    };
    let mut shares = Vec::with_capacity(c.players.len());
    for j in 1..=c.players.len() as u32 {
        let Some(key) = st::ceremony_key(kv, c.round, j)? else {
            shares.push(EncryptedShare::default());
            continue;
        };
        let Ok(pk) = parse_public_key(&key) else {
            return Ok(None);
        };
        let eph = me.enc.seed(&seed_label(
            chain,
            c.round,
            &[b"eph".as_slice(), &j.to_be_bytes()].concat(),
        ));
        let Ok((r, ct)) = encrypt(
            &pk,
            &poly.eval(j),
            &share_context(chain, c.round, pos, j),
            &eph,
        ) else {
            return Ok(None);
        };
        shares.push(EncryptedShare {
            ephemeral: r.to_vec(),
            ciphertext: ct.to_vec(),
        });
    }
    Ok(Some(Dealing {
        round: c.round,
        commitment,
        shares,
    }))
}

/// My share of dealing `d` (as player `j`), checked against its
/// commitment: revealed if on chain, else decrypted.
pub fn my_share_of(
    kv: &impl KvRead,
    chain: &str,
    c: &Ceremony,
    d: u32,
    j: u32,
    enc: &EncKey,
) -> Result<Option<(BigUint, Vec<PublicKey>)>, Fatal> {
    let Some(dealing) = st::dealing(kv, c.round, d)? else {
        return Ok(None);
    };
    let commitment = st::commitment(&dealing)?;
    let value = match st::reveal(kv, c.round, d, j)? {
        Some(b) => scalar_from_bytes(&b),
        None => dealing.shares.get(j as usize - 1).and_then(|s| {
            enc.decrypt(
                &s.ephemeral,
                &s.ciphertext,
                &share_context(chain, c.round, d, j),
            )
            .ok()
        }),
    };
    Ok(value
        .filter(|v| verify_share(&commitment, j, v))
        .map(|v| (v, commitment)))
}

/// The messages this validator should send now (at the last committed
/// height): its key for the round, its dealing, acks of good dealings,
/// and reveals for players that did not ack. Empty when no ceremony runs
/// or all is sent.
pub fn next_messages(kv: &impl KvRead, me: &Me) -> Result<Vec<ValidatorMsg>, Fatal> {
    let Some(c) = st::ceremony(kv)? else {
        return Ok(Vec::new());
    };
    let chain = chain_id(kv)?;
    let h = st::last_height(kv)?;
    let msg = |sum| ValidatorMsg {
        chain_id: chain.clone(),
        sum: Some(sum),
    };
    let mut out = Vec::new();
    let player = c
        .players
        .iter()
        .position(|p| p.address.as_slice() == me.address)
        .map(|i| i as u32 + 1);
    let registered = match player {
        Some(j) => st::ceremony_key(kv, c.round, j)?,
        None => None,
    };
    if player.is_some() && registered.is_none() && h < c.keys_end {
        let key = me.enc.public();
        let pop = me.enc.prove(&key_context(&chain, c.round, &me.address));
        out.push(msg(Sum::Key(DkgKey {
            round: c.round,
            enc_key: key.compress().to_vec(),
            pop: pop.compress().to_vec(),
        })));
    }
    let dealer = c
        .dealers
        .iter()
        .position(|d| d.address.as_slice() == me.address)
        .map(|i| i as u32 + 1);
    if let Some(pos) = dealer {
        out.extend(
            dealer_messages(kv, &chain, &c, pos, h, me)?
                .into_iter()
                .map(msg),
        );
    }
    // Acks only with the key on chain being the one held: a node that lost
    // its round key cannot decrypt and stays silent.
    let mine = me.enc.public().compress().to_vec();
    if let (Some(j), true) = (player, h < c.ack_end && registered == Some(mine)) {
        let mut good = Vec::new();
        for d in 1..=c.dealers.len() as u32 {
            if st::has_ack(kv, c.round, d, j)? {
                continue;
            }
            if my_share_of(kv, &chain, &c, d, j, me.enc)?.is_some() {
                good.push(d);
            }
        }
        if !good.is_empty() {
            out.push(msg(Sum::Ack(DkgAck {
                round: c.round,
                dealers: good,
            })));
        }
    }
    Ok(out)
}

/// What dealer `pos` sends after height `h`: its dealing once the keys
/// phase is over (every round key is on chain, and CheckTx, which checks
/// at the last height, takes a dealing from `keys_end` on), then reveals
/// for keyed players that did not ack it.
fn dealer_messages(
    kv: &impl KvRead,
    chain: &str,
    c: &Ceremony,
    pos: u32,
    h: u64,
    me: &Me,
) -> Result<Vec<Sum>, Fatal> {
    let mine = st::dealing(kv, c.round, pos)?;
    let Some(poly) = polynomial(chain, c, me) else {
        return Ok(Vec::new());
    };
    if mine.is_none() && h >= c.keys_end && h < c.deal_end {
        return Ok(dealing(kv, chain, c, pos, &poly, me)?
            .map(Sum::Dealing)
            .into_iter()
            .collect());
    }
    if mine.is_none() || h < c.ack_end || h >= c.end {
        return Ok(Vec::new());
    }
    let mut shares = Vec::new();
    for j in 1..=c.players.len() as u32 {
        if st::ceremony_key(kv, c.round, j)?.is_some()
            && !st::has_ack(kv, c.round, pos, j)?
            && st::reveal(kv, c.round, pos, j)?.is_none()
        {
            shares.push(RevealedShare {
                player: j,
                share: scalar_to_bytes(&poly.eval(j)).to_vec(),
            });
        }
    }
    if shares.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec![Sum::Reveal(DkgReveal {
        round: c.round,
        shares,
    })])
}

/// This validator's share of the newest key a ceremony made (the active
/// key, or a new key waiting to activate), from the chain's record of that
/// ceremony and its key for that ceremony's round. `None` when it is not
/// a player of that ceremony, registered no key in it, or no ceremony made
/// a key yet.
pub fn derive_share(
    kv: &impl KvRead,
    address: &[u8; 20],
    enc: &EncKey,
) -> Result<Option<(u64, SecretShare)>, DeriveError> {
    let Some(c) = st::last_ceremony(kv)? else {
        return Ok(None);
    };
    let Some(j) = c
        .players
        .iter()
        .position(|p| p.address.as_slice() == address)
        .map(|i| i as u32 + 1)
    else {
        return Ok(None);
    };
    let Some(registered) = st::ceremony_key(kv, c.round, j)? else {
        return Ok(None);
    };
    if registered != enc.public().compress().to_vec() {
        return Err(DeriveError::NotMyKey(c.round));
    }
    let chain = chain_id(kv)?;
    let mut values = Vec::with_capacity(c.qualified.len());
    for &d in &c.qualified {
        match my_share_of(kv, &chain, &c, d, j, enc)? {
            Some((v, _)) => values.push(v),
            None => return Err(DeriveError::BadShare(d)),
        }
    }
    let s = combine_shares(&values, None);
    let share = SecretShare::from_bytes(j, &scalar_to_bytes(&s))
        .map_err(|e| DeriveError::Crypto(e.to_string()))?;
    // The public share the chain recorded for j, in the key this
    // ceremony made (active, or waiting to activate).
    let key = match st::next_key(kv)? {
        Some(n) => Some(st::next_key_record(&n)?),
        None => st::active_key_record(kv)?,
    };
    // None: that key was dropped unsigned for a recovery (ADR 0018).
    let Some(key) = key.filter(|k| k.epoch == c.epoch) else {
        return Ok(None);
    };
    let want = key
        .public_shares
        .get(j as usize - 1)
        .cloned()
        .unwrap_or_default();
    if hex::encode(share.public().compress()) != want {
        return Err(DeriveError::Mismatch(j));
    }
    Ok(Some((c.epoch, share)))
}

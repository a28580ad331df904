//! Byzantine validators: what they send instead of their honest vote
//! extension, and what their relay hands in.
//!
//! - [`ForeignIndex`]: well-formed partials under other validators' share
//!   indices, signed with a key that is not theirs (partial suppression).
//! - [`Oversize`]: the honest extension padded past
//!   `max_vote_extension_bytes` with a field decoders skip.
//! - [`Malformed`]: bytes that do not decode, or partials that are
//!   malformed (short digest, unknown kind, not a curve point, one message
//!   twice, too many).
//! - [`Silent`]: never signs (empty extensions, always valid).
//! - [`LyingRelay`]: the node's relay hands in forged hub deposits (all
//!   redirected to one user, amounts inflated), which its honest app then
//!   signs and carries in its proposals.

use prost::Message;
use tally_abci::HandIn;
use tally_settlement::bls::{Kind, SecretShare};
use tally_settlement::proto::{PartialSig, VoteExtension};

use super::{act, decode_extension, junk_digest, Acts, Behaviour, Ctx};

/// For each message the honest extension signs (or the batch the chain
/// waits for, or a junk digest), one well-formed partial under another
/// validator's share index, signed with a key that is not that
/// validator's: always the same victim, the last validator. One
/// suppressed honest index is enough to keep a message below the
/// threshold when exactly t validators are honest.
#[derive(Debug, Default)]
pub struct ForeignIndex {
    /// What was done.
    pub acts: Acts,
}

impl Behaviour for ForeignIndex {
    fn extension(&mut self, ctx: &Ctx<'_>, honest: Vec<u8>) -> Vec<u8> {
        let honest = decode_extension(&honest);
        let mut digests: Vec<(u32, Vec<u8>)> = honest
            .partials
            .iter()
            .map(|p| (p.kind, p.digest.clone()))
            .collect();
        if digests.is_empty() {
            let d = ctx
                .awaited_batch()
                .unwrap_or_else(|| junk_digest(ctx.height as u64));
            digests.push((Kind::Batch.value(), d.to_vec()));
        }
        let own = ctx.share.map(|s| s.index).unwrap_or(0);
        let victim = (1..=ctx.n as u32).rev().find(|i| *i != own).unwrap_or(1);
        let Ok(fake) = SecretShare::from_bytes(victim, &[7u8; 32]) else {
            return Vec::new();
        };
        let mut out = VoteExtension::default();
        for (kind, digest) in digests {
            let k = Kind::try_from(kind).unwrap_or(Kind::Batch);
            let d: [u8; 32] = digest.as_slice().try_into().unwrap_or([0; 32]);
            out.partials.push(PartialSig {
                epoch: 0,
                index: victim,
                kind,
                digest,
                signature: fake
                    .sign(&tally_settlement::bls::message(ctx.chain_id, k, &d))
                    .sig_bytes()
                    .to_vec(),
            });
        }
        act(&self.acts, ctx, "foreign index");
        out.encode_to_vec()
    }
}

/// The honest extension plus an unknown length-delimited field (field 15)
/// that brings it to `max_vote_extension_bytes + 1`: it decodes, so only
/// the size check refuses it.
#[derive(Debug, Default)]
pub struct Oversize {
    /// What was done.
    pub acts: Acts,
}

impl Behaviour for Oversize {
    fn extension(&mut self, ctx: &Ctx<'_>, honest: Vec<u8>) -> Vec<u8> {
        let target = ctx.params().max_vote_extension_bytes as usize + 1;
        act(&self.acts, ctx, "oversize");
        pad_to(honest, target)
    }
}

/// `bytes` followed by field 15 (wire type 2) of the length that makes the
/// whole exactly `target` bytes (or the shortest such field past it).
pub fn pad_to(mut bytes: Vec<u8>, target: usize) -> Vec<u8> {
    let room = target.saturating_sub(bytes.len() + 1);
    // room = varint_len(len) + len: find len.
    let mut len = room;
    while len > 0 && varint_len(len) + len > room {
        len -= 1;
    }
    bytes.push((15 << 3) | 2);
    let mut v = len;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            bytes.push(b);
            break;
        }
        bytes.push(b | 0x80);
    }
    bytes.extend(std::iter::repeat_n(0u8, len));
    bytes
}

fn varint_len(mut v: usize) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// The malformed extensions [`Malformed`] cycles through.
pub const MALFORMED: [&str; 6] = [
    "undecodable bytes",
    "31-byte digest",
    "unknown kind",
    "signature not a point",
    "one message twice",
    "too many partials",
];

/// A different malformed extension at every height (see [`MALFORMED`]),
/// each otherwise well-formed and under the sender's own index.
#[derive(Debug, Default)]
pub struct Malformed {
    /// What was done.
    pub acts: Acts,
    next: usize,
}

impl Malformed {
    /// A fresh one that logs to `acts`.
    pub fn new(acts: &Acts) -> Self {
        Self {
            acts: acts.clone(),
            ..Self::default()
        }
    }
}

impl Behaviour for Malformed {
    fn extension(&mut self, ctx: &Ctx<'_>, _honest: Vec<u8>) -> Vec<u8> {
        let what = MALFORMED[self.next % MALFORMED.len()];
        self.next += 1;
        let digest = ctx.awaited_batch().unwrap_or_else(|| junk_digest(1));
        let good = ctx.own_partial(Kind::Batch, digest);
        let one = |p: PartialSig| VoteExtension { partials: vec![p] }.encode_to_vec();
        act(&self.acts, ctx, what);
        match what {
            "undecodable bytes" => vec![0xff; 40],
            "31-byte digest" => {
                let mut p = good;
                p.digest.truncate(31);
                one(p)
            }
            "unknown kind" => one(PartialSig { kind: 9, ..good }),
            "signature not a point" => one(PartialSig {
                epoch: 0,
                signature: vec![0u8; 96],
                ..good
            }),
            "one message twice" => VoteExtension {
                partials: vec![good.clone(), good],
            }
            .encode_to_vec(),
            _ => {
                let max = ctx.params().max_extension_partials as u64;
                VoteExtension {
                    partials: (0..=max)
                        .map(|i| ctx.own_partial(Kind::Batch, junk_digest(100 + i)))
                        .collect(),
                }
                .encode_to_vec()
            }
        }
    }
}

/// Never signs: every extension is empty (which is always valid).
#[derive(Debug, Default)]
pub struct Silent;

impl Behaviour for Silent {
    fn extension(&mut self, _ctx: &Ctx<'_>, _honest: Vec<u8>) -> Vec<u8> {
        Vec::new()
    }
}

/// The user a [`LyingRelay`] credits.
pub const THIEF: &str = "mallory";

/// The node's relay forges every hub block it hands in: each deposit goes
/// to [`THIEF`] with its amount multiplied by 1000 (the message stays
/// well-formed and correctly numbered, so only the threshold stops it).
/// Hub results pass unchanged.
#[derive(Debug, Default)]
pub struct LyingRelay {
    /// What was done.
    pub acts: Acts,
}

impl Behaviour for LyingRelay {
    fn relay(&mut self, ctx: &Ctx<'_>, honest: Vec<HandIn>) -> Vec<HandIn> {
        honest
            .into_iter()
            .map(|h| match h {
                HandIn::Block(mut b) => {
                    for d in &mut b.deposits {
                        d.user = THIEF.into();
                        d.amount = d.amount.saturating_mul(1000);
                    }
                    act(&self.acts, ctx, "forged deposits");
                    HandIn::Block(b)
                }
                r => r,
            })
            .collect()
    }
}

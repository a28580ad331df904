//! Target 2: vote-extension decode and VerifyVoteExtension, on arbitrary
//! bytes, on extensions built from fuzzed partials (own, foreign, zero and
//! out-of-range indices, the key's and other epochs, unknown kinds, digests
//! of every length, good, foreign, junk and infinity signatures, repeated
//! messages, hundreds of partials) and on byte-level mutations of them,
//! from signers and strangers. The oracle ([`broken`]) is the rules of
//! ADR 0006, 0010 and 0015 written out, each citing its rule, with prost's
//! decode and blst's point check and none of the state machine's helpers:
//! `check_extension` must accept exactly what breaks no rule, and a refusal
//! must name a rule the extension breaks (anything over
//! `max_vote_extension_bytes` is `TooLarge`, whatever the bytes); the
//! adapter's VerifyVoteExtension must accept exactly what the rules accept.
//! Also ExtendVote's side: an honest [`sync::extension`] for any relay
//! inbox stays within the caps, breaks no rule and signs only what the
//! chain waits for.

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;
use tally_settlement::proto::{HubBlock, HubResult, PartialSig, VoteExtension};
use tally_settlement::sync::{self, check_extension, BadExtension};
use tally_settlement::KeyCache;
use tally_tests::driver::address;
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{
    response_verify_vote_extension::VerifyStatus, RequestVerifyVoteExtension,
};

use crate::env::{params, Env, CHAIN, EPOCH, N};
use crate::mutate::{apply, mutation, Mutation};
use crate::spec;

/// Who sends the extension.
#[derive(Clone, Debug)]
enum Sender {
    /// Validator `i` (share index `i + 1`).
    Signer(usize),
    /// An address bound to no share (any length).
    Stranger(Vec<u8>),
}

/// A partial's share index.
#[derive(Clone, Debug)]
enum Idx {
    Own,
    Signer(usize),
    Raw(u32),
}

/// A partial's digest.
#[derive(Clone, Debug)]
enum Dig {
    Pool(usize),
    Raw(Vec<u8>),
}

/// A partial's signature bytes.
#[derive(Clone, Debug)]
enum Sig {
    /// Signer `.1`'s good signature of pool message `.0`.
    Good(usize, usize),
    Raw(Vec<u8>),
    /// The compressed point at infinity.
    Infinity,
}

#[derive(Clone, Debug)]
struct Spec {
    idx: Idx,
    epoch: u64,
    kind: u32,
    dig: Dig,
    sig: Sig,
}

#[derive(Clone, Debug)]
enum Input {
    Raw(Vec<u8>),
    Built(Vec<Spec>, Vec<Mutation>),
    /// One partial `.1` times (a huge repeated field).
    Repeated(Spec, usize),
}

fn spec(pool: usize) -> impl Strategy<Value = Spec> {
    let idx = prop_oneof![
        6 => Just(Idx::Own),
        2 => (0..N).prop_map(Idx::Signer),
        1 => prop_oneof![Just(0u32), Just(N as u32 + 1), any::<u32>()].prop_map(Idx::Raw),
    ];
    let epoch = prop_oneof![8 => Just(EPOCH), 1 => Just(EPOCH + 1), 1 => any::<u64>()];
    let kind = prop_oneof![8 => 1u32..=3, 1 => Just(0u32), 1 => any::<u32>()];
    let dig = prop_oneof![
        6 => (0..pool).prop_map(Dig::Pool),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Dig::Raw),
    ];
    let sig = prop_oneof![
        6 => (0..pool, 0..N).prop_map(|(m, s)| Sig::Good(m, s)),
        2 => prop::collection::vec(any::<u8>(), 0..100).prop_map(Sig::Raw),
        1 => Just(Sig::Infinity),
    ];
    (idx, epoch, kind, dig, sig).prop_map(|(idx, epoch, kind, dig, sig)| Spec {
        idx,
        epoch,
        kind,
        dig,
        sig,
    })
}

fn input(pool: usize) -> impl Strategy<Value = (Sender, Input)> {
    let sender = prop_oneof![
        8 => (0..N).prop_map(Sender::Signer),
        1 => prop::collection::vec(any::<u8>(), 0..33).prop_map(Sender::Stranger),
    ];
    // A duplicated field: one more partial, encoded on its own.
    let extra = spec(pool).prop_map(|s| {
        VoteExtension {
            partials: vec![PartialSig {
                epoch: 0,
                index: 1,
                kind: s.kind,
                digest: vec![7; 32],
                signature: vec![1; 96],
            }],
        }
        .encode_to_vec()
    });
    let built = (
        prop::collection::vec(spec(pool), 0..7),
        prop::collection::vec(mutation(extra), 0..3),
    )
        .prop_map(|(s, m)| Input::Built(s, m));
    let inputs = prop_oneof![
        2 => prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            prop::collection::vec(any::<u8>(), 505..530),
        ]
        .prop_map(Input::Raw),
        6 => built,
        1 => (spec(pool), 5usize..400).prop_map(|(s, n)| Input::Repeated(s, n)),
    ];
    (sender, inputs)
}

fn own_index(sender: &Sender) -> u32 {
    match sender {
        Sender::Signer(i) => *i as u32 + 1,
        Sender::Stranger(_) => 0,
    }
}

fn partial(env: &Env, sender: &Sender, s: &Spec) -> PartialSig {
    PartialSig {
        epoch: s.epoch,
        index: match s.idx {
            Idx::Own => own_index(sender),
            Idx::Signer(i) => i as u32 + 1,
            Idx::Raw(i) => i,
        },
        kind: s.kind,
        digest: match &s.dig {
            Dig::Pool(m) => env.msgs[*m].digest.to_vec(),
            Dig::Raw(d) => d.clone(),
        },
        signature: match &s.sig {
            Sig::Good(m, signer) => env.msgs[*m].sigs[*signer].to_vec(),
            Sig::Raw(b) => b.clone(),
            Sig::Infinity => {
                let mut b = vec![0u8; 96];
                b[0] = 0xc0;
                b
            }
        },
    }
}

fn build(env: &Env, sender: &Sender, input: &Input) -> Vec<u8> {
    match input {
        Input::Raw(b) => b.clone(),
        Input::Built(specs, ms) => {
            let e = VoteExtension {
                partials: specs.iter().map(|s| partial(env, sender, s)).collect(),
            };
            apply(e.encode_to_vec(), ms)
        }
        Input::Repeated(s, n) => VoteExtension {
            partials: vec![partial(env, sender, s); *n],
        }
        .encode_to_vec(),
    }
}

/// A rule of the ADRs that a vote extension can break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// ADR 0010, limits table: more bytes than `max_vote_extension_bytes`
    /// are refused before decoding.
    Size,
    /// ADR 0006, VerifyVoteExtension "decodes": not a `VoteExtension`.
    Decode,
    /// ADR 0010, limits table: more partials than `max_extension_partials`.
    Count,
    /// ADR 0010 decision 3: a partial from a sender that holds no share.
    Stranger,
    /// ADR 0010 decision 3: a partial under another share index than the
    /// sender's own (genesis `dkg.signers[i-1]` holds share `i`), so zero
    /// and out-of-range indices too.
    Foreign,
    /// ADR 0006: kinds 1 to 3 (signing.md section 2).
    Kind,
    /// ADR 0015, "Epochs": a partial of another key epoch than the active
    /// key's.
    Epoch,
    /// ADR 0006: 32-byte digests.
    Digest,
    /// ADR 0010, limits table (one partial per signer and message) and
    /// signing.md 6 (duplicate indices are refused): one message signed
    /// twice by the sender's one index.
    Twice,
    /// ADR 0006: signatures that parse as G2 points in the subgroup.
    Point,
}

/// Every rule the extension `bytes` from `addr` breaks, each with the
/// position of the partial that breaks it (`None`: the whole extension).
/// Empty: VerifyVoteExtension must accept it. The size is judged before
/// decoding (ADR 0010) and decoding before anything in it; the ADRs give
/// the other rules no order, so every broken one is listed and a refusal
/// may name any of them. Decoding is prost's (the wire format), the point
/// check blst's; nothing here calls the state machine.
fn broken(addr: &[u8], bytes: &[u8]) -> Vec<(Option<usize>, Rule)> {
    let p = params();
    if bytes.len() > p.max_vote_extension_bytes as usize {
        return vec![(None, Rule::Size)];
    }
    let Ok(ext) = VoteExtension::decode(bytes) else {
        return vec![(None, Rule::Decode)];
    };
    let mut out = Vec::new();
    if ext.partials.len() > p.max_extension_partials as usize {
        out.push((None, Rule::Count));
    }
    let own = (0..N)
        .find(|&i| address(i).as_ref() == addr)
        .map(|i| i as u32 + 1);
    let mut seen: Vec<(u32, &[u8])> = Vec::new();
    for (i, q) in ext.partials.iter().enumerate() {
        let mut rule = |r| out.push((Some(i), r));
        match own {
            None => rule(Rule::Stranger),
            Some(own) if q.index != own => rule(Rule::Foreign),
            Some(_) => {}
        }
        if !spec::KINDS.contains(&q.kind) {
            rule(Rule::Kind);
        }
        if q.epoch != EPOCH {
            rule(Rule::Epoch);
        }
        if q.digest.len() != 32 {
            rule(Rule::Digest);
        }
        if seen.contains(&(q.kind, q.digest.as_slice())) {
            rule(Rule::Twice);
        }
        seen.push((q.kind, q.digest.as_slice()));
        if blst::min_pk::Signature::sig_validate(&q.signature, true).is_err() {
            rule(Rule::Point);
        }
    }
    out
}

/// The rule a refusal names, and the partial it blames; `None` for a
/// refusal no rule explains.
fn named(e: &BadExtension, addr: &[u8]) -> Option<(Option<usize>, Rule)> {
    let own = (0..N).find(|&i| address(i).as_ref() == addr);
    Some(match e {
        BadExtension::TooLarge { .. } => (None, Rule::Size),
        BadExtension::Undecodable => (None, Rule::Decode),
        BadExtension::TooManyPartials { .. } => (None, Rule::Count),
        BadExtension::NotASigner => return own.is_none().then_some((None, Rule::Stranger)),
        // Names no position: any foreign partial, if `own` is the sender's.
        BadExtension::ForeignIndex { own: o, .. } => {
            return (own.map(|i| i as u32 + 1) == Some(*o)).then_some((None, Rule::Foreign))
        }
        BadExtension::Malformed { position, why } => {
            let rule = match *why {
                "unknown kind" => Rule::Kind,
                "signed with a share of another key epoch" => Rule::Epoch,
                "digest is not 32 bytes" => Rule::Digest,
                "signs a message twice" => Rule::Twice,
                "signature is not a valid G2 point" => Rule::Point,
                _ => return None,
            };
            (Some(*position), rule)
        }
        BadExtension::State(_) => return None,
    })
}

#[test]
fn verify_vote_extension_on_arbitrary_and_mutated_extensions() {
    let env = Env::new();
    let backend = env.app.committed_state().clone();
    let max = params().max_vote_extension_bytes as usize;
    let mut runner = crate::runner(file!(), 8);
    let r = runner.run(&input(env.msgs.len()), |(sender, input)| {
        let bytes = build(&env, &sender, &input);
        let addr: Vec<u8> = match &sender {
            Sender::Signer(i) => address(*i).to_vec(),
            Sender::Stranger(a) => a.clone(),
        };
        let got = check_extension(&backend, &KeyCache::new(), &addr, &bytes);
        if bytes.len() > max {
            prop_assert!(
                matches!(got, Err(BadExtension::TooLarge { len, .. }) if len == bytes.len()),
                "{} bytes not refused by size: {got:?}",
                bytes.len()
            );
        }
        let rules = broken(&addr, &bytes);
        match &got {
            Ok(ext) => {
                prop_assert!(rules.is_empty(), "accepted, but it breaks {rules:?}");
                let decoded = VoteExtension::decode(bytes.as_slice()).ok();
                prop_assert_eq!(Some(ext), decoded.as_ref());
            }
            Err(e) => {
                let n = named(e, &addr);
                let explained = n.is_some_and(|(at, rule)| {
                    rules
                        .iter()
                        .any(|&(p, r)| r == rule && (at.is_none() || at == p))
                });
                prop_assert!(explained, "refused with {e:?}, but it breaks {rules:?}");
            }
        }
        let v = env.app.verify_vote_extension(RequestVerifyVoteExtension {
            hash: Bytes::new(),
            validator_address: addr.into(),
            height: 4,
            vote_extension: bytes.into(),
        });
        let want = if rules.is_empty() {
            VerifyStatus::Accept
        } else {
            VerifyStatus::Reject
        };
        prop_assert_eq!(v.status, want as i32);
        prop_assert!(env.halts.is_empty(), "halted: {:?}", env.halts.events());
        Ok(())
    });
    crate::report("verify_vote_extension", r);
}

/// Which pool messages the committed state waits for (attempt 1 current,
/// hub cursor at height 1, sequence 1): see `Env::build_pool`.
const AWAITED: [usize; 6] = [0, 1, 2, 4, 5, 6];

#[test]
fn honest_extensions_fit_the_caps_and_sign_only_awaited_messages() {
    let env = Env::new();
    let backend = env.app.committed_state().clone();
    let p = params();
    let results: Vec<usize> = (0..env.msgs.len())
        .filter(|&m| env.msgs[m].result.is_some())
        .collect();
    let blocks: Vec<usize> = (0..env.msgs.len())
        .filter(|&m| env.msgs[m].block.is_some())
        .collect();
    let strategy = (
        0..N,
        any::<bool>(),
        prop::collection::vec(prop::sample::select(results), 0..5),
        prop::collection::vec(prop::sample::select(blocks), 0..8),
    );
    let mut runner = crate::runner(file!(), 1);
    let r = runner.run(&strategy, |(signer, with_start, rs, bs)| {
        let observed: Vec<HubResult> = rs
            .iter()
            .filter_map(|&m| env.msgs[m].result.clone())
            .collect();
        let inbox: Vec<HubBlock> = bs
            .iter()
            .filter_map(|&m| env.msgs[m].block.clone())
            .collect();
        let start = with_start.then_some(&env.start);
        let ext = sync::extension(
            &backend,
            &KeyCache::new(),
            CHAIN,
            &env.shares[signer],
            0,
            start,
            &observed,
            &inbox,
        )
        .map_err(|f| TestCaseError::fail(f.to_string()))?;
        let bytes = ext.encode_to_vec();
        prop_assert!(bytes.len() <= p.max_vote_extension_bytes as usize);
        prop_assert!(ext.partials.len() <= p.max_extension_partials as usize);
        prop_assert_eq!(
            check_extension(&backend, &KeyCache::new(), &address(signer), &bytes),
            Ok(ext.clone())
        );
        // The oracle: the batch, then the inbox in order, awaited, new for
        // this signer, each once; cut by count, then by bytes.
        let mut want: Vec<usize> = vec![0];
        want.extend(rs.iter().chain(bs.iter()).copied());
        let mut seen = Vec::new();
        want.retain(|m| {
            let keep = AWAITED.contains(m)
                && !env.stored[*m].contains(&(signer as u32 + 1))
                && !seen.contains(m);
            seen.push(*m);
            keep
        });
        want.truncate(p.max_extension_partials as usize);
        let mut oracle = VoteExtension {
            partials: want.iter().map(|&m| env.good(m, signer)).collect(),
        };
        while oracle.encoded_len() > p.max_vote_extension_bytes as usize {
            oracle.partials.pop();
        }
        prop_assert_eq!(&ext, &oracle);
        prop_assert!(ext.partials.iter().all(|q| spec::KINDS.contains(&q.kind)));
        prop_assert!(broken(&address(signer), &bytes).is_empty());
        Ok(())
    });
    crate::report("extension", r);
}

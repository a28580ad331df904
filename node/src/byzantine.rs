//! Test-only (cargo feature `byzantine`, never in a default build): a
//! byzantine validator for the end-to-end tests. [`Byzantine`] wraps
//! [`TallyApp`] as the ABCI application, delegates every method to it and
//! replaces only ExtendVote's answer, as [`Mode`] says:
//!
//! - `foreign-index`: well-formed partials, signed with a junk key, under the
//!   OTHER validators' share indices (over what this node would honestly
//!   sign, or a filler digest when there is nothing to sign), the partial
//!   suppression attack of issue 10: honest nodes refuse the extension
//!   (`ForeignIndex`);
//! - `oversized`: a well-formed extension of more bytes than
//!   `max_vote_extension_bytes` (`TooLarge`);
//! - `garbage`: bytes that do not decode as a `VoteExtension`
//!   (`Undecodable`);
//! - `silent`: an empty extension (always accepted; the validator never
//!   signs);
//! - `old-release`: honest in everything, but runs app versions up to 1
//!   only: a release from before app version 2, for the upgrade tests
//!   (ADR 0019). It stops with exit code 4 where the plan switches to 2.
//!
//! The `tallyd-byzantine` binary (`src/bin/tallyd-byzantine.rs`) runs
//! `tallyd start` with this wrapper; the mode comes from
//! [`MODE_VAR`]. Everything else the node does (proposals, verification of
//! other validators' extensions, block execution, the relay) is honest.

use std::fmt;
use std::str::FromStr;

use prost::Message;
use tally_abci::TallyApp;
use tally_settlement::bls::{self, Kind, SecretShare};
use tally_settlement::proto::{PartialSig, VoteExtension};
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{
    RequestApplySnapshotChunk, RequestCheckTx, RequestEcho, RequestExtendVote,
    RequestFinalizeBlock, RequestInfo, RequestInitChain, RequestLoadSnapshotChunk,
    RequestOfferSnapshot, RequestPrepareProposal, RequestProcessProposal, RequestQuery,
    RequestVerifyVoteExtension, ResponseApplySnapshotChunk, ResponseCheckTx, ResponseCommit,
    ResponseEcho, ResponseExtendVote, ResponseFinalizeBlock, ResponseFlush, ResponseInfo,
    ResponseInitChain, ResponseListSnapshots, ResponseLoadSnapshotChunk, ResponseOfferSnapshot,
    ResponsePrepareProposal, ResponseProcessProposal, ResponseQuery, ResponseVerifyVoteExtension,
};

/// The environment variable `tallyd-byzantine start` reads its [`Mode`]
/// from (`foreign-index`, `oversized`, `garbage`, `silent`, `old-release`).
pub const MODE_VAR: &str = "TALLY_BYZANTINE_MODE";

/// The junk secret the forged partials are signed with (a valid scalar,
/// no validator's share).
const JUNK_SECRET: [u8; 32] = [0x07; 32];

/// The digest forged partials cover when this node has nothing to sign.
const FILLER_DIGEST: [u8; 32] = [0xbb; 32];

/// How the byzantine validator's vote extensions misbehave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Junk-key partials under the other validators' share indices.
    ForeignIndex,
    /// More bytes than `max_vote_extension_bytes`.
    Oversized,
    /// Bytes that do not decode.
    Garbage,
    /// Always empty.
    Silent,
    /// Honest, on a release that carries app version 1 only.
    OldRelease,
}

impl Mode {
    /// Every mode, in the order of its names.
    pub const ALL: [Mode; 5] = [
        Mode::ForeignIndex,
        Mode::Oversized,
        Mode::Garbage,
        Mode::Silent,
        Mode::OldRelease,
    ];

    /// The mode's name (what [`MODE_VAR`] holds).
    pub fn name(self) -> &'static str {
        match self {
            Mode::ForeignIndex => "foreign-index",
            Mode::Oversized => "oversized",
            Mode::Garbage => "garbage",
            Mode::Silent => "silent",
            Mode::OldRelease => "old-release",
        }
    }

    /// The mode in [`MODE_VAR`]; an error if it is unset or unknown.
    pub fn from_env() -> Result<Self, ModeError> {
        std::env::var(MODE_VAR)
            .map_err(|_| ModeError(String::new()))?
            .parse()
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A [`MODE_VAR`] value that names no [`Mode`].
#[derive(Debug, thiserror::Error)]
#[error("{MODE_VAR}={0:?}: set it to foreign-index, oversized, garbage, silent or old-release")]
pub struct ModeError(String);

impl FromStr for Mode {
    type Err = ModeError;

    fn from_str(s: &str) -> Result<Self, ModeError> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| ModeError(s.to_string()))
    }
}

/// What [`forge`] needs to know about the chain.
#[derive(Clone, Debug)]
pub struct Context {
    /// The chain id (part of every signed message).
    pub chain_id: String,
    /// Number of threshold shares (indices 1..=n).
    pub shares: u32,
    /// This validator's own share index, if it holds one.
    pub own: Option<u32>,
    /// `max_vote_extension_bytes`.
    pub max_bytes: u32,
    /// `max_extension_partials`.
    pub max_partials: u32,
}

/// The extension bytes `mode` sends instead of `honest` (this node's
/// honest extension, decoded).
pub fn forge(mode: Mode, honest: &VoteExtension, ctx: &Context) -> Vec<u8> {
    match mode {
        Mode::OldRelease => honest.encode_to_vec(),
        Mode::Silent => Vec::new(),
        // A varint that never ends: no protobuf message starts like this.
        Mode::Garbage => vec![0xff; 64],
        Mode::ForeignIndex => {
            // What honest validators sign now, or a filler message.
            let mut messages: Vec<(u32, Vec<u8>)> = honest
                .partials
                .iter()
                .map(|p| (p.kind, p.digest.clone()))
                .collect();
            if messages.is_empty() {
                messages.push((Kind::Batch.value(), FILLER_DIGEST.to_vec()));
            }
            let foreign: Vec<u32> = (1..=ctx.shares).filter(|i| Some(*i) != ctx.own).collect();
            let mut out = VoteExtension::default();
            'messages: for (kind, digest) in messages {
                let signature = junk_signature(ctx, kind, &digest);
                for &index in &foreign {
                    if out.partials.len() >= ctx.max_partials as usize {
                        break 'messages;
                    }
                    out.partials.push(PartialSig {
                        epoch: 0,
                        index,
                        kind,
                        digest: digest.clone(),
                        signature: signature.clone(),
                    });
                }
            }
            out.encode_to_vec()
        }
        Mode::Oversized => {
            // Well-formed partials under the own index, distinct digests,
            // until the cap is passed.
            let index = ctx.own.unwrap_or(1);
            let mut out = VoteExtension::default();
            let mut n: u32 = 0;
            while out.encoded_len() <= ctx.max_bytes as usize {
                let mut digest = FILLER_DIGEST;
                digest[..4].copy_from_slice(&n.to_be_bytes());
                out.partials.push(PartialSig {
                    epoch: 0,
                    index,
                    kind: Kind::Batch.value(),
                    digest: digest.to_vec(),
                    signature: junk_signature(ctx, Kind::Batch.value(), &digest),
                });
                n = n.wrapping_add(1);
            }
            out.encode_to_vec()
        }
    }
}

/// A valid G2 point: the junk key's signature on the message of `kind`
/// over `digest` (empty if the kind or digest is not one).
fn junk_signature(ctx: &Context, kind: u32, digest: &[u8]) -> Vec<u8> {
    let (Ok(kind), Ok(digest)) = (Kind::try_from(kind), <[u8; 32]>::try_from(digest)) else {
        return Vec::new();
    };
    match SecretShare::from_bytes(1, &JUNK_SECRET) {
        Ok(junk) => junk
            .sign(&bls::message(&ctx.chain_id, kind, &digest))
            .sig_bytes()
            .to_vec(),
        Err(_) => Vec::new(),
    }
}

/// [`TallyApp`] with byzantine vote extensions (see the module docs).
#[derive(Clone, Debug)]
pub struct Byzantine {
    app: TallyApp,
    mode: Mode,
    /// This validator's consensus address (its share index is looked up in
    /// the genesis binding).
    address: Vec<u8>,
}

impl Byzantine {
    /// Wraps `app` of the validator with consensus `address`.
    pub fn new(app: TallyApp, mode: Mode, address: Vec<u8>) -> Self {
        tracing::warn!(mode = %mode, "BYZANTINE test build: this node's vote extensions misbehave");
        if mode == Mode::OldRelease {
            app.set_max_app_version(1);
        }
        Self { app, mode, address }
    }

    /// The chain facts [`forge`] needs, from committed state.
    fn context(&self) -> Context {
        let kv = self.app.committed_state();
        let params = tally_settlement::params(kv).unwrap_or_default();
        let key = tally_settlement::dkg::state::active_key_record(kv)
            .ok()
            .flatten();
        Context {
            chain_id: tally_settlement::chain_id(kv).unwrap_or_default(),
            shares: key
                .as_ref()
                .map_or(0, |k| u32::try_from(k.public_shares.len()).unwrap_or(0)),
            own: key.as_ref().and_then(|k| k.index_of(&self.address)),
            max_bytes: params.max_vote_extension_bytes,
            max_partials: params.max_extension_partials,
        }
    }
}

impl Application for Byzantine {
    fn echo(&self, req: RequestEcho) -> ResponseEcho {
        self.app.echo(req)
    }

    fn info(&self, req: RequestInfo) -> ResponseInfo {
        self.app.info(req)
    }

    fn init_chain(&self, req: RequestInitChain) -> ResponseInitChain {
        self.app.init_chain(req)
    }

    fn query(&self, req: RequestQuery) -> ResponseQuery {
        self.app.query(req)
    }

    fn check_tx(&self, req: RequestCheckTx) -> ResponseCheckTx {
        self.app.check_tx(req)
    }

    fn flush(&self) -> ResponseFlush {
        self.app.flush()
    }

    fn commit(&self) -> ResponseCommit {
        self.app.commit()
    }

    fn list_snapshots(&self) -> ResponseListSnapshots {
        self.app.list_snapshots()
    }

    fn offer_snapshot(&self, req: RequestOfferSnapshot) -> ResponseOfferSnapshot {
        self.app.offer_snapshot(req)
    }

    fn load_snapshot_chunk(&self, req: RequestLoadSnapshotChunk) -> ResponseLoadSnapshotChunk {
        self.app.load_snapshot_chunk(req)
    }

    fn apply_snapshot_chunk(&self, req: RequestApplySnapshotChunk) -> ResponseApplySnapshotChunk {
        self.app.apply_snapshot_chunk(req)
    }

    fn prepare_proposal(&self, req: RequestPrepareProposal) -> ResponsePrepareProposal {
        self.app.prepare_proposal(req)
    }

    fn process_proposal(&self, req: RequestProcessProposal) -> ResponseProcessProposal {
        self.app.process_proposal(req)
    }

    fn extend_vote(&self, req: RequestExtendVote) -> ResponseExtendVote {
        let height = req.height;
        let honest = self.app.extend_vote(req);
        let honest = VoteExtension::decode(honest.vote_extension).unwrap_or_default();
        let bytes = forge(self.mode, &honest, &self.context());
        tracing::info!(
            height,
            mode = %self.mode,
            bytes = bytes.len(),
            honest_partials = honest.partials.len(),
            "byzantine vote extension"
        );
        ResponseExtendVote {
            vote_extension: bytes.into(),
        }
    }

    fn verify_vote_extension(
        &self,
        req: RequestVerifyVoteExtension,
    ) -> ResponseVerifyVoteExtension {
        self.app.verify_vote_extension(req)
    }

    fn finalize_block(&self, req: RequestFinalizeBlock) -> ResponseFinalizeBlock {
        self.app.finalize_block(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_settlement::dkg::key::ThresholdKey;
    use tally_settlement::sync::{check_extension_with, BadExtension};
    use tally_settlement::{KeyEpoch, Params};

    fn key() -> ThresholdKey {
        let (shares, _) = bls::deal(4, 3, &[[1u8; 64], [2u8; 64], [3u8; 64]]).unwrap();
        let signers: Vec<[u8; 20]> = (1..=4u8).map(|i| [i; 20]).collect();
        ThresholdKey {
            record: KeyEpoch {
                epoch: 0,
                threshold: 3,
                group_key: String::new(),
                public_shares: Vec::new(),
                signers: signers.iter().map(hex::encode).collect(),
            },
            shares,
            signers,
        }
    }

    fn ctx() -> Context {
        let p = Params::default();
        Context {
            chain_id: "byz".into(),
            shares: 4,
            own: Some(2),
            max_bytes: p.max_vote_extension_bytes,
            max_partials: p.max_extension_partials,
        }
    }

    fn honest() -> VoteExtension {
        let (_, secrets) = bls::deal(4, 3, &[[1u8; 64], [2u8; 64], [3u8; 64]]).unwrap();
        let digest = [9u8; 32];
        VoteExtension {
            partials: vec![PartialSig {
                epoch: 0,
                index: 2,
                kind: Kind::Batch.value(),
                digest: digest.to_vec(),
                signature: secrets[1]
                    .sign(&bls::message("byz", Kind::Batch, &digest))
                    .sig_bytes()
                    .to_vec(),
            }],
        }
    }

    /// What validator 2 (address [2; 20]) sending `bytes` gets from an
    /// honest node's VerifyVoteExtension.
    fn verify(bytes: &[u8]) -> Result<VoteExtension, BadExtension> {
        check_extension_with(&Params::default(), Some(&key()), &[2u8; 20], bytes)
    }

    #[test]
    fn modes_parse_by_name() {
        for m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>().unwrap(), m);
        }
        assert!("honest".parse::<Mode>().is_err());
    }

    #[test]
    fn the_honest_extension_passes() {
        let bytes = honest().encode_to_vec();
        assert_eq!(verify(&bytes).unwrap(), honest());
    }

    #[test]
    fn foreign_index_is_refused_as_foreign() {
        for h in [honest(), VoteExtension::default()] {
            let bytes = forge(Mode::ForeignIndex, &h, &ctx());
            let ext = VoteExtension::decode(bytes.as_slice()).unwrap();
            assert!(!ext.partials.is_empty());
            assert!(ext.partials.iter().all(|p| p.index != 2));
            assert!(matches!(
                verify(&bytes),
                Err(BadExtension::ForeignIndex { own: 2, .. })
            ));
        }
        // Over the honest digest, under indices 1, 3 and 4.
        let ext =
            VoteExtension::decode(forge(Mode::ForeignIndex, &honest(), &ctx()).as_slice()).unwrap();
        let idx: Vec<u32> = ext.partials.iter().map(|p| p.index).collect();
        assert_eq!(idx, [1, 3, 4]);
        assert!(ext.partials.iter().all(|p| p.digest == [9u8; 32]));
    }

    #[test]
    fn oversized_garbage_and_silent() {
        let bytes = forge(Mode::Oversized, &honest(), &ctx());
        assert!(bytes.len() > 4096);
        assert!(matches!(verify(&bytes), Err(BadExtension::TooLarge { .. })));
        let bytes = forge(Mode::Garbage, &honest(), &ctx());
        assert_eq!(verify(&bytes), Err(BadExtension::Undecodable));
        let bytes = forge(Mode::Silent, &honest(), &ctx());
        assert!(bytes.is_empty() && verify(&bytes).is_ok());
    }
}

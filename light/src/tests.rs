//! The light client over a synthetic chain whose headers and commits are
//! built and signed here (ed25519-dalek), independently of the verifier:
//! honest headers verify, bisection crosses validator rotations, and a
//! wrong trust root, a tampered header, a chain signed by strangers, an
//! expired trust root and a broken hash chain are refused.

use std::cell::Cell;
use std::collections::BTreeMap;

use ed25519_dalek::{Signer, SigningKey};
use tendermint::block::header::Version;
use tendermint::block::signed_header::SignedHeader;
use tendermint::block::{self, parts, Commit, CommitSig, Header};
use tendermint::validator::{Info, Set};
use tendermint::vote::{self, ValidatorIndex, Vote};
use tendermint::{AppHash, Hash, PublicKey, Signature, Time};

use super::client::{LightClient, VerifiedHeader};
use super::source::{validator_set, LightBlock, Source};
use super::{LightError, Options, TrustRoot};

const CHAIN: &str = "tally-light-test";
/// Header `h` is at `T0 + h` seconds.
const T0: i64 = 1_900_000_000;

fn key(i: u8) -> SigningKey {
    SigningKey::from_bytes(&[i + 1; 32])
}

fn info(k: &SigningKey) -> Info {
    let pk = PublicKey::from_raw_ed25519(k.verifying_key().as_bytes()).unwrap();
    Info::new(pk, vote::Power::try_from(10u64).unwrap())
}

fn time(h: u64) -> Time {
    Time::from_unix_timestamp(T0 + h as i64, 0).unwrap()
}

/// A chain of `len` headers; the validators of height `h` are the keys
/// `members(h)`.
struct Chain {
    headers: BTreeMap<u64, SignedHeader>,
    sets: BTreeMap<u64, Set>,
    fetches: Cell<usize>,
}

impl Chain {
    fn new(len: u64, members: impl Fn(u64) -> Vec<u8>) -> Self {
        let keyset = |h: u64| members(h).into_iter().map(key).collect::<Vec<_>>();
        let set = |h: u64| validator_set(keyset(h).iter().map(info).collect()).unwrap();
        let mut headers = BTreeMap::new();
        let mut sets = BTreeMap::new();
        let mut last: Option<block::Id> = None;
        for h in 1..=len {
            let header = Header {
                version: Version { block: 11, app: 1 },
                chain_id: CHAIN.try_into().unwrap(),
                height: h.try_into().unwrap(),
                time: time(h),
                last_block_id: last,
                last_commit_hash: None,
                data_hash: None,
                validators_hash: set(h).hash(),
                next_validators_hash: set(h + 1).hash(),
                consensus_hash: Hash::Sha256([7; 32]),
                app_hash: AppHash::try_from(vec![h as u8; 32]).unwrap(),
                last_results_hash: None,
                evidence_hash: None,
                proposer_address: info(&keyset(h)[0]).address,
            };
            let sh = sign(header, &keyset(h));
            last = Some(sh.commit.block_id);
            headers.insert(h, sh);
            sets.insert(h, set(h));
            sets.insert(h + 1, set(h + 1));
        }
        Self {
            headers,
            sets,
            fetches: Cell::new(0),
        }
    }

    fn root(&self, h: u64) -> TrustRoot {
        TrustRoot {
            chain_id: Some(CHAIN.into()),
            height: h,
            hash: self.headers[&h].header.hash().as_bytes().to_vec(),
        }
    }
}

/// `header` with a commit signed by every key of `keys` (its validators).
fn sign(header: Header, keys: &[SigningKey]) -> SignedHeader {
    let block_id = block::Id {
        hash: header.hash(),
        part_set_header: parts::Header::new(1, Hash::Sha256([9; 32])).unwrap(),
    };
    let set = validator_set(keys.iter().map(info).collect()).unwrap();
    let signatures = set
        .validators()
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let k = keys.iter().find(|k| info(k).address == v.address).unwrap();
            let vote = Vote {
                vote_type: vote::Type::Precommit,
                height: header.height,
                round: block::Round::default(),
                block_id: Some(block_id),
                timestamp: Some(header.time),
                validator_address: v.address,
                validator_index: ValidatorIndex::try_from(i).unwrap(),
                signature: None,
                extension: Vec::new(),
                extension_signature: None,
            };
            let bytes = vote.into_signable_vec(CHAIN.try_into().unwrap());
            CommitSig::BlockIdFlagCommit {
                validator_address: v.address,
                timestamp: header.time,
                signature: Some(Signature::try_from(k.sign(&bytes).to_bytes().as_slice()).unwrap()),
            }
        })
        .collect();
    let commit = Commit {
        height: header.height,
        round: block::Round::default(),
        block_id,
        signatures,
    };
    SignedHeader::new(header, commit).unwrap()
}

impl Source for Chain {
    fn signed_header(&self, height: Option<u64>) -> Result<SignedHeader, LightError> {
        let h = height.unwrap_or(*self.headers.keys().last().unwrap());
        self.headers
            .get(&h)
            .cloned()
            .ok_or_else(|| LightError::decode("commit", format!("no header {h}")))
    }
    fn validators(&self, height: u64) -> Result<Set, LightError> {
        self.sets
            .get(&height)
            .cloned()
            .ok_or_else(|| LightError::decode("validators", format!("no set {height}")))
    }
    fn latest_height(&self) -> Result<u64, LightError> {
        Ok(*self.headers.keys().last().unwrap())
    }
    fn light_block(&self, height: u64) -> Result<LightBlock, LightError> {
        self.fetches.set(self.fetches.get() + 1);
        Ok(LightBlock {
            signed_header: self.signed_header(Some(height))?,
            validators: self.validators(height)?,
            next_validators: self.validators(height + 1)?,
        })
    }
}

fn client(chain: Chain, root: TrustRoot, now_h: u64) -> LightClient<Chain> {
    LightClient::new(chain, root, Options::default(), time(now_h))
}

fn expect(chain: &Chain, h: u64) -> VerifiedHeader {
    let sh = &chain.headers[&h];
    VerifiedHeader {
        chain_id: CHAIN.into(),
        height: h,
        hash: sh.header.hash().as_bytes().to_vec(),
        app_hash: vec![h as u8; 32],
        time: time(h),
    }
}

#[test]
fn a_header_above_the_root_verifies_in_one_step() {
    let chain = Chain::new(30, |_| vec![0, 1, 2, 3]);
    let want = expect(&chain, 25);
    let root = chain.root(3);
    let c = client(chain, root, 40);
    assert_eq!(c.verify_to(25).unwrap(), want);
    // The root and the target: no bisection.
    assert_eq!(c.source().fetches.get(), 2);
    assert_eq!(c.verify_to(3).unwrap().height, 3);
}

/// Every 4 heights one validator leaves and a new one joins: headers far
/// apart share no validator, so the client bisects.
fn rotating(len: u64) -> Chain {
    Chain::new(len, |h| {
        let s = (h / 4) as u8;
        vec![s, s + 1, s + 2, s + 3]
    })
}

#[test]
fn bisection_crosses_validator_rotations() {
    let chain = rotating(60);
    let root = chain.root(2);
    let want = expect(&chain, 58);
    let c = client(chain, root, 70);
    assert_eq!(c.verify_to(58).unwrap(), want);
    assert!(c.source().fetches.get() > 3, "{}", c.source().fetches.get());
}

#[test]
fn a_wrong_trust_root_is_refused() {
    let chain = Chain::new(10, |_| vec![0, 1, 2, 3]);
    let mut root = chain.root(2);
    root.hash[0] ^= 1;
    let c = client(chain, root, 20);
    assert!(matches!(
        c.verify_to(8),
        Err(LightError::TrustRootMismatch { height: 2, .. })
    ));
    assert!(matches!(
        c.verify_to(1),
        Err(LightError::TrustRootMismatch { .. })
    ));
    let chain = Chain::new(10, |_| vec![0, 1, 2, 3]);
    let mut root = chain.root(2);
    root.chain_id = Some("other-chain".into());
    let c = client(chain, root, 20);
    assert!(matches!(
        c.verify_to(8),
        Err(LightError::ChainMismatch { .. })
    ));
}

#[test]
fn a_tampered_header_is_refused() {
    let mut chain = Chain::new(10, |_| vec![0, 1, 2, 3]);
    let root = chain.root(2);
    // A changed app hash no longer matches the signed block id.
    let sh = chain.headers.get_mut(&8).unwrap();
    let mut header = sh.header.clone();
    header.app_hash = AppHash::try_from(vec![0xee; 32]).unwrap();
    *sh = SignedHeader::new(header, sh.commit.clone()).unwrap();
    let c = client(chain, root, 20);
    let e = c.verify_to(8).unwrap_err();
    assert!(
        matches!(e, LightError::Verification { height: 8, .. }),
        "{e}"
    );
    assert_eq!(c.verify_to(7).unwrap().height, 7);
}

#[test]
fn a_chain_signed_by_strangers_is_refused() {
    let honest = Chain::new(10, |_| vec![0, 1, 2, 3]);
    let root = honest.root(2);
    // The honest header 2 and its validators, then headers signed by
    // validators 20..23 that the honest ones never handed over to.
    let mut forged = Chain::new(10, |h| {
        if h <= 2 {
            vec![0, 1, 2, 3]
        } else {
            vec![20, 21, 22, 23]
        }
    });
    forged.headers.insert(2, honest.headers[&2].clone());
    forged.sets.insert(3, honest.sets[&3].clone());
    let c = client(forged, root, 20);
    let e = c.verify_to(9).unwrap_err();
    assert!(matches!(e, LightError::Verification { .. }), "{e}");
}

#[test]
fn forged_validator_sets_at_the_root_are_refused() {
    // The honest root header, but the node claims the next validators are
    // 20..23 (who then sign header 9): the sets must hash to the header's.
    let honest = Chain::new(10, |_| vec![0, 1, 2, 3]);
    let root = honest.root(2);
    let mut forged = Chain::new(10, |h| {
        if h <= 2 {
            vec![0, 1, 2, 3]
        } else {
            vec![20, 21, 22, 23]
        }
    });
    forged.headers.insert(2, honest.headers[&2].clone());
    let c = client(forged, root, 20);
    let e = c.verify_to(9).unwrap_err();
    assert!(
        matches!(e, LightError::Verification { height: 2, .. }),
        "{e}"
    );
}

#[test]
fn an_expired_trust_root_is_refused() {
    let chain = Chain::new(10, |_| vec![0, 1, 2, 3]);
    let root = chain.root(2);
    let c = client(chain, root, 15 * 24 * 3600);
    let e = c.verify_to(9).unwrap_err();
    assert!(
        matches!(e, LightError::TrustExpired { trusted: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("tallyd light init"), "{e}");
}

#[test]
fn below_the_root_the_hash_chain_is_followed() {
    let chain = Chain::new(12, |_| vec![0, 1, 2, 3]);
    let want = expect(&chain, 4);
    let root = chain.root(10);
    let c = client(chain, root, 20);
    assert_eq!(c.verify_to(4).unwrap(), want);
    let mut chain = Chain::new(12, |_| vec![0, 1, 2, 3]);
    let root = chain.root(10);
    let sh = chain.headers.get_mut(&6).unwrap();
    let mut header = sh.header.clone();
    header.app_hash = AppHash::try_from(vec![0xee; 32]).unwrap();
    *sh = SignedHeader::new(header, sh.commit.clone()).unwrap();
    let c = client(chain, root, 20);
    assert!(matches!(
        c.verify_to(4),
        Err(LightError::Verification { height: 6, .. })
    ));
    assert_eq!(c.verify_to(7).unwrap().height, 7);
}

#[test]
fn a_header_from_the_future_is_refused() {
    let chain = Chain::new(10, |_| vec![0, 1, 2, 3]);
    let root = chain.root(2);
    // The clock reads header 3's time: header 9 is 6 s ahead, within the
    // 10 s drift; with 1 s of drift allowed it is refused.
    let mut c = client(chain, root, 3);
    assert_eq!(c.verify_to(9).unwrap().height, 9);
    c = LightClient::new(
        Chain::new(10, |_| vec![0, 1, 2, 3]),
        c.root().clone(),
        Options {
            clock_drift: std::time::Duration::from_secs(1),
            ..Options::default()
        },
        time(3),
    );
    assert!(matches!(
        c.verify_to(9),
        Err(LightError::Verification { height: 9, .. })
    ));
}

#[test]
fn a_bad_signature_is_refused() {
    // Header 8 with the first validator's signature made by another key.
    // (The verifier stops counting once enough power signed, so only a
    // signature it reaches is checked: the first one always is.)
    let mut chain = Chain::new(10, |_| vec![0, 1, 2, 3]);
    let root = chain.root(2);
    let sh = chain.headers.get_mut(&8).unwrap();
    let mut commit = sh.commit.clone();
    if let Some(CommitSig::BlockIdFlagCommit { signature, .. }) = commit.signatures.get_mut(0) {
        *signature = Some(Signature::try_from(key(9).sign(b"x").to_bytes().as_slice()).unwrap());
    }
    *sh = SignedHeader::new(sh.header.clone(), commit).unwrap();
    let c = client(chain, root, 20);
    let e = c.verify_to(8).unwrap_err();
    assert!(
        matches!(e, LightError::Verification { height: 8, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("signature"), "{e}");
}

#[test]
fn waiting_for_a_header_is_bounded() {
    use super::proven::wait_for_height;
    use std::time::{Duration, Instant};
    let chain = Chain::new(5, |_| vec![0, 1, 2, 3]);
    wait_for_height(&chain, 5, Duration::ZERO).unwrap();
    let start = Instant::now();
    let e = wait_for_height(&chain, 6, Duration::from_millis(300)).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(
        matches!(
            e,
            LightError::NotYetAvailable {
                height: 6,
                latest: 5,
                ..
            }
        ),
        "{e}"
    );
}

//! Header verification from a trust root: [`LightClient::verify_to`].

use std::time::{SystemTime, UNIX_EPOCH};

use tendermint::block::Header;
use tendermint::Time;
use tendermint_light_client_verifier::errors::VerificationErrorDetail;
use tendermint_light_client_verifier::options::Options as VerifierOptions;
use tendermint_light_client_verifier::types::TrustThreshold;
use tendermint_light_client_verifier::{ProdVerifier, Verdict, Verifier};

use crate::error::{hex_upper, LightError};
use crate::options::Options;
use crate::source::{LightBlock, Source};
use crate::trust::TrustRoot;

/// Most headers one backward check walks (a target below the trust root).
pub const MAX_BACKWARD: u64 = 1000;
/// Most verification steps (bisection included) for one target.
const MAX_STEPS: usize = 256;

/// A header the light client verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedHeader {
    /// Chain id.
    pub chain_id: String,
    /// Height.
    pub height: u64,
    /// The header's hash.
    pub hash: Vec<u8>,
    /// The app hash it carries (of block `height - 1`).
    pub app_hash: Vec<u8>,
    /// The header's time.
    pub time: Time,
}

impl VerifiedHeader {
    fn of(h: &Header) -> Self {
        Self {
            chain_id: h.chain_id.to_string(),
            height: h.height.value(),
            hash: h.hash().as_bytes().to_vec(),
            app_hash: h.app_hash.as_bytes().to_vec(),
            time: h.time,
        }
    }

    /// This header as a trust root.
    pub fn as_root(&self) -> TrustRoot {
        TrustRoot {
            chain_id: Some(self.chain_id.clone()),
            height: self.height,
            hash: self.hash.clone(),
        }
    }
}

/// The time now, as tendermint's verifier wants it.
pub fn now() -> Result<Time, LightError> {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| LightError::decode("system clock", e))?;
    let secs = i64::try_from(d.as_secs()).map_err(|e| LightError::decode("system clock", e))?;
    Time::from_unix_timestamp(secs, d.subsec_nanos())
        .map_err(|e| LightError::decode("system clock", e))
}

/// Verifies headers of one node from a trust root.
#[derive(Debug)]
pub struct LightClient<S> {
    source: S,
    root: TrustRoot,
    options: Options,
    now: Time,
}

impl<S: Source> LightClient<S> {
    /// A client of `source` trusting `root`, verifying at `now`.
    pub fn new(source: S, root: TrustRoot, options: Options, now: Time) -> Self {
        Self {
            source,
            root,
            options,
            now,
        }
    }

    /// The source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The trust root.
    pub fn root(&self) -> &TrustRoot {
        &self.root
    }

    fn verifier_options(&self) -> VerifierOptions {
        VerifierOptions {
            trust_threshold: TrustThreshold::ONE_THIRD,
            trusting_period: self.options.trusting_period,
            clock_drift: self.options.clock_drift,
        }
    }

    /// The trust root's light block, checked against the trusted hash and
    /// chain id.
    pub fn trusted_block(&self) -> Result<LightBlock, LightError> {
        let b = self.source.light_block(self.root.height)?;
        let h = &b.signed_header.header;
        self.check_root(h)?;
        // The verifier trusts these sets as given (skipping verification
        // counts the trusted next validators' signatures): they must be the
        // ones the trusted header commits to.
        if b.validators.hash() != h.validators_hash
            || b.next_validators.hash() != h.next_validators_hash
        {
            return Err(LightError::Verification {
                height: self.root.height,
                reason: "the node's validator sets do not hash to the trusted header's".into(),
            });
        }
        Ok(b)
    }

    fn check_root(&self, h: &Header) -> Result<(), LightError> {
        let got = h.hash().as_bytes().to_vec();
        if got != self.root.hash {
            return Err(LightError::TrustRootMismatch {
                height: self.root.height,
                got: hex_upper(&got),
                want: hex_upper(&self.root.hash),
            });
        }
        if let Some(want) = &self.root.chain_id {
            if h.chain_id.as_str() != want {
                return Err(LightError::ChainMismatch {
                    want: want.clone(),
                    got: h.chain_id.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Verifies the node's header at `target` from the trust root.
    pub fn verify_to(&self, target: u64) -> Result<VerifiedHeader, LightError> {
        if target < self.root.height {
            return self.verify_backward(target);
        }
        let mut trusted = self.trusted_block()?;
        if target == self.root.height {
            return Ok(VerifiedHeader::of(&trusted.signed_header.header));
        }
        let options = self.verifier_options();
        let verifier = ProdVerifier::default();
        let mut pending = vec![self.source.light_block(target)?];
        let mut steps = 0;
        while let Some(next) = pending.last() {
            steps += 1;
            if steps > MAX_STEPS {
                return Err(LightError::Verification {
                    height: target,
                    reason: format!("no verification path in {MAX_STEPS} steps"),
                });
            }
            let verdict = verifier.verify_update_header(
                next.as_untrusted(),
                trusted.as_trusted(),
                &options,
                self.now,
            );
            match verdict {
                Verdict::Success => {
                    if let Some(b) = pending.pop() {
                        trusted = b;
                    }
                }
                Verdict::NotEnoughTrust(tally) => {
                    let (lo, hi) = (trusted.height(), next.height());
                    if hi <= lo + 1 {
                        return Err(LightError::Verification {
                            height: hi,
                            reason: format!("not enough trust from adjacent header {lo}: {tally}"),
                        });
                    }
                    let pivot = lo + (hi - lo) / 2;
                    pending.push(self.source.light_block(pivot)?);
                }
                Verdict::Invalid(detail) => {
                    let height = next.height();
                    let reason = detail.to_string();
                    return Err(match detail {
                        VerificationErrorDetail::NotWithinTrustPeriod(_) => {
                            LightError::TrustExpired {
                                height,
                                trusted: trusted.height(),
                                reason,
                            }
                        }
                        _ => LightError::Verification { height, reason },
                    });
                }
            }
        }
        Ok(VerifiedHeader::of(&trusted.signed_header.header))
    }

    /// A header below the trust root: each header's hash must be the
    /// `last_block_id` of the one above it, down from the trusted header.
    fn verify_backward(&self, target: u64) -> Result<VerifiedHeader, LightError> {
        let span = self.root.height - target;
        if span > MAX_BACKWARD {
            return Err(LightError::Verification {
                height: target,
                reason: format!(
                    "it is {span} blocks below the trust root at height {} (at most {MAX_BACKWARD} are walked back); \
                     ask a node that has caught up",
                    self.root.height
                ),
            });
        }
        let top = self.source.signed_header(Some(self.root.height))?;
        self.check_root(&top.header)?;
        let mut above = top.header;
        for h in (target..self.root.height).rev() {
            let sh = self.source.signed_header(Some(h))?;
            let header = sh.header;
            let want = above.last_block_id.map(|id| id.hash);
            let got = header.hash();
            if header.height.value() != h || want != Some(got) {
                return Err(LightError::Verification {
                    height: h,
                    reason: format!(
                        "its hash {} is not the last_block_id of the verified header {}",
                        hex_upper(got.as_bytes()),
                        above.height
                    ),
                });
            }
            above = header;
        }
        Ok(VerifiedHeader::of(&above))
    }
}

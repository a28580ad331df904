//! Where light blocks come from: [`Source`], and [`RpcSource`], a CometBFT
//! node's RPC (`/commit` for signed headers, `/validators` page by page).
//! Nothing a source returns is trusted: [`crate::client`] verifies
//! it.

use serde_json::{json, Value};
use tendermint::block::signed_header::SignedHeader;
use tendermint::validator::{Info, Set};
use tendermint_light_client_verifier::types::{TrustedBlockState, UntrustedBlockState};

use tally_client::rpc::RpcClient;

use crate::error::LightError;

/// Validators asked for per `/validators` page (CometBFT's maximum).
const PER_PAGE: usize = 100;
/// Most `/validators` pages read for one height (10,000 validators).
const MAX_PAGES: usize = 100;

/// A signed header with the validator sets the verifier needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LightBlock {
    /// The header and the commit that signs it.
    pub signed_header: SignedHeader,
    /// The validators at this height (they signed the commit).
    pub validators: Set,
    /// The validators at the next height.
    pub next_validators: Set,
}

impl LightBlock {
    /// The block's height.
    pub fn height(&self) -> u64 {
        self.signed_header.header.height.value()
    }

    /// The header's hash.
    pub fn hash(&self) -> Vec<u8> {
        self.signed_header.header.hash().as_bytes().to_vec()
    }

    /// The block as the verifier's trusted state.
    pub fn as_trusted(&self) -> TrustedBlockState<'_> {
        let h = &self.signed_header.header;
        TrustedBlockState {
            chain_id: &h.chain_id,
            header_time: h.time,
            height: h.height,
            next_validators: &self.next_validators,
            next_validators_hash: h.next_validators_hash,
        }
    }

    /// The block as the verifier's untrusted state.
    pub fn as_untrusted(&self) -> UntrustedBlockState<'_> {
        UntrustedBlockState {
            signed_header: &self.signed_header,
            validators: &self.validators,
            next_validators: Some(&self.next_validators),
        }
    }
}

/// A provider of (unverified) headers and validator sets.
pub trait Source {
    /// The signed header at `height`, or the latest one for `None`.
    fn signed_header(&self, height: Option<u64>) -> Result<SignedHeader, LightError>;
    /// The whole validator set at `height`.
    fn validators(&self, height: u64) -> Result<Set, LightError>;
    /// The latest block height.
    fn latest_height(&self) -> Result<u64, LightError>;

    /// The light block at `height`: its signed header, its validators and
    /// the next height's.
    fn light_block(&self, height: u64) -> Result<LightBlock, LightError> {
        let signed_header = self.signed_header(Some(height))?;
        let got = signed_header.header.height.value();
        if got != height {
            return Err(LightError::decode(
                "commit",
                format!("asked for header {height}, got header {got}"),
            ));
        }
        Ok(LightBlock {
            signed_header,
            validators: self.validators(height)?,
            next_validators: self.validators(height + 1)?,
        })
    }
}

/// A CometBFT node's RPC as a [`Source`].
#[derive(Clone, Debug)]
pub struct RpcSource {
    rpc: RpcClient,
}

impl RpcSource {
    /// Reads from `rpc`.
    pub fn new(rpc: RpcClient) -> Self {
        Self { rpc }
    }

    /// The RPC client.
    pub fn rpc(&self) -> &RpcClient {
        &self.rpc
    }
}

/// A number CometBFT sends as a JSON string (or a number).
pub(crate) fn num(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

impl Source for RpcSource {
    fn signed_header(&self, height: Option<u64>) -> Result<SignedHeader, LightError> {
        let params = match height {
            Some(h) => json!({ "height": h.to_string() }),
            None => json!({}),
        };
        let mut r = self.rpc.call("commit", params)?;
        let sh = r
            .get_mut("signed_header")
            .map(Value::take)
            .ok_or_else(|| LightError::decode("commit", "no signed_header"))?;
        serde_json::from_value(sh).map_err(|e| LightError::decode("commit", e))
    }

    fn validators(&self, height: u64) -> Result<Set, LightError> {
        let what = || format!("validators at height {height}");
        let mut all: Vec<Info> = Vec::new();
        for page in 1..=MAX_PAGES {
            let r = self.rpc.call(
                "validators",
                json!({
                    "height": height.to_string(),
                    "page": page.to_string(),
                    "per_page": PER_PAGE.to_string(),
                }),
            )?;
            let total =
                num(&r["total"]).ok_or_else(|| LightError::decode(what(), "no total"))? as usize;
            let vals: Vec<Info> = serde_json::from_value(r["validators"].clone())
                .map_err(|e| LightError::decode(what(), e))?;
            if vals.is_empty() && all.len() < total {
                return Err(LightError::decode(
                    what(),
                    format!("page {page} is empty with {} of {total} read", all.len()),
                ));
            }
            all.extend(vals);
            if all.len() >= total {
                if all.len() > total {
                    return Err(LightError::decode(
                        what(),
                        format!("{} validators listed, total says {total}", all.len()),
                    ));
                }
                return validator_set(all).map_err(|m| LightError::decode(what(), m));
            }
        }
        Err(LightError::decode(
            what(),
            format!("more than {} validators", PER_PAGE * MAX_PAGES),
        ))
    }

    fn latest_height(&self) -> Result<u64, LightError> {
        Ok(self.rpc.status()?.height)
    }
}

/// A validator set of `vals`, refusing what tendermint's constructor would
/// panic on (a total voting power above its maximum).
pub fn validator_set(vals: Vec<Info>) -> Result<Set, String> {
    let total = vals
        .iter()
        .try_fold(0u64, |acc, v| acc.checked_add(v.power()))
        .filter(|t| *t <= Set::MAX_TOTAL_VOTING_POWER)
        .ok_or_else(|| "total voting power too large".to_string())?;
    if total == 0 {
        return Err("no voting power".into());
    }
    Ok(Set::without_proposer(vals))
}

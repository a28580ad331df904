//! Genesis `app_state` and chain parameters.

use serde::{Deserialize, Serialize};

use crate::dkg::key::KeyEpoch;
use crate::ident;

/// The largest `max_report_expiry_secs` genesis accepts: no report id
/// lives longer than this after the block that accepted it (the replay
/// layout of app version 2 relies on it).
pub const MAX_REPORT_EXPIRY_CAP: u64 = 600;

/// The largest `sla_keep_windows` (190 years of 60-second windows).
pub const MAX_SLA_KEEP_WINDOWS: u64 = 100_000_000;

/// Chain parameters, fixed in genesis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Params {
    /// Length of a settlement window in seconds of block time.
    pub settlement_window_secs: u64,
    /// Most records one report may carry (1..=1000).
    pub max_report_records: u32,
    /// How far past the block time a report's `expires_at` may be.
    pub max_report_expiry_secs: u64,
    /// Largest transaction accepted, in bytes.
    pub max_tx_bytes: u64,
    /// The hub chain batches settle on.
    pub hub_chain: String,
    /// Most hub calls in one batch.
    pub max_batch_calls: u32,
    /// A sync attempt counts as running this long after `last_sync`.
    pub sync_window_secs: u64,
    /// On failure `last_sync` is set this far back (cooldown =
    /// sync_window_secs - failure_backdate_secs).
    pub failure_backdate_secs: u64,
    /// Seconds after an attempt starts at which validators sign `failed`
    /// if the hub does not show it settled (used by the relay).
    pub attempt_deadline_secs: u64,
    /// Partials of a message that never reaches the threshold are deleted
    /// this many blocks after the first one arrived.
    pub partial_expiry_blocks: u64,
    /// Hub heights covered by one signed HubBlock (deposits).
    pub hub_block_range: u64,
    /// Most deposits one HubBlock message carries; a range with more is
    /// credited in several messages (`more` set on all but the last).
    pub max_block_deposits: u32,
    /// Largest vote extension accepted, in bytes (checked in ExtendVote and
    /// VerifyVoteExtension before decoding).
    pub max_vote_extension_bytes: u32,
    /// Most partial signatures in one vote extension.
    pub max_extension_partials: u32,
    /// Most distinct messages (digests) a block's SubmitPartials may carry
    /// partials for.
    pub max_block_messages: u32,
    /// Most owed entries of closed windows turned into hub calls at the
    /// start of one block (1..=100000): a window with more is converted
    /// over several blocks, oldest window first.
    pub max_close_per_block: u32,
    /// Settlement windows a settled batch's calls (user, provider, amount)
    /// stay in state after it settled: queryable, and the bodies a relay
    /// re-submits if the hub ever forgets a nonce (1..=1000000).
    pub settled_retention_windows: u64,
    /// Blocks in each phase of a DKG or re-key ceremony (dealings, acks,
    /// reveals): a ceremony takes three times this many blocks. At least 3,
    /// so a message that misses one block still lands in its phase.
    pub dkg_phase_blocks: u64,
    /// Blocks an open validator-set proposal waits for approvals before
    /// it expires.
    pub proposal_expiry_blocks: u64,
    /// Settlement windows before the current one whose SLA records are
    /// kept; older windows' records are pruned and answer code 28 (app
    /// version 7, ADR 0026). 0 keeps every window. Left out of the stored
    /// parameters while 0, so earlier versions' state is unchanged.
    #[serde(skip_serializing_if = "is_zero")]
    pub sla_keep_windows: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Default for Params {
    fn default() -> Self {
        Self {
            settlement_window_secs: 60,
            max_report_records: 1000,
            max_report_expiry_secs: 600,
            max_tx_bytes: 1 << 20,
            hub_chain: "hub".into(),
            max_batch_calls: 100,
            sync_window_secs: 360,
            failure_backdate_secs: 300,
            attempt_deadline_secs: 30,
            partial_expiry_blocks: 50,
            hub_block_range: 10,
            max_block_deposits: 256,
            max_vote_extension_bytes: 4096,
            max_extension_partials: 8,
            max_block_messages: 8,
            max_close_per_block: 1000,
            settled_retention_windows: 1440,
            dkg_phase_blocks: 8,
            proposal_expiry_blocks: 3600,
            sla_keep_windows: 0,
        }
    }
}

impl Params {
    /// Every parameter as a JSON object, including those the stored
    /// encoding leaves out while 0 (`sla_keep_windows`): what `/params`
    /// shows and what names a parameter for a change.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let serde_json::Value::Object(m) = &mut v {
            m.entry("sla_keep_windows")
                .or_insert(serde_json::Value::from(self.sla_keep_windows));
        }
        v
    }

    /// Checks the parameters' ranges.
    pub fn validate(&self) -> Result<(), GenesisError> {
        let bad = |m: &str| Err(GenesisError::Invalid(m.to_string()));
        if self.settlement_window_secs == 0 || self.settlement_window_secs > 86_400 * 31 {
            return bad("settlement_window_secs must be 1..=2678400");
        }
        if !(1..=1000).contains(&self.max_report_records) {
            return bad("max_report_records must be 1..=1000");
        }
        if !(1..=MAX_REPORT_EXPIRY_CAP).contains(&self.max_report_expiry_secs) {
            return bad("max_report_expiry_secs must be 1..=600");
        }
        if !(1024..=(64 << 20)).contains(&self.max_tx_bytes) {
            return bad("max_tx_bytes must be 1024..=67108864");
        }
        if crate::ident::check_party("hub_chain", &self.hub_chain).is_err() {
            return bad("hub_chain must be 1-64 characters of [A-Za-z0-9._:/-]");
        }
        if !(1..=1000).contains(&self.max_batch_calls) {
            return bad("max_batch_calls must be 1..=1000");
        }
        if self.sync_window_secs == 0 || self.failure_backdate_secs > self.sync_window_secs {
            return bad("sync_window_secs must be > 0 and >= failure_backdate_secs");
        }
        if self.attempt_deadline_secs == 0 || self.attempt_deadline_secs > self.sync_window_secs {
            return bad("attempt_deadline_secs must be 1..=sync_window_secs");
        }
        if !(1..=10_000).contains(&self.partial_expiry_blocks) {
            return bad("partial_expiry_blocks must be 1..=10000");
        }
        if !(1..=1000).contains(&self.hub_block_range) {
            return bad("hub_block_range must be 1..=1000");
        }
        if !(1..=10_000).contains(&self.max_block_deposits) {
            return bad("max_block_deposits must be 1..=10000");
        }
        if !(512..=65_536).contains(&self.max_vote_extension_bytes) {
            return bad("max_vote_extension_bytes must be 512..=65536");
        }
        if !(1..=64).contains(&self.max_extension_partials) {
            return bad("max_extension_partials must be 1..=64");
        }
        if !(1..=64).contains(&self.max_block_messages) {
            return bad("max_block_messages must be 1..=64");
        }
        if !(1..=100_000).contains(&self.max_close_per_block) {
            return bad("max_close_per_block must be 1..=100000");
        }
        if !(1..=1_000_000).contains(&self.settled_retention_windows) {
            return bad("settled_retention_windows must be 1..=1000000");
        }
        if !(3..=10_000).contains(&self.dkg_phase_blocks) {
            return bad("dkg_phase_blocks must be 3..=10000");
        }
        if !(1..=1_000_000).contains(&self.proposal_expiry_blocks) {
            return bad("proposal_expiry_blocks must be 1..=1000000");
        }
        if self.sla_keep_windows > MAX_SLA_KEEP_WINDOWS {
            return bad("sla_keep_windows must be 0 (keep every window) or 1..=100000000");
        }
        Ok(())
    }
}

/// A gateway allowed to report usage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayEntry {
    /// A name for logs and queries.
    pub name: String,
    /// Hex ed25519 public key (32 bytes).
    pub pubkey: String,
}

/// A user's starting balance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalanceEntry {
    /// The user.
    pub user: String,
    /// Credits.
    pub amount: u64,
}

/// A user's ed25519 key: the user signs its allowance changes with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    /// The user's name (as in usage records).
    pub name: String,
    /// Hex ed25519 public key (32 bytes).
    pub pubkey: String,
}

/// An allowance in force from genesis (the localnet demo's, or a
/// network's migrated ones).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowanceEntry {
    /// The user.
    pub user: String,
    /// The gateway's name in `gateways`.
    pub gateway: String,
    /// Most credits the gateway may charge the user per settlement window.
    pub max_per_window: u64,
    /// Unix seconds (block time) from which it no longer holds.
    pub expires_at: u64,
}

/// The `app_state` of CometBFT's genesis.json.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Genesis {
    /// Parameters (defaults for missing fields).
    #[serde(default)]
    pub params: Params,
    /// Registered gateways.
    #[serde(default)]
    pub gateways: Vec<GatewayEntry>,
    /// Starting balances.
    #[serde(default)]
    pub balances: Vec<BalanceEntry>,
    /// Users' keys (for signing allowance changes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<UserEntry>,
    /// Allowances in force from the first block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowances: Vec<AllowanceEntry>,
    /// The validators' threshold key from a trusted dealer (tests only;
    /// without it the chain makes its key by an on-chain DKG).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dkg: Option<KeyEpoch>,
}

/// Why a genesis `app_state` was refused.
#[derive(Debug, thiserror::Error)]
pub enum GenesisError {
    /// Not JSON of the expected shape.
    #[error("app_state is not valid Tally genesis JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// JSON of the right shape with a wrong value.
    #[error("invalid genesis: {0}")]
    Invalid(String),
}

impl Genesis {
    /// Parses `app_state` bytes; empty bytes, `null` and `{}` give the
    /// defaults.
    pub fn parse(bytes: &[u8]) -> Result<Self, GenesisError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.is_empty() || trimmed == b"null" || trimmed == b"\"\"" {
            return Ok(Genesis::default());
        }
        let g: Genesis = serde_json::from_slice(trimmed)?;
        g.validate()?;
        Ok(g)
    }

    /// The node's rule on top of [`Genesis::validate`]: a genesis with a
    /// threshold key settles on a hub, whose escrow pays every batch in full
    /// or refuses it, so balances must come only from hub deposits (synced
    /// down as signed hub blocks). Genesis balances would be credits no
    /// escrow backs: every batch charging them would be refused forever.
    /// `tallyd genesis ...` and `tallyd start` apply it; the state machine
    /// itself does not (in-process tests fund users directly).
    pub fn check_hub_funding(&self) -> Result<(), GenesisError> {
        if self.dkg.is_some() && !self.balances.is_empty() {
            return Err(GenesisError::Invalid(format!(
                "genesis funds {} user(s) and has a threshold key (batches settle on a hub): \
                 balances must come from hub deposits; remove `balances` (or the `dkg` entry \
                 for a chain without a hub)",
                self.balances.len()
            )));
        }
        Ok(())
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<(), GenesisError> {
        self.params.validate()?;
        if let Some(d) = &self.dkg {
            d.public_shares()
                .map_err(|e| GenesisError::Invalid(e.to_string()))?;
        }
        let invalid = |m: String| Err(GenesisError::Invalid(m));
        let mut keys = std::collections::BTreeSet::new();
        let mut names = std::collections::BTreeSet::new();
        for gw in &self.gateways {
            ident::check_party("gateway name", &gw.name)
                .map_err(|e| GenesisError::Invalid(e.log))?;
            let key = parse_pubkey(&gw.pubkey).map_err(GenesisError::Invalid)?;
            if !keys.insert(key) {
                return invalid(format!("gateway key {} is listed twice", gw.pubkey));
            }
            if !names.insert(gw.name.as_str()) {
                return invalid(format!("gateway name {} is listed twice", gw.name));
            }
        }
        let mut with_key = std::collections::BTreeSet::new();
        for u in &self.users {
            ident::check_party("user", &u.name).map_err(|e| GenesisError::Invalid(e.log))?;
            parse_pubkey(&u.pubkey).map_err(GenesisError::Invalid)?;
            if !with_key.insert(u.name.as_str()) {
                return invalid(format!("user {} has two keys", u.name));
            }
        }
        let mut given = std::collections::BTreeSet::new();
        for a in &self.allowances {
            ident::check_party("user", &a.user).map_err(|e| GenesisError::Invalid(e.log))?;
            if !names.contains(a.gateway.as_str()) {
                return invalid(format!(
                    "allowance of {} names gateway {}, which is not in gateways",
                    a.user, a.gateway
                ));
            }
            if a.max_per_window == 0 || a.expires_at == 0 {
                return invalid(format!(
                    "allowance of {} to {} needs max_per_window and expires_at above 0",
                    a.user, a.gateway
                ));
            }
            if !given.insert((a.user.as_str(), a.gateway.as_str())) {
                return invalid(format!(
                    "user {} gives gateway {} two allowances",
                    a.user, a.gateway
                ));
            }
        }
        let mut users = std::collections::BTreeSet::new();
        for b in &self.balances {
            ident::check_party("user", &b.user).map_err(|e| GenesisError::Invalid(e.log))?;
            if !users.insert(&b.user) {
                return Err(GenesisError::Invalid(format!(
                    "user {} is funded twice",
                    b.user
                )));
            }
        }
        Ok(())
    }
}

/// Parses a hex ed25519 public key and checks it is a valid point.
pub fn parse_pubkey(hex_key: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(hex_key.trim())
        .map_err(|e| format!("gateway key {hex_key:?} is not hex: {e}"))?;
    let arr: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| format!("gateway key {hex_key:?} is {} bytes, want 32", bytes.len()))?;
    ed25519_dalek::VerifyingKey::from_bytes(&arr)
        .map_err(|e| format!("gateway key {hex_key:?} is not an ed25519 point: {e}"))?;
    Ok(arr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_app_state_gives_defaults() {
        assert_eq!(Genesis::parse(b"").unwrap(), Genesis::default());
        assert_eq!(Genesis::parse(b"{}").unwrap(), Genesis::default());
    }

    #[test]
    fn refuses_bad_values_with_a_message() {
        let e = Genesis::parse(br#"{"params":{"settlement_window_secs":0}}"#).unwrap_err();
        assert!(e.to_string().contains("settlement_window_secs"), "{e}");
        let e = Genesis::parse(br#"{"gateways":[{"name":"g","pubkey":"zz"}]}"#).unwrap_err();
        assert!(e.to_string().contains("not hex"), "{e}");
        let e = Genesis::parse(br#"{"balances":[{"user":"a b","amount":1}]}"#).unwrap_err();
        assert!(e.to_string().contains("character"), "{e}");
        for bad in [0, 100_001] {
            let json = format!(r#"{{"params":{{"max_close_per_block":{bad}}}}}"#);
            let e = Genesis::parse(json.as_bytes()).unwrap_err();
            assert!(e.to_string().contains("max_close_per_block"), "{e}");
        }
        let g = Genesis::parse(br#"{"params":{"max_close_per_block":100000}}"#).unwrap();
        assert_eq!(g.params.max_close_per_block, 100_000);
        let e = Genesis::parse(br#"{"bogus":1}"#).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }
}

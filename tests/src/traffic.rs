//! Random but reproducible usage traffic, with the totals it should produce.

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally_settlement::proto::{Outcome, ReportUsage, UsageRecord};
use tally_settlement::{sign_report, Counters, RouteId};

/// The gateway key the generated traffic is signed with.
pub fn gateway_key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// Genesis `allowances`: each of `users` lets `gateway` charge without
/// limit (tests that check allowances build their own).
pub fn allowances(users: &[String], gateway: &str) -> serde_json::Value {
    users
        .iter()
        .map(|u| {
            serde_json::json!({
                "user": u,
                "gateway": gateway,
                "max_per_window": u64::MAX,
                "expires_at": u64::MAX,
            })
        })
        .collect()
}

/// Genesis `app_state` JSON registering `key` as gateway `gw-test`,
/// funding `users` and giving it their allowances.
pub fn app_state(key: &SigningKey, users: &[String], amount: u64, window_secs: u64) -> String {
    let balances: Vec<_> = users
        .iter()
        .map(|u| serde_json::json!({"user": u, "amount": amount}))
        .collect();
    serde_json::json!({
        "params": {"settlement_window_secs": window_secs},
        "gateways": [{"name": "gw-test", "pubkey": hex::encode(key.verifying_key().to_bytes())}],
        "balances": balances,
        "allowances": allowances(users, "gw-test"),
    })
    .to_string()
}

/// InitChain of an in-process benchmark at unix time `t0`: [`app_state`]
/// for `key`'s gateway and `users` (each funded with `u64::MAX / 16`,
/// 60-second windows), genesis at app `version`.
pub fn bench_init_chain(
    chain_id: &str,
    t0: i64,
    key: &SigningKey,
    users: &[String],
    version: u64,
) -> tendermint_proto::v0_38::abci::RequestInitChain {
    use tendermint_proto::v0_38::types::{ConsensusParams, VersionParams};
    tendermint_proto::v0_38::abci::RequestInitChain {
        time: Some(tendermint_proto::google::protobuf::Timestamp {
            seconds: t0,
            nanos: 0,
        }),
        chain_id: chain_id.into(),
        app_state_bytes: app_state(key, users, u64::MAX / 16, 60).into_bytes().into(),
        initial_height: 1,
        consensus_params: Some(ConsensusParams {
            version: Some(VersionParams { app: version }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A reproducible traffic generator over a fixed set of routes.
#[derive(Debug)]
pub struct Traffic {
    rng: StdRng,
    key: SigningKey,
    chain_id: String,
    next_id: u64,
    /// Users that traffic charges.
    pub users: Vec<String>,
    /// Providers.
    pub providers: Vec<String>,
    /// Models.
    pub models: Vec<String>,
    /// Routes.
    pub routes: Vec<String>,
}

impl Traffic {
    /// Traffic over `users x providers x models x routes`.
    pub fn new(seed: u64, key: SigningKey, chain_id: &str, dims: [usize; 4]) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            key,
            chain_id: chain_id.into(),
            next_id: seed.wrapping_mul(1 << 32),
            users: (0..dims[0]).map(|i| format!("user-{i}")).collect(),
            providers: (0..dims[1]).map(|i| format!("prov-{i}")).collect(),
            models: (0..dims[2]).map(|i| format!("org/model-{i}")).collect(),
            routes: (0..dims[3]).map(|i| format!("/v1/route-{i}")).collect(),
        }
    }

    /// `n` random records.
    pub fn records(&mut self, n: usize, max_amount: u64) -> Vec<UsageRecord> {
        (0..n)
            .map(|_| {
                let o = Outcome::ALL[self.rng.gen_range(0..Outcome::ALL.len())];
                UsageRecord {
                    user: self.users[self.rng.gen_range(0..self.users.len())].clone(),
                    provider: self.providers[self.rng.gen_range(0..self.providers.len())].clone(),
                    model: self.models[self.rng.gen_range(0..self.models.len())].clone(),
                    route: self.routes[self.rng.gen_range(0..self.routes.len())].clone(),
                    outcome: o as i32,
                    units: self.rng.gen_range(0..1000),
                    amount: match self.rng.gen_range(0..=max_amount) {
                        // Failed calls carry no amount (DESIGN.md).
                        _ if !o.may_carry_amount() => 0,
                        a => a,
                    },
                    ..Default::default()
                }
            })
            .collect()
    }

    /// A signed report of `records`, expiring `ttl` seconds after `now`.
    pub fn report(&mut self, records: Vec<UsageRecord>, now: u64, ttl: u64) -> Vec<u8> {
        self.next_id += 1;
        let mut id = [0u8; 16];
        id[8..].copy_from_slice(&self.next_id.to_be_bytes());
        sign_report(
            &self.key,
            &ReportUsage {
                chain_id: self.chain_id.clone(),
                report_id: id.to_vec(),
                expires_at: now + ttl,
                records,
                route_calls: Vec::new(),
            },
        )
    }

    /// A random number in `range`, from the same seed.
    pub fn pick(&mut self, range: std::ops::Range<usize>) -> usize {
        self.rng.gen_range(range)
    }
}

/// Expected counters per route, summed over windows.
pub fn totals(records: &[UsageRecord]) -> BTreeMap<RouteId, Counters> {
    let mut m: BTreeMap<RouteId, Counters> = BTreeMap::new();
    for r in records {
        let id = RouteId {
            user: r.user.clone(),
            provider: r.provider.clone(),
            model: r.model.clone(),
            route: r.route.clone(),
        };
        let o = Outcome::try_from(r.outcome).unwrap_or(Outcome::Unknown);
        // Test traffic stays far below u64::MAX.
        let _ = m.entry(id).or_default().add_record(o, r.units, r.amount);
    }
    m
}

/// The query path of one route's records over all windows.
pub fn route_path(id: &RouteId) -> String {
    format!(
        "/sla/route/{}/{}/{}/{}?limit=1000",
        id.user,
        id.provider,
        id.model.replace('/', "%2F"),
        id.route.replace('/', "%2F")
    )
}

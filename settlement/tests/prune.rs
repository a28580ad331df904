//! Pruning old windows' SLA records (app version 7, ADR 0026), against a
//! twin chain that never prunes: both run the same reports, and after
//! every block the pruned chain's state must be the twin's with exactly
//! the SLA keys of windows before the horizon removed (windows read by the
//! test's own key parser, not the code's), plus the two pruning keys. The
//! horizon itself is checked against the test's model (`max(window - K)`
//! over the blocks so far, never lower), and the queries against it: a
//! pruned window answers code 28, listings start at the horizon and list
//! the twin's records from there.

use std::collections::BTreeMap;
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use tally_settlement::proto::{Outcome, ReportUsage, UsageRecord};
use tally_settlement::query::query;
use tally_settlement::state::prune::{kept_from, PRUNE_PER_BLOCK};
use tally_settlement::{
    begin_block, deliver_tx, end_block, init_chain_at, keys, sign_report, AllowanceEntry,
    BalanceEntry, Block, Code, GatewayEntry, Genesis, Params,
};
use tally_store::{KvRead, MemBackend, Pending};

const CHAIN: &str = "prune-test";
const T0: u64 = 1_800_000_000; // a window boundary for 60 s windows
const W0: u64 = T0 / 60;
const USERS: [&str; 3] = ["alice", "bob", "org/carol"];
const PROVIDERS: [&str; 3] = ["acme", "beta", "org/zed"];
const MODELS: [&str; 2] = ["m1", "llama/3"];
const ROUTES: [&str; 2] = ["/v1/chat", "/v1/embed"];

fn gw_key() -> SigningKey {
    SigningKey::from_bytes(&[9u8; 32])
}

fn chain(keep: u64, version: u64) -> Result<Pending, String> {
    let mut p = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let g = Genesis {
        params: Params {
            sla_keep_windows: keep,
            ..Params::default()
        },
        gateways: vec![GatewayEntry {
            name: "gw0".into(),
            pubkey: hex::encode(gw_key().verifying_key().to_bytes()),
        }],
        balances: USERS
            .iter()
            .map(|u| BalanceEntry {
                user: (*u).into(),
                amount: 1 << 40,
            })
            .collect(),
        allowances: USERS
            .iter()
            .map(|u| AllowanceEntry {
                user: (*u).into(),
                gateway: "gw0".into(),
                max_per_window: u64::MAX,
                expires_at: u64::MAX,
            })
            .collect(),
        ..Genesis::default()
    };
    init_chain_at(&mut p, CHAIN, &g, version).map_err(|e| e.to_string())?;
    p.commit(0).unwrap();
    Ok(p)
}

/// One call: indexes into the name lists, and a latency bucket (0: none).
type Call = (usize, usize, usize, usize, u32);

fn record(c: &Call) -> UsageRecord {
    UsageRecord {
        user: USERS[c.0].into(),
        provider: PROVIDERS[c.1].into(),
        model: MODELS[c.2].into(),
        route: ROUTES[c.3].into(),
        outcome: Outcome::Ok as i32,
        units: 3,
        amount: 2,
        latency_bucket: c.4,
        ttft_bucket: c.4,
    }
}

/// Runs one block at `time` with one report of `calls` on `p`.
fn run(p: &mut Pending, height: u64, time: u64, id: u64, calls: &[UsageRecord]) {
    let b = Block { height, time };
    begin_block(p, &b).unwrap();
    if !calls.is_empty() {
        let mut report_id = vec![0u8; 8];
        report_id.extend_from_slice(&id.to_be_bytes());
        let r = ReportUsage {
            chain_id: CHAIN.into(),
            report_id,
            expires_at: time + 300,
            records: calls.to_vec(),
            route_calls: Vec::new(),
        };
        let res = deliver_tx(p, &b, &sign_report(&gw_key(), &r)).unwrap();
        assert_eq!(res.code, Code::Ok, "{}", res.log);
    }
    end_block(p, &b).unwrap();
    p.commit(height).unwrap();
}

/// The window of an SLA-record key, parsed here from the layout the docs
/// give (not with the code's parser); `None` for other keys.
fn window_of(k: &[u8]) -> Option<u64> {
    let be = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().unwrap());
    if let Some(rest) = k.strip_prefix(b"rr/") {
        return Some(be(&rest[rest.len() - 8..]));
    }
    if let Some(rest) = k.strip_prefix(b"win/") {
        return Some(be(rest));
    }
    for ns in [&b"ip/"[..], b"iu/", b"pw/", b"uw/", b"lat/", b"plat/"] {
        if let Some(rest) = k.strip_prefix(ns) {
            let sep = rest.iter().position(|b| *b == 0).unwrap();
            return Some(be(&rest[sep + 1..]));
        }
    }
    None
}

fn all(kv: &impl KvRead) -> BTreeMap<Vec<u8>, Vec<u8>> {
    kv.scan(b"", b"", usize::MAX).unwrap().into_iter().collect()
}

/// The pruned chain's state is the twin's without SLA keys of windows
/// before `kept`, plus the pruning keys; returns how many SLA keys the
/// twin has that were pruned.
fn check_state(pruned: &Pending, twin: &Pending, kept: u64) -> usize {
    let mut want = all(twin);
    let before = want.len();
    want.retain(|k, _| window_of(k).is_none_or(|w| w >= kept));
    let gone = before - want.len();
    let mut have = all(pruned);
    for k in [keys::SLA_KEPT_FROM, keys::SLA_PRUNE] {
        have.remove(k);
    }
    // The parameters differ by sla_keep_windows alone.
    let (a, b) = (have.remove(keys::PARAMS), want.remove(keys::PARAMS));
    let params = |v: Option<Vec<u8>>| -> serde_json::Value {
        let mut p: serde_json::Value = serde_json::from_slice(&v.unwrap()).unwrap();
        p.as_object_mut().unwrap().remove("sla_keep_windows");
        p
    };
    assert_eq!(params(a), params(b));
    let extra: Vec<_> = have.keys().filter(|k| !want.contains_key(*k)).collect();
    let missing: Vec<_> = want.keys().filter(|k| !have.contains_key(*k)).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "kept from {kept}: {} keys not pruned (first {:?}), {} missing (first {:?})",
        extra.len(),
        extra.first().map(|k| String::from_utf8_lossy(k)),
        missing.len(),
        missing.first().map(|k| String::from_utf8_lossy(k)),
    );
    let differs = have.iter().find(|(k, v)| want.get(*k) != Some(v));
    assert!(
        differs.is_none(),
        "a kept value differs: {:?}",
        differs.map(|(k, _)| String::from_utf8_lossy(k))
    );
    gone
}

fn route_path(c: &Call) -> String {
    let esc = |s: &str| s.replace('/', "%2F");
    format!(
        "/sla/route/{}/{}/{}/{}",
        esc(USERS[c.0]),
        esc(PROVIDERS[c.1]),
        esc(MODELS[c.2]),
        esc(ROUTES[c.3])
    )
}

fn json(kv: &Pending, path: &str) -> serde_json::Value {
    let r = query(kv, path);
    assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
    serde_json::from_slice(&r.value).unwrap()
}

/// The queries at the horizon: a pruned window answers 28, a kept one what
/// the twin answers; listings hold the twin's items from the horizon on.
fn check_queries(pruned: &Pending, twin: &Pending, kept: u64, c: &Call, windows: &[u64]) {
    for &w in windows {
        let one = format!("{}/{w}", route_path(c));
        let provider = format!("/sla/provider/{}/{w}", PROVIDERS[c.1].replace('/', "%2F"));
        let latency = format!("/latency/{}/{w}", PROVIDERS[c.1].replace('/', "%2F"));
        for path in [one, provider, latency] {
            let (a, b) = (query(pruned, &path), query(twin, &path));
            if w < kept {
                assert_eq!(a.code, Code::HeightUnavailable, "{path} kept from {kept}");
                assert!(a.log.contains("pruned"), "{}", a.log);
            } else {
                assert_eq!((a.code, &a.value), (b.code, &b.value), "{path}");
            }
        }
    }
    for (path, field) in [
        (format!("{}?limit=1000", route_path(c)), "records"),
        ("/windows?limit=1000".to_string(), "windows"),
    ] {
        let items = |kv: &Pending| json(kv, &path)[field].clone();
        let twin_from: Vec<_> = items(twin)
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["window"].as_u64().unwrap() >= kept)
            .cloned()
            .collect();
        assert_eq!(items(pruned), serde_json::Value::Array(twin_from), "{path}");
    }
}

fn call() -> impl Strategy<Value = Call> {
    (0..3usize, 0..3usize, 0..2usize, 0..2usize, 0..4u32)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn pruning_removes_exactly_the_old_windows_sla_keys(
        keep in 1..4u64,
        blocks in proptest::collection::vec(
            (0..3u64, proptest::collection::vec(call(), 0..6)),
            1..40,
        ),
    ) {
        let mut pruned = chain(keep, 7).unwrap();
        let mut twin = chain(0, 7).unwrap();
        let (mut time, mut model_kept, mut windows) = (T0, 0u64, Vec::new());
        for (i, (step, calls)) in blocks.iter().enumerate() {
            // 0: the same window; 1: the next; 2: skip one.
            time += step * 60 + 1;
            let height = i as u64 + 1;
            let recs: Vec<_> = calls.iter().map(record).collect();
            run(&mut pruned, height, time, height, &recs);
            run(&mut twin, height, time, height, &recs);
            let w = time / 60;
            windows.push(w);
            model_kept = model_kept.max(w.saturating_sub(keep));
            prop_assert_eq!(kept_from(&pruned).unwrap(), model_kept);
            check_state(&pruned, &twin, model_kept);
            if let Some(c) = calls.first() {
                check_queries(&pruned, &twin, model_kept, c, &windows);
            }
        }
    }
}

/// More records than one block prunes: the pass takes several blocks,
/// queries answer 28 for the window from the first of them on, and the
/// state ends exactly the twin's without the window.
#[test]
fn a_large_window_is_pruned_over_several_blocks() {
    let mut pruned = chain(1, 7).unwrap();
    let mut twin = chain(0, 7).unwrap();
    // 3 reports of 1,000 distinct routes in window W0.
    let mut height = 0;
    for r in 0..3u64 {
        let recs: Vec<_> = (0..1000u64)
            .map(|i| UsageRecord {
                route: format!("/r/{r}/{i}"),
                ..record(&(0, 0, 0, 0, 1))
            })
            .collect();
        height += 1;
        run(&mut pruned, height, T0 + height, height, &recs);
        run(&mut twin, height, T0 + height, height, &recs);
    }
    let routes: usize = 3000;
    // Two windows on: W0 is before the horizon.
    let mut blocks = 0;
    let mut time = T0 + 120;
    loop {
        height += 1;
        time += 1;
        run(&mut pruned, height, time, height, &[]);
        run(&mut twin, height, time, height, &[]);
        blocks += 1;
        assert_eq!(kept_from(&pruned).unwrap(), W0 + 1);
        let one = format!(
            "{}/{W0}",
            route_path(&(0, 0, 0, 0, 1)).replace("%2Fv1%2Fchat", "%2Fr%2F2%2F999")
        );
        assert_eq!(query(&pruned, &one).code, Code::HeightUnavailable);
        assert_eq!(query(&twin, &one).code, Code::Ok);
        // Listings start at the horizon while the window's keys are
        // still being deleted: nothing of W0, which the twin lists.
        let user = json(&pruned, "/sla/user/alice?limit=5")["records"].clone();
        assert_eq!(user, serde_json::json!([]), "block {blocks}");
        let twin_user = json(&twin, "/sla/user/alice?limit=5")["records"].clone();
        assert_eq!(twin_user.as_array().map(Vec::len), Some(5));
        let wins = json(&pruned, "/windows")["windows"].clone();
        assert_eq!(wins, serde_json::json!([]), "block {blocks}");
        let route = json(
            &pruned,
            &route_path(&(0, 0, 0, 0, 1)).replace("%2Fv1%2Fchat", "%2Fr%2F2%2F999"),
        );
        assert_eq!(route["records"], serde_json::json!([]), "block {blocks}");
        if pruned
            .get(keys::SLA_PRUNE)
            .unwrap()
            .is_some_and(|v| v.len() == 8)
        {
            break;
        }
        assert!(blocks < 10, "the pass did not finish in 10 blocks");
    }
    // Each route is one unit and the pass reads at least one pw/ entry.
    let least = (routes + 1).div_ceil(PRUNE_PER_BLOCK);
    assert!(
        blocks >= least,
        "{blocks} blocks, at least {least} expected"
    );
    assert!(
        blocks <= least + 1,
        "{blocks} blocks, at most {} expected",
        least + 1
    );
    assert_eq!(check_state(&pruned, &twin, W0 + 1), 4 * routes + 4);
}

#[test]
fn before_version_7_the_parameter_is_refused_at_genesis() {
    let e = chain(5, 6).unwrap_err();
    assert!(
        e.contains("sla_keep_windows takes effect from app version 7"),
        "{e}"
    );
    assert!(chain(0, 6).is_ok());
    let e = chain(100_000_001, 7).unwrap_err();
    assert!(e.contains("sla_keep_windows must be"), "{e}");
}

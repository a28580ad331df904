//! The settlement timeline on four in-process validators with a
//! controllable clock and a scripted stand-in for the relay's hand-in:
//! window close -> SyncTxStart -> partials in vote extensions -> combined
//! group signature; a failed result gives the ~60 s cooldown, a silent
//! attempt expires after 360 s, and every call settles exactly once.

use prost::Message;
use tally_settlement::bls::{self, deal, Kind, PublicShares, SecretShare};
use tally_settlement::proto::{HubResult, Outcome, UsageRecord, VoteExtension};
use tally_settlement::Code;
use tally_tests::driver::Net;
use tally_tests::traffic::{gateway_key, Traffic};

const CHAIN: &str = "tally-driver";
const T0: i64 = 1_800_000_000; // a 60 s window boundary

fn query(net: &Net, i: usize, path: &str) -> serde_json::Value {
    let r = net.nodes[i].app.query_path(path);
    assert_eq!(r.code, Code::Ok, "{path}: {}", r.log);
    serde_json::from_slice(&r.value).expect("json")
}

fn setup() -> (Net, Traffic, PublicShares, tempfile::TempDir) {
    setup_with(serde_json::json!({}))
}

fn setup_with(extra_params: serde_json::Value) -> (Net, Traffic, PublicShares, tempfile::TempDir) {
    let key = gateway_key(3);
    let traffic = Traffic::new(5, key.clone(), CHAIN, [2, 2, 1, 1]);
    let coeffs: Vec<[u8; 64]> = (0..3u8).map(|i| [i + 11; 64]).collect();
    let (pubs, shares) = deal(4, 3, &coeffs).expect("deal");
    let hexkey = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
    let mut params = serde_json::json!({"settlement_window_secs": 60, "hub_chain": "hub"});
    for (k, v) in extra_params.as_object().cloned().unwrap_or_default() {
        params[k] = v;
    }
    let app_state = serde_json::json!({
        "params": params,
        "gateways": [{"name": "gw", "pubkey": hex::encode(key.verifying_key().to_bytes())}],
        "allowances": tally_tests::traffic::allowances(&traffic.users, "gw"),
        "balances": traffic.users.iter().map(|u| serde_json::json!({"user": u, "amount": 1_000_000})).collect::<Vec<_>>(),
        "dkg": {
            "threshold": 3,
            "group_key": hexkey(&pubs.group),
            "public_shares": pubs.shares.iter().map(hexkey).collect::<Vec<_>>(),
            "signers": tally_tests::driver::signers(4),
        },
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let mut net = Net::on_rocksdb(4, dir.path(), CHAIN, T0).expect("net");
    net.init(&app_state.to_string()).expect("init");
    net.set_signers(shares);
    (net, traffic, pubs, dir)
}

/// Well-formed partials signed with a key that is not the validator's share.
fn forge(ext: Vec<u8>) -> Vec<u8> {
    let Ok(mut e) = VoteExtension::decode(ext.as_slice()) else {
        return ext;
    };
    for p in &mut e.partials {
        let fake = SecretShare::from_bytes(p.index, &[9u8; 32]).expect("scalar");
        let kind = if p.kind == 1 {
            Kind::Batch
        } else {
            Kind::HubResult
        };
        let d: [u8; 32] = p.digest.as_slice().try_into().expect("digest");
        p.signature = fake
            .sign(&bls::message(CHAIN, kind, &d))
            .sig_bytes()
            .to_vec();
    }
    e.encode_to_vec()
}

/// Partial-signature keys left in node `i`'s RocksDB (read from the store).
fn psig_keys(net: &Net, i: usize) -> usize {
    net.nodes[i]
        .app
        .committed_state()
        .scan(b"psig/", b"psig0", 1000)
        .expect("scan")
        .len()
}

use tally_store::KvRead;

#[test]
fn settlement_timeline_with_cooldown_expiry_and_faults() -> anyhow::Result<()> {
    let (mut net, mut traffic, pubs, _dir) = setup();
    // Validator 3 forges its partials; validator 2 will be down for a while.
    net.nodes[3].tamper = Some(forge);

    // Usage in window w0 with amounts.
    let recs: Vec<UsageRecord> = traffic
        .records(20, 9)
        .into_iter()
        .map(|mut r| {
            r.outcome = Outcome::Ok as i32;
            r.amount += 1;
            r
        })
        .collect();
    let total: u64 = recs.iter().map(|r| r.amount).sum();
    let tx = traffic.report(recs, net.now as u64, 300);
    net.block(vec![tx], 10)?;
    let mut height_started = None;
    while net.now <= T0 + 70 {
        let out = net.block(vec![], 10)?;
        if height_started.is_none() && query(&net, 0, "/sync/hub")["attempt"] == 1 {
            height_started = Some(out.block.height);
        }
    }
    let started = height_started.expect("a sync started after the window closed");
    let b = query(&net, 1, "/batch/hub/1");
    assert_eq!(
        b["total"], total,
        "the batch carries exactly the window's payments"
    );
    // Partials ride in the extensions of the SyncTxStart height and are
    // combined in the next block: signed two blocks after the start at most.
    assert_eq!(b["status"], "signed", "batch: {b}");
    assert!(
        net.height <= started + 2,
        "signed at {} for start at {started}",
        net.height
    );
    let sig = hex::decode(b["signature"].as_str().expect("sig"))?;
    let digest: [u8; 32] = hex::decode(b["digest"].as_str().expect("digest"))?
        .try_into()
        .expect("32");
    let sig = bls::parse_signature(&sig)?;
    assert!(pubs.verify_group(&bls::message(CHAIN, Kind::Batch, &digest), &sig));
    for i in 0..4 {
        assert_eq!(
            psig_keys(&net, i),
            0,
            "node{i}: partials deleted after combine"
        );
    }

    // The hub reports attempt 1 failed at time T: cooldown of ~60 s.
    let fail = HubResult {
        chain: "hub".into(),
        nonce: 1,
        attempt: 1,
        settled: false,
    };
    for i in 0..4 {
        net.nodes[i].app.hand_in(fail.clone());
    }
    let mut t_fail = None;
    for _ in 0..5 {
        let out = net.block(vec![], 5)?;
        if query(&net, 0, "/sync/hub")["failures"] == 1 {
            t_fail = Some(out.block.time as u64);
            break;
        }
    }
    let t_fail = t_fail.expect("failure recorded");
    let s = query(&net, 0, "/sync/hub");
    assert_eq!(s["last_sync"], t_fail - 300);
    assert!(s["last_error"]
        .as_str()
        .is_some_and(|e| e.contains("attempt 1")));
    // No new attempt before T + 60; one in the first block after it.
    // A validator down: the retry still starts (it reuses the batch's
    // signature; `a_batch_is_signed_and_settled_with_one_validator_down`
    // shows t of the rest signing).
    net.stop(2);
    while (net.now as u64) <= t_fail + 60 {
        net.block(vec![], 7)?;
        assert_eq!(
            query(&net, 0, "/sync/hub")["attempt"],
            1,
            "no retry inside the cooldown"
        );
    }
    let out = net.block(vec![], 7)?;
    assert!(out.block.time as u64 > t_fail + 60);
    let s = query(&net, 0, "/sync/hub");
    assert_eq!(s["attempt"], 2, "retry right after the cooldown: {s}");
    assert_eq!(s["nonce"], 1, "same batch, same nonce");
    let start2 = s["last_sync"].as_u64().expect("last_sync");
    net.restart(2)?;

    // Attempt 2 gets no result at all: it expires after 360 s.
    while (net.now as u64) <= start2 + 360 {
        net.block(vec![], 20)?;
        assert_eq!(query(&net, 0, "/sync/hub")["attempt"], 2);
    }
    net.block(vec![], 20)?;
    assert_eq!(
        query(&net, 0, "/sync/hub")["attempt"],
        3,
        "silent attempt expired and restarted"
    );

    // The hub shows nonce 1 settled: the sync ends, calls are paid once.
    let ok = HubResult {
        chain: "hub".into(),
        nonce: 1,
        attempt: 3,
        settled: true,
    };
    for i in 0..4 {
        net.nodes[i].app.hand_in(ok.clone());
    }
    for _ in 0..4 {
        net.block(vec![], 5)?;
    }
    let s = query(&net, 2, "/sync/hub");
    assert_eq!(s["settled_batches"], 1, "{s}");
    assert_eq!(s["running"], false);
    assert!(s["nonce"].is_null());
    let b = query(&net, 2, "/batch/hub/1");
    assert_eq!(b["status"], "settled");
    assert!(b["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .all(|c| c["settled"] == true));
    assert!(query(&net, 0, "/hubcalls/hub")["calls"]
        .as_array()
        .expect("calls")
        .is_empty());
    // Nothing else is started: no second batch can hold these calls.
    for _ in 0..10 {
        net.block(vec![], 30)?;
    }
    assert_eq!(query(&net, 0, "/sync/hub")["attempts"], 3);
    assert_eq!(
        net.nodes[0].app.query_path("/batch/hub/2").code,
        Code::NotFound
    );
    for i in 0..4 {
        assert_eq!(psig_keys(&net, i), 0);
    }
    let heads = net.heads();
    assert!(heads.iter().all(|h| h == &heads[0]), "{heads:?}");
    Ok(())
}

/// Several windows, small batches, a relay stand-in that reports every
/// signed batch settled, and a node crashing between FinalizeBlock and
/// Commit in every block: each call lands in exactly one batch and is
/// settled once; credits moved equal the usage charged.
#[test]
fn every_call_settles_exactly_once_across_crashes() -> anyhow::Result<()> {
    settle_everything_across_crashes(serde_json::json!({"max_batch_calls": 2}), 4, 400)?;
    Ok(())
}

/// The same with one owed entry turned into a hub call per block and two
/// blocks per window: closed windows convert over many blocks (some are
/// seen `converting`), a window closes while the one before it still
/// converts, batches form meanwhile, and still every call settles exactly
/// once.
#[test]
fn every_call_settles_exactly_once_when_windows_convert_over_many_blocks() -> anyhow::Result<()> {
    let converting = settle_everything_across_crashes(
        serde_json::json!({"max_batch_calls": 2, "max_close_per_block": 1}),
        30,
        1500,
    )?;
    assert!(converting > 0, "no window was ever seen converting");
    Ok(())
}

/// Runs [`every_call_settles_exactly_once_across_crashes`] with `params`,
/// blocks `step` seconds apart, for `secs` seconds; returns in how many
/// blocks some window was `converting`.
fn settle_everything_across_crashes(
    params: serde_json::Value,
    step: i64,
    secs: i64,
) -> anyhow::Result<usize> {
    let (mut net, mut traffic, _pubs, _dir) = setup_with(params);
    let mut charged = 0u64;
    let mut h = 0u64;
    let mut converting = 0;
    while net.now < T0 + secs {
        let ws = query(&net, 0, "/windows");
        if ws["windows"]
            .as_array()
            .expect("windows")
            .iter()
            .any(|w| w["converting"] == true)
        {
            converting += 1;
        }
        h += 1;
        let mut txs = Vec::new();
        if net.now < T0 + 200 && h.is_multiple_of(3) {
            let recs: Vec<UsageRecord> = traffic.records(10, 7);
            charged += recs.iter().map(|r| r.amount).sum::<u64>();
            txs.push(traffic.report(recs, net.now as u64, 300));
        }
        // The relay stand-in: a signed batch is reported settled.
        let s = query(&net, 0, "/sync/hub");
        if let Some(nonce) = s["nonce"].as_u64() {
            if query(&net, 0, &format!("/batch/hub/{nonce}"))["status"] == "signed" {
                let r = HubResult {
                    chain: "hub".into(),
                    nonce,
                    attempt: s["attempt"].as_u64().unwrap_or(0) as u32,
                    settled: true,
                };
                for n in &net.nodes {
                    n.app.hand_in(r.clone());
                }
            }
        }
        let out = net.block_crashing(txs, step, (h % 4) as usize)?;
        assert!(
            out.tx_results.iter().all(|r| r.code == 0),
            "{:?}",
            out.tx_results
        );
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut moved = 0u64;
    let mut nonce = 1;
    loop {
        let r = net.nodes[1].app.query_path(&format!("/batch/hub/{nonce}"));
        if r.code == Code::NotFound {
            break;
        }
        let b: serde_json::Value = serde_json::from_slice(&r.value)?;
        assert_eq!(b["status"], "settled", "{b}");
        for c in b["calls"].as_array().expect("calls") {
            assert!(
                ids.insert(c["id"].as_u64().expect("id")),
                "call in two batches: {c}"
            );
        }
        moved += b["total"].as_u64().expect("total");
        nonce += 1;
    }
    assert!(nonce > 3, "expected several batches, got {}", nonce - 1);
    assert_eq!(
        ids.len() as u64,
        *ids.iter().max().expect("calls"),
        "call ids 1..=n, none missing"
    );
    assert_eq!(moved, charged, "every charged credit settled exactly once");
    assert!(query(&net, 0, "/hubcalls/hub")["calls"]
        .as_array()
        .expect("calls")
        .is_empty());
    for i in 0..4 {
        assert_eq!(psig_keys(&net, i), 0);
    }
    Ok(converting)
}

/// Partials that never reach the threshold expire and are range-deleted;
/// once enough signers are back the batch is signed.
#[test]
fn partials_below_threshold_expire() -> anyhow::Result<()> {
    let (mut net, mut traffic, _pubs, _dir) =
        setup_with(serde_json::json!({"partial_expiry_blocks": 4}));
    net.nodes[3].tamper = Some(forge);
    let recs: Vec<UsageRecord> = traffic
        .records(4, 5)
        .into_iter()
        .map(|mut r| {
            r.outcome = Outcome::Ok as i32;
            r.amount = 2;
            r
        })
        .collect();
    net.block(vec![traffic.report(recs, net.now as u64, 300)], 1)?;
    net.stop(2);
    // Two honest signers of four, threshold three: stored, never combined,
    // deleted when they expire (then signed again, since the batch still
    // waits).
    let mut seen = 0;
    let mut expired = 0;
    let mut last = 0;
    while net.now <= T0 + 160 {
        net.block(vec![], 5)?;
        let now = psig_keys(&net, 0);
        seen = seen.max(now);
        if last == 2 && now == 0 {
            expired += 1;
        }
        last = now;
        let b = net.nodes[0].app.query_path("/batch/hub/1");
        assert!(
            b.code == Code::NotFound || !String::from_utf8_lossy(&b.value).contains("\"signed\"")
        );
    }
    assert_eq!(seen, 2, "two partials were stored while waiting");
    assert!(expired >= 2, "partials expired {expired} times");
    net.restart(2)?;
    for _ in 0..3 {
        net.block(vec![], 5)?;
    }
    assert_eq!(query(&net, 0, "/batch/hub/1")["status"], "signed");
    assert_eq!(psig_keys(&net, 0), 0);
    Ok(())
}

/// One validator of four is down from genesis on: the other three (t = 3)
/// still sign the window's batch, the hub settles it (paying exactly the
/// usage), and the stopped validator catches up to the same state.
#[test]
fn a_batch_is_signed_and_settled_with_one_validator_down() -> anyhow::Result<()> {
    let (mut net, mut traffic, pubs, _dir) = setup();
    net.stop(3);
    net.hub = Some(tally_tests::hub::Hub::default());
    let recs: Vec<UsageRecord> = traffic
        .records(8, 5)
        .into_iter()
        .map(|mut r| {
            r.outcome = Outcome::Ok as i32;
            r.amount = 3;
            r
        })
        .collect();
    let mut want = std::collections::BTreeMap::new();
    for r in &recs {
        *want
            .entry((r.user.clone(), r.provider.clone()))
            .or_insert(0u64) += 3;
    }
    let out = net.block(vec![traffic.report(recs, net.now as u64, 300)], 10)?;
    assert_eq!(out.tx_results[0].code, 0, "{}", out.tx_results[0].log);
    let mut signed_at = None;
    while net.now <= T0 + 120 {
        let out = net.block(vec![], 10)?;
        if out
            .tx_results
            .iter()
            .flat_map(|r| &r.events)
            .any(|e| e.r#type == "batch_signed")
        {
            signed_at.get_or_insert(out.block.height);
        }
    }
    assert!(signed_at.is_some(), "no batch signed with three of four up");
    let b = query(&net, 0, "/batch/hub/1");
    assert_eq!(b["status"], "settled", "{b}");
    let sig = bls::parse_signature(&hex::decode(b["signature"].as_str().expect("sig"))?)?;
    let digest: [u8; 32] = hex::decode(b["digest"].as_str().expect("digest"))?
        .try_into()
        .expect("32");
    assert!(pubs.verify_group(&bls::message(CHAIN, Kind::Batch, &digest), &sig));
    let hub = net.hub.clone().expect("hub");
    assert_eq!(hub.settled.len(), 1);
    assert_eq!(hub.paid, want, "the hub paid exactly the usage");
    // No partial of node 3 was ever proposed.
    for blk in &net.blocks {
        for t in &blk.txs {
            if let Ok(Some(tally_settlement::proto::tx::Sum::Partials(p))) =
                tally_settlement::decode_tx(t).map(|d| d.sum)
            {
                assert!(
                    p.partials.iter().all(|x| x.index != 4),
                    "a partial of the stopped node3 (share 4) at height {}",
                    blk.height
                );
            }
        }
    }
    net.restart(3)?;
    net.block(vec![], 10)?;
    let heads = net.heads();
    assert!(heads.iter().all(|h| h == &heads[0]), "{heads:?}");
    Ok(())
}

//! Deposits: confirmation depth, stale ranges, refused answers and the
//! caps on what is handed in.

use super::*;

fn dep(seq: u64, user: &str, amount: u64) -> HubDeposit {
    HubDeposit {
        seq,
        user: user.into(),
        amount,
        pubkey: Vec::new(),
    }
}

/// A chain with no attempt running and its deposit cursor at
/// (`height`, `seq`).
fn chain_with_cursor(params: &Params, height: u64, seq: u64) -> Arc<MemBackend> {
    let backend = Arc::new(MemBackend::new());
    commit(&backend, |kv| {
        chain_state::put_params(kv, params).unwrap();
        sync_state::put_hub_height(kv, CHAIN, height);
        sync_state::put_deposit_seq(kv, CHAIN, seq);
    });
    backend
}

fn deposits_script(tip: u64) -> Script {
    Script {
        tip,
        deposits: vec![
            (2, dep(1, "alice", 5)),
            (10, dep(2, "bob", 7)),
            (11, dep(3, "carol", 9)),
            (20, dep(4, "dave", 11)),
        ],
        ..Script::default()
    }
}

#[tokio::test]
async fn a_deposit_range_waits_for_its_confirmation_depth() {
    let hub = FakeHub::start(deposits_script(12));
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.confirmations = 3;
    let mut r = relay(app.clone(), cfg, &metrics);
    // Range 1..=10 needs the tip at 13: at 12 it is not even read.
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    assert!(!hub.log().iter().any(|l| l.starts_with("query /deposits")));
    hub.with(|s| s.tip = 13);
    r.poll().await;
    assert_eq!(
        app.held().blocks(),
        [HubBlock {
            chain: CHAIN.into(),
            from_height: 1,
            to_height: 10,
            deposits: vec![dep(1, "alice", 5), dep(2, "bob", 7)],
            more: false,
            deposit_count: 2,
        }]
    );
}

#[tokio::test]
async fn a_range_the_cursor_moved_past_is_neither_read_nor_held() {
    let hub = FakeHub::start(deposits_script(40));
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    assert_eq!(app.held().blocks().len(), 1);
    // The chain credited 1..=10: the cursor is at 11, next seq 3.
    commit(&backend, |kv| {
        sync_state::put_hub_height(kv, CHAIN, 11);
        sync_state::put_deposit_seq(kv, CHAIN, 3);
    });
    r.poll().await;
    assert_eq!(
        app.held().blocks(),
        [HubBlock {
            chain: CHAIN.into(),
            from_height: 11,
            to_height: 20,
            deposits: vec![dep(3, "carol", 9), dep(4, "dave", 11)],
            more: false,
            deposit_count: 4,
        }]
    );
    let ranges: Vec<String> = hub
        .log()
        .into_iter()
        .filter(|l| l.starts_with("query /deposits"))
        .collect();
    assert_eq!(ranges, ["query /deposits/1/10", "query /deposits/11/20"]);
}

#[tokio::test]
async fn hand_ins_stay_within_their_caps() {
    // A range with 4 deposits and messages of at most 3.
    let hub = FakeHub::start(Script {
        tip: 40,
        deposits: (1..=4).map(|s| (s, dep(s, "u", s * 10))).collect(),
        ..Script::default()
    });
    let params = Params {
        max_block_deposits: 3,
        ..Params::default()
    };
    let backend = chain_with_cursor(&params, 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    let blocks = app.held().blocks().to_vec();
    assert_eq!(blocks.len(), 1);
    assert_eq!(
        blocks[0].deposits,
        [dep(1, "u", 10), dep(2, "u", 20), dep(3, "u", 30)]
    );
    assert!(blocks[0].more);
    assert_eq!(blocks[0].deposit_count, 4);
    // 70 attempts of nonce 7 each seen settled: 70 distinct results handed
    // in, of which the inbox keeps the newest MAX_HELD (64): attempts 7..=70.
    hub.with(|s| {
        s.settled.insert(NONCE, 30);
    });
    for attempt in 1..=70 {
        commit(&backend, |kv| {
            sync_state::put_sync_state(kv, CHAIN, &sync_at(attempt));
        });
        r.poll().await;
    }
    let held = app.held();
    assert_eq!(held.results().len(), tally_abci::inbox::MAX_HELD);
    assert_eq!(held.results().len(), 64);
    let attempts: Vec<u32> = held.results().iter().map(|x| x.attempt).collect();
    assert_eq!(attempts, (7..=70).collect::<Vec<u32>>());
    assert!(held.results().iter().all(|x| x.settled && x.nonce == NONCE));
}

/// `GET path` from `addr`, the whole answer as text.

#[tokio::test]
async fn a_refused_or_garbled_deposit_answer_is_not_handed_in() {
    let hub = FakeHub::start(Script {
        deposits_answer: Some((21, "")),
        ..deposits_script(40)
    });
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    hub.with(|s| s.deposits_answer = Some((0, "not json")));
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    // A JSON-RPC answer is an answer: the endpoint's breaker stays closed.
    assert_eq!(
        r.hub.breakers()[0].state(),
        tally_client::BreakerState::Closed
    );
    hub.with(|s| s.deposits_answer = None);
    r.poll().await;
    assert_eq!(app.held().blocks().len(), 1);
    assert_eq!(
        hub.log()
            .iter()
            .filter(|l| *l == "query /deposits/1/10")
            .count(),
        3
    );
}

fn refused(m: &Metrics, reason: &str) -> Option<f64> {
    sample(
        &m.encode(),
        &format!("tally_hub_deposit_answers_refused_total{{reason=\"{reason}\"}}"),
    )
}

/// The range is read at the tip's height, and an answer from below the
/// range's end (a node that has not committed it: its list may be short)
/// is refused and counted, never handed in.
#[tokio::test]
async fn an_answer_from_below_the_range_end_is_refused() {
    let hub = FakeHub::start(Script {
        answer_height: Some(9),
        ..deposits_script(40)
    });
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    assert_eq!(refused(&metrics, "stale"), Some(1.0));
    // The deposits were asked for at the tip just read (the other queries
    // of the poll are at the latest height, "0").
    let asked: Vec<(String, String)> = hub.with(|s| {
        s.log
            .iter()
            .filter(|l| l.starts_with("query"))
            .cloned()
            .zip(s.query_heights.clone())
            .collect()
    });
    assert_eq!(asked[0], ("query /deposits/1/10".into(), "40".into()));
    // An answer from the range's end on is taken.
    hub.with(|s| s.answer_height = Some(10));
    r.poll().await;
    assert_eq!(app.held().blocks().len(), 1);
    assert_eq!(app.held().blocks()[0].deposit_count, 2);
    assert_eq!(refused(&metrics, "stale"), Some(1.0));
}

/// The tip and the range come from one endpoint: the primary answers its
/// tip (40) but fails the deposit read, and the step is abandoned instead
/// of asking the lagging second endpoint (tip 5, which knows only
/// deposit 1 of range 1..=10). The next step starts at the second
/// endpoint, whose tip is too low for the range; the one after goes back
/// to the primary.
#[tokio::test]
async fn the_tip_and_the_range_come_from_one_endpoint() {
    let primary = FakeHub::start(Script {
        deposits_unavailable: true,
        ..deposits_script(40)
    });
    let lagging = FakeHub::start(Script {
        tip: 5,
        deposits: vec![(2, dep(1, "alice", 5))],
        ..Script::default()
    });
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let cfg = config(vec![primary.url.clone(), lagging.url.clone()]);
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    let deposit_reads = |h: &FakeHub| {
        h.log()
            .iter()
            .filter(|l| l.starts_with("query /deposits"))
            .count()
    };
    assert_eq!((deposit_reads(&primary), deposit_reads(&lagging)), (1, 0));
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    assert_eq!(lagging.log().first().map(String::as_str), Some("status"));
    assert_eq!((deposit_reads(&primary), deposit_reads(&lagging)), (1, 0));
    primary.with(|s| s.deposits_unavailable = false);
    r.poll().await;
    assert_eq!(
        app.held().blocks(),
        [HubBlock {
            chain: CHAIN.into(),
            from_height: 1,
            to_height: 10,
            deposits: vec![dep(1, "alice", 5), dep(2, "bob", 7)],
            more: false,
            deposit_count: 2,
        }]
    );
    assert_eq!((deposit_reads(&primary), deposit_reads(&lagging)), (2, 0));
}

/// A list the hub's own count says is short (2 listed, 3 counted through
/// the range's end) is refused before it is handed in: the chain would
/// not credit it either.
#[tokio::test]
async fn a_short_list_under_its_count_is_not_handed_in() {
    let hub = FakeHub::start(Script {
        count_override: Some(3),
        ..deposits_script(40)
    });
    let backend = chain_with_cursor(&Params::default(), 1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    assert_eq!(refused(&metrics, "inconsistent"), Some(1.0));
    assert_eq!(refused(&metrics, "stale"), Some(0.0));
    hub.with(|s| s.count_override = None);
    r.poll().await;
    assert_eq!(app.held().blocks().len(), 1);
}

/// From app version 5 (ADR 0024) one poll hands in every message the
/// chain waits for, as far as the hub is deep: the rest of the cursor's
/// range and the ranges after it, at most `2 × max_block_messages` of
/// them. Hand-computed for cap 1 and the script's four deposits: the
/// cursor's range 1..=10 splits into [1] (more) and [2]; 11..=20 into [3]
/// (more) and [4]; 21..=30 (tip 40) is one empty message; 31..=40 is not
/// confirmed yet (tip 40, one confirmation needed).
#[tokio::test]
async fn from_version_5_one_poll_hands_in_the_messages_in_flight() {
    let hub = FakeHub::start(deposits_script(40));
    let params = Params {
        max_block_deposits: 1,
        ..Params::default()
    };
    let backend = chain_with_cursor(&params, 1, 1);
    commit(&backend, |kv| {
        chain_state::put_app_version(kv, tally_settlement::types::PIPELINE_VERSION)
    });
    let chain = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.confirmations = 1;
    let mut r = relay(chain.clone(), cfg, &metrics);
    r.poll().await;
    let got: Vec<(u64, Vec<u64>, bool, u64)> = chain
        .held()
        .blocks()
        .iter()
        .map(|b| {
            (
                b.from_height,
                b.deposits.iter().map(|d| d.seq).collect(),
                b.more,
                b.deposit_count,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, vec![1], true, 2),
            (1, vec![2], false, 2),
            (11, vec![3], true, 4),
            (11, vec![4], false, 4),
            (21, vec![], false, 4),
        ]
    );
    // Capped at 2 × max_block_messages.
    let backend = chain_with_cursor(
        &Params {
            max_block_messages: 1,
            ..params
        },
        1,
        1,
    );
    commit(&backend, |kv| {
        chain_state::put_app_version(kv, tally_settlement::types::PIPELINE_VERSION)
    });
    let chain = app(&backend);
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.confirmations = 1;
    relay(chain.clone(), cfg, &metrics).poll().await;
    assert_eq!(chain.held().blocks().len(), 2);
}

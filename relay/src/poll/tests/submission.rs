//! Submissions: which endpoints are tried, what is (not) submitted, how the
//! hub's answers, deadlines, retries and new attempts end a submission.

use super::*;

#[tokio::test]
async fn an_endpoint_whose_breaker_is_open_is_not_tried() {
    let (a, b) = (
        FakeHub::start(Script::default()),
        FakeHub::start(Script::default()),
    );
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![a.url.clone(), b.url.clone()]);
    cfg.breaker = BreakerConfig {
        failure_threshold: 1,
        open_for: Duration::from_secs(600),
        probes: 1,
    };
    let mut r = relay(app(&backend), cfg, &metrics);
    r.hub.breakers()[0].record(false);
    r.poll().await;
    settle(&mut r).await;
    // Endpoint a: not one request, for reads or the submission.
    assert_eq!(a.log(), Vec::<String>::new());
    // Endpoint b: the tip, the deposit range 1..=10 (tip 100 is deep
    // enough), nonce 7's settlement, then the submission's last-nonce
    // check and its one broadcast, with the batch's exact bytes.
    assert_eq!(
        b.log(),
        [
            "status",
            "query /deposits/1/10",
            "query /batch/hub/7",
            "query /last_nonce/hub",
            "broadcast"
        ]
    );
    assert_eq!(b.with(|s| s.txs.clone()), [expected_tx()]);
    let text = metrics.encode();
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
    // No try went to the open endpoint: no transport retry at all.
    assert_eq!(
        sample(&text, "tally_retries_total{layer=\"transport\"}"),
        Some(0.0)
    );
    let state = |e: &str| {
        sample(
            &text,
            &format!("tally_hub_circuit_state{{endpoint=\"{e}\"}}"),
        )
    };
    assert_eq!((state(&a.url), state(&b.url)), (Some(2.0), Some(0.0)));
}

#[tokio::test]
async fn a_nonce_the_hub_already_settled_is_not_submitted() {
    // The hub's last nonce is 7 already (its /batch answer is not in yet).
    let hub = FakeHub::start(Script {
        last_nonce: NONCE,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(hub.broadcasts(), 0, "{:?}", hub.log());
    assert_eq!(outcome(&metrics, "already_settled"), Some(1.0));
    assert_eq!(outcome(&metrics, "ok"), Some(0.0));
    assert!(app.held().results().is_empty());
    // Submitted once per attempt: the next poll does not start another.
    r.poll().await;
    assert!(r.in_flight.is_none());
    // One behind: the batch is submitted.
    hub.with(|s| s.last_nonce = NONCE - 1);
    let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(hub.broadcasts(), 1);
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
}

#[tokio::test]
async fn hub_result_codes_are_handled_as_documented() {
    let ok = |check, deliver| Answer::Codes { check, deliver };
    // (answer, outcome label, whether `failed` is handed in)
    let cases = [
        (ok(0, 0), "ok", false),
        (ok(0, 4), "already_settled", false),
        (Answer::InCache, "in_cache", false),
        (ok(0, 3), "refused", true),
        // The hub cannot pay the batch in full: refused whole, not settled.
        (ok(0, 8), "refused", true),
        (ok(2, 0), "refused", true),
        (ok(0, 16), "refused", true),
        (ok(0, 77), "refused", true),
        (ok(4, 0), "already_settled", false),
    ];
    for (answer, label, fails) in cases {
        let hub = FakeHub::start(Script {
            broadcast: answer,
            ..Script::default()
        });
        let backend = chain_with_signed_batch(&Params::default(), 3);
        let app = app(&backend);
        let metrics = Metrics::new("tally");
        let mut r = relay(app.clone(), config(vec![hub.url.clone()]), &metrics);
        r.poll().await;
        settle(&mut r).await;
        let case = format!("{answer:?}");
        assert_eq!(hub.broadcasts(), 1, "{case}");
        for o in Outcome::ALL {
            let want = if o.as_str() == label { 1.0 } else { 0.0 };
            assert_eq!(outcome(&metrics, o.as_str()), Some(want), "{case}: {o:?}");
        }
        let want: Vec<HubResult> = if fails {
            vec![failed_result(3)]
        } else {
            vec![]
        };
        assert_eq!(app.held().results(), want.as_slice(), "{case}");
    }
}

#[tokio::test]
async fn a_submission_in_flight_is_cancelled_once_the_hub_shows_the_nonce_settled() {
    let hub = FakeHub::start(Script {
        broadcast: Answer::Unavailable,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.confirmations = 2;
    // After the first refused try the submission waits 30 s (the hub's
    // Retry-After) to retry.
    cfg.policy = RetryPolicy {
        base: Duration::from_secs(30),
        cap: Duration::from_secs(30),
        budget: 3,
        per_try_timeout: Duration::from_secs(5),
        max_elapsed: Duration::from_secs(120),
    };
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    wait_for_broadcast(&hub).await;
    // Settled at 100 with the tip at 101: one confirmation of two. The
    // submission is moot already; nothing is handed in yet.
    hub.with(|s| {
        s.settled.insert(NONCE, 100);
        s.tip = 101;
    });
    r.poll().await;
    assert!(r.in_flight.is_none(), "still in flight");
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(outcome(&metrics, "cancelled"), Some(1.0));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(app.held().results().is_empty());
    // Two deep: `settled` is handed in, and nothing was tried again.
    hub.with(|s| s.tip = 102);
    r.poll().await;
    assert_eq!(
        app.held().results(),
        [HubResult {
            settled: true,
            ..failed_result(1)
        }]
    );
    assert_eq!(hub.broadcasts(), 1);
    assert_eq!(outcome(&metrics, "failed"), Some(0.0));
    assert_eq!(outcome(&metrics, "refused"), Some(0.0));
}

#[tokio::test]
async fn spent_retries_fail_the_attempt() {
    // Nothing listens there: every read and try fails on the transport.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let backend = chain_with_signed_batch(&Params::default(), 2);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![dead]);
    cfg.breaker.failure_threshold = 100;
    let mut r = relay(app.clone(), cfg, &metrics);
    // The hub cannot be read, and the batch is submitted all the same: one
    // try and the budget's 2 retries, then `failed` for attempt 2.
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(app.held().results(), [failed_result(2)]);
    assert_eq!(outcome(&metrics, "failed"), Some(1.0));
    assert_eq!(
        sample(
            &metrics.encode(),
            "tally_retries_total{layer=\"transport\"}"
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn the_deadline_fails_the_attempt_and_stops_its_submission() {
    let hub = FakeHub::start(Script {
        broadcast: Answer::Unavailable,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.policy.base = Duration::from_secs(30);
    cfg.policy.cap = Duration::from_secs(30);
    cfg.policy.max_elapsed = Duration::from_secs(120);
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    wait_for_broadcast(&hub).await;
    assert!(r.in_flight.is_some());
    // The attempt started 30 s ago: the deadline (30 s) has passed.
    commit(&backend, |kv| {
        let st = SyncState {
            last_sync: unix_now() - 30,
            ..sync_at(1)
        };
        sync_state::put_sync_state(kv, CHAIN, &st);
    });
    r.poll().await;
    assert!(r.in_flight.is_none());
    assert_eq!(app.held().results(), [failed_result(1)]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(outcome(&metrics, "cancelled"), Some(1.0));
    assert_eq!(hub.broadcasts(), 1);
}

#[tokio::test]
async fn rank_one_submits_a_stagger_after_it_first_saw_the_batch_signed() {
    let hub = FakeHub::start(Script::default());
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.rank = Some(1);
    cfg.stagger = Duration::from_millis(300);
    let mut r = relay(app(&backend), cfg, &metrics);
    r.poll().await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    r.poll().await;
    assert!(r.in_flight.is_none());
    assert_eq!(hub.broadcasts(), 0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(hub.broadcasts(), 1);
    assert_eq!(hub.with(|s| s.txs.clone()), [expected_tx()]);
}

#[tokio::test]
async fn a_new_attempt_cancels_the_previous_ones_submission() {
    let hub = FakeHub::start(Script {
        broadcast: Answer::Unavailable,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.policy.base = Duration::from_secs(30);
    cfg.policy.cap = Duration::from_secs(30);
    cfg.policy.max_elapsed = Duration::from_secs(120);
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    wait_for_broadcast(&hub).await;
    // Attempt 1 failed on the chain; attempt 2's batch is signed.
    commit(&backend, |kv| {
        sync_state::put_sync_state(kv, CHAIN, &sync_at(2));
    });
    hub.with(|s| {
        s.broadcast = Answer::Codes {
            check: 0,
            deliver: 0,
        }
    });
    r.poll().await;
    assert_eq!(r.in_flight.as_ref().map(|f| f.key), Some((NONCE, 2)));
    settle(&mut r).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(outcome(&metrics, "cancelled"), Some(1.0));
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
    assert_eq!(hub.broadcasts(), 2);
    assert!(app.held().results().is_empty());
}

#[tokio::test]
async fn a_hub_behind_or_without_a_last_nonce_still_gets_the_batch() {
    // (last nonce 3: behind the chain's 7), then (no last nonce at all).
    for (last, refused) in [(3, false), (0, true)] {
        let hub = FakeHub::start(Script {
            last_nonce: last,
            refuse_last_nonce: refused,
            ..Script::default()
        });
        let backend = chain_with_signed_batch(&Params::default(), 1);
        let metrics = Metrics::new("tally");
        let mut r = relay(app(&backend), config(vec![hub.url.clone()]), &metrics);
        r.poll().await;
        settle(&mut r).await;
        assert_eq!(hub.broadcasts(), 1, "{last} {refused}");
        assert_eq!(outcome(&metrics, "ok"), Some(1.0));
    }
}

/// Chain state beside [`chain_with_signed_batch`]: nonce 6 settled, its
/// one call (id 2) kept unless `pruned`.
fn with_settled_six(backend: &Arc<MemBackend>, pruned: bool) -> HubCall {
    let six = HubCall {
        id: 2,
        user: "carol".into(),
        provider: "dave".into(),
        amount: 9,
        window: 2,
        kind: 0,
    };
    let kept = six.clone();
    commit(backend, |kv| {
        if !pruned {
            sync_state::put_pending_call(kv, CHAIN, &kept);
            sync_state::unpend_call(kv, CHAIN, kept.id);
        }
        sync_state::put_batch(
            kv,
            CHAIN,
            NONCE - 1,
            &BatchRecord {
                nonce: NONCE - 1,
                call_ids: vec![2],
                status: BatchStatus::Settled.value(),
                signature: vec![0xCD; 96],
                ..signed_batch()
            },
        );
    });
    six
}

#[tokio::test]
async fn a_hub_that_forgot_a_settled_nonce_gets_it_again_from_the_kept_body() {
    // The hub's last nonce is 5, Tally settled 6 and signed 7: the relay
    // re-submits 6 (same calls, same group signature) before 7.
    let hub = FakeHub::start(Script {
        last_nonce: NONCE - 2,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let six = with_settled_six(&backend, false);
    let metrics = Metrics::new("tally");
    let mut r = relay(app(&backend), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    settle(&mut r).await;
    let six_tx = b64(&HubTx {
        sum: Some(hub_tx::Sum::SubmitBatch(SubmitBatch {
            chain: CHAIN.into(),
            nonce: NONCE - 1,
            calls: vec![six],
            signature: vec![0xCD; 96],
        })),
    }
    .encode_to_vec());
    assert_eq!(hub.with(|s| s.txs.clone()), vec![six_tx, expected_tx()]);
    assert_eq!(outcome(&metrics, "recovered"), Some(1.0));
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
}

#[tokio::test]
async fn a_forgotten_batch_past_its_retention_is_not_invented() {
    let hub = FakeHub::start(Script {
        last_nonce: NONCE - 2,
        ..Script::default()
    });
    let backend = chain_with_signed_batch(&Params::default(), 1);
    with_settled_six(&backend, true);
    let metrics = Metrics::new("tally");
    let mut r = relay(app(&backend), config(vec![hub.url.clone()]), &metrics);
    r.poll().await;
    settle(&mut r).await;
    // Only the current batch goes out (the hub refuses the gap itself).
    assert_eq!(hub.with(|s| s.txs.clone()), vec![expected_tx()]);
    assert_eq!(outcome(&metrics, "recovered"), Some(0.0));
}

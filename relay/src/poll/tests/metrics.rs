//! The relay's metric families after a poll, and the relay thread's life
//! cycle.

use super::*;

#[tokio::test]
async fn the_metrics_page_shows_what_the_relay_saw() {
    let (a, b) = (
        FakeHub::start(Script::default()),
        FakeHub::start(Script::default()),
    );
    b.with(|s| s.tip = 20);
    let backend = chain_with_signed_batch(&Params::default(), 1);
    // Cursor at height 4; a second pending call of window 9.
    commit(&backend, |kv| {
        sync_state::put_hub_height(kv, CHAIN, 4);
        sync_state::put_pending_call(
            kv,
            CHAIN,
            &HubCall {
                id: 2,
                window: 9,
                ..call()
            },
        );
    });
    let metrics = Metrics::new("tally");
    let mut cfg = config(vec![a.url.clone(), b.url.clone()]);
    cfg.breaker = BreakerConfig {
        failure_threshold: 1,
        open_for: Duration::from_secs(600),
        probes: 1,
    };
    let mut r = relay(app(&backend), cfg, &metrics);
    r.hub.breakers()[0].record(false);
    let before = unix_now();
    r.poll().await;
    let after = unix_now();
    settle(&mut r).await;
    let page = metrics.encode();
    let v = |name: &str| sample(&page, name);
    // From sync_at(1): 9 attempts, 2 failures, next nonce 8 (nonces
    // 1..=7 begun), so 9 - 7 = 2 attempts beyond each batch's first.
    assert_eq!(v("tally_sync_attempts_total"), Some(9.0));
    assert_eq!(v("tally_sync_failures_total"), Some(2.0));
    assert_eq!(v("tally_retries_total{layer=\"settlement\"}"), Some(2.0));
    assert_eq!(v("tally_retries_total{layer=\"transport\"}"), Some(0.0));
    // Tip 20, cursor 4: heights 4..=20 are 17 blocks not credited.
    assert_eq!(v("tally_hub_cursor_lag_blocks"), Some(17.0));
    // Calls 1 (window 3) and 2 (window 9); the oldest window ended at
    // (3 + 1) * 60 s.
    assert_eq!(v("tally_pending_hub_calls"), Some(2.0));
    let age = v("tally_oldest_pending_call_age_seconds").unwrap() as u64;
    assert!((before - 240..=after - 240).contains(&age), "{age}");
    assert_eq!(
        v(&format!(
            "tally_hub_circuit_state{{endpoint=\"{}\"}}",
            a.url
        )),
        Some(2.0)
    );
    assert_eq!(
        v(&format!(
            "tally_hub_circuit_state{{endpoint=\"{}\"}}",
            b.url
        )),
        Some(0.0)
    );
    assert_eq!(
        v("tally_relay_submissions_total{outcome=\"ok\"}"),
        Some(1.0)
    );
}

#[test]
fn the_relay_thread_polls_and_stops() {
    let hub = FakeHub::start(Script::default());
    let backend = chain_with_signed_batch(&Params::default(), 1);
    let app = app(&backend);
    let mut cfg = config(vec![hub.url.clone()]);
    cfg.poll = Duration::from_millis(20);
    let metrics = Metrics::new("tally");
    let stop = crate::spawn(Arc::new(app.clone()), cfg, metrics.relay().clone()).unwrap();
    let waited = (0..500).find(|_| {
        std::thread::sleep(Duration::from_millis(10));
        hub.broadcasts() == 1
    });
    assert!(waited.is_some(), "{:?}", hub.log());
    let counted = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        outcome(&metrics, "ok") == Some(1.0)
    });
    assert!(counted, "{}", metrics.encode());
    stop.send(true).unwrap();
    // Stopped: no more reads of the hub.
    std::thread::sleep(Duration::from_millis(200));
    let seen = hub.log().len();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(hub.log().len(), seen);
    assert_eq!(hub.broadcasts(), 1);
}

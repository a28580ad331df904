//! The real HTTP transport and retry policy through the fault proxy on
//! loopback, one test per fault: a 429 whose body asks for a delay (with
//! `Retry-After: 0`), a 503 with `Retry-After`, a reset connection, a slow
//! upstream (inside and beyond the per-try timeout), an answer held back
//! after the upstream took the transaction, and a 400 that is not retried.
//! A fake upstream counts what reached it.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_client::{Broadcast, Failure, HttpTransport, RetryError, RetryPolicy, Transport};
use tally_tests::proxy::{Fault, FaultProxy, ProxyState};

/// A fake CometBFT that accepts every broadcast at height 7 and counts them.
fn upstream() -> anyhow::Result<(SocketAddr, Arc<AtomicU32>)> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let n = Arc::new(AtomicU32::new(0));
    let count = n.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 65536];
            let _ = s.read(&mut buf);
            count.fetch_add(1, Ordering::SeqCst);
            let body = r#"{"jsonrpc":"2.0","id":1,"result":{"check_tx":{"code":0},"tx_result":{"code":0,"log":"ok"},"height":"7"}}"#;
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    Ok((addr, n))
}

/// Runs one submission through `endpoints` with `policy`.
fn submit(
    policy: &RetryPolicy,
    endpoints: &[String],
) -> anyhow::Result<(Result<Broadcast, RetryError>, Duration)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let t = HttpTransport::new(policy.per_try_timeout);
    let start = Instant::now();
    let r = rt.block_on(async {
        let (_tx, mut rx) = tokio::sync::watch::channel(false);
        let mut rng = rand::thread_rng();
        policy
            .run(endpoints, &mut rx, &mut rng, |e: &String, _| {
                t.broadcast_commit(e.clone(), vec![1, 2, 3])
            })
            .await
    });
    Ok((r, start.elapsed()))
}

fn accepted() -> Result<Broadcast, RetryError> {
    Ok(Broadcast::Result {
        code: 0,
        log: "ok".into(),
        height: 7,
        data: Vec::new(),
    })
}

#[test]
fn retry_delay_from_a_429_body_is_a_floor_and_a_dead_endpoint_is_failed_over() -> anyhow::Result<()>
{
    let (up, reached) = upstream()?;
    let proxy = FaultProxy::start(&up.to_string(), ProxyState::with([Fault::too_many(2)]))?;
    let endpoints = vec![proxy.url(), "http://127.0.0.1:1".to_string()];
    let (r, elapsed) = submit(&RetryPolicy::default(), &endpoints)?;
    assert_eq!(r, accepted());
    let st = proxy.state();
    assert_eq!(st.labels(), vec!["429", "forwarded"]);
    let gap = st.broadcasts[1].at - st.broadcasts[0].at;
    assert!(gap >= Duration::from_secs(2), "retried after {gap:?}");
    assert!(elapsed < Duration::from_secs(10));
    assert_eq!(reached.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn a_503_retry_after_header_is_honoured() -> anyhow::Result<()> {
    let (up, reached) = upstream()?;
    let proxy = FaultProxy::start(&up.to_string(), ProxyState::with([Fault::unavailable(1)]))?;
    let (r, _) = submit(&RetryPolicy::default(), &[proxy.url()])?;
    assert_eq!(r, accepted());
    let st = proxy.state();
    assert_eq!(st.labels(), vec!["503", "forwarded"]);
    let gap = st.broadcasts[1].at - st.broadcasts[0].at;
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    assert_eq!(reached.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn a_reset_connection_is_retried() -> anyhow::Result<()> {
    let (up, reached) = upstream()?;
    let proxy = FaultProxy::start(
        &up.to_string(),
        ProxyState::with([Fault::Reset, Fault::Reset]),
    )?;
    let (r, _) = submit(&RetryPolicy::default(), &[proxy.url()])?;
    assert_eq!(r, accepted());
    assert_eq!(proxy.state().labels(), vec!["reset", "reset", "forwarded"]);
    assert_eq!(reached.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn a_slow_upstream_within_the_per_try_timeout_is_waited_for() -> anyhow::Result<()> {
    let (up, reached) = upstream()?;
    let proxy = FaultProxy::start(
        &up.to_string(),
        ProxyState::with([Fault::Delay(Duration::from_millis(400))]),
    )?;
    let policy = RetryPolicy {
        per_try_timeout: Duration::from_secs(2),
        ..RetryPolicy::default()
    };
    let (r, elapsed) = submit(&policy, &[proxy.url()])?;
    assert_eq!(r, accepted());
    assert!(elapsed >= Duration::from_millis(400));
    assert_eq!(proxy.state().labels(), vec!["delayed"]);
    assert_eq!(reached.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn a_try_past_its_timeout_is_retried_and_the_upstream_may_see_it_twice() -> anyhow::Result<()> {
    // Delayed before the upstream and held after it: both tries time out
    // on our side, but each reached (or will reach) the upstream. This is
    // why the hub must treat a repeated nonce as "already settled".
    let (up, reached) = upstream()?;
    let proxy = FaultProxy::start(
        &up.to_string(),
        ProxyState::with([
            Fault::Delay(Duration::from_millis(900)),
            Fault::HoldAnswer(Duration::from_millis(900)),
        ]),
    )?;
    let policy = RetryPolicy {
        per_try_timeout: Duration::from_millis(300),
        ..RetryPolicy::default()
    };
    let (r, _) = submit(&policy, &[proxy.url()])?;
    assert_eq!(r, accepted());
    assert_eq!(proxy.state().labels(), vec!["delayed", "held", "forwarded"]);
    // Let the delayed try land too.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(reached.load(Ordering::SeqCst), 3);
    Ok(())
}

#[test]
fn a_400_is_not_retried() -> anyhow::Result<()> {
    let (up, reached) = upstream()?;
    let proxy = FaultProxy::start(
        &up.to_string(),
        ProxyState::with([Fault::Status {
            code: 400,
            retry_after: None,
            body_delay_secs: None,
        }]),
    )?;
    let (r, _) = submit(&RetryPolicy::default(), &[proxy.url()])?;
    assert!(
        matches!(r, Err(RetryError::Fatal(Failure::Status { code: 400, .. }))),
        "{r:?}"
    );
    assert_eq!(proxy.state().labels(), vec!["400"]);
    assert_eq!(reached.load(Ordering::SeqCst), 0);
    Ok(())
}

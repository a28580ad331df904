//! The transport retry policy through the fault proxy on loopback: a 429
//! with a body retry delay makes the next try wait at least that long.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use tally_client::{Broadcast, HttpTransport, RetryPolicy, Transport};
use tally_tests::proxy::{FaultProxy, ProxyState};

#[test]
fn retry_delay_from_a_429_body_is_a_floor() -> anyhow::Result<()> {
    // A fake hub that accepts every broadcast.
    let upstream = std::net::TcpListener::bind("127.0.0.1:0")?;
    let up_addr = upstream.local_addr()?;
    std::thread::spawn(move || {
        for s in upstream.incoming().flatten() {
            let mut s = s;
            let mut buf = [0u8; 65536];
            let _ = s.read(&mut buf);
            let body = r#"{"jsonrpc":"2.0","id":1,"result":{"check_tx":{"code":0},"tx_result":{"code":0,"log":"ok"},"height":"7"}}"#;
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    let proxy = FaultProxy::start(
        &up_addr.to_string(),
        ProxyState {
            fail_429: 1,
            retry_delay_secs: 2,
            ..Default::default()
        },
    )?;
    let endpoints = vec![proxy.url(), "http://127.0.0.1:1".to_string()];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let t = HttpTransport::new(Duration::from_secs(5));
    let start = Instant::now();
    let r = rt.block_on(async {
        let (_tx, mut rx) = tokio::sync::watch::channel(false);
        let mut rng = rand::thread_rng();
        RetryPolicy::default()
            .run(&endpoints, &mut rx, &mut rng, |e: &String, _| {
                t.broadcast_commit(e.clone(), vec![1, 2, 3])
            })
            .await
    });
    assert_eq!(
        r,
        Ok(Broadcast::Result {
            code: 0,
            log: "ok".into(),
            height: 7
        })
    );
    let st = proxy.state.lock().unwrap();
    let codes: Vec<u16> = st.broadcasts.iter().map(|(_, c)| *c).collect();
    assert_eq!(codes, vec![429, 0]);
    let gap = st.broadcasts[1].0 - st.broadcasts[0].0;
    assert!(gap >= Duration::from_secs(2), "retried after {gap:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    Ok(())
}

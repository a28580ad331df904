//! The exposition keeps the names, labels and values operators and the
//! end-to-end tests read, and the endpoint serves it over HTTP.

use std::io::{Read, Write};
use std::time::Duration;

use super::*;

/// The value of the sample line starting with `name`, the way the
/// end-to-end tests read it.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

#[test]
fn names_labels_and_values_are_the_documented_ones() {
    let m = Metrics::new("tally");
    let r = m.relay();
    r.submitted(Outcome::Ok);
    r.submitted(Outcome::Refused);
    r.submitted(Outcome::Refused);
    for _ in 0..3 {
        r.transport_retry();
    }
    r.set_sync(5, 1, 2);
    r.set_pending(4, 30);
    r.set_cursor_lag(7);
    r.refused_answer(Refusal::Stale);
    r.set_circuit_state("http://127.0.0.1:26757", 2);
    r.set_circuit_state("http://127.0.0.1:1", 0);
    let text = m.encode();
    let want = [
        ("tally_relay_submissions_total{outcome=\"ok\"}", 1.0),
        ("tally_relay_submissions_total{outcome=\"refused\"}", 2.0),
        (
            "tally_relay_submissions_total{outcome=\"already_settled\"}",
            0.0,
        ),
        ("tally_relay_submissions_total{outcome=\"in_cache\"}", 0.0),
        ("tally_relay_submissions_total{outcome=\"failed\"}", 0.0),
        ("tally_relay_submissions_total{outcome=\"cancelled\"}", 0.0),
        ("tally_retries_total{layer=\"transport\"}", 3.0),
        ("tally_retries_total{layer=\"settlement\"}", 2.0),
        ("tally_sync_attempts_total", 5.0),
        ("tally_sync_failures_total", 1.0),
        ("tally_pending_hub_calls", 4.0),
        ("tally_oldest_pending_call_age_seconds", 30.0),
        ("tally_hub_cursor_lag_blocks", 7.0),
        (
            "tally_hub_deposit_answers_refused_total{reason=\"stale\"}",
            1.0,
        ),
        (
            "tally_hub_deposit_answers_refused_total{reason=\"inconsistent\"}",
            0.0,
        ),
        (
            "tally_hub_circuit_state{endpoint=\"http://127.0.0.1:26757\"}",
            2.0,
        ),
        (
            "tally_hub_circuit_state{endpoint=\"http://127.0.0.1:1\"}",
            0.0,
        ),
    ];
    for (name, v) in want {
        assert_eq!(sample(&text, name), Some(v), "{name} in\n{text}");
    }
    for line in [
        "# TYPE tally_relay_submissions_total counter",
        "# TYPE tally_retries_total counter",
        "# TYPE tally_sync_attempts_total counter",
        "# TYPE tally_sync_failures_total counter",
        "# TYPE tally_hub_circuit_state gauge",
        "# TYPE tally_pending_hub_calls gauge",
        "# TYPE tally_oldest_pending_call_age_seconds gauge",
        "# TYPE tally_hub_cursor_lag_blocks gauge",
        "# TYPE tally_hub_deposit_answers_refused_total counter",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}

#[test]
fn families_are_exposed_before_anything_happens_and_the_prefix_is_applied() {
    let m = Metrics::new("edge");
    let text = m.encode();
    // The end-to-end tests look for this name before any submission.
    assert!(text.contains("edge_relay_submissions_total"), "{text}");
    assert_eq!(
        sample(&text, "edge_relay_submissions_total{outcome=\"failed\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "edge_retries_total{layer=\"transport\"}"),
        Some(0.0)
    );
    assert!(!text.contains("tally_"), "{text}");
    // A labelled family shows once it has a series (the relay sets one per
    // endpoint when it starts).
    assert!(!text.contains("edge_hub_circuit_state"), "{text}");
    m.relay().set_circuit_state("http://127.0.0.1:26757", 0);
    assert!(m.encode().contains("# TYPE edge_hub_circuit_state gauge"));
}

#[test]
fn the_node_can_register_its_own_families() {
    let mut m = Metrics::new("tally");
    let blocks = Counter::<u64>::default();
    m.registry_mut()
        .register("node_blocks", "Blocks committed", blocks.clone());
    blocks.inc();
    assert_eq!(sample(&m.encode(), "tally_node_blocks_total"), Some(1.0));
}

/// A raw HTTP/1.1 exchange that asks the server to close, read to the end.
fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_endpoint_serves_metrics_and_stops_when_dropped() {
    let metrics = Arc::new(Metrics::new("tally"));
    metrics.relay().submitted(Outcome::Ok);
    let server = serve("127.0.0.1:0", metrics.clone()).unwrap();
    let addr = server.local_addr().unwrap();
    let ok = get(addr, "/metrics");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
    assert_eq!(
        sample(&ok, "tally_relay_submissions_total{outcome=\"ok\"}"),
        Some(1.0)
    );
    // Read at each request: a later increment shows.
    metrics.relay().submitted(Outcome::Ok);
    assert_eq!(
        sample(
            &get(addr, "/metrics?x=1"),
            "tally_relay_submissions_total{outcome=\"ok\"}"
        ),
        Some(2.0)
    );
    let missing = get(addr, "/nope");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    // Dropped: the serving thread ends and the port is free again (the
    // listener closes on tiny_http's accept thread, shortly after).
    drop(server);
    let rebound = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        serve(&addr.to_string(), metrics.clone()).is_ok()
    });
    assert!(rebound, "{addr} still taken");
}

#[test]
fn a_taken_port_is_an_error_naming_the_address() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let e = serve(&addr, Arc::new(Metrics::new("tally"))).unwrap_err();
    assert!(e.to_string().contains(&addr), "{e}");
}

#[test]
fn the_metrics_page_never_shows_an_endpoints_credentials() {
    let metrics = Arc::new(Metrics::new("tally"));
    let keyed = "https://relay:s3cret@hub.example.com:8443/rpc?api_key=K3Y&network=main";
    metrics.relay().set_circuit_state(keyed, 1);
    metrics
        .relay()
        .set_circuit_state("http://127.0.0.1:26757/?token=T0K3N", 0);
    let server = serve("127.0.0.1:0", metrics.clone()).unwrap();
    let page = get(server.local_addr().unwrap(), "/metrics");
    for secret in ["s3cret", "K3Y", "T0K3N", "relay:"] {
        assert!(!page.contains(secret), "{secret} on the page:\n{page}");
    }
    // The endpoints stay told apart by scheme, host, port and path.
    assert_eq!(
        sample(
            &page,
            "tally_hub_circuit_state{endpoint=\"https://***@hub.example.com:8443/rpc?api_key=***&network=***\"}"
        ),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "tally_hub_circuit_state{endpoint=\"http://127.0.0.1:26757/?token=***\"}"
        ),
        Some(0.0),
        "{page}"
    );
}

//! The page serves what the app and the relay registered, over HTTP, and
//! stops when dropped.

use std::io::{Read, Write};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tally_relay::metrics::Outcome;
use tally_relay::RelayMetrics;

use super::*;

/// The value of the sample line starting with `name`, the way the
/// end-to-end tests read it.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// The node's registry with the relay's families, and the relay's handles.
fn with_relay(prefix: &str) -> (Arc<Metrics>, RelayMetrics) {
    let mut m = Metrics::new(prefix);
    let relay = RelayMetrics::register(m.registry_mut());
    (Arc::new(m), relay)
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
    let (metrics, relay) = with_relay("tally");
    relay.submitted(Outcome::Ok);
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
    relay.submitted(Outcome::Ok);
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
    let (metrics, relay) = with_relay("tally");
    let keyed = "https://relay:s3cret@hub.example.com:8443/rpc?api_key=K3Y&network=main";
    relay.set_circuit_state(keyed, 1);
    relay.set_circuit_state("http://127.0.0.1:26757/?token=T0K3N", 0);
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

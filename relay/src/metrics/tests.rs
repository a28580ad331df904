//! The exposition keeps the names, labels and values operators and the
//! end-to-end tests read (the node's page serving them over HTTP is tested
//! in `tally_node::metrics`).

use super::*;

/// The relay's families in a registry with `prefix`, as the node's page
/// shows them.
struct Metrics {
    registry: Registry,
    relay: RelayMetrics,
}

impl Metrics {
    fn new(prefix: &str) -> Self {
        let mut registry = Registry::with_prefix(prefix);
        let relay = RelayMetrics::register(&mut registry);
        Self { registry, relay }
    }

    fn relay(&self) -> &RelayMetrics {
        &self.relay
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry).unwrap();
        out
    }
}

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

//! The Grafana dashboard and the Prometheus alert rules in `deploy/`:
//! the dashboard parses and every panel has a query; every `tally_*` name
//! they use is on the metrics page the node's own code serves (built here
//! in-process the way `tallyd start` builds it: the node's registry with
//! the relay's and the app's families registered in it). The same check against a real
//! node's page, and CometBFT's names against a real CometBFT's page, is in
//! `e2e_status.rs`; `promtool` runs in `promtool.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;

use tally_tests::metric_names::{dashboard_exprs, dashboard_path, referenced, rules_path, served};

/// The page `tallyd start` serves with a relay, in-process.
fn page() -> String {
    let backend: Arc<dyn tally_store::Backend> = Arc::new(tally_store::MemBackend::new());
    let app = tally_abci::TallyApp::new(backend, tally_abci::Halt::new(|_| {})).unwrap();
    let mut metrics = tally_node::metrics::Metrics::new("tally");
    let relay = tally_relay::RelayMetrics::register(metrics.registry_mut());
    app.register_metrics(metrics.registry_mut());
    // What the relay's first poll sets (a family without series is not
    // written at all).
    relay.set_circuit_state("http://127.0.0.1:1", 0);
    metrics.encode()
}

#[test]
fn the_dashboard_parses_and_every_panel_has_a_query() {
    let json = std::fs::read_to_string(dashboard_path()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let panels = v["panels"].as_array().unwrap();
    let mut graphs = 0;
    for p in panels.iter().filter(|p| p["type"] != "row") {
        graphs += 1;
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.is_empty()),
                "panel {}: {t}",
                p["title"]
            );
        }
    }
    assert!(graphs >= 20, "{graphs} panels");
    let exprs = dashboard_exprs(&json).unwrap().join("\n");
    // It covers the three sources.
    for needed in [
        "cometbft_consensus_height",
        "cometbft_p2p_peers",
        "cometbft_mempool_size",
        "tally_abci_duration_seconds_bucket",
        "tally_signing_partials",
        "tally_hub_circuit_state",
        "tally_relay_submissions_total",
    ] {
        assert!(
            referenced(&exprs, &["tally", "cometbft"]).contains(needed),
            "{needed}"
        );
    }
}

#[test]
fn every_tally_name_in_the_deploy_files_is_served() {
    let served = served(&page());
    let json = std::fs::read_to_string(dashboard_path()).unwrap();
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let mut used: BTreeSet<String> =
        referenced(&dashboard_exprs(&json).unwrap().join("\n"), &["tally"]);
    used.extend(referenced(&rules, &["tally"]));
    assert!(used.len() >= 20, "{used:?}");
    let missing: Vec<_> = used.iter().filter(|n| !served.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "not on the page: {missing:?}\npage names: {served:?}"
    );
}

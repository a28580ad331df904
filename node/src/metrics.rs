//! The node's metrics page: one Prometheus registry (`prometheus-client`)
//! that `tallyd start` owns, whose names all carry `metrics_prefix`. The
//! state machine registers its families there (`tally_abci::metrics`,
//! listed in that module) and so does the relay when one runs
//! (`tally_relay::RelayMetrics`). [`serve`] answers `GET /metrics` (and
//! `HEAD`) in the Prometheus text format (version 0.0.4) over the HTTP
//! helper the explorer uses too ([`tally_explorer::http`]) until its
//! [`Server`] is dropped; any other path is 404.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tally_explorer::http::{self, Answer, ServeError, Server};

/// The node's registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// An empty registry whose names start with `prefix_`.
    pub fn new(prefix: &str) -> Self {
        Self {
            registry: Registry::with_prefix(prefix),
        }
    }

    /// The registry, for the families of the app and the relay (register
    /// before serving).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Everything registered, in the Prometheus text format (0.0.4).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// Serves `metrics` at `http://addr/metrics` on a thread of its own.
pub fn serve(addr: &str, metrics: Arc<Metrics>) -> Result<Server, ServeError> {
    let handler = move |method: &str, target: &str| page(&metrics, method, target);
    http::serve(
        "metrics endpoint",
        "tally-metrics",
        addr,
        1,
        Arc::new(handler),
    )
}

/// The answer to `method` on `target`: the metrics at `/metrics` (a query
/// string is ignored), 404 elsewhere.
fn page(metrics: &Metrics, method: &str, target: &str) -> Answer {
    let path = target.split('?').next().unwrap_or("");
    if matches!(method, "GET" | "HEAD") && path == "/metrics" {
        Answer {
            status: 200,
            headers: vec![(
                "Content-Type",
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE.to_string(),
            )],
            body: metrics.encode().into_bytes(),
        }
    } else {
        Answer {
            status: 404,
            headers: vec![("Content-Type", "text/plain; charset=UTF-8".to_string())],
            body: b"not found; metrics are at /metrics\n".to_vec(),
        }
    }
}

#[cfg(test)]
mod tests;

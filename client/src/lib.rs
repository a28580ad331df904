//! Tally's gateway SDK.
//!
//! - [`classify`]: the outcome class of one upstream call, with the same
//!   precedence in every gateway (cancel, status, timeout, text, unknown).
//! - [`Reporter`]: buffers usage records and gets every one of them onto the
//!   chain exactly once, through node restarts and network failures.
//! - [`timing`]: an upstream call's latency and time to first token, as
//!   the buckets of its usage record ([`CallTimer`]).
//! - [`retry`]: the workspace's one transport retry policy.
//! - [`breaker`]: a circuit breaker per endpoint (the relay's hub endpoints).
//! - [`transport`]: talking to CometBFT nodes from async code
//!   ([`HttpTransport`]).
//! - [`rpc`]: the workspace's one CometBFT JSON-RPC client.
//! - [`redact`]: endpoint URLs with their credentials hidden, for logs,
//!   errors and metrics.
//!
//! ```no_run
//! # async fn demo(key: ed25519_dalek::SigningKey) -> Result<(), Box<dyn std::error::Error>> {
//! use tally_client::{classify, CallTimer, HttpTransport, Reporter, ReporterConfig, UpstreamCall};
//! use tally_client::proto::UsageRecord;
//! let cfg = ReporterConfig::new(vec!["http://127.0.0.1:26657".into()], "tally-localnet");
//! let reporter = Reporter::start(cfg, key, HttpTransport::new(std::time::Duration::from_secs(15)))?;
//! let timer = CallTimer::start(); // just before sending the upstream request
//! // ... the upstream answers 503 ...
//! let timing = timer.finish();
//! let outcome = classify(&UpstreamCall { status: Some(503), ..Default::default() });
//! let mut record = UsageRecord {
//!     user: "alice".into(), provider: "acme-ai".into(), model: "llama/3-70b".into(),
//!     route: "/v1/chat".into(), outcome: outcome as i32, units: 0, amount: 0,
//!     ..Default::default()
//! };
//! timing.apply(&mut record); // latency and TTFT buckets (app version 4 on)
//! reporter.record(record).await?;
//! let outcomes = reporter.shutdown().await; // flushes and waits
//! # Ok(()) }
//! ```

pub mod breaker;
pub mod classify;
pub mod redact;
pub mod reporter;
pub mod retry;
pub mod rpc;
pub mod timing;
pub mod transport;

pub use breaker::{Breaker, BreakerState};
pub use classify::{classify, UpstreamCall};
pub use redact::{redact_url, redact_urls_in};
pub use reporter::{Metrics, ReportError, ReportOutcome, Reporter, ReporterConfig};
pub use retry::{Failure, RetryError, RetryPolicy};
pub use rpc::{RpcClient, RpcError};
pub use tally_settlement::proto;
pub use timing::{CallTimer, CallTiming};
pub use transport::{Admission, Block, BlockTx, Broadcast, HttpTransport, Included, Transport};

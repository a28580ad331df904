//! One submission of a signed batch to the hub, run as its own task so the
//! poll loop keeps observing the hub meanwhile (and can cancel it once the
//! nonce settled or the attempt ended). Tries go through the SDK's retry
//! policy over the hub's endpoints, each try gated by that endpoint's
//! breaker; a refusal or spent retries are handed to the signer as
//! `failed`.

use rand::SeedableRng;
use tally_abci::TallyApp;
use tally_client::{Broadcast, Failure, HttpTransport, RetryError, RetryPolicy, Transport};
use tally_hub_types::HubCode;
use tally_settlement::proto::HubResult;
use tokio::sync::watch;

use crate::hub::{usable, Hub};
use crate::metrics::{Outcome, RelayMetrics};

/// A submission running as a task.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// The (nonce, attempt) it submits.
    pub(crate) key: (u64, u32),
    /// The task.
    pub(crate) task: tokio::task::JoinHandle<()>,
    cancel: watch::Sender<bool>,
}

impl InFlight {
    /// Spawns `sub` on the current runtime.
    pub(crate) fn spawn(sub: Submission, cancel: watch::Sender<bool>) -> Self {
        Self {
            key: (sub.nonce, sub.attempt),
            task: tokio::spawn(sub.run()),
            cancel,
        }
    }

    /// No further tries: a try on the wire still completes (and its
    /// outcome is recorded), a wait before the next one ends at once.
    pub(crate) fn cancel(self) {
        let _ = self.cancel.send(true);
    }
}

/// Everything one submission needs, owned so it can run as a task.
pub(crate) struct Submission {
    pub(crate) app: TallyApp,
    /// Its endpoints and breakers are the submission's too.
    pub(crate) hub: Hub,
    pub(crate) metrics: RelayMetrics,
    pub(crate) transport: HttpTransport,
    pub(crate) policy: RetryPolicy,
    /// Turns true when the loop cancels this submission.
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) chain: String,
    pub(crate) nonce: u64,
    pub(crate) attempt: u32,
    /// The encoded hub transaction.
    pub(crate) tx: Vec<u8>,
}

impl Submission {
    async fn run(mut self) {
        let (nonce, attempt) = (self.nonce, self.attempt);
        // The hub's last settled nonce first: a nonce it already settled
        // needs no transaction (an unreadable hub is left to the tries).
        let (hub, chain) = (self.hub.clone(), self.chain.clone());
        match tokio::task::spawn_blocking(move || hub.last_nonce(&chain)).await {
            Ok(Ok(last)) if last >= nonce => {
                self.metrics.submitted(Outcome::AlreadySettled);
                tracing::info!(
                    nonce,
                    attempt,
                    last,
                    "the hub already settled this nonce; nothing to submit"
                );
                return;
            }
            Ok(Ok(last)) if last + 1 < nonce => tracing::warn!(
                nonce,
                attempt,
                last,
                "the hub is behind the chain's nonces; submitting anyway (it will refuse a gap)"
            ),
            _ => {}
        }
        let r = self.broadcast().await;
        self.conclude(r);
    }

    /// The tries, through the retry policy.
    async fn broadcast(&mut self) -> Result<Broadcast, RetryError> {
        let (nonce, attempt) = (self.nonce, self.attempt);
        let breakers = self.hub.breakers();
        let usable = usable(breakers);
        let endpoints = self.hub.endpoints();
        let mut rng = rand::rngs::StdRng::from_entropy();
        let (metrics, transport, tx) = (&self.metrics, &self.transport, &self.tx);
        self.policy
            .run(&usable, &mut self.shutdown, &mut rng, |i: &usize, n| {
                let i = *i;
                if n > 1 {
                    metrics.transport_retry();
                }
                let endpoint = endpoints.get(i).cloned().unwrap_or_default();
                let breaker = breakers.get(i);
                // A half-open breaker takes a probe only when it is tried.
                let allowed = breaker.is_some_and(|b| b.allow());
                let fut = transport.broadcast_commit(endpoint.clone(), tx.clone());
                // Logs and errors show the URL without its credentials.
                let endpoint = tally_client::redact_url(&endpoint);
                async move {
                    if !allowed {
                        return Err(Failure::Transport(format!("{endpoint}: circuit open")));
                    }
                    tracing::debug!(nonce, attempt, endpoint, try_no = n, "submitting to the hub");
                    let r = fut.await;
                    if let Some(b) = breaker {
                        b.record(r.is_ok());
                    }
                    if let Err(e) = &r {
                        tracing::info!(nonce, attempt, endpoint, try_no = n, error = %e, "hub submission try failed");
                    }
                    r
                }
            })
            .await
    }

    /// Records the outcome; a refusal or spent retries fail the attempt.
    fn conclude(&self, r: Result<Broadcast, RetryError>) {
        let (nonce, attempt) = (self.nonce, self.attempt);
        let failed = || {
            self.app.hand_in(HubResult {
                chain: self.chain.clone(),
                nonce,
                attempt,
                settled: false,
            })
        };
        match r {
            Ok(Broadcast::Result {
                code, log, height, ..
            }) if code == HubCode::Ok.value() || code == HubCode::AlreadySettled.value() => {
                self.metrics.submitted(if code == HubCode::Ok.value() {
                    Outcome::Ok
                } else {
                    Outcome::AlreadySettled
                });
                tracing::info!(
                    nonce,
                    attempt,
                    code,
                    log,
                    height,
                    "batch submitted to the hub"
                );
            }
            Ok(Broadcast::InCache) => {
                self.metrics.submitted(Outcome::InCache);
                tracing::info!(
                    nonce,
                    attempt,
                    "batch already in the hub's mempool or a block"
                )
            }
            Ok(Broadcast::Result { code, log, .. }) => {
                tracing::warn!(
                    nonce,
                    attempt,
                    code,
                    log,
                    "hub refused the batch; signing failed"
                );
                self.metrics.submitted(Outcome::Refused);
                failed();
            }
            Err(RetryError::Shutdown) => {
                // The hub settled the nonce, the attempt ended, or the node
                // is stopping: no further tries.
                self.metrics.submitted(Outcome::Cancelled);
                tracing::info!(
                    nonce,
                    attempt,
                    "submission stopped before its retries were spent"
                );
            }
            Err(e) => {
                tracing::warn!(nonce, attempt, error = %e, layer = "transport", "submission failed; signing failed");
                self.metrics.submitted(Outcome::Failed);
                failed();
            }
        }
    }
}

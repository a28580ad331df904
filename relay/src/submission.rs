//! One submission of a signed batch to the hub, run as its own task so the
//! poll loop keeps observing the hub meanwhile (and can cancel it once the
//! nonce settled or the attempt ended). It carries a hub-neutral
//! [`Payload`] that the hub kind's protocol encodes in each try. Tries go
//! through the SDK's retry policy over the hub's endpoints, each try gated
//! by that endpoint's breaker; a refusal or spent retries are handed to the
//! signer as `failed`.
//!
//! **Recovery when the hub forgot nonces.** A hub restored from a backup can
//! be behind Tally: its last settled nonce below batches Tally already
//! counts as settled. It then refuses every later batch (a gap), while the
//! calls it forgot are settled on Tally. Before submitting nonce N to a hub
//! whose last nonce L is below N - 1, the submission re-submits batches
//! L+1 ..= N-1 in order, from the bodies Tally keeps for
//! `settled_retention_windows` after a batch settled: the same calls and
//! the same threshold signature the validators made, so the hub checks them
//! like any batch, and no new signature or trust is needed. A forgotten
//! batch whose body was already pruned cannot be re-submitted: the
//! submission logs it (an operator's matter, see docs) and goes on.
//!
//! **Key rotations first.** When the validator set changed, the chain's
//! new key signs batches only after the old key signed a rotation naming
//! it (ADR 0017). Before any batch, a submission hands the hub every
//! signed rotation it has not applied, in nonce order (a hub that already
//! has one answers code 4, which counts as done). The poll loop starts a
//! rotations-only submission when the chain has signed a rotation the hub
//! lacks and nothing is in flight. A *governed* rotation (a recovery, ADR
//! 0018) has no signature to hand over: the hub takes it only from its
//! governors (`tally-hub govern-key`, or `tally-evm govern-key` for the
//! EVM hub), and until they act the relay stops at it and says so.

use std::sync::Arc;

use rand::SeedableRng;
use tally_client::{Broadcast, Failure, RetryError, RetryPolicy};
use tally_hub_types::HubCode;
use tally_settlement::proto::{BatchRecord, HubResult};
use tally_settlement::sync;
use tokio::sync::watch;

use crate::chain::SharedChain;
use crate::hub::{usable, Hub, Payload, TryFailure, TryLimits};
use crate::metrics::{Outcome, RelayMetrics};

/// The payload of `batch` (nonce `nonce` on `chain`) from the calls in
/// `kv`; `None` when a call is missing (pruned) or it is not signed.
pub(crate) fn batch_payload(
    kv: &impl tally_store::KvRead,
    chain: &str,
    nonce: u64,
    batch: &BatchRecord,
) -> Option<Payload> {
    if batch.signature.is_empty() {
        return None;
    }
    let calls: Vec<_> = batch
        .call_ids
        .iter()
        .filter_map(|id| sync::hub_call(kv, *id).ok().flatten())
        .collect();
    (calls.len() == batch.call_ids.len()).then(|| Payload::Batch {
        chain: chain.to_string(),
        nonce,
        calls,
        signature: batch.signature.clone(),
    })
}

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

/// The payload of rotation `nonce`, if the chain has it signed.
pub(crate) fn rotation_payload(kv: &impl tally_store::KvRead, nonce: u64) -> Option<Payload> {
    let r = tally_settlement::dkg::state::rotation(kv, nonce).ok()??;
    if r.signature.is_empty() {
        return None;
    }
    Some(Payload::Rotation {
        chain: r.hub,
        nonce: r.nonce,
        epoch: r.epoch,
        group_key: r.group_key,
        signature: r.signature,
    })
}

/// Whether rotation `nonce` is a governed recovery (no signature to hand
/// over; the hub's governors must accept it).
pub(crate) fn governed_rotation(kv: &impl tally_store::KvRead, nonce: u64) -> bool {
    tally_settlement::dkg::state::rotation(kv, nonce)
        .ok()
        .flatten()
        .is_some_and(|r| r.governed)
}

/// The newest rotation the chain has signed (0: none). Only the last one
/// can still be waiting for its signature.
pub(crate) fn newest_signed_rotation(kv: &impl tally_store::KvRead) -> u64 {
    let last = tally_settlement::dkg::state::last_rotation(kv).unwrap_or(0);
    (last.saturating_sub(1)..=last)
        .rev()
        .find(|&n| n > 0 && rotation_payload(kv, n).is_some())
        .unwrap_or(0)
}

/// Everything one submission needs, owned so it can run as a task.
pub(crate) struct Submission {
    pub(crate) app: SharedChain,
    /// Its endpoints and breakers are the submission's too.
    pub(crate) hub: Hub,
    pub(crate) metrics: RelayMetrics,
    pub(crate) policy: RetryPolicy,
    /// Turns true when the loop cancels this submission.
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) chain: String,
    pub(crate) nonce: u64,
    pub(crate) attempt: u32,
    /// The batch to submit; `None`: hand over key rotations only.
    pub(crate) payload: Option<Payload>,
}

impl Submission {
    async fn run(mut self) {
        let handed_over = self.hand_over_keys().await;
        let Some(payload) = self.payload.clone() else {
            return;
        };
        if !handed_over {
            tracing::warn!(
                nonce = self.nonce,
                "the hub may still hold an older group key; submitting the batch anyway"
            );
        }
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
            Ok(Ok(last)) if last.saturating_add(1) < nonce => {
                tracing::warn!(
                    nonce,
                    attempt,
                    last,
                    "the hub is behind the chain's nonces: re-submitting the batches it forgot"
                );
                self.recover(last.saturating_add(1), nonce).await;
            }
            _ => {}
        }
        let r = self.broadcast(payload).await;
        self.conclude(r);
    }

    /// Hands the hub every signed rotation it has not applied, in order;
    /// `false` if the hub could not be read or one was not taken.
    async fn hand_over_keys(&mut self) -> bool {
        let kv = self.app.committed_state().clone();
        let newest = newest_signed_rotation(&kv);
        if newest == 0 {
            return true;
        }
        let (hub, chain) = (self.hub.clone(), self.chain.clone());
        let last = match tokio::task::spawn_blocking(move || hub.last_rotation(&chain)).await {
            Ok(Ok(last)) => last,
            _ => return false,
        };
        for n in last.saturating_add(1)..=newest {
            let Some(payload) = rotation_payload(&kv, n) else {
                if governed_rotation(&kv, n) {
                    let command = self.hub.govern_command();
                    tracing::warn!(
                        rotation = n,
                        "the hub needs governed rotation {n} from its governors ({command}) before any later key or batch"
                    );
                }
                return false;
            };
            match self.broadcast(payload).await {
                Ok(Broadcast::Result { code, .. })
                    if code == HubCode::Ok.value() || code == HubCode::AlreadySettled.value() =>
                {
                    tracing::info!(rotation = n, code, "handed the hub a key rotation");
                }
                Ok(Broadcast::InCache) => {}
                other => {
                    let outcome = other.map(|b| match b {
                        Broadcast::Result { code, log, .. } => format!("code {code}: {log}"),
                        Broadcast::InCache => "in cache".into(),
                    });
                    tracing::warn!(
                        rotation = n,
                        ?outcome,
                        "the hub did not take a key rotation"
                    );
                    return false;
                }
            }
        }
        true
    }

    /// Re-submits the settled batches `from..until` from the bodies Tally
    /// kept, in order; stops at the first that cannot be re-submitted or
    /// that the hub refuses (the current batch then meets the gap and its
    /// attempt fails, to be retried after the cooldown).
    async fn recover(&mut self, from: u64, until: u64) {
        for n in from..until {
            let kv = self.app.committed_state().clone();
            let payload = match sync::batch(&kv, &self.chain, n) {
                Ok(Some(b)) => batch_payload(&kv, &self.chain, n, &b),
                _ => None,
            };
            let Some(payload) = payload else {
                self.metrics.submitted(Outcome::Refused);
                tracing::error!(
                    nonce = n,
                    "cannot re-submit a batch the hub forgot: its body is no longer kept \
                     (settled_retention_windows passed); see docs/relay.md, recovery"
                );
                return;
            };
            match self.broadcast(payload).await {
                Ok(Broadcast::Result { code, .. })
                    if code == HubCode::Ok.value() || code == HubCode::AlreadySettled.value() =>
                {
                    self.metrics.submitted(Outcome::Recovered);
                    tracing::info!(nonce = n, "re-submitted a batch the hub forgot");
                }
                Ok(Broadcast::InCache) => {
                    self.metrics.submitted(Outcome::Recovered);
                }
                other => {
                    self.metrics.submitted(Outcome::Refused);
                    tracing::warn!(nonce = n, outcome = ?other.map(|_| ()), "re-submitting a forgotten batch failed");
                    return;
                }
            }
        }
    }

    /// The tries of `payload`, through the retry policy: each on one
    /// endpoint whose breaker lets it through, run on tokio's blocking
    /// pool, its outcome recorded on that breaker (a try the hub answered
    /// counts as the endpoint working, even when the try failed).
    async fn broadcast(&mut self, payload: Payload) -> Result<Broadcast, RetryError> {
        let (nonce, attempt) = (self.nonce, self.attempt);
        let hub = self.hub.clone();
        let usable = usable(hub.breakers());
        let endpoints = hub.endpoints();
        let per_try = self.policy.per_try_timeout;
        let mut rng = rand::rngs::StdRng::from_entropy();
        let (metrics, payload) = (&self.metrics, Arc::new(payload));
        self.policy
            .run(&usable, &mut self.shutdown, &mut rng, |i: &usize, n| {
                let i = *i;
                if n > 1 {
                    metrics.transport_retry();
                }
                // Logs and errors show the URL without its credentials.
                let endpoint =
                    tally_client::redact_url(&endpoints.get(i).cloned().unwrap_or_default());
                // A half-open breaker takes a probe only when it is tried.
                let allowed = hub.breakers().get(i).is_some_and(|b| b.allow());
                let (hub, payload) = (hub.clone(), payload.clone());
                async move {
                    if !allowed {
                        return Err(Failure::Transport(format!("{endpoint}: circuit open")));
                    }
                    tracing::debug!(nonce, attempt, endpoint, try_no = n, "submitting to the hub");
                    let limits = TryLimits {
                        deadline: std::time::Instant::now() + per_try - per_try / 10,
                    };
                    let h = hub.clone();
                    let r = tokio::task::spawn_blocking(move || h.submit_on(i, &payload, limits))
                        .await
                        .unwrap_or_else(|e| {
                            Err(TryFailure::endpoint(Failure::Transport(e.to_string())))
                        });
                    if let Some(b) = hub.breakers().get(i) {
                        b.record(r.as_ref().map_or_else(|f| f.endpoint_ok, |_| true));
                    }
                    let r = r.map_err(|f| f.failure);
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
            self.app.hand_in_result(HubResult {
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

//! The relay's loop: every `poll` it reads the chain's committed
//! settlement state and the hub, updates the metrics, and acts on what
//! [`decide`](crate::decide) says: hand deposits and hub results to the
//! signer, start a submission, or cancel one that became moot. Decisions
//! are pure functions in `decide`; this module only does the I/O.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tally_settlement::proto::{BatchRecord, HubResult, SyncState};
use tally_settlement::sync;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::chain::SharedChain;
use crate::config::RelayConfig;
use crate::decide;
use crate::hub::protocol::Deposits;
use crate::hub::{Hub, HubError, Payload, Tip};
use crate::metrics::{Refusal, RelayMetrics};
use crate::submission::{
    batch_payload, governed_rotation, newest_signed_rotation, InFlight, Submission,
};

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs a blocking hub read on tokio's blocking pool; `None` (logged) if
/// it failed.
async fn read_hub<T: Send + 'static>(
    what: &'static str,
    hub: &Hub,
    read: impl FnOnce(&Hub) -> Result<T, HubError> + Send + 'static,
) -> Option<T> {
    let h = hub.clone();
    match tokio::task::spawn_blocking(move || read(&h)).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "hub {what} not readable");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "hub read task failed");
            None
        }
    }
}

/// The loop's state between polls.
struct Relay {
    app: SharedChain,
    cfg: RelayConfig,
    hub: Hub,
    metrics: RelayMetrics,
    /// (nonce, attempt) whose submission already started here.
    done: Option<(u64, u32)>,
    /// When this relay first saw (nonce, attempt) signed: ranks are
    /// staggered from there, so a slow signing round does not let every
    /// relay submit at once.
    signed_seen: Option<((u64, u32), Instant)>,
    in_flight: Option<InFlight>,
    /// The last key rotation the hub was seen to hold.
    hub_rotation: u64,
}

impl Relay {
    /// The loop over `app` and `hub`, before its first poll.
    pub(crate) fn new(app: SharedChain, hub: Hub, cfg: RelayConfig, metrics: RelayMetrics) -> Self {
        Self {
            app,
            cfg,
            hub,
            metrics,
            done: None,
            signed_seen: None,
            in_flight: None,
            hub_rotation: 0,
        }
    }

    /// This relay's signer rank now: from the active key when the
    /// validator's address is known (on-chain DKG), else the configured one.
    fn rank(&self, kv: &impl tally_store::KvRead) -> Option<u32> {
        match self.cfg.address {
            Some(a) => tally_settlement::dkg::state::active_key_record(kv)
                .ok()
                .flatten()
                .and_then(|k| k.index_of(&a))
                .map(|i| i.saturating_sub(1))
                .or(self.cfg.rank),
            None => self.cfg.rank,
        }
    }
}

/// Polls `hub` until `stop` turns true.
pub(crate) async fn run(
    app: SharedChain,
    hub: Hub,
    cfg: RelayConfig,
    metrics: RelayMetrics,
    mut stop: watch::Receiver<bool>,
) {
    match (cfg.rank, cfg.address) {
        (Some(rank), None) => {
            tracing::info!(hub = ?cfg.shown_hub_endpoints(), rank, "relay started")
        }
        (_, Some(a)) => tracing::info!(
            hub = ?cfg.shown_hub_endpoints(),
            address = ?a,
            "relay started: submits while this validator holds a share of the active key"
        ),
        (None, None) => tracing::info!(
            hub = ?cfg.shown_hub_endpoints(),
            "relay started without a key share: observes the hub, never submits"
        ),
    }
    let mut relay = Relay::new(app, hub, cfg, metrics);
    // Every endpoint's breaker state is exposed from the start.
    for (e, b) in relay.cfg.hub_endpoints.iter().zip(relay.hub.breakers()) {
        relay.metrics.set_circuit_state(e, b.state().gauge());
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(relay.cfg.poll) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            if let Some(f) = relay.in_flight.take() {
                f.task.abort();
            }
            return; // the runtime, and any cancelled task, ends with the thread
        }
        relay.poll().await;
    }
}

impl Relay {
    /// Cancels the submission in flight, if any.
    fn cancel_in_flight(&mut self) {
        if let Some(f) = self.in_flight.take() {
            f.cancel();
        }
    }

    /// One poll.
    async fn poll(&mut self) {
        if self
            .in_flight
            .as_ref()
            .is_some_and(|f| f.task.is_finished())
        {
            self.in_flight = None;
        }
        let app = self.app.clone();
        let kv = app.committed_state();
        let Ok(p) = tally_settlement::params(kv) else {
            return;
        };
        // The hub's tip, read once per poll for deposits and settlement;
        // the deposits are read on the endpoint that answered it.
        let c = p.hub_chain.clone();
        let tip = read_hub("tip", &self.hub, move |h| h.tip(&c)).await;
        if let Some(tip) = tip {
            self.deposits(kv, &p, tip).await;
        }
        let tip = tip.map(|t| t.height);
        let Ok(st) = sync::sync_state(kv, &p.hub_chain) else {
            return;
        };
        self.update_gauges(kv, &p, &st);
        let key = (st.current_nonce, st.attempt);
        // A submission for an attempt that is no longer current is moot.
        if let Some(f) = self.in_flight.take_if(|f| f.key != key) {
            f.cancel();
        }
        self.rotations(kv, &p.hub_chain, key).await;
        let (chain, nonce, attempt) = (p.hub_chain.clone(), st.current_nonce, st.attempt);
        if nonce == 0 || attempt == 0 {
            return;
        }
        let batch = sync::batch(kv, &chain, nonce).ok().flatten();
        let view = self.hub_view(tip, &chain, nonce).await;
        let since_signed = self.since_signed(batch.as_ref(), key);
        let step = decide::decide(&decide::Inputs {
            state: &st,
            batch: batch.as_ref(),
            hub: view,
            confirmations: self.cfg.confirmations,
            now_unix: unix_now(),
            attempt_deadline_secs: p.attempt_deadline_secs,
            since_signed,
            rank: self.rank(kv),
            stagger: self.cfg.stagger,
            submitted: self.done == Some(key),
        });
        let result = |settled| HubResult {
            chain: chain.clone(),
            nonce,
            attempt,
            settled,
        };
        match (step, batch) {
            (decide::Step::Idle, _) => {}
            (decide::Step::SettledShallow | decide::Step::Settled, _) => {
                // Whatever this relay still had in flight is moot.
                self.cancel_in_flight();
                if step == decide::Step::Settled {
                    self.app.hand_in_result(result(true));
                }
            }
            (decide::Step::DeadlinePassed { elapsed }, _) => {
                self.cancel_in_flight();
                tracing::warn!(
                    nonce,
                    attempt,
                    elapsed,
                    layer = "settlement",
                    "attempt deadline passed without settlement; signing failed"
                );
                self.app.hand_in_result(result(false));
            }
            (decide::Step::Submit, Some(b)) => self.submit(kv, chain, key, &b),
            (decide::Step::Submit, None) => {}
        }
    }

    /// With nothing in flight, a signer whose chain signed a key rotation
    /// the hub lacks starts a rotations-only submission.
    async fn rotations(&mut self, kv: &impl tally_store::KvRead, chain: &str, key: (u64, u32)) {
        if self.in_flight.is_some() || self.rank(kv).is_none() {
            return;
        }
        let newest = newest_signed_rotation(kv);
        if newest <= self.hub_rotation {
            return;
        }
        let c = chain.to_string();
        match read_hub("rotation", &self.hub, move |h| h.last_rotation(&c)).await {
            // The next one is governed: only the hub's governors can hand
            // it over; a submission would stop at it (and says so).
            Some(last) if governed_rotation(kv, last + 1) => self.hub_rotation = last,
            Some(last) if last < newest => self.spawn_submission(chain.to_string(), key, None),
            Some(last) => self.hub_rotation = last,
            None => {}
        }
    }

    /// Observes the hub: has it settled `nonce` on `chain`, and how deep
    /// below `tip` (`None`: no tip, or the hub could not be read)?
    async fn hub_view(&self, tip: Option<u64>, chain: &str, nonce: u64) -> Option<decide::HubView> {
        let tip = tip?;
        let c = chain.to_string();
        read_hub("settlement", &self.hub, move |h| h.settled_at(&c, nonce))
            .await
            .map(|settled_at| decide::HubView { settled_at, tip })
    }

    /// Deposits: the next fixed range of hub heights, once it is
    /// `confirmations` blocks deep, goes to the signer, as the next message
    /// of at most `max_block_deposits` deposits from the chain's sequence
    /// cursor with the hub's deposit count (see [`decide::hub_block`]).
    /// From app version 5 the chain waits for up to
    /// `sync::deposits::in_flight` messages at once (ADR 0024): the rest of
    /// that range's messages and the following ranges' go too, as far as
    /// the hub is deep enough. Each range is read on `tip`'s endpoint at
    /// `tip`'s height; an answer from below the range's end, or one the
    /// chain would not credit (a short list under its count), is refused
    /// and counted, never handed in, and ends the step. A failed read
    /// abandons the step until the next poll.
    async fn deposits(
        &self,
        kv: &impl tally_store::KvRead,
        p: &tally_settlement::Params,
        tip: Tip,
    ) {
        let chain = p.hub_chain.as_str();
        let Ok(sync::HubCursor {
            height: cursor,
            deposit_seq,
        }) = sync::hub_cursor(kv, chain)
        else {
            return;
        };
        let range = p.hub_block_range;
        self.metrics
            .set_cursor_lag(tip.height.saturating_sub(cursor.saturating_sub(1)));
        // Before app version 3 the chain binds no keys: every honest relay
        // leaves them out, so all sign the same message (ADR 0020).
        let version = tally_settlement::state::chain::app_version(kv).unwrap_or(1);
        let window = sync::deposits::in_flight(p, version) as usize;
        let (mut from_height, mut first_seq, mut built) = (cursor, deposit_seq, 0usize);
        while built < window {
            let Some((from, to)) =
                decide::deposit_range(from_height, range, tip.height, self.cfg.confirmations)
            else {
                return;
            };
            let Some(answer) = self.read_deposits(chain, tip, from, to).await else {
                return;
            };
            let mut deposits = answer.deposits;
            if version < tally_settlement::types::GROWTH_VERSION {
                for d in &mut deposits {
                    d.pubkey.clear();
                }
            }
            let messages = decide::range_messages(
                chain,
                (from, to),
                deposits,
                answer.count,
                first_seq,
                p.max_block_deposits as usize,
                window - built,
            );
            for block in messages {
                match sync::deposits::check_slot(kv, p, &block) {
                    Ok(Ok(_)) => self.app.hand_in_block(block),
                    Ok(Err(why)) => {
                        self.metrics.refused_answer(Refusal::Inconsistent);
                        tracing::warn!(
                            endpoint = tip.endpoint,
                            from,
                            to,
                            answer_height = answer.height,
                            error = %why,
                            "hub deposit answer refused: the chain would not credit it"
                        );
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "committed state not readable");
                        return;
                    }
                }
                built += 1;
            }
            from_height = to.saturating_add(1);
            first_seq = answer.count.saturating_add(1);
        }
    }

    /// The hub's deposits in heights `from..=to` of `chain`, read on
    /// `tip`'s endpoint; `None` (counted or logged) if the answer is from
    /// a lagging node or the hub could not be read.
    async fn read_deposits(&self, chain: &str, tip: Tip, from: u64, to: u64) -> Option<Deposits> {
        let (h, c) = (self.hub.clone(), chain.to_string());
        let read = move || h.deposits(&c, tip, from, to);
        match tokio::task::spawn_blocking(read).await {
            Ok(Ok(a)) => Some(a),
            Ok(Err(e @ HubError::Stale { .. })) => {
                self.metrics.refused_answer(Refusal::Stale);
                tracing::warn!(endpoint = tip.endpoint, error = %e, "hub deposit answer refused: from a lagging node");
                None
            }
            Ok(Err(e)) => {
                tracing::debug!(endpoint = tip.endpoint, error = %e, "hub deposits not readable");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "hub read task failed");
                None
            }
        }
    }

    /// Gauges and counters read from committed state and the breakers.
    fn update_gauges(
        &self,
        kv: &impl tally_store::KvRead,
        p: &tally_settlement::Params,
        st: &SyncState,
    ) {
        // Attempts beyond each batch's first: the chain's settlement retries.
        self.metrics.set_sync(
            st.attempts_total,
            st.failures,
            st.attempts_total.saturating_sub(st.next_nonce.max(1) - 1),
        );
        if let Ok(pending) = sync::pending_calls(kv, &p.hub_chain, None, 1000) {
            let oldest = pending
                .first()
                .map(|c| unix_now().saturating_sub((c.window + 1) * p.settlement_window_secs))
                .unwrap_or(0);
            self.metrics.set_pending(pending.len(), oldest);
        }
        for (e, b) in self.cfg.hub_endpoints.iter().zip(self.hub.breakers()) {
            self.metrics.set_circuit_state(e, b.state().gauge());
        }
    }

    /// How long ago this relay first saw the current attempt's batch
    /// signed (`None`: not signed).
    fn since_signed(&mut self, batch: Option<&BatchRecord>, key: (u64, u32)) -> Option<Duration> {
        let now = Instant::now();
        match (batch, self.signed_seen) {
            (Some(b), Some((k, t)))
                if b.status == sync::BatchStatus::Signed.value() && k == key =>
            {
                Some(now.duration_since(t))
            }
            (Some(b), _) if b.status == sync::BatchStatus::Signed.value() => {
                self.signed_seen = Some((key, now));
                Some(Duration::ZERO)
            }
            _ => None,
        }
    }

    /// Starts the submission of the signed `batch` as a task.
    fn submit(
        &mut self,
        kv: &impl tally_store::KvRead,
        chain: String,
        key: (u64, u32),
        batch: &BatchRecord,
    ) {
        let (nonce, attempt) = key;
        let Some(payload) = batch_payload(kv, &chain, nonce, batch) else {
            return;
        };
        self.done = Some(key);
        tracing::info!(
            nonce,
            attempt,
            rank = self.cfg.rank.unwrap_or_default(),
            "submitting the signed batch to the hub"
        );
        self.spawn_submission(chain, key, Some(payload));
    }

    /// Starts a submission of `payload` for (nonce, attempt) `key` (`None`:
    /// key rotations only) as the one in flight.
    fn spawn_submission(&mut self, chain: String, key: (u64, u32), payload: Option<Payload>) {
        let (cancel, cancel_rx) = watch::channel(false);
        let sub = Submission {
            app: self.app.clone(),
            hub: self.hub.clone(),
            metrics: self.metrics.clone(),
            policy: self.cfg.policy.clone(),
            shutdown: cancel_rx,
            chain,
            nonce: key.0,
            attempt: key.1,
            payload,
        };
        self.in_flight = Some(InFlight::spawn(sub, cancel));
    }
}

#[cfg(test)]
mod tests;

//! The gauges read from committed state on each scrape: signing progress
//! and the current batch. They run on the metrics endpoint's thread and
//! read the backend the way queries do; a read error is logged at debug
//! and leaves these gauges out of that scrape.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use tally_settlement::bls::Kind;
use tally_settlement::dkg::state::active_key_record;
use tally_settlement::proto::PendingMessage;
use tally_settlement::state::load;
use tally_settlement::state::sync::{batch, hub_call, stored_partials, sync_state};
use tally_settlement::{keys, Fatal};
use tally_store::KvRead;

use super::gauge;

/// Most pending messages listed one by one (they expire after
/// `partial_expiry_blocks`; this only bounds a scrape).
const MAX_LISTED: usize = 256;

/// Signing progress of one message below the threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    pub kind: &'static str,
    pub digest: String,
    pub partials: u64,
    pub first_height: u64,
}

/// What the state gauges show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StateGauges {
    pub threshold: Option<u64>,
    pub pending: Vec<Pending>,
    pub batch_age_secs: u64,
    pub attempt: u64,
}

/// The `kind` label of a stored message kind.
fn kind_name(kind: u32) -> &'static str {
    Kind::try_from(kind).map_or("unknown", Kind::name)
}

/// The threshold of the active key, read from its record alone (no point
/// is parsed, and the ABCI path's key cache is not touched); a record that
/// does not decode shows no threshold.
fn threshold(kv: &impl KvRead) -> Result<Option<u64>, Fatal> {
    match active_key_record(kv) {
        Ok(k) => Ok(k.map(|k| u64::from(k.threshold))),
        Err(Fatal::Corrupt(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the gauges from committed state.
pub(crate) fn read(kv: &impl KvRead) -> Result<StateGauges, Fatal> {
    let mut g = StateGauges {
        threshold: threshold(kv)?,
        ..Default::default()
    };
    let rows = kv.scan_prefix(keys::PMSG, MAX_LISTED)?;
    for (k, _) in rows {
        let digest = k.get(keys::PMSG.len()..).unwrap_or_default();
        let Some(m) = load::<PendingMessage>(kv, &k, "pending message")? else {
            continue;
        };
        let partials = stored_partials(kv, digest)?.len() as u64;
        let mut hex = hex::encode(digest);
        hex.truncate(16);
        g.pending.push(Pending {
            kind: kind_name(m.kind),
            digest: hex,
            partials,
            first_height: m.first_height,
        });
    }
    let p = tally_settlement::params(kv)?;
    let st = sync_state(kv, &p.hub_chain)?;
    if st.current_nonce != 0 {
        g.attempt = u64::from(st.attempt);
        let now = tally_settlement::state::chain::last_time(kv)?;
        let oldest = match batch(kv, &p.hub_chain, st.current_nonce)? {
            Some(b) => match b.call_ids.first() {
                Some(id) => hub_call(kv, *id)?,
                None => None,
            },
            None => None,
        };
        if let Some(c) = oldest {
            let window_end = c
                .window
                .saturating_add(1)
                .saturating_mul(p.settlement_window_secs);
            g.batch_age_secs = now.saturating_sub(window_end);
        }
    }
    Ok(g)
}

/// Encodes the state gauges; `height` is the last committed height.
pub(crate) fn encode(
    e: &mut DescriptorEncoder,
    kv: &impl KvRead,
    height: u64,
) -> Result<(), std::fmt::Error> {
    let g = match read(kv) {
        Ok(g) => g,
        Err(err) => {
            tracing::debug!(error = %err, "state gauges not read");
            return Ok(());
        }
    };
    encode_gauges(e, &g, height)
}

pub(crate) fn encode_gauges(
    e: &mut DescriptorEncoder,
    g: &StateGauges,
    height: u64,
) -> Result<(), std::fmt::Error> {
    gauge(
        e,
        "signing_threshold",
        "Partial signatures needed per message (0: no threshold key)",
        g.threshold.unwrap_or(0),
    )?;
    gauge(
        e,
        "signing_pending_messages",
        "Messages with partial signatures stored, still below the threshold",
        g.pending.len() as u64,
    )?;
    {
        let mut d = e.encode_descriptor(
            "signing_partials",
            "Partial signatures stored for each message below the threshold",
            None,
            MetricType::Gauge,
        )?;
        for m in &g.pending {
            let labels = [("kind", m.kind), ("digest", m.digest.as_str())];
            let v = i64::try_from(m.partials).unwrap_or(i64::MAX);
            ConstGauge::new(v).encode(d.encode_family(&labels)?)?;
        }
    }
    let oldest = g
        .pending
        .iter()
        .map(|m| height.saturating_sub(m.first_height))
        .max()
        .unwrap_or(0);
    gauge(
        e,
        "signing_oldest_pending_blocks",
        "Blocks since the oldest message below the threshold got its first partial",
        oldest,
    )?;
    gauge(
        e,
        "batch_age_seconds",
        "Last block time minus the end of the window of the oldest call in the current unsettled batch (0: none)",
        g.batch_age_secs,
    )?;
    gauge(
        e,
        "sync_current_attempt",
        "Attempt number of the current batch (0: none)",
        g.attempt,
    )
}

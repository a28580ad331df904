use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tally_settlement::keys;
use tally_settlement::proto::{BatchRecord, HubCall, PendingMessage, SyncState};
use tally_store::{Kv, MemBackend, Pending};
use tendermint_proto::v0_38::abci::{Event, EventAttribute, ExecTxResult};

use super::*;

fn event(kind: &str, attrs: &[(&str, &str)]) -> Event {
    Event {
        r#type: kind.into(),
        attributes: attrs
            .iter()
            .map(|(k, v)| EventAttribute {
                key: (*k).into(),
                value: (*v).into(),
                index: true,
            })
            .collect(),
    }
}

fn tx(code: u32, events: Vec<Event>) -> ExecTxResult {
    ExecTxResult {
        code,
        events,
        ..Default::default()
    }
}

/// A block written by hand: two reports (3 + 5 records), one refused
/// report (13) and one refused system tx (17), a closed window, a signed
/// batch and a credited hub block.
fn block() -> ResponseFinalizeBlock {
    ResponseFinalizeBlock {
        events: vec![event("window_closed", &[("window", "7")])],
        tx_results: vec![
            tx(0, vec![event("usage_report", &[("records", "3")])]),
            tx(13, vec![]),
            tx(0, vec![event("usage_report", &[("records", "5")])]),
            tx(
                0,
                vec![
                    event("batch_signed", &[("nonce", "1")]),
                    event("hub_deposits", &[]),
                ],
            ),
            tx(17, vec![]),
        ],
        ..Default::default()
    }
}

/// The value of the series written exactly as `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn scrape(m: &AppMetrics, backend: Arc<dyn Backend>) -> String {
    let mut r = Registry::with_prefix("tally");
    m.register(&mut r, backend);
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &r).unwrap(); // ok: unit test
    out
}

#[test]
fn a_block_tally_counts_what_the_block_says() {
    let t = BlockTally::from_response(9, 1000, &block());
    assert_eq!(
        t,
        BlockTally {
            height: 9,
            time: 1000,
            reports: 2,
            records: 8,
            rejected: vec![13, 17],
            windows_closed: 1,
            signed: [1, 0, 1],
            combine_failed: 0,
        }
    );
}

#[test]
fn the_page_shows_what_was_counted() {
    let m = AppMetrics::default();
    m.committed(&BlockTally::from_response(9, 1000, &block()));
    m.rejected(Phase::CheckTx, 13);
    m.rejected(Phase::CheckTx, 13);
    m.rejected(Phase::Recheck, 7);
    m.rejected(Phase::CheckTx, 0);
    m.rejected(Phase::CheckTx, 999);
    m.observe(Method::FinalizeBlock, Duration::from_millis(3));
    m.observe(Method::FinalizeBlock, Duration::from_secs(20));
    m.set_share(Some(2));
    let text = scrape(&m, Arc::new(MemBackend::new()));
    let v = |s: &str| value(&text, s);
    assert_eq!(v("tally_reports_accepted_total"), Some(2.0));
    assert_eq!(v("tally_records_accepted_total"), Some(8.0));
    assert_eq!(v("tally_windows_closed_total"), Some(1.0));
    assert_eq!(v("tally_app_height"), Some(9.0));
    assert_eq!(v("tally_last_block_time_seconds"), Some(1000.0));
    assert_eq!(v("tally_bls_share_loaded"), Some(1.0));
    assert_eq!(v("tally_bls_share_index"), Some(2.0));
    let rej = |phase: &str, code: &str| {
        v(&format!(
            "tally_tx_rejected_total{{phase=\"{phase}\",code=\"{code}\"}}"
        ))
    };
    assert_eq!(rej("check_tx", "insufficient_balance"), Some(2.0));
    assert_eq!(rej("block", "insufficient_balance"), Some(1.0));
    assert_eq!(rej("block", "bad_system_tx"), Some(1.0));
    assert_eq!(rej("recheck", "duplicate_report"), Some(1.0));
    assert_eq!(rej("check_tx", "malformed_tx"), Some(0.0));
    assert_eq!(rej("check_tx", "ok"), None);
    let signed = |k: &str| v(&format!("tally_threshold_signed_total{{kind=\"{k}\"}}"));
    assert_eq!(signed("batch"), Some(1.0));
    assert_eq!(signed("hub_result"), Some(0.0));
    assert_eq!(signed("hub_block"), Some(1.0));
    let bucket = |le: &str| {
        v(&format!(
            "tally_abci_duration_seconds_bucket{{method=\"finalize_block\",le=\"{le}\"}}"
        ))
    };
    assert_eq!(bucket("0.0025"), Some(0.0));
    assert_eq!(bucket("0.005"), Some(1.0));
    assert_eq!(bucket("10"), Some(1.0));
    assert_eq!(bucket("+Inf"), Some(2.0));
    assert_eq!(
        v("tally_abci_duration_seconds_count{method=\"finalize_block\"}"),
        Some(2.0)
    );
    let sum = v("tally_abci_duration_seconds_sum{method=\"finalize_block\"}").unwrap(); // ok: unit test
    assert!((sum - 20.003).abs() < 1e-9, "{sum}");
    assert_eq!(
        v("tally_abci_duration_seconds_count{method=\"commit\"}"),
        Some(0.0)
    );
    // Without a share, and with no batch in flight.
    m.set_share(None);
    let text = scrape(&m, Arc::new(MemBackend::new()));
    assert_eq!(value(&text, "tally_bls_share_loaded"), Some(0.0));
    assert_eq!(value(&text, "tally_batch_age_seconds"), Some(0.0));
    assert_eq!(value(&text, "tally_signing_pending_messages"), Some(0.0));
    assert_eq!(value(&text, "tally_signing_threshold"), Some(0.0));
}

#[test]
fn refused_vote_extensions_are_counted_by_reason() {
    let m = AppMetrics::default();
    m.extension_rejected(&BadExtension::ForeignIndex { got: 1, own: 4 });
    m.extension_rejected(&BadExtension::ForeignIndex { got: 2, own: 4 });
    m.extension_rejected(&BadExtension::TooLarge {
        len: 5000,
        max: 4096,
    });
    m.extension_rejected(&BadExtension::State("x".into()));
    let text = scrape(&m, Arc::new(MemBackend::new()));
    let got: Vec<(&str, Option<f64>)> = EXTENSION_REASONS
        .iter()
        .map(|r| {
            let series = format!("tally_vote_extensions_rejected_total{{reason=\"{r}\"}}");
            (*r, value(&text, &series))
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("too_large", Some(1.0)),
            ("undecodable", Some(0.0)),
            ("too_many_partials", Some(0.0)),
            ("not_a_signer", Some(0.0)),
            ("foreign_index", Some(2.0)),
            ("malformed", Some(0.0)),
            ("state", Some(1.0)),
        ]
    );
}

#[test]
fn state_gauges_read_committed_state() {
    let backend: Arc<dyn Backend> = Arc::new(MemBackend::new());
    // Window length 60 (the default params); the batch's oldest call is
    // from window 10, which ended at 660; the last block was at 700.
    let mut p = Pending::open(backend.clone()).unwrap(); // ok: unit test
    p.put(keys::LAST_TIME.to_vec(), 700u64.to_be_bytes().to_vec());
    let st = SyncState {
        attempt: 3,
        current_nonce: 1,
        next_nonce: 2,
        ..Default::default()
    };
    p.put(keys::sync_state("hub"), st.encode_to_vec());
    let b = BatchRecord {
        chain: "hub".into(),
        nonce: 1,
        call_ids: vec![4, 5],
        ..Default::default()
    };
    p.put(keys::batch("hub", 1), b.encode_to_vec());
    for (id, window) in [(4, 10), (5, 11)] {
        let c = HubCall {
            id,
            user: "u".into(),
            provider: "p".into(),
            amount: 1,
            window,
            kind: 0,
        };
        p.put(keys::hub_call(id), c.encode_to_vec());
    }
    // Two messages below the threshold: 2 partials since height 5, 1 since 8.
    for (digest, kind, first, n) in [([1u8; 32], 1, 5, 2u32), ([2u8; 32], 3, 8, 1)] {
        let m = PendingMessage {
            kind,
            first_height: first,
            ..Default::default()
        };
        p.put(keys::pmsg(&digest), m.encode_to_vec());
        for i in 1..=n {
            p.put(keys::psig(&digest, i), vec![9; 96]);
        }
    }
    p.commit(10).unwrap(); // ok: unit test
    let g = state::read(&backend).unwrap(); // ok: unit test
    assert_eq!(g.batch_age_secs, 40);
    assert_eq!(g.attempt, 3);
    assert_eq!(g.pending.len(), 2);
    let m = AppMetrics::default();
    m.set_height(12, 700);
    let text = scrape(&m, backend);
    let v = |s: &str| value(&text, s);
    assert_eq!(v("tally_batch_age_seconds"), Some(40.0));
    assert_eq!(v("tally_sync_current_attempt"), Some(3.0));
    assert_eq!(v("tally_signing_pending_messages"), Some(2.0));
    assert_eq!(
        v("tally_signing_partials{kind=\"batch\",digest=\"0101010101010101\"}"),
        Some(2.0)
    );
    assert_eq!(
        v("tally_signing_partials{kind=\"hub_block\",digest=\"0202020202020202\"}"),
        Some(1.0)
    );
    // Height 12, the oldest message's first partial at 5.
    assert_eq!(v("tally_signing_oldest_pending_blocks"), Some(7.0));
}

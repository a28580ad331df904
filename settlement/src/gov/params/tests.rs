//! Governed parameters against hand-computed cases and a model: the
//! parameters a window runs under are genesis's with every change whose
//! window is at or before it applied in window order.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tally_store::{MemBackend, Pending};

use super::*;
use crate::proto::{BatchRecord, Ceremony, ParamValue, SyncState};
use crate::state::chain::{put_cur_window, put_params};
use crate::state::sync::{put_batch, put_sync_state};

const SECS: u64 = 60;

fn chain() -> Pending {
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    let p = Params {
        settlement_window_secs: SECS,
        ..Params::default()
    };
    put_params(&mut kv, &p).unwrap();
    put_cur_window(&mut kv, 10);
    kv
}

fn change(from_window: u64, values: &[(&str, &str)]) -> ParamChange {
    ParamChange {
        from_window,
        values: values
            .iter()
            .map(|(n, v)| ParamValue {
                name: (*n).into(),
                value: (*v).into(),
            })
            .collect(),
    }
}

fn refusal(kv: &Pending, c: &ParamChange) -> String {
    check(kv, Some(c)).unwrap().unwrap_err()
}

/// Accepts `c` as proposal `id` would be.
fn accept(kv: &mut Pending, id: u64, c: ParamChange) {
    check(kv, Some(&c)).unwrap().unwrap();
    let p = Proposal {
        id,
        params: Some(c),
        ..Proposal::default()
    };
    schedule(kv, &p).unwrap();
}

#[test]
fn a_change_is_refused_with_its_reason() {
    let mut kv = chain();
    let cases: [(ParamChange, &str); 11] = [
        (
            change(10, &[("max_batch_calls", "50")]),
            "not after the current window 10",
        ),
        (
            change(9, &[("max_batch_calls", "50")]),
            "not after the current window",
        ),
        (
            change(100_011, &[("max_batch_calls", "50")]),
            "more than 100000 windows",
        ),
        (change(11, &[]), "1 to 32 parameters"),
        (change(11, &[("nope", "1")]), "no parameter \"nope\""),
        (
            change(11, &[("max_batch_calls", "5"), ("max_batch_calls", "6")]),
            "named twice",
        ),
        (
            change(11, &[("max_batch_calls", "-5")]),
            "not a whole number",
        ),
        (
            change(11, &[("max_batch_calls", "1001")]),
            "max_batch_calls must be 1..=1000",
        ),
        (
            change(11, &[("settlement_window_secs", "30")]),
            "settlement_window_secs cannot change",
        ),
        (
            change(11, &[("hub_chain", "other")]),
            "hub_chain cannot change",
        ),
        (
            change(11, &[("max_extension_partials", "4")]),
            "may only be raised (8 to 4)",
        ),
    ];
    for (c, want) in cases {
        let why = refusal(&kv, &c);
        assert!(why.contains(want), "{c:?}: {why}");
    }
    // u32 fields refuse what does not fit.
    assert!(
        refusal(&kv, &change(11, &[("max_batch_calls", "4294967296")])).contains("does not fit")
    );
    // Raising a vote-extension cap is fine.
    check(&kv, Some(&change(11, &[("max_extension_partials", "16")])))
        .unwrap()
        .unwrap();

    // A ceremony running: the phase length cannot change.
    crate::dkg::state::put_ceremony(
        &mut kv,
        Some(&Ceremony {
            round: 3,
            ..Ceremony::default()
        }),
    );
    let why = refusal(&kv, &change(11, &[("dkg_phase_blocks", "6")]));
    assert!(why.contains("while DKG round 3 runs"), "{why}");
    crate::dkg::state::put_ceremony(&mut kv, None);
    check(&kv, Some(&change(11, &[("dkg_phase_blocks", "6")])))
        .unwrap()
        .unwrap();

    // A batch of 40 calls being settled: max_batch_calls stays >= 40.
    let ids: Vec<u64> = (1..=40).collect();
    put_batch(
        &mut kv,
        "hub",
        7,
        &BatchRecord {
            call_ids: ids,
            nonce: 7,
            ..BatchRecord::default()
        },
    );
    put_sync_state(
        &mut kv,
        "hub",
        &SyncState {
            current_nonce: 7,
            next_nonce: 8,
            ..SyncState::default()
        },
    );
    let why = refusal(&kv, &change(11, &[("max_batch_calls", "39")]));
    assert!(why.contains("below the 40 calls"), "{why}");
    check(&kv, Some(&change(11, &[("max_batch_calls", "40")])))
        .unwrap()
        .unwrap();

    // The largest system transaction must still fit.
    let why = refusal(&kv, &change(11, &[("max_tx_bytes", "1024")]));
    assert!(
        why.contains("short of the largest system transaction"),
        "{why}"
    );

    // Scheduling before a window a change waits for is refused; at it or
    // after it is fine.
    accept(&mut kv, 1, change(20, &[("max_report_records", "500")]));
    let why = refusal(&kv, &change(15, &[("max_report_records", "400")]));
    assert!(why.contains("scheduled from window 20"), "{why}");
    check(&kv, Some(&change(20, &[("max_report_records", "400")])))
        .unwrap()
        .unwrap();
}

#[test]
fn a_change_takes_effect_at_the_first_block_of_its_window_and_old_windows_keep_theirs() {
    let mut kv = chain();
    accept(&mut kv, 1, change(12, &[("max_batch_calls", "50")]));
    accept(&mut kv, 2, change(12, &[("sync_window_secs", "400")]));
    let json = json(&kv).unwrap();
    assert_eq!(json["max_batch_calls"], 100);
    assert_eq!(json["scheduled"][0]["from_window"], 12);
    assert_eq!(json["scheduled"][0]["proposals"], serde_json::json!([1, 2]));

    assert!(begin_block(&mut kv, 11).unwrap().is_empty());
    assert_eq!(params(&kv).unwrap().max_batch_calls, 100);
    let ev = begin_block(&mut kv, 12).unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].kind, "params_changed");
    assert_eq!(ev[0].attrs[1], ("proposals".into(), "1,2".into()));
    let now = params(&kv).unwrap();
    assert_eq!((now.max_batch_calls, now.sync_window_secs), (50, 400));
    assert_eq!(since(&kv).unwrap(), 12);
    // Window 11 (closed, maybe still converting) keeps the old version.
    put_cur_window(&mut kv, 12);
    crate::state::chain::put_closing(&mut kv, &crate::state::chain::Closing::new(11));
    assert_eq!(params_at(&kv, 11).unwrap().max_batch_calls, 100);
    assert_eq!(params_at(&kv, 12).unwrap().max_batch_calls, 50);
    begin_block(&mut kv, 12).unwrap();
    assert!(
        kv.get(&keys::params_at(0)).unwrap().is_some(),
        "kept while 11 converts"
    );
    crate::state::chain::delete_closing(&mut kv, 11);
    begin_block(&mut kv, 12).unwrap();
    assert!(
        kv.get(&keys::params_at(0)).unwrap().is_none(),
        "dropped once unneeded"
    );
}

#[test]
fn a_change_that_no_longer_fits_at_its_window_is_refused_there() {
    let mut kv = chain();
    accept(
        &mut kv,
        4,
        change(11, &[("dkg_phase_blocks", "12"), ("max_batch_calls", "60")]),
    );
    // A ceremony started after the change was accepted.
    crate::dkg::state::put_ceremony(
        &mut kv,
        Some(&Ceremony {
            round: 9,
            ..Ceremony::default()
        }),
    );
    let ev = begin_block(&mut kv, 11).unwrap();
    assert_eq!(ev[0].kind, "params_refused");
    assert!(
        ev[0].attrs[2].1.contains("while DKG round 9 runs"),
        "{:?}",
        ev[0]
    );
    let now = params(&kv).unwrap();
    assert_eq!((now.dkg_phase_blocks, now.max_batch_calls), (8, 100));
    assert!(scheduled(&kv).unwrap().is_empty());
}

proptest! {
    #[test]
    fn every_window_runs_genesis_with_its_due_changes_applied(
        changes in prop::collection::vec((1u64..6, 1u32..1000, 1u64..1000), 1..6),
    ) {
        let mut kv = chain();
        // The model: window -> values, applied in window order.
        let mut model: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        let mut from = 10u64;
        for (i, (gap, calls, records)) in changes.iter().enumerate() {
            from += gap;
            let c = change(from, &[
                ("max_batch_calls", &calls.to_string()),
                ("max_report_records", &records.min(&1000).to_string()),
            ]);
            accept(&mut kv, i as u64 + 1, c);
            model.insert(from, (*calls, *records.min(&1000)));
        }
        for w in 11..=from + 2 {
            put_cur_window(&mut kv, w);
            begin_block(&mut kv, w).unwrap();
            let want = model.range(..=w).next_back().map(|(_, v)| *v).unwrap_or((100, 1000));
            let p = params(&kv).unwrap();
            prop_assert_eq!((p.max_batch_calls, u64::from(p.max_report_records)), (want.0, want.1));
        }
        prop_assert!(scheduled(&kv).unwrap().is_empty());
    }
}

/// `sla_keep_windows` (ADR 0026) is named like any parameter although the
/// stored parameters leave it out while 0, and may only be set once the
/// chain runs app version 7; turning it off is always allowed.
#[test]
fn sla_keep_windows_waits_for_version_7() {
    let mut kv = chain();
    crate::state::chain::put_app_version(&mut kv, 6);
    let why = refusal(&kv, &change(11, &[("sla_keep_windows", "1440")]));
    assert!(
        why.contains("takes effect from app version 7; the chain runs version 6"),
        "{why}"
    );
    check(&kv, Some(&change(11, &[("sla_keep_windows", "0")])))
        .unwrap()
        .unwrap();
    crate::state::chain::put_app_version(&mut kv, 7);
    accept(&mut kv, 1, change(11, &[("sla_keep_windows", "1440")]));
    let why = refusal(&kv, &change(12, &[("sla_keep_windows", "100000001")]));
    assert!(why.contains("sla_keep_windows must be"), "{why}");
    assert_eq!(json(&kv).unwrap()["sla_keep_windows"], 0);
    begin_block(&mut kv, 11).unwrap();
    assert_eq!(params(&kv).unwrap().sla_keep_windows, 1440);
    assert_eq!(json(&kv).unwrap()["sla_keep_windows"], 1440);
}

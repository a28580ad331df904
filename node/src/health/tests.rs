use super::*;

const ADDR: &str = "AB12";

/// A healthy signing validator with a relay: every check passes.
fn healthy() -> Observed {
    Observed {
        now: 1_000,
        cometbft: Ok(CometStatus {
            chain_id: "tally".into(),
            height: 50,
            block_time: 995,
            catching_up: false,
            validator_address: ADDR.into(),
        }),
        app_height: Ok(50),
        metrics: Some(Ok(MetricsView {
            share_loaded: Some(true),
            circuits: vec![("http://a".into(), 0), ("http://b".into(), 2)],
            app_height: Some(50),
        })),
        settlement: Ok(Settlement {
            nonce: Some(3),
            attempt: 1,
            batch_age_secs: Some(40),
            pending_age_secs: None,
            signers: vec!["ab12".into(), "cd34".into()],
        }),
        upgrade: Ok(UpgradeView {
            app_version: 1,
            pending: None,
            binary_max: 2,
        }),
    }
}

fn states(r: &Report) -> Vec<(&'static str, State)> {
    r.checks.iter().map(|c| (c.name, c.state)).collect()
}

fn code_of(o: &Observed) -> u8 {
    decide(o, &Limits::default()).exit_code
}

#[test]
fn a_healthy_node_passes_every_check() {
    let r = decide(&healthy(), &Limits::default());
    assert!(r.healthy, "{r:#?}");
    assert_eq!(r.exit_code, 0);
    assert!(r.checks.iter().all(|c| c.state == State::Ok), "{r:#?}");
    assert_eq!(
        r.checks.iter().map(|c| c.name).collect::<Vec<_>>(),
        [
            "cometbft",
            "synced",
            "recent_block",
            "app_height",
            "metrics",
            "bls_share",
            "hub",
            "settlement",
            "upgrade"
        ]
    );
}

#[test]
fn a_pending_upgrade_fails_only_on_a_binary_without_its_version() {
    let mut o = healthy();
    o.upgrade = Ok(UpgradeView {
        app_version: 1,
        pending: Some(("v2".into(), 2, 80)),
        binary_max: 2,
    });
    let r = decide(&o, &Limits::default());
    assert_eq!(r.exit_code, 0, "{r:#?}");
    let detail = &r.checks.last().expect("checks").detail;
    assert!(detail.contains("at height 80 (in 30 blocks)"), "{detail}");
    o.upgrade = Ok(UpgradeView {
        app_version: 1,
        pending: Some(("v3".into(), 3, 80)),
        binary_max: 2,
    });
    let r = decide(&o, &Limits::default());
    assert_eq!(r.exit_code, 18, "{r:#?}");
    assert!(r
        .checks
        .last()
        .expect("checks")
        .detail
        .starts_with("UPGRADE NEEDED"));
    o.upgrade = Err("no answer".into());
    assert_eq!(code_of(&o), 0);
}

#[test]
fn each_fault_gives_its_own_code() {
    let mut o = healthy();
    o.cometbft = Err("connection refused".into());
    // Without CometBFT the app's Info cannot be read either.
    o.app_height = Err("connection refused".into());
    assert_eq!(code_of(&o), 10);

    let mut o = healthy();
    if let Ok(s) = &mut o.cometbft {
        s.catching_up = true;
    }
    assert_eq!(code_of(&o), 11);

    let mut o = healthy();
    if let Ok(s) = &mut o.cometbft {
        s.block_time = 969; // 31 s old, limit 30
    }
    assert_eq!(code_of(&o), 12);
    if let Ok(s) = &mut o.cometbft {
        s.block_time = 970; // exactly 30 s: still fine
    }
    assert_eq!(code_of(&o), 0);

    let mut o = healthy();
    o.app_height = Ok(48); // two behind, limit 1
    assert_eq!(code_of(&o), 13);
    o.app_height = Ok(49);
    assert_eq!(code_of(&o), 0);
    o.app_height = Err("timed out".into());
    assert_eq!(code_of(&o), 13);

    let mut o = healthy();
    o.metrics = Some(Err("connection refused".into()));
    assert_eq!(code_of(&o), 14);

    let mut o = healthy();
    o.metrics = Some(Ok(MetricsView {
        share_loaded: Some(false),
        ..MetricsView::default()
    }));
    assert_eq!(code_of(&o), 15);

    let mut o = healthy();
    o.metrics = Some(Ok(MetricsView {
        share_loaded: Some(true),
        circuits: vec![("http://a".into(), 2), ("http://b".into(), 2)],
        app_height: None,
    }));
    assert_eq!(code_of(&o), 16);

    let mut o = healthy();
    if let Ok(s) = &mut o.settlement {
        s.pending_age_secs = Some(601);
    }
    assert_eq!(code_of(&o), 17);
    if let Ok(s) = &mut o.settlement {
        s.pending_age_secs = None;
        s.batch_age_secs = Some(700);
    }
    assert_eq!(code_of(&o), 17);
}

#[test]
fn the_first_failing_check_decides_the_code() {
    let mut o = healthy();
    if let Ok(s) = &mut o.cometbft {
        s.catching_up = true;
        s.block_time = 0;
    }
    o.app_height = Ok(1);
    let r = decide(&o, &Limits::default());
    assert_eq!(r.exit_code, 11);
    let fails: Vec<_> = r.checks.iter().filter(|c| c.state == State::Fail).collect();
    assert_eq!(fails.len(), 3, "{r:#?}");
}

#[test]
fn what_does_not_apply_is_skipped_not_failed() {
    // A full node: no share in genesis, no relay, no metrics address.
    let mut o = healthy();
    if let Ok(s) = &mut o.cometbft {
        s.validator_address = "FFFF".into();
    }
    o.metrics = None;
    let r = decide(&o, &Limits::default());
    assert_eq!(r.exit_code, 0, "{r:#?}");
    let s = states(&r);
    assert!(s.contains(&("metrics", State::Skipped)));
    assert!(s.contains(&("bls_share", State::Skipped)));
    assert!(s.contains(&("hub", State::Skipped)));
    // A node with no share in genesis does not need one loaded.
    o.metrics = Some(Ok(MetricsView {
        share_loaded: Some(false),
        ..MetricsView::default()
    }));
    assert_eq!(code_of(&o), 0);
    // Without a threshold key nothing settles, and that is not a fault.
    if let Ok(s) = &mut o.settlement {
        s.signers.clear();
        s.pending_age_secs = Some(100_000);
    }
    let r = decide(&o, &Limits::default());
    assert_eq!(r.exit_code, 0);
    assert!(states(&r).contains(&("settlement", State::Skipped)));
}

#[test]
fn limits_are_honoured() {
    let mut o = healthy();
    if let Ok(s) = &mut o.settlement {
        s.batch_age_secs = Some(100);
    }
    let strict = Limits {
        max_batch_age: 99,
        ..Limits::default()
    };
    assert_eq!(decide(&o, &strict).exit_code, 17);
    let lax = Limits {
        max_app_lag: 10,
        ..Limits::default()
    };
    o.app_height = Ok(41);
    assert_eq!(decide(&o, &lax).exit_code, 0);
}

#[test]
fn the_metrics_page_is_read_by_name_and_prefix() {
    let page = "\
# HELP tally_bls_share_loaded x
# TYPE tally_bls_share_loaded gauge
tally_bls_share_loaded 1
tally_app_height 77
tally_hub_circuit_state{endpoint=\"http://127.0.0.1:26757\"} 2
tally_hub_circuit_state{endpoint=\"http://***@h:1/\"} 0
other_bls_share_loaded 0
tally_bls_share_loaded_extra 0
";
    let v = parse_metrics(page, "tally");
    assert_eq!(v.share_loaded, Some(true));
    assert_eq!(v.app_height, Some(77));
    assert_eq!(
        v.circuits,
        vec![
            ("http://127.0.0.1:26757".to_string(), 2),
            ("http://***@h:1/".to_string(), 0)
        ]
    );
    assert_eq!(parse_metrics(page, "other").share_loaded, Some(false));
    assert_eq!(parse_metrics("", "tally"), MetricsView::default());
}

#[test]
fn window_ages_count_from_the_window_end() {
    // Window 10 of 60 s ends at 660.
    assert_eq!(window_age(700, 10, 60), 40);
    assert_eq!(window_age(600, 10, 60), 0);
}

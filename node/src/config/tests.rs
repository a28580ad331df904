//! app.toml: defaults, every key read back, ranges checked at load, and
//! what reaches the relay.

use super::*;

#[test]
fn save_then_load_roundtrips_and_bad_values_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = AppConfig {
        abci_listen: "127.0.0.1:1".into(),
        ..AppConfig::default()
    };
    cfg.save(dir.path()).unwrap();
    assert_eq!(AppConfig::load(dir.path()).unwrap(), cfg);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(AppConfig::path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "app.toml may hold hub API keys");
    }
    std::fs::write(AppConfig::path(dir.path()), "log_format = \"xml\"\n").unwrap();
    let e = AppConfig::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("log_format"), "{e}");
    std::fs::write(AppConfig::path(dir.path()), "nope = 1\n").unwrap();
    assert!(AppConfig::load(dir.path()).is_err());
}

#[test]
fn the_relay_section_roundtrips_and_defaults_to_the_old_constants() {
    let dir = tempfile::tempdir().unwrap();
    // A file from before the section existed loads with the defaults.
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::write(
        AppConfig::path(dir.path()),
        "hub_endpoints = [\"http://127.0.0.1:26757\"]\nrelay_stagger_secs = 3\n",
    )
    .unwrap();
    let cfg = AppConfig::load(dir.path()).unwrap();
    assert_eq!(cfg.relay, RelaySettings::default());
    let rc = cfg.relay_config(dir.path(), Some(2));
    assert_eq!(rc.hub_endpoints, ["http://127.0.0.1:26757"]);
    assert_eq!((rc.rank, rc.confirmations), (Some(2), 1));
    assert_eq!(rc.stagger, Duration::from_secs(3));
    assert_eq!(rc.poll, Duration::from_millis(500));
    assert_eq!(rc.policy, RetryPolicy::default());
    assert_eq!(rc.breaker, BreakerConfig::default());
    assert_eq!(
        (
            rc.breaker.failure_threshold,
            rc.breaker.open_for,
            rc.breaker.probes
        ),
        (3, Duration::from_secs(10), 1)
    );
    assert_eq!(rc.hub_timeouts, HubTimeouts::default());
    assert_eq!(rc.hub_timeouts.read, Duration::from_secs(5));

    // Every key written by save() is read back; the [relay] keys reach the
    // relay.
    let cfg = AppConfig {
        metrics_listen: "127.0.0.1:9".into(),
        relay: RelaySettings {
            poll_interval_ms: 250,
            breaker_failures: 5,
            breaker_open_secs: 30,
            breaker_probes: 2,
            hub_connect_timeout_secs: 4,
            hub_read_timeout_secs: 9,
            submit_retry_budget: 0,
            submit_try_timeout_secs: 20,
            submit_max_elapsed_secs: 120,
        },
        ..AppConfig::default()
    };
    cfg.save(dir.path()).unwrap();
    let text = std::fs::read_to_string(AppConfig::path(dir.path())).unwrap();
    assert!(text.contains("\n[relay]\n"), "{text}");
    assert_eq!(AppConfig::load(dir.path()).unwrap(), cfg);
    let rc = cfg.relay_config(dir.path(), None);
    assert_eq!(rc.poll, Duration::from_millis(250));
    assert_eq!(
        rc.breaker,
        BreakerConfig {
            failure_threshold: 5,
            open_for: Duration::from_secs(30),
            probes: 2
        }
    );
    assert_eq!(
        rc.hub_timeouts,
        HubTimeouts {
            connect: Duration::from_secs(4),
            read: Duration::from_secs(9)
        }
    );
    assert_eq!(
        (
            rc.policy.budget,
            rc.policy.per_try_timeout,
            rc.policy.max_elapsed
        ),
        (0, Duration::from_secs(20), Duration::from_secs(120))
    );
    assert_eq!(rc.policy.base, RetryPolicy::default().base);
}

#[test]
fn each_relay_key_is_checked_against_its_range_at_load() {
    let dir = tempfile::tempdir().unwrap();
    AppConfig::default().save(dir.path()).unwrap();
    for (key, lo, hi) in RelaySettings::RANGES {
        let mut bad = vec![hi + 1];
        if lo > 0 {
            bad.push(lo - 1);
        }
        for v in bad {
            std::fs::write(
                AppConfig::path(dir.path()),
                format!("[relay]\n{key} = {v}\n"),
            )
            .unwrap();
            let e = AppConfig::load(dir.path()).unwrap_err().to_string();
            let want = format!("relay.{key} must be between {lo} and {hi}, got {v}");
            assert!(e.contains(&want), "{key} = {v}: {e}");
            assert!(e.contains("app.toml"), "{e}");
        }
        for v in [lo, hi] {
            std::fs::write(
                AppConfig::path(dir.path()),
                format!("[relay]\n{key} = {v}\n"),
            )
            .unwrap();
            assert!(AppConfig::load(dir.path()).is_ok(), "{key} = {v}");
        }
    }
    // Unknown keys in the section are refused, by name.
    std::fs::write(AppConfig::path(dir.path()), "[relay]\npoll_ms = 500\n").unwrap();
    let e = AppConfig::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("poll_ms"), "{e}");
    // So are values of the wrong type.
    std::fs::write(
        AppConfig::path(dir.path()),
        "[relay]\nbreaker_probes = -1\n",
    )
    .unwrap();
    assert!(AppConfig::load(dir.path()).is_err());
}

#[test]
fn the_hub_kind_and_the_evm_keys_roundtrip_are_checked_and_reach_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    // Defaults: the reference hub, the latest block, the key under config/.
    let cfg = AppConfig::default();
    assert_eq!(
        (cfg.hub_kind.as_str(), cfg.evm_tip.as_str()),
        ("tally", "latest")
    );
    assert_eq!(cfg.evm_key_file, "config/relay_evm_key.hex");
    assert_eq!(cfg.relay_config(home, None).hub, HubKind::Tally);
    // Written by save(), read back, and given to the relay.
    let cfg = AppConfig {
        hub_kind: "evm".into(),
        evm_tip: "finalized".into(),
        ..AppConfig::default()
    };
    cfg.save(home).unwrap();
    let text = std::fs::read_to_string(AppConfig::path(home)).unwrap();
    for key in [
        "hub_kind = \"evm\"",
        "evm_tip = \"finalized\"",
        "evm_key_file = ",
    ] {
        assert!(text.contains(key), "{key}: {text}");
    }
    assert_eq!(AppConfig::load(home).unwrap(), cfg);
    assert_eq!(
        cfg.relay_config(home, Some(0)).hub,
        HubKind::Evm(EvmConfig {
            tip: EvmTip::Finalized,
            key_file: home.join("config/relay_evm_key.hex"),
        })
    );
    let abs = AppConfig {
        evm_key_file: "/etc/tally/relay.hex".into(),
        ..cfg.clone()
    };
    assert_eq!(
        abs.evm_key_path(home),
        std::path::PathBuf::from("/etc/tally/relay.hex")
    );
    // Anything else is refused at load, naming the key.
    for (line, key) in [
        ("hub_kind = \"ethereum\"", "hub_kind"),
        ("evm_tip = \"safe\"", "evm_tip"),
        ("evm_key_file = \"\"", "evm_key_file"),
    ] {
        std::fs::write(AppConfig::path(home), format!("{line}\n")).unwrap();
        let e = AppConfig::load(home).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains("app.toml"), "{line}: {e}");
    }
}

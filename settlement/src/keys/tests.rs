//! Tests of the key layout: keys parse back, no prefix shadows another.

use super::*;

#[test]
fn index_keys_parse_back() {
    let id = RouteId {
        user: "u:1".into(),
        provider: "p/x".into(),
        model: "m-1".into(),
        route: "/v1/chat".into(),
    };
    assert_eq!(
        parse_index(&by_provider(&id, 42), true),
        Some((id.clone(), 42))
    );
    assert_eq!(parse_index(&by_user(&id, 7), false), Some((id, 7)));
    assert_eq!(parse_index(b"ip/x", true), None);
}

#[test]
fn no_prefix_is_a_prefix_of_another() {
    for (i, (a, _)) in LAYOUT.iter().enumerate() {
        for (j, (b, _)) in LAYOUT.iter().enumerate() {
            assert!(i == j || !b.starts_with(a), "{:?} / {:?}", a, b);
        }
    }
}

#[test]
fn sync_keys_parse_back() {
    assert_eq!(parse_hub_pending(&hub_pending("hub", 9), "hub"), Some(9));
    assert_eq!(parse_hub_pending(&hub_pending("hub", 9), "hu"), None);
    assert_eq!(parse_psig_index(&psig(&[7; 32], 4)), Some(4));
    assert_eq!(parse_psig_index(b"ab"), None);
    assert_eq!(parse_pexp(&pexp(5, &[1; 32])), Some(&[1u8; 32][..]));
    assert_eq!(
        parse_report_expiry(&report_expiry(5, &[2; 16])),
        Some(&[2u8; 16][..])
    );
    assert_eq!(parse_report_expiry(b"rexp/abc"), None);
    assert_eq!(
        parse_owed(&owed(3, "p", "u"), 3),
        Some(("p".to_string(), "u".to_string()))
    );
    assert_eq!(parse_owed(&owed(3, "p", "u"), 4), None);
    assert_eq!(parse_closing(&closing(7)), Some(7));
    assert_eq!(parse_closing(b"closing/abc"), None);
}

#[test]
fn every_sla_key_names_its_window_and_no_other_key_does() {
    // Windows whose bytes hold 0x00 and 0xff, so separators cannot be
    // confused with them.
    for w in [0u64, 0x0100_ff00, u64::MAX] {
        let id = RouteId {
            user: "org/u".into(),
            provider: "p".into(),
            model: "m/1".into(),
            route: "/v1".into(),
        };
        for k in [
            route(&id, w),
            by_provider(&id, w),
            by_user(&id, w),
            window(w),
            provider_window("p", w),
            user_window("org/u", w),
            route_latency("p", w, "m/1", "/v1"),
            provider_latency("p", w),
        ] {
            assert_eq!(sla_window(&k), Some(w), "{k:?}");
        }
        assert_eq!(
            parse_party_window(&provider_window("p", w), PROVIDER_WINDOW),
            Some(("p".into(), w))
        );
        for k in [
            owed(w, "p", "u"),
            closing(w),
            slo_verdict("p", w),
            balance("u"),
        ] {
            assert_eq!(sla_window(&k), None, "{k:?}");
        }
    }
    assert_eq!(sla_window(b"rr/a\0b\0c\0"), None);
    assert_eq!(sla_window(b"win/1234567"), None);
    assert_eq!(sla_window(b"pw/p"), None);
}

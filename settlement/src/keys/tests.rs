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

use super::*;

/// The node path a request is forwarded as, or the refusal's status and
/// message.
fn fwd(target: &str) -> Result<String, (u16, String)> {
    match route("GET", target) {
        Ok(Route::Query(p)) => Ok(p.to_string()),
        Ok(other) => panic!("{target} routed to {other:?}"),
        Err(e) => Err((e.status(), e.to_string())),
    }
}

fn refused(target: &str, status: u16, needle: &str) {
    match fwd(target) {
        Ok(p) => panic!("{target} was forwarded as {p}"),
        Err((s, msg)) => {
            assert_eq!(s, status, "{target}: {msg}");
            assert!(msg.contains(needle), "{target}: {msg:?} lacks {needle:?}");
        }
    }
}

#[test]
fn the_page_and_its_files() {
    let page = |t: &str| match route("GET", t) {
        Ok(Route::Asset(a)) => a.path,
        other => panic!("{t}: {other:?}"),
    };
    assert_eq!(page("/"), "/");
    assert_eq!(page("/index.html"), "/");
    // The page's own query string is the page's business.
    assert_eq!(page("/?provider=acme-ai&provider=x"), "/");
    assert_eq!(page("/app.js"), "/app.js");
    assert_eq!(page("/slo.js"), "/slo.js");
    assert_eq!(page("/style.css?v=1"), "/style.css");
    assert_eq!(route("HEAD", "/"), Ok(Route::Asset(&ASSETS[0])));
    assert_eq!(route("GET", "/api/status"), Ok(Route::Status));
    assert_eq!(route("GET", "/api/config"), Ok(Route::Config));
}

#[test]
fn assets_load_nothing_from_elsewhere() {
    for a in ASSETS {
        // The SVG namespace is a name, not a location.
        let body = a.body.replace("http://www.w3.org/2000/svg", "");
        for bad in ["http:", "https:", "//cdn", "<script>", "import ", "@import"] {
            assert!(!body.contains(bad), "{} contains {bad:?}", a.path);
        }
    }
    let html = ASSETS[0].body;
    assert!(html.contains(r#"<script src="/app.js" defer></script>"#));
    // slo.js uses app.js's helpers: it must come after it.
    let slo = html.find(r#"<script src="/slo.js" defer></script>"#);
    assert!(slo > html.find("/app.js"), "{html}");
    assert!(html.contains(r#"href="/style.css""#));
}

#[test]
fn allowed_paths_are_forwarded_rebuilt() {
    for (target, node) in [
        ("/api/q/sla/provider/acme-ai", "/sla/provider/acme-ai"),
        (
            "/api/q/sla/provider/acme-ai/29000000",
            "/sla/provider/acme-ai/29000000",
        ),
        (
            "/api/q/sla/provider/acme-ai?limit=1000&cursor=00Ff",
            "/sla/provider/acme-ai?limit=1000&cursor=00Ff",
        ),
        // Parameters in canonical order, escapes only where needed.
        (
            "/api/q/sla/provider/acme%2dai?cursor=0a&limit=5",
            "/sla/provider/acme-ai?limit=5&cursor=0a",
        ),
        ("/api/q/sla/user/alice?limit=1", "/sla/user/alice?limit=1"),
        ("/api/q/sla/user/alice/7", "/sla/user/alice/7"),
        (
            "/api/q/sla/route/alice/acme-ai/llama%2F3-70b/%2Fv1%2Fchat",
            "/sla/route/alice/acme-ai/llama%2F3-70b/%2Fv1%2Fchat",
        ),
        (
            "/api/q/sla/route/alice/acme-ai/m/r/18446744073709551615",
            "/sla/route/alice/acme-ai/m/r/18446744073709551615",
        ),
        ("/api/q/windows", "/windows"),
        ("/api/q/windows?limit=3&", "/windows?limit=3"),
        ("/api/q/balance/bob", "/balance/bob"),
        ("/api/q/params", "/params"),
        ("/api/q/sync/hub", "/sync/hub"),
        ("/api/q/batch/hub/1", "/batch/hub/1"),
        ("/api/q/hubcalls/hub?limit=100", "/hubcalls/hub?limit=100"),
        // A window's records are paged too (a breach lists its routes).
        (
            "/api/q/sla/provider/acme-ai/7?cursor=ab&limit=1000",
            "/sla/provider/acme-ai/7?limit=1000&cursor=ab",
        ),
    ] {
        assert_eq!(fwd(target), Ok(node.to_string()), "{target}");
    }
}

#[test]
fn slo_paths_are_forwarded_rebuilt() {
    for (target, node) in [
        ("/api/q/slo/policies", "/slo/policies"),
        ("/api/q/slo/policy/acme-ai", "/slo/policy/acme-ai"),
        ("/api/q/slo/policy/acme%2dai", "/slo/policy/acme-ai"),
        ("/api/q/slo/verdicts/acme-ai", "/slo/verdicts/acme-ai"),
        (
            "/api/q/slo/verdicts/acme-ai?from=29000000",
            "/slo/verdicts/acme-ai?from=29000000",
        ),
        // The window is rebuilt from its number.
        (
            "/api/q/slo/verdicts/acme-ai?from=007&",
            "/slo/verdicts/acme-ai?from=7",
        ),
        (
            "/api/q/slo/verdicts/org%2Fp?from=18446744073709551615",
            "/slo/verdicts/org%2Fp?from=18446744073709551615",
        ),
        (
            "/api/q/slo/verdict/acme-ai/29000000",
            "/slo/verdict/acme-ai/29000000",
        ),
        ("/api/q/slo/reputation/acme-ai", "/slo/reputation/acme-ai"),
        (
            "/api/q/latency/acme-ai/29000000",
            "/latency/acme-ai/29000000",
        ),
        ("/api/q/latency/acme-ai/0", "/latency/acme-ai/0"),
    ] {
        assert_eq!(fwd(target), Ok(node.to_string()), "{target}");
    }
    for t in [
        "/api/q/slo",
        "/api/q/slo/policy",
        "/api/q/slo/policies/acme-ai",
        "/api/q/slo/policy/acme-ai/1",
        "/api/q/slo/verdicts",
        "/api/q/slo/verdicts/acme-ai/1",
        "/api/q/slo/verdict/acme-ai",
        "/api/q/slo/verdict/acme-ai/1/2",
        "/api/q/slo/reputation",
        "/api/q/slo/reputation/acme-ai/1",
        "/api/q/slo/judge/acme-ai",
        "/api/q/latency",
        "/api/q/latency/acme-ai",
        "/api/q/latency/acme-ai/1/org%2Fm",
        "/api/q/SLO/policies",
    ] {
        refused(t, 403, "not a query path the explorer forwards");
    }
}

#[test]
fn slo_arguments_are_checked_before_anything_is_sent() {
    let long = "p".repeat(65);
    let cases: Vec<(String, &str)> = vec![
        ("/api/q/slo/policy/a%20b".into(), "character ' '"),
        ("/api/q/slo/reputation/".into(), "provider is empty"),
        (format!("/api/q/slo/verdicts/{long}"), "at most 64"),
        (format!("/api/q/latency/{long}/1"), "at most 64"),
        ("/api/q/latency/a%3Fb/1".into(), "character '?'"),
        (
            "/api/q/latency/p/1.5".into(),
            "window must be a decimal number",
        ),
        (
            "/api/q/slo/verdict/p/x".into(),
            "window must be a decimal number",
        ),
        (
            "/api/q/slo/verdict/p/18446744073709551616".into(),
            "does not fit in 64 bits",
        ),
        (
            "/api/q/slo/verdicts/p?from=x".into(),
            "from must be a decimal number",
        ),
        (
            "/api/q/slo/verdicts/p?from=-1".into(),
            "from must be a decimal number",
        ),
        (
            "/api/q/slo/verdicts/p?from=".into(),
            "from must be a decimal number",
        ),
        (
            "/api/q/slo/verdicts/p?from=%2B1".into(),
            "from must be a decimal number",
        ),
        (
            "/api/q/slo/verdicts/p?from=18446744073709551616".into(),
            "does not fit in 64 bits",
        ),
        (
            "/api/q/slo/verdicts/p?from=1&from=2".into(),
            "from given twice",
        ),
        (
            "/api/q/slo/verdicts/p?limit=5".into(),
            "unknown parameter \"limit\"",
        ),
        (
            "/api/q/slo/verdicts/p?from=1&prove=true".into(),
            "unknown parameter \"prove\"",
        ),
        ("/api/q/slo/verdicts/p?from=%zz".into(), "bad parameter"),
        ("/api/q/slo/policies?limit=5".into(), "takes no parameters"),
        ("/api/q/slo/policy/p?from=1".into(), "takes no parameters"),
        (
            "/api/q/slo/verdict/p/1?from=1".into(),
            "takes no parameters",
        ),
        (
            "/api/q/slo/reputation/p?height=1".into(),
            "takes no parameters",
        ),
        ("/api/q/latency/p/1?limit=5".into(), "takes no parameters"),
    ];
    for (t, needle) in &cases {
        refused(t, 400, needle);
    }
}

#[test]
fn other_node_paths_are_not_forwarded() {
    for t in [
        "/api/q/key",
        "/api/q/dkg",
        "/api/q/gateways",
        "/api/q/allowances/alice",
        "/api/q/http:%2F%2Fevil.example%2F",
        "/api/q/sla",
        "/api/q/sla/provider",
        "/api/q/sla/provider/p/1/2",
        "/api/q/sla/route/u/p/m",
        "/api/q/sla/route/u/p/m/r/1/2",
        "/api/q/batch/hub",
        "/api/q/params/x",
        "/api/q/",
    ] {
        refused(t, 403, "not a query path the explorer forwards");
    }
}

#[test]
fn arguments_are_checked_before_anything_is_sent() {
    let long = "p".repeat(65);
    let long_route = format!("/api/q/sla/route/u/p/m/{}", "r".repeat(129));
    let cases: Vec<(String, &str)> = vec![
        ("/api/q/sla/provider/a%20b".into(), "character ' '"),
        ("/api/q/sla/provider/a%3Fb".into(), "character '?'"),
        (format!("/api/q/sla/provider/{long}"), "at most 64"),
        (long_route, "at most 128"),
        ("/api/q/balance/".into(), "user is empty"),
        ("/api/q/sync/h%C3%A9".into(), "character"),
        ("/api/q/sla/provider/%zz".into(), "bad query path"),
        (
            "/api/q/sla/provider/p/12x".into(),
            "window must be a decimal number",
        ),
        (
            "/api/q/sla/provider/p/-1".into(),
            "window must be a decimal number",
        ),
        (
            "/api/q/sla/provider/p/18446744073709551616".into(),
            "does not fit in 64 bits",
        ),
        (
            "/api/q/batch/hub/one".into(),
            "nonce must be a decimal number",
        ),
        ("/api/q/windows?limit=0".into(), "limit must be 1..=1000"),
        ("/api/q/windows?limit=1001".into(), "limit must be 1..=1000"),
        ("/api/q/windows?limit=%2B5".into(), "limit must be 1..=1000"),
        ("/api/q/windows?limit=".into(), "limit must be 1..=1000"),
        ("/api/q/windows?limit=5&limit=6".into(), "limit given twice"),
        ("/api/q/windows?cursor=zz".into(), "cursor must be"),
        ("/api/q/windows?cursor=abc".into(), "cursor must be"),
        (
            format!("/api/q/windows?cursor={}", "ab".repeat(513)),
            "cursor must be",
        ),
        (
            "/api/q/windows?height=3".into(),
            "unknown parameter \"height\"",
        ),
        ("/api/q/windows?prove=true".into(), "unknown parameter"),
        ("/api/q/balance/alice?limit=5".into(), "takes no parameters"),
        ("/api/q/sla/user/u/1?limit=5".into(), "takes no parameters"),
        (
            "/api/q/sla/route/u/p/m/r/1?limit=5".into(),
            "takes no parameters",
        ),
        ("/api/q/windows?limit=%zz".into(), "bad parameter"),
    ];
    for (t, needle) in &cases {
        refused(t, 400, needle);
    }
}

#[test]
fn methods_lengths_and_unknown_pages() {
    for m in ["POST", "PUT", "DELETE", "OPTIONS", "CONNECT"] {
        let e = route(m, "/api/q/params").unwrap_err();
        assert_eq!(e.status(), 405);
        assert!(e.to_string().contains("GET and HEAD only"), "{e}");
    }
    let long = format!("/api/q/windows?cursor={}", "a".repeat(MAX_TARGET_BYTES));
    assert_eq!(route("GET", &long), Err(RequestError::TooLong));
    assert_eq!(RequestError::TooLong.status(), 414);
    for t in [
        "/etc/passwd",
        "/../app.js",
        "/api",
        "/api/qx/params",
        "/api/q",
        "/app.js/",
        "/favicon.ico",
    ] {
        let e = route("GET", t).unwrap_err();
        assert_eq!(e.status(), 404, "{t}: {e}");
        assert!(e.to_string().starts_with("not found"), "{e}");
    }
    let e = route("GET", "/api/status?node=http://evil").unwrap_err();
    assert_eq!(e.status(), 400);
    assert!(e.to_string().contains("takes no parameters"), "{e}");
}

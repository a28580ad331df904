use std::io::{Read, Write};
use std::sync::Mutex;

use super::*;

/// A node that answers from a script and records what it was asked.
#[derive(Default)]
struct FakeNode {
    asked: Mutex<Vec<String>>,
    answer: Option<Result<QueryAnswer, RpcError>>,
}

impl FakeNode {
    fn answering(code: u32, log: &str, value: &[u8]) -> Self {
        Self {
            asked: Mutex::default(),
            answer: Some(Ok(QueryAnswer {
                code,
                log: log.into(),
                value: value.to_vec(),
                height: 42,
            })),
        }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl Node for FakeNode {
    fn query(&self, path: &str) -> Result<QueryAnswer, RpcError> {
        self.asked.lock().unwrap().push(path.to_string());
        self.answer
            .clone()
            .expect("the fake node was asked a query")
    }

    fn status(&self) -> Result<Status, RpcError> {
        self.asked.lock().unwrap().push("status".into());
        Ok(Status {
            chain_id: "tally-test".into(),
            height: 9,
            app_hash: "AB".into(),
            catching_up: false,
        })
    }
}

fn cfg() -> Config {
    Config {
        node: "http://127.0.0.1:26657".into(),
        providers: vec!["acme-ai".into()],
        chain: None,
        refresh_secs: 5,
    }
}

fn body(r: &Reply) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()))
}

#[test]
fn a_forwarded_query_reaches_the_node_once_and_comes_back_wrapped() {
    let node = FakeNode::answering(0, "", br#"{"user":"bob","balance":7}"#);
    let r = handle(&node, &cfg(), "GET", "/api/q/balance/bob");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.content_type, "application/json");
    assert_eq!(
        body(&r),
        json!({"height": 42, "value": {"user": "bob", "balance": 7}})
    );
    assert_eq!(node.asked(), ["/balance/bob"]);
    let r = handle(
        &node,
        &cfg(),
        "GET",
        "/api/q/sla/route/u/p/a%2Fb/%2Fv1?cursor=ff&limit=2",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        node.asked()[1],
        "/sla/route/u/p/a%2Fb/%2Fv1?limit=2&cursor=ff"
    );
    let r = handle(
        &node,
        &cfg(),
        "GET",
        "/api/q/slo/verdicts/acme-ai?from=0012",
    );
    assert_eq!(r.status, 200);
    assert_eq!(node.asked()[2], "/slo/verdicts/acme-ai?from=12");
}

#[test]
fn refused_requests_never_reach_the_node() {
    let node = FakeNode::default();
    for (method, target, status) in [
        ("GET", "/api/q/key", 403),
        ("GET", "/api/q/dkg", 403),
        ("GET", "/api/q/sla/provider/a%20b", 400),
        ("GET", "/api/q/windows?limit=5000", 400),
        ("GET", "/api/q/slo/verdicts/p?from=x", 400),
        ("GET", "/api/q/latency/p/1?limit=5", 400),
        ("GET", "/api/q/slo/verdict/p", 403),
        ("POST", "/api/q/params", 405),
        ("GET", "/nope", 404),
    ] {
        let r = handle(&node, &cfg(), method, target);
        assert_eq!(r.status, status, "{method} {target}: {}", r.text());
        let err = body(&r)["error"].as_str().unwrap_or_default().to_string();
        assert!(!err.is_empty(), "{target}: {}", r.text());
    }
    assert!(node.asked().is_empty(), "{:?}", node.asked());
}

#[test]
fn node_refusals_and_failures_keep_their_meaning() {
    for (code, status, name) in [
        (22, 404, "not_found"),
        (21, 400, "bad_argument"),
        (16, 502, "internal"),
    ] {
        let node = FakeNode::answering(code, "why", b"");
        let r = handle(&node, &cfg(), "GET", "/api/q/batch/hub/9");
        assert_eq!(r.status, status, "{}", r.text());
        let v = body(&r);
        assert_eq!(v["code"], code);
        assert_eq!(v["code_name"], name);
        assert!(
            v["error"].as_str().unwrap().contains("/batch/hub/9: code"),
            "{v}"
        );
    }
    let node = FakeNode {
        answer: Some(Err(RpcError::Transport {
            url: "http://127.0.0.1:1".into(),
            msg: "connection refused".into(),
        })),
        ..FakeNode::default()
    };
    let r = handle(&node, &cfg(), "GET", "/api/q/params");
    assert_eq!(r.status, 502);
    assert!(r.text().contains("connection refused"), "{}", r.text());
    let node = FakeNode::answering(0, "", b"not json");
    let r = handle(&node, &cfg(), "GET", "/api/q/params");
    assert_eq!(r.status, 502);
    assert!(r.text().contains("not JSON"), "{}", r.text());
    let big = format!("\"{}\"", "x".repeat(MAX_ANSWER_BYTES));
    let node = FakeNode::answering(0, "", big.as_bytes());
    let r = handle(&node, &cfg(), "GET", "/api/q/params");
    assert_eq!(r.status, 502);
    assert!(
        r.text().contains("more than the explorer passes on"),
        "{}",
        r.text()
    );
    assert!(r.body.len() < 1000);
}

#[test]
fn status_config_and_page() {
    let node = FakeNode::default();
    let r = handle(&node, &cfg(), "GET", "/api/status");
    assert_eq!(
        body(&r),
        json!({"chain_id": "tally-test", "height": 9, "app_hash": "AB",
               "catching_up": false, "node": "http://127.0.0.1:26657"})
    );
    let r = handle(&node, &cfg(), "GET", "/api/config");
    assert_eq!(
        body(&r),
        json!({"providers": ["acme-ai"], "chain": null, "refresh_secs": 5,
               "node": "http://127.0.0.1:26657"})
    );
    let r = handle(&node, &cfg(), "GET", "/?provider=x");
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "text/html; charset=utf-8");
    assert!(r.text().contains("<title>"));
}

/// One raw HTTP/1.0 exchange with `addr`: the status line and headers, and
/// the body.
fn exchange(addr: std::net::SocketAddr, request: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_string(), body.to_string())
}

#[test]
fn served_over_http_with_its_headers() {
    let node: Arc<dyn Node> = Arc::new(FakeNode::answering(0, "", br#"{"ok":1}"#));
    let ex = serve("127.0.0.1:0", node, cfg()).unwrap();
    let addr = ex.local_addr().unwrap();
    let (head, body) = exchange(addr, "GET / HTTP/1.0\r\nHost: x\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.contains("Content-Security-Policy: default-src 'none'"),
        "{head}"
    );
    assert!(head.contains("Content-Type: text/html"), "{head}");
    assert!(body.contains("/app.js"));
    let (head, body) = exchange(
        addr,
        "POST /api/q/params HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(head.contains(" 405"), "{head}");
    assert!(head.contains("Allow: GET, HEAD"), "{head}");
    assert!(body.contains("GET and HEAD only"), "{body}");
    let (head, body) = exchange(addr, "GET /api/q/params HTTP/1.0\r\n\r\n");
    assert!(head.contains(" 200"), "{head}");
    assert_eq!(body, r#"{"height":42,"value":{"ok":1}}"#);
    let (head, body) = exchange(addr, "HEAD /app.js HTTP/1.0\r\n\r\n");
    assert!(
        head.contains(" 200") && head.contains("text/javascript"),
        "{head}"
    );
    assert!(body.is_empty(), "{body}");
    drop(ex);
    // tiny_http closes the listener on its accept thread, shortly after.
    let closed = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::net::TcpStream::connect(addr).is_err()
    });
    assert!(closed, "still listening after drop");
}

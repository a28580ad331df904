//! The client against a tiny HTTP server on loopback that answers each
//! request from a script and records what it was sent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::*;

/// One scripted answer.
struct Answer {
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: String,
}

fn answer(status: u16, body: impl Into<String>) -> Answer {
    Answer {
        status,
        headers: vec![("Content-Type", "application/json")],
        body: body.into(),
    }
}

fn result(v: Value) -> Answer {
    answer(
        200,
        json!({"jsonrpc": "2.0", "id": 1, "result": v}).to_string(),
    )
}

/// A server on 127.0.0.1:0 that answers requests in script order.
struct Fake {
    url: String,
    seen: Arc<Mutex<Vec<Value>>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fake {
    fn start(script: Vec<Answer>) -> Fake {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let port = server.server_addr().to_ip().unwrap().port();
        let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (s, log) = (server.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            for a in script {
                let Ok(mut rq) = s.recv() else { return };
                let mut body = String::new();
                rq.as_reader().read_to_string(&mut body).unwrap();
                log.lock()
                    .unwrap()
                    .push(serde_json::from_str(&body).unwrap_or(Value::Null));
                let mut resp = tiny_http::Response::from_string(a.body).with_status_code(a.status);
                for (k, v) in a.headers {
                    resp.add_header(tiny_http::Header::from_bytes(k, v).unwrap());
                }
                let _ = rq.respond(resp);
            }
        });
        Fake {
            url: format!("http://127.0.0.1:{port}/"),
            seen,
            server,
            thread: Some(thread),
        }
    }

    fn client(&self) -> RpcClient {
        RpcClient::new(&self.url, Duration::from_secs(2), Duration::from_secs(5))
    }

    fn seen(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn an_ok_result_is_unwrapped_and_typed() {
    let fake = Fake::start(vec![result(json!({
        "node_info": {"network": "tally-localnet"},
        "sync_info": {"latest_block_height": "42", "latest_app_hash": "ABCD", "catching_up": false}
    }))]);
    let c = fake.client();
    assert_eq!(c.url(), fake.url.trim_end_matches('/'));
    let s = c.status().unwrap();
    assert_eq!(
        s,
        Status {
            chain_id: "tally-localnet".into(),
            height: 42,
            app_hash: "ABCD".into(),
            catching_up: false,
        }
    );
    let sent = &fake.seen()[0];
    assert_eq!(sent["jsonrpc"], "2.0");
    assert_eq!(sent["method"], "status");
}

#[test]
fn a_jsonrpc_error_keeps_code_message_and_data() {
    // CometBFT answers some JSON-RPC errors with HTTP 500, others with 200.
    let in_cache = json!({"jsonrpc": "2.0", "id": 1, "error":
        {"code": -32603, "message": "Internal error", "data": "tx already exists in cache"}});
    let not_found = json!({"jsonrpc": "2.0", "id": 1, "error":
        {"code": -32603, "message": "Internal error", "data": "tx (ABCD) not found"}});
    let fake = Fake::start(vec![
        answer(500, in_cache.to_string()),
        answer(200, not_found.to_string()),
        answer(500, not_found.to_string()),
    ]);
    let c = fake.client();
    let e = c.broadcast_tx_commit(b"tx").unwrap_err();
    assert_eq!(
        e,
        RpcError::Rpc {
            method: "broadcast_tx_commit".into(),
            code: -32603,
            message: "Internal error".into(),
            data: "tx already exists in cache".into(),
        }
    );
    assert!(e.is_tx_in_cache() && !e.is_not_found());
    assert!(e.to_string().contains("tx already exists in cache"), "{e}");
    let f = e.into_failure();
    assert!(f.retryable(), "{f:?}");
    // A lookup of a hash in no block is an answer, not an error.
    assert_eq!(c.tx(&[7; 32]).unwrap(), None);
    let e = c.call("tx", json!({})).unwrap_err();
    assert!(e.is_not_found(), "{e:?}");
}

#[test]
fn a_429_keeps_its_status_retry_after_header_and_body_delay() {
    let body = r#"{"error":{"code":429,"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"5s"}]}}"#;
    let mut a = answer(429, body);
    a.headers.push(("Retry-After", "3"));
    let fake = Fake::start(vec![a]);
    let e = fake.client().broadcast_tx_commit(b"tx").unwrap_err();
    match &e {
        RpcError::Http {
            status,
            retry_after,
            body: b,
            ..
        } => {
            assert_eq!(*status, 429);
            assert_eq!(retry_after.as_deref(), Some("3"));
            assert_eq!(b, body);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("HTTP 429"), "{e}");
    let f = e.into_failure();
    assert!(f.retryable());
    // The longer of header (3 s) and body (5 s) wins.
    assert_eq!(
        f.requested_delay(SystemTime::now()),
        Some(Duration::from_secs(5))
    );
}

#[test]
fn connection_refused_is_a_retryable_transport_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let c = RpcClient::new(&url, Duration::from_secs(2), Duration::from_secs(5));
    let e = c.status().unwrap_err();
    assert!(
        matches!(&e, RpcError::Transport { url: u, .. } if *u == url),
        "{e:?}"
    );
    assert!(e.to_string().starts_with("cannot reach CometBFT RPC at"));
    let f = e.into_failure();
    assert!(matches!(f, Failure::Transport(_)) && f.retryable());
}

#[test]
fn queries_decode_base64_and_broadcasts_send_it() {
    let value = base64::engine::general_purpose::STANDARD.encode(br#"{"a":1}"#);
    let fake = Fake::start(vec![
        result(json!({"response": {"code": 0, "log": "", "value": value, "height": "9"}})),
        result(json!({"response": {"code": 22, "log": "nothing there", "height": "9"}})),
        result(json!({
            "check_tx": {"code": 0, "log": "", "data": null},
            "tx_result": {"code": 5, "log": "bad batch", "data": "AAEC"},
            "height": "11", "hash": "FF"
        })),
        result(
            json!({"check_tx": {"code": 7, "log": "duplicate", "data": "BwcH"}, "tx_result": {}, "height": "0", "hash": "EE"}),
        ),
        result(json!({"code": 0, "log": "", "data": "CQ==", "hash": "DD"})),
        result(json!({"height": "12", "tx_result": {"code": 7, "log": "ok", "data": "AQID"}})),
        result(json!({"height": "13", "tx_result": {"code": 0, "log": "ok", "data": "%%"}})),
    ]);
    let c = fake.client();
    let q = c.abci_query("/params").unwrap();
    assert_eq!(
        (q.code, q.value.as_slice(), q.height),
        (0, &br#"{"a":1}"#[..], 9)
    );
    let q = c.abci_query("/nothing").unwrap();
    assert_eq!(
        (q.code, q.log.as_str(), q.value.len()),
        (22, "nothing there", 0)
    );
    // `data` travels base64-encoded; the one that decides is CheckTx's
    // when it refused, else the block's.
    let r = c.broadcast_tx_commit(&[1, 2, 3]).unwrap();
    assert_eq!(
        (r.final_code(), r.final_log(), r.height, r.final_data()),
        (5, "bad batch", 11, &[0u8, 1, 2][..])
    );
    assert!(r.check_data.is_empty());
    let r = c.broadcast_tx_commit(&[1, 2, 3]).unwrap();
    assert_eq!(
        (
            r.final_code(),
            r.final_log(),
            r.hash.as_str(),
            r.final_data()
        ),
        (7, "duplicate", "EE", &[7u8, 7, 7][..])
    );
    let r = c.broadcast_tx_sync(&[4]).unwrap();
    assert_eq!(
        (r.code, r.hash.as_str(), r.data.as_slice()),
        (0, "DD", &[9u8][..])
    );
    let t = c.tx(&[9; 32]).unwrap().unwrap();
    assert_eq!(
        (t.height, t.code, t.log.as_str(), t.data.as_slice()),
        (12, 7, "ok", &[1u8, 2, 3][..])
    );
    // A `data` that is not base64 is a malformed answer, not empty data.
    let e = c.tx(&[9; 32]).unwrap_err();
    assert!(
        matches!(&e, RpcError::Decode { method, .. } if method == "tx"),
        "{e:?}"
    );
    let seen = fake.seen();
    assert_eq!(seen[0]["params"]["path"], "/params");
    assert_eq!(seen[2]["method"], "broadcast_tx_commit");
    assert_eq!(seen[2]["params"]["tx"], "AQID");
    assert_eq!(seen[4]["method"], "broadcast_tx_sync");
    assert_eq!(
        seen[5]["params"]["hash"],
        base64::engine::general_purpose::STANDARD.encode([9u8; 32])
    );
}

#[test]
fn malformed_and_oversized_answers_are_typed() {
    let fake = Fake::start(vec![
        answer(500, "upstream exploded"),
        answer(200, "not json"),
        answer(200, json!({"jsonrpc": "2.0", "id": 1}).to_string()),
        answer(200, "x".repeat(64)),
    ]);
    let c = fake.client();
    let e = c.status().unwrap_err();
    assert!(
        matches!(&e, RpcError::Http { status: 500, body, .. } if body == "upstream exploded"),
        "{e:?}"
    );
    let e = c.status().unwrap_err();
    assert!(matches!(&e, RpcError::Decode { .. }), "{e:?}");
    assert!(e.into_failure().retryable());
    let e = c.status().unwrap_err();
    assert!(
        matches!(&e, RpcError::Decode { msg, .. } if msg == "no result"),
        "{e:?}"
    );
    let mut small = Connector::new(Duration::from_secs(2), Duration::from_secs(5));
    small.limit = 16;
    let e = small.client(&fake.url).status().unwrap_err();
    assert!(matches!(&e, RpcError::TooLarge { limit: 16, .. }), "{e:?}");
    assert_eq!(e.into_failure(), Failure::TooLarge);
}

#[test]
fn errors_never_show_the_endpoints_credentials() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://gw:s3cret@127.0.0.1:{port}/?api_key=K3Y");
    let c = RpcClient::new(&url, Duration::from_secs(2), Duration::from_secs(5));
    assert_eq!(c.url(), url, "the configured URL is what is called");
    assert_eq!(
        c.shown_url(),
        format!("http://***@127.0.0.1:{port}/?api_key=***")
    );
    let e = c.status().unwrap_err();
    let text = format!("{e} {e:?} {}", e.clone().into_failure());
    assert!(!text.contains("s3cret") && !text.contains("K3Y"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");

    let mut a = answer(503, "busy");
    a.headers.push(("Retry-After", "1"));
    let fake = Fake::start(vec![a, answer(200, "not json")]);
    let url = fake.url.replace("http://", "http://gw:s3cret@") + "?key=K3Y";
    let c = RpcClient::new(&url, Duration::from_secs(2), Duration::from_secs(5));
    for _ in 0..2 {
        let e = c.status().unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains("s3cret") && !text.contains("K3Y"), "{text}");
    }
}

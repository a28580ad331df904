//! The precedence table and the phrase tables of [`classify`](super::classify).

use super::*;

fn call(f: impl FnOnce(&mut UpstreamCall)) -> UpstreamCall {
    let mut c = UpstreamCall::default();
    f(&mut c);
    c
}

#[test]
fn table() {
    use Outcome::*;
    let cases: Vec<(&str, UpstreamCall, Outcome)> = vec![
        // cancel beats everything
        ("client gone", call(|c| c.client_gone = true), Cancel),
        (
            "deadline passed",
            call(|c| c.client_deadline_passed = true),
            Cancel,
        ),
        (
            "gone + 500",
            call(|c| {
                c.client_gone = true;
                c.status = Some(500)
            }),
            Cancel,
        ),
        (
            "gone + reset",
            call(|c| {
                c.client_gone = true;
                c.error = Some("connection reset by peer".into())
            }),
            Cancel,
        ),
        (
            "deadline + half-read body",
            call(|c| {
                c.client_deadline_passed = true;
                c.status = Some(200);
                c.error = Some("unexpected EOF".into())
            }),
            Cancel,
        ),
        (
            "deadline + 429",
            call(|c| {
                c.client_deadline_passed = true;
                c.status = Some(429)
            }),
            Cancel,
        ),
        (
            "deadline + upstream timeout",
            call(|c| {
                c.client_deadline_passed = true;
                c.upstream_timed_out = true
            }),
            Cancel,
        ),
        // statuses
        ("429", call(|c| c.status = Some(429)), RateLimit),
        ("401", call(|c| c.status = Some(401)), Auth),
        ("402", call(|c| c.status = Some(402)), Auth),
        ("403", call(|c| c.status = Some(403)), Auth),
        ("500", call(|c| c.status = Some(500)), Transient),
        ("503", call(|c| c.status = Some(503)), Transient),
        ("529", call(|c| c.status = Some(529)), Transient),
        ("599", call(|c| c.status = Some(599)), Transient),
        ("400", call(|c| c.status = Some(400)), Client),
        ("404", call(|c| c.status = Some(404)), Client),
        ("422", call(|c| c.status = Some(422)), Client),
        ("200", call(|c| c.status = Some(200)), Ok),
        ("204", call(|c| c.status = Some(204)), Ok),
        // status beats text and timeout
        (
            "400 saying rate limit",
            call(|c| {
                c.status = Some(400);
                c.error = Some("rate limit".into())
            }),
            Client,
        ),
        (
            "403 saying quota exceeded",
            call(|c| {
                c.status = Some(403);
                c.error = Some("Quota exceeded".into())
            }),
            Auth,
        ),
        (
            "500 saying too many requests",
            call(|c| {
                c.status = Some(500);
                c.error = Some("too many requests".into())
            }),
            Transient,
        ),
        (
            "429 + upstream timeout",
            call(|c| {
                c.status = Some(429);
                c.upstream_timed_out = true
            }),
            RateLimit,
        ),
        (
            "200 + eof",
            call(|c| {
                c.status = Some(200);
                c.error = Some("EOF".into())
            }),
            Ok,
        ),
        // other statuses fall through to text
        ("302", call(|c| c.status = Some(302)), Unknown),
        (
            "302 + connection reset",
            call(|c| {
                c.status = Some(302);
                c.error = Some(
                    "read tcp 10.0.0.2:5000->10.0.0.1:443: read: connection reset by peer".into(),
                )
            }),
            Transient,
        ),
        // upstream timeout is transient, unlike the client's deadline
        (
            "upstream timeout",
            call(|c| c.upstream_timed_out = true),
            Transient,
        ),
        (
            "upstream timeout + rate limit text",
            call(|c| {
                c.upstream_timed_out = true;
                c.error = Some("rate limit".into())
            }),
            Transient,
        ),
        // text, case-insensitive
        (
            "Rate Limit text",
            call(|c| c.error = Some("Rate Limit reached".into())),
            RateLimit,
        ),
        (
            "rate_limit text",
            call(|c| c.error = Some("error: rate_limit_exceeded".into())),
            RateLimit,
        ),
        (
            "quota text",
            call(|c| c.error = Some("QUOTA EXCEEDED for model".into())),
            RateLimit,
        ),
        (
            "too many requests text",
            call(|c| c.error = Some("Too Many Requests".into())),
            RateLimit,
        ),
        (
            "rate limit beats network text",
            call(|c| c.error = Some("rate limit; connection reset".into())),
            RateLimit,
        ),
        (
            "refused",
            call(|c| c.error = Some("dial tcp 10.0.0.1:443: connect: Connection Refused".into())),
            Transient,
        ),
        (
            "reset",
            call(|c| c.error = Some("connection reset by peer".into())),
            Transient,
        ),
        (
            "dns",
            call(|c| c.error = Some("lookup api: no such host".into())),
            Transient,
        ),
        (
            "timeout text",
            call(|c| c.error = Some("i/o Timeout".into())),
            Transient,
        ),
        (
            "tls",
            call(|c| c.error = Some("remote error: tls: handshake failure".into())),
            Transient,
        ),
        (
            "eof",
            call(|c| c.error = Some("unexpected EOF".into())),
            Transient,
        ),
        (
            "pipe",
            call(|c| c.error = Some("write: broken pipe".into())),
            Transient,
        ),
        (
            "dial tcp",
            call(|c| c.error = Some("dial tcp: lookup failed".into())),
            Transient,
        ),
        (
            "other text",
            call(|c| c.error = Some("model exploded".into())),
            Unknown,
        ),
        ("nothing known", UpstreamCall::default(), Unknown),
    ];
    for (name, c, want) in cases {
        assert_eq!(classify(&c), want, "{name}");
    }
}

/// One row per phrase: a real error text that carries it (as the stack
/// prints it), the class it must give, and the phrase's source.
#[test]
fn every_phrase_classifies_a_real_error_text() {
    use Outcome::*;
    let rows: &[(&str, Outcome)] = &[
        // cancellations (never failures)
        (r#"Post "https://api.example/v1/chat": context canceled"#, Cancel),
        ("net/http: request canceled", Cancel),
        ("AbortError: This operation was aborted", Cancel),
        ("DOMException [AbortError]: This operation was aborted", Cancel),
        ("RequestAbortedError [UND_ERR_ABORTED]: Request aborted", Cancel),
        ("asyncio.exceptions.CancelledError", Cancel),
        // timeouts
        (r#"Post "https://api.example/v1": context deadline exceeded"#, Transient),
        (
            r#"Get "https://api.example": net/http: request canceled (Client.Timeout exceeded while awaiting headers)"#,
            Transient,
        ),
        ("read tcp 10.0.0.2:41234->10.0.0.1:443: i/o timeout", Transient),
        ("net/http: timeout awaiting response headers", Transient),
        ("net/http: TLS handshake timeout", Transient),
        ("dial tcp 10.0.0.1:443: connect: connection timed out", Transient),
        ("error sending request for url (https://api.example/): operation timed out", Transient),
        ("requests.exceptions.ConnectTimeout: HTTPSConnectionPool(host='api.example', port=443)", Transient),
        ("httpx.ReadTimeout: The read operation timed out", Transient),
        ("(Caused by ConnectTimeoutError(<urllib3.connection.HTTPSConnection>, 'Connection to api.example timed out. (connect timeout=3)'))", Transient),
        ("urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='api.example', port=443)", Transient),
        ("HTTPSConnectionPool(host='api.example', port=443): Read timed out. (read timeout=10)", Transient),
        ("aiohttp.client_exceptions.ConnectionTimeoutError: Connection timeout to host https://api.example/v1", Transient),
        ("ConnectTimeoutError: Connect Timeout Error (attempted address: api.example:443, timeout: 10000ms)", Transient),
        ("UND_ERR_CONNECT_TIMEOUT", Transient),
        ("HeadersTimeoutError [UND_ERR_HEADERS_TIMEOUT]: Headers Timeout Error", Transient),
        ("BodyTimeoutError [UND_ERR_BODY_TIMEOUT]: Body Timeout Error", Transient),
        // network
        ("dial tcp 10.0.0.1:443: connect: connection refused", Transient),
        ("read: connection reset by peer", Transient),
        ("write tcp 10.0.0.2:5000->10.0.0.1:443: write: broken pipe", Transient),
        ("dial tcp 192.0.2.55:443: connect: no route to host", Transient),
        ("dial tcp 192.0.2.55:443: connect: network is unreachable", Transient),
        ("dial tcp: lookup api.example on 127.0.0.53:53: no such host", Transient),
        ("dial tcp 10.0.0.1:443: socket: too many open files", Transient),
        (r#"Post "https://api.example/v1": EOF"#, Transient),
        ("unexpected EOF", Transient),
        ("http: server closed idle connection", Transient),
        ("read tcp 10.0.0.2:5000->10.0.0.1:443: use of closed network connection", Transient),
        ("net/http: HTTP/1.x transport connection broken: malformed HTTP response", Transient),
        ("remote error: tls: handshake failure", Transient),
        ("http2: client connection lost", Transient),
        (r#"http2: server sent GOAWAY and closed the connection; LastStreamID=1, ErrCode=NO_ERROR, debug="""#, Transient),
        ("error sending request for url (https://api.example/v1/chat)", Transient),
        ("hyper::Error(IncompleteMessage): connection closed before message completed", Transient),
        ("error trying to connect: tcp connect error: Connection refused (os error 111)", Transient),
        ("client error (Connect)", Transient),
        ("tcp connect error: Network is unreachable (os error 101)", Transient),
        ("dns error: failed to lookup address information: Name or service not known", Transient),
        ("HTTPSConnectionPool(host='api.example', port=443): Max retries exceeded with url: /v1/chat (Caused by NameResolutionError)", Transient),
        ("<urllib3.connection.HTTPSConnection object>: Failed to establish a new connection: [Errno 111]", Transient),
        ("('Connection aborted.', RemoteDisconnected('Remote end closed connection without response'))", Transient),
        ("http.client.RemoteDisconnected: Remote end closed connection without response", Transient),
        ("RemoteDisconnected", Transient),
        ("httpx.ConnectError: [Errno -2] Name or service not known", Transient),
        ("httpx.RemoteProtocolError: Server disconnected without sending a response.", Transient),
        ("aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected", Transient),
        ("ServerDisconnectedError", Transient),
        ("Cannot connect to host api.example:443 ssl:default [Connection refused]", Transient),
        ("TypeError: fetch failed", Transient),
        ("SocketError: other side closed", Transient),
        ("UND_ERR_SOCKET", Transient),
        ("Error: socket hang up", Transient),
        ("Error: read ECONNRESET", Transient),
        ("Error: connect ECONNREFUSED 127.0.0.1:443", Transient),
        ("Error: getaddrinfo ENOTFOUND api.example", Transient),
    ];
    for (text, want) in rows {
        assert_eq!(classify_text(text), *want, "{text}");
        // The flags still come first: a client that left is a cancel.
        let gone = UpstreamCall {
            client_gone: true,
            error: Some(text.to_string()),
            ..Default::default()
        };
        assert_eq!(classify(&gone), Outcome::Cancel, "{text}");
    }
    // Every phrase of every table is exercised by some row above, and
    // each row's phrase source is written down.
    let all = CANCEL_PHRASES
        .iter()
        .chain(TIMEOUT_PHRASES.iter())
        .chain(NETWORK_PHRASES.iter());
    for (phrase, source) in all {
        assert!(!source.is_empty(), "{phrase} has no source");
        assert!(
            rows.iter()
                .any(|(t, _)| phrases::contains_phrase(&t.to_lowercase(), phrase)),
            "no row exercises {phrase:?} ({source})"
        );
    }
}

#[test]
fn texts_that_only_look_like_network_failures_are_not() {
    use Outcome::*;
    let rows: &[(&str, Outcome)] = &[
        ("the answer thereof is unknown", Unknown),
        ("model exploded", Unknown),
        ("invalid request: unknown field 'temperature'", Unknown),
        ("ECONNRESETS", Unknown),
        ("context cancelled by policy reviewer", Unknown),
        ("MyConnectErrorHandler failed", Unknown),
        ("the fetch failedness metric", Unknown),
        ("tls handshake", Unknown),
        ("operation was canceled", Unknown),
        // A cancellation qualified by our own timeout is a timeout.
        (
            "context canceled (Client.Timeout exceeded while awaiting headers)",
            Transient,
        ),
        // A cancellation beats the reset it caused, and a rate limit.
        ("context canceled: read: connection reset by peer", Cancel),
        ("rate limit reached; context canceled", Cancel),
        // A rate limit beats a network phrase.
        ("rate limit; connection reset by peer", RateLimit),
    ];
    for (text, want) in rows {
        assert_eq!(classify_text(text), *want, "{text}");
    }
    // The text is read only when no status decided: a provider's 500 body
    // saying "AbortError" is still the provider's failure.
    let c = UpstreamCall {
        status: Some(500),
        error: Some("AbortError".into()),
        ..Default::default()
    };
    assert_eq!(classify(&c), Transient);
}

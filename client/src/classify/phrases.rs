//! The error-text phrases [`classify`](super::classify) reads, each copied
//! from the source of the HTTP stack that produces it (named beside it), so
//! that a gateway written in Go, Rust, Python or Node gets the same class
//! for the same failure. Matching is case-insensitive and by whole words at
//! the phrase's edges (`EOF` matches `unexpected EOF`, not `thereof`).

/// A phrase and where it comes from.
pub type Phrase = (&'static str, &'static str);

/// Phrases that mean "rate limited" (plain substrings, any case).
pub const RATE_LIMIT_PHRASES: [&str; 4] = [
    "rate limit",
    "rate_limit",
    "quota exceeded",
    "too many requests",
];

/// Phrases that mean the call was cancelled on our side (the request's
/// context, controller or task was cancelled), unless a timeout phrase is
/// also present (then it was our own deadline: `transient`).
///
/// Left out on purpose: "operation was canceled". Go's `net` uses it for a
/// cancelled dial, but hyper uses the same words for a request dropped
/// because its connection closed, which is a network failure; the text
/// cannot tell them apart, so the gateway's `client_gone` flag must.
pub const CANCEL_PHRASES: [Phrase; 6] = [
    ("context canceled", "Go context/context.go: Canceled"),
    (
        "net/http: request canceled",
        "Go net/http/transport.go: errRequestCanceled (x/net http2/transport.go too)",
    ),
    (
        "AbortError",
        "Node: undici lib/core/errors.js AbortError name, DOMException name",
    ),
    (
        "This operation was aborted",
        "Node: AbortSignal DOMException message (undici test/client-request.js)",
    ),
    (
        "UND_ERR_ABORTED",
        "Node undici lib/core/errors.js: RequestAbortedError code",
    ),
    (
        "CancelledError",
        "CPython Lib/asyncio/exceptions.py: CancelledError",
    ),
];

/// Phrases that mean a timeout of ours or of the network: `transient`, and
/// they turn a cancellation phrase into a timeout ("net/http: request
/// canceled (Client.Timeout exceeded while awaiting headers)").
pub const TIMEOUT_PHRASES: [Phrase; 17] = [
    (
        "context deadline exceeded",
        "Go context/context.go: DeadlineExceeded",
    ),
    (
        "Client.Timeout exceeded",
        "Go net/http/client.go: \" (Client.Timeout exceeded while awaiting headers)\"",
    ),
    ("i/o timeout", "Go internal/poll/fd.go: TimeoutError"),
    (
        "timeout awaiting response headers",
        "Go net/http/transport.go: errTimeout (x/net http2/http2.go too)",
    ),
    (
        "TLS handshake timeout",
        "Go net/http/transport.go: tlsHandshakeTimeoutError",
    ),
    (
        "connection timed out",
        "Go syscall zerrors_linux: ETIMEDOUT",
    ),
    (
        "operation timed out",
        "reqwest src/error.rs: TimedOut; hyper src/error.rs: TimedOut",
    ),
    (
        "ConnectTimeout",
        "Python requests exceptions.py, httpx _exceptions.py: ConnectTimeout",
    ),
    (
        "ReadTimeout",
        "Python requests exceptions.py, httpx _exceptions.py: ReadTimeout",
    ),
    (
        "ConnectTimeoutError",
        "Python urllib3 exceptions.py: ConnectTimeoutError",
    ),
    (
        "ReadTimeoutError",
        "Python urllib3 exceptions.py: ReadTimeoutError",
    ),
    (
        "Read timed out",
        "Python urllib3 connectionpool.py: \"Read timed out. (read timeout=..)\"",
    ),
    (
        "Connection timeout to host",
        "Python aiohttp client.py: ConnectionTimeoutError",
    ),
    (
        "UND_ERR_CONNECT_TIMEOUT",
        "Node undici lib/core/errors.js: ConnectTimeoutError",
    ),
    (
        "UND_ERR_HEADERS_TIMEOUT",
        "Node undici lib/core/errors.js: HeadersTimeoutError",
    ),
    (
        "UND_ERR_BODY_TIMEOUT",
        "Node undici lib/core/errors.js: BodyTimeoutError",
    ),
    (
        "Connect Timeout Error",
        "Node undici lib/core/errors.js: ConnectTimeoutError message",
    ),
];

/// Phrases that mean a network-level failure (refused, reset, DNS, TLS,
/// a connection closed under the request): `transient`.
pub const NETWORK_PHRASES: [Phrase; 36] = [
    // Go: the OS error strings (syscall's table), net, net/http, crypto/tls.
    ("connection refused", "Go syscall zerrors_linux: ECONNREFUSED"),
    ("connection reset by peer", "Go syscall zerrors_linux: ECONNRESET"),
    ("broken pipe", "Go syscall zerrors_linux: EPIPE"),
    ("no route to host", "Go syscall zerrors_linux: EHOSTUNREACH"),
    ("network is unreachable", "Go syscall zerrors_linux: ENETUNREACH"),
    ("no such host", "Go net/net.go: errNoSuchHost"),
    ("dial tcp", "Go net/net.go: OpError{Op: \"dial\", Net: \"tcp\"}"),
    ("EOF", "Go io/io.go: EOF, ErrUnexpectedEOF"),
    ("server closed idle connection", "Go net/http/transport.go: errServerClosedIdle"),
    ("use of closed network connection", "Go internal/poll/fd.go: ErrNetClosing"),
    (
        "transport connection broken",
        "Go net/http/transport.go: \"net/http: HTTP/1.x transport connection broken\"",
    ),
    ("tls: handshake failure", "Go crypto/tls/alert.go: alertHandshakeFailure"),
    ("http2: client connection lost", "Go x/net http2/transport.go"),
    (
        "http2: server sent GOAWAY and closed the connection",
        "Go x/net http2/transport_common.go",
    ),
    // Rust: hyper, hyper-util, reqwest.
    ("error sending request", "reqwest src/error.rs: Kind::Request"),
    (
        "connection closed before message completed",
        "hyper src/error.rs: Kind::IncompleteMessage",
    ),
    ("error trying to connect", "hyper 0.14 src/error.rs: Kind::Connect"),
    ("client error (Connect)", "hyper-util src/client/legacy/client.rs: ErrorKind::Connect"),
    ("tcp connect error", "hyper-util src/client/legacy/connect/http.rs: ConnectError"),
    ("dns error", "hyper-util src/client/legacy/connect/http.rs: ConnectError"),
    // Python: requests/urllib3, http.client, httpx/httpcore, aiohttp.
    ("Max retries exceeded with url", "Python urllib3 exceptions.py: MaxRetryError"),
    ("Failed to establish a new connection", "Python urllib3 connection.py: NewConnectionError"),
    ("Connection aborted", "Python urllib3 connectionpool.py: ProtocolError(\"Connection aborted.\")"),
    (
        "Remote end closed connection without response",
        "CPython Lib/http/client.py: RemoteDisconnected",
    ),
    ("RemoteDisconnected", "CPython Lib/http/client.py: RemoteDisconnected"),
    ("ConnectError", "Python httpx _exceptions.py, httpcore _exceptions.py: ConnectError"),
    (
        "Server disconnected",
        "Python httpcore _async/http11.py (\"Server disconnected without sending a response.\"), aiohttp client_exceptions.py",
    ),
    ("ServerDisconnectedError", "Python aiohttp client_exceptions.py: ServerDisconnectedError"),
    ("Cannot connect to host", "Python aiohttp client_exceptions.py: ClientConnectorError"),
    // Node: undici (fetch) and the core http client.
    ("fetch failed", "Node undici lib/web/fetch/index.js: TypeError('fetch failed')"),
    ("other side closed", "Node undici lib/dispatcher/client-h1.js: SocketError"),
    ("UND_ERR_SOCKET", "Node undici lib/core/errors.js: SocketError code"),
    ("socket hang up", "Node lib/_http_client.js: ConnResetException('socket hang up')"),
    ("ECONNRESET", "Node undici lib/handler/retry-handler.js: default errorCodes"),
    ("ECONNREFUSED", "Node undici lib/handler/retry-handler.js: default errorCodes"),
    ("ENOTFOUND", "Node undici lib/handler/retry-handler.js: default errorCodes"),
];

/// Whether `phrase` occurs in `lower_text` (already lower-cased) as whole
/// words at its edges: a phrase edge that is a letter or digit must not
/// touch another letter, digit or `_` in the text.
pub fn contains_phrase(lower_text: &str, phrase: &str) -> bool {
    let p = phrase.to_lowercase();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let first_is_word = p.chars().next().is_some_and(word);
    let last_is_word = p.chars().last().is_some_and(word);
    lower_text.match_indices(&p).any(|(at, _)| {
        let before_ok = !first_is_word || !lower_text[..at].chars().next_back().is_some_and(word);
        let after_ok =
            !last_is_word || !lower_text[at + p.len()..].chars().next().is_some_and(word);
        before_ok && after_ok
    })
}

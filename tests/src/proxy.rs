//! A fault-injection HTTP proxy on loopback, between a relay (or any
//! JSON-RPC client) and a CometBFT node. Each `broadcast_tx_commit` request
//! takes the next [`Fault`] from a script (forwarded untouched once the
//! script is empty); every other request is forwarded. The proxy logs when
//! each broadcast arrived, its request body, and what it did to it. Stopped
//! (and its port freed) on drop.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does to one broadcast.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer with `code` (e.g. 429, 503), a `Retry-After` header if given,
    /// and a body `google.rpc.RetryInfo.retryDelay` of that many seconds if
    /// given. Nothing reaches the upstream.
    Status {
        /// HTTP status.
        code: u16,
        /// `Retry-After` value (seconds or an HTTP date), verbatim.
        retry_after: Option<String>,
        /// Body `retryDelay`, seconds.
        body_delay_secs: Option<u32>,
    },
    /// Read the request, then close the connection without an answer.
    Reset,
    /// Wait, then forward.
    Delay(Duration),
    /// Forward (the upstream gets the transaction), then hold the answer
    /// this long before passing it back: the caller is left waiting.
    HoldAnswer(Duration),
}

impl Fault {
    /// A 429 with `Retry-After: 0` and a body retry delay.
    pub fn too_many(body_delay_secs: u32) -> Self {
        Fault::Status {
            code: 429,
            retry_after: Some("0".into()),
            body_delay_secs: Some(body_delay_secs),
        }
    }

    /// A 503 with `Retry-After: secs`.
    pub fn unavailable(retry_after_secs: u32) -> Self {
        Fault::Status {
            code: 503,
            retry_after: Some(retry_after_secs.to_string()),
            body_delay_secs: None,
        }
    }

    /// The label the log records for it.
    pub fn label(&self) -> String {
        match self {
            Fault::Status { code, .. } => code.to_string(),
            Fault::Reset => "reset".into(),
            Fault::Delay(_) => "delayed".into(),
            Fault::HoldAnswer(_) => "held".into(),
        }
    }
}

/// One broadcast the proxy saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When it arrived.
    pub at: Instant,
    /// What was done: a fault's [`Fault::label`], or `"forwarded"`.
    pub what: String,
    /// The HTTP request body (the JSON-RPC call), as received.
    pub body: Vec<u8>,
}

impl Seen {
    /// The broadcast transaction as the call carries it: `params.tx`,
    /// base64 (CometBFT's JSON-RPC encoding, one string per byte
    /// sequence, so equal strings are equal transactions); `None` if the
    /// body is not such a call.
    pub fn tx_base64(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        v["params"]["tx"].as_str().map(str::to_string)
    }
}

/// What the proxy does and saw.
#[derive(Debug, Default)]
pub struct ProxyState {
    /// Faults for the next broadcasts, in order.
    pub script: VecDeque<Fault>,
    /// Every broadcast, in arrival order.
    pub broadcasts: Vec<Seen>,
    /// While set, `status` calls are answered with the last answer recorded
    /// before it was set (a lagging node's stale tip); other reads pass.
    pub stale_status: bool,
    /// The last upstream answer to a `status` call, recorded while
    /// `stale_status` is off.
    pub last_status: Option<Vec<u8>>,
    /// `status` calls answered from `last_status`.
    pub stale_answers: u64,
}

impl ProxyState {
    /// A state that applies `faults` to the first broadcasts.
    pub fn with(faults: impl IntoIterator<Item = Fault>) -> Self {
        Self {
            script: faults.into_iter().collect(),
            ..Self::default()
        }
    }

    /// What was done to each broadcast, in order.
    pub fn labels(&self) -> Vec<String> {
        self.broadcasts.iter().map(|s| s.what.clone()).collect()
    }

    /// Arrival times relative to the first broadcast, with labels.
    pub fn timeline(&self) -> Vec<(u128, String)> {
        let Some(t0) = self.broadcasts.first().map(|s| s.at) else {
            return Vec::new();
        };
        self.broadcasts
            .iter()
            .map(|s| (s.at.duration_since(t0).as_millis(), s.what.clone()))
            .collect()
    }
}

/// A running proxy.
#[derive(Debug)]
pub struct FaultProxy {
    /// Its address.
    pub addr: SocketAddr,
    /// Shared state (the script may be changed while it runs).
    pub state: Arc<Mutex<ProxyState>>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (host:port).
    pub fn start(upstream: &str, state: ProxyState) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(state));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, up) = (state.clone(), stop.clone(), upstream.to_string());
        std::thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((sock, _)) => {
                        let (st, up) = (st.clone(), up.clone());
                        std::thread::spawn(move || {
                            let _ = handle(sock, &up, &st);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(Self { addr, state, stop })
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Locks the state.
    pub fn state(&self) -> std::sync::MutexGuard<'_, ProxyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads one HTTP request: its head and its body (by Content-Length).
pub fn read_request(sock: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok((head, body))
}

fn handle(mut sock: TcpStream, upstream: &str, state: &Mutex<ProxyState>) -> std::io::Result<()> {
    let (head, body) = read_request(&mut sock)?;
    let mut hold = None;
    if String::from_utf8_lossy(&body).contains("broadcast_tx_commit") {
        let fault = {
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            let fault = st.script.pop_front();
            let what = fault.as_ref().map_or("forwarded".into(), Fault::label);
            st.broadcasts.push(Seen {
                at: Instant::now(),
                what,
                body: body.clone(),
            });
            fault
        };
        match fault {
            None => {}
            Some(Fault::Status {
                code,
                retry_after,
                body_delay_secs,
            }) => {
                let b = match body_delay_secs {
                    Some(d) => format!(
                        r#"{{"error":{{"code":{code},"details":[{{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"{d}s"}}]}}}}"#
                    ),
                    None => format!(r#"{{"error":{{"code":{code}}}}}"#),
                };
                let ra = retry_after
                    .map(|v| format!("Retry-After: {v}\r\n"))
                    .unwrap_or_default();
                let resp = format!(
                    "HTTP/1.1 {code} Fault\r\n{ra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                    b.len()
                );
                sock.write_all(resp.as_bytes())?;
                return sock.shutdown(Shutdown::Both);
            }
            Some(Fault::Reset) => {
                // SO_LINGER 0 would send an RST; a bare close without an
                // answer is what a crashed upstream looks like to HTTP.
                return sock.shutdown(Shutdown::Both);
            }
            Some(Fault::Delay(d)) => std::thread::sleep(d),
            Some(Fault::HoldAnswer(d)) => hold = Some(d),
        }
    }
    let is_status = String::from_utf8_lossy(&body).contains("\"status\"");
    if is_status {
        let stale = {
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            let stale = st.stale_status.then(|| st.last_status.clone()).flatten();
            if stale.is_some() {
                st.stale_answers += 1;
            }
            stale
        };
        if let Some(resp) = stale {
            sock.write_all(&resp)?;
            return sock.shutdown(Shutdown::Both);
        }
    }
    // Forward with Connection: close, then copy the answer back.
    let mut up = TcpStream::connect(upstream)?;
    let mut new_head: String = head
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    new_head.push_str("Connection: close\r\n\r\n");
    // One write: an upstream that reads the request with a single read
    // (the tests' fake) must not see the head without the body, answer,
    // and close on the unread body (a reset that loses its answer).
    let mut request = new_head.into_bytes();
    request.extend_from_slice(&body);
    up.write_all(&request)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    if let Some(d) = hold {
        std::thread::sleep(d);
    }
    if is_status {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        if !st.stale_status {
            st.last_status = Some(resp.clone());
        }
    }
    sock.write_all(&resp)?;
    sock.shutdown(Shutdown::Both)
}

//! A fault-injection HTTP proxy on loopback, between a relay and the hub:
//! answers the first N `broadcast_tx_commit` requests with 429 and a body
//! `RetryInfo.retryDelay`, forwards everything else, and logs when each
//! broadcast arrived. Stopped (and its port freed) on drop.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does and saw.
#[derive(Debug, Default)]
pub struct ProxyState {
    /// Broadcasts still to answer with 429.
    pub fail_429: u32,
    /// The body's `retryDelay`, seconds.
    pub retry_delay_secs: u32,
    /// When each broadcast arrived, and the status it got (0: forwarded).
    pub broadcasts: Vec<(Instant, u16)>,
}

/// A running proxy.
#[derive(Debug)]
pub struct FaultProxy {
    /// Its address.
    pub addr: SocketAddr,
    /// Shared state.
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
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn read_request(sock: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
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
    if String::from_utf8_lossy(&body).contains("broadcast_tx_commit") {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        if st.fail_429 > 0 {
            st.fail_429 -= 1;
            st.broadcasts.push((Instant::now(), 429));
            let b = format!(
                r#"{{"error":{{"code":429,"details":[{{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"{}s"}}]}}}}"#,
                st.retry_delay_secs
            );
            let resp = format!(
                "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            );
            sock.write_all(resp.as_bytes())?;
            return sock.shutdown(Shutdown::Both);
        }
        st.broadcasts.push((Instant::now(), 0));
    }
    // Forward with Connection: close, then copy the answer back.
    let mut up = TcpStream::connect(upstream)?;
    let mut new_head: String = head
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    new_head.push_str("Connection: close\r\n\r\n");
    up.write_all(new_head.as_bytes())?;
    up.write_all(&body)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    sock.write_all(&resp)?;
    sock.shutdown(Shutdown::Both)
}

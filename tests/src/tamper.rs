//! A test-only tampering HTTP proxy in front of a CometBFT node's RPC: it
//! forwards every JSON-RPC call and edits chosen answers the way a lying
//! node would, so that tests can check a client refuses them. Stopped (and
//! its port freed) on drop.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tendermint_proto::serializers::bytes::base64string;

use crate::proxy::read_request;

/// What the proxy changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tamper {
    /// The `value` of every `abci_query` answer that has a binary one (a
    /// raw state value of `/key`; JSON objects, which a flipped byte would
    /// only make unreadable, pass): the last byte gets its low bit flipped
    /// (a balance, an amount or a route count off by one).
    AbciValue,
    /// The `app_hash` of every `/commit` header above this height: its
    /// first hex digit changed.
    CommitAppHashAbove(u64),
}

/// A running tampering proxy.
#[derive(Debug)]
pub struct TamperProxy {
    /// Its address.
    pub addr: SocketAddr,
    edited: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl TamperProxy {
    /// Starts a proxy to `upstream` (host:port) that applies `tamper`.
    pub fn start(upstream: &str, tamper: Tamper) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let edited = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ed, sp, up) = (edited.clone(), stop.clone(), upstream.to_string());
        std::thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((sock, _)) => {
                        let (ed, up) = (ed.clone(), up.clone());
                        std::thread::spawn(move || {
                            let _ = handle(sock, &up, tamper, &ed);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(Self { addr, edited, stop })
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many answers it changed so far.
    pub fn edited(&self) -> u64 {
        self.edited.load(Ordering::SeqCst)
    }
}

impl Drop for TamperProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The body of an HTTP response with `Transfer-Encoding: chunked`.
pub fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n")?;
        let size_field = std::str::from_utf8(&b[..line_end]).ok()?;
        let size_hex = size_field.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

/// Splits a whole HTTP response into its head and its (de-chunked) body.
fn split_response(resp: &[u8]) -> Option<(String, Vec<u8>)> {
    let head_end = resp.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&resp[..head_end]).to_string();
    let raw = &resp[head_end..];
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.contains("chunked"));
    let body = if chunked { dechunk(raw)? } else { raw.to_vec() };
    Some((head, body))
}

/// Applies `tamper` to the JSON-RPC answer `v` of a call of `method`;
/// whether it changed anything.
pub fn apply(tamper: Tamper, method: &str, v: &mut Value) -> bool {
    match tamper {
        Tamper::AbciValue if method == "abci_query" => {
            let slot = &mut v["result"]["response"]["value"];
            let Some(s) = slot.as_str().filter(|s| !s.is_empty()) else {
                return false;
            };
            let Ok(mut bytes) = base64string::deserialize::<_, Vec<u8>>(Value::String(s.into()))
            else {
                return false;
            };
            if bytes.first() == Some(&b'{') {
                return false;
            }
            if let Some(last) = bytes.last_mut() {
                *last ^= 1;
            }
            match base64string::serialize(&bytes, serde_json::value::Serializer) {
                Ok(new) => {
                    *slot = new;
                    true
                }
                Err(_) => false,
            }
        }
        Tamper::CommitAppHashAbove(min) if method == "commit" => {
            let header = &mut v["result"]["signed_header"]["header"];
            let height = header["height"]
                .as_str()
                .and_then(|h| h.parse::<u64>().ok())
                .unwrap_or(0);
            let Some(hash) = header["app_hash"].as_str().map(str::to_string) else {
                return false;
            };
            if height <= min || hash.is_empty() {
                return false;
            }
            let first = if hash.starts_with('0') { "1" } else { "0" };
            header["app_hash"] = Value::String(format!("{first}{}", &hash[1..]));
            true
        }
        _ => false,
    }
}

fn handle(
    mut sock: TcpStream,
    upstream: &str,
    tamper: Tamper,
    edited: &AtomicU64,
) -> std::io::Result<()> {
    let (head, body) = read_request(&mut sock)?;
    let method = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["method"].as_str().map(str::to_string))
        .unwrap_or_default();
    let mut up = TcpStream::connect(upstream)?;
    let mut request: String = head
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    request.push_str("Connection: close\r\n\r\n");
    let mut request = request.into_bytes();
    request.extend_from_slice(&body);
    up.write_all(&request)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    let edit = split_response(&resp).and_then(|(head, body)| {
        let mut v = serde_json::from_slice::<Value>(&body).ok()?;
        apply(tamper, &method, &mut v).then(|| (head, v.to_string()))
    });
    let out = match edit {
        Some((head, body)) => {
            edited.fetch_add(1, Ordering::SeqCst);
            let status = head.lines().next().unwrap_or("HTTP/1.1 200 OK");
            let mut out = format!(
                "{status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            out.extend_from_slice(body.as_bytes());
            out
        }
        None => resp,
    };
    sock.write_all(&out)?;
    sock.shutdown(Shutdown::Both)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk(b"4\r\nWiki\r\n6;x=1\r\npedia \r\n0\r\n\r\n").as_deref(),
            Some(&b"Wikipedia "[..])
        );
        assert_eq!(dechunk(b"4\r\nWi"), None);
    }

    #[test]
    fn values_and_app_hashes_are_changed() {
        // 1000 big-endian is 00..03 E8 ("AAAAAAAAA+g="); flipped: 03 E9.
        let mut v = json!({"result": {"response": {"value": "AAAAAAAAA+g=", "code": 0}}});
        assert!(apply(Tamper::AbciValue, "abci_query", &mut v));
        assert_eq!(v["result"]["response"]["value"], "AAAAAAAAA+k=");
        let mut empty = json!({"result": {"response": {"value": null}}});
        assert!(!apply(Tamper::AbciValue, "abci_query", &mut empty));
        // `{"a":1}` passes.
        let mut object = json!({"result": {"response": {"value": "eyJhIjoxfQ=="}}});
        assert!(!apply(Tamper::AbciValue, "abci_query", &mut object));
        assert!(!apply(Tamper::AbciValue, "commit", &mut v));

        let commit = |h: &str| json!({"result": {"signed_header": {"header": {"height": h, "app_hash": "0A1B"}}}});
        let mut low = commit("5");
        assert!(!apply(Tamper::CommitAppHashAbove(5), "commit", &mut low));
        let mut high = commit("6");
        assert!(apply(Tamper::CommitAppHashAbove(5), "commit", &mut high));
        assert_eq!(
            high["result"]["signed_header"]["header"]["app_hash"],
            "1A1B"
        );
    }
}

//! Network faults between processes on loopback, in userspace (no root, no
//! network namespaces): TCP forwarders that can be cut and healed.
//!
//! - [`P2pMesh`] sits on every CometBFT P2P link of a localnet. Validator
//!   `i` reaches validator `j` at `base + n*i + j` (`n` validators), a port
//!   that forwards to `j`'s real P2P port; `localnet/up.sh` writes those
//!   ports into `persistent_peers` when `TALLY_P2P_PROXY_BASE` is set and
//!   turns `pex` off, so no node learns a real P2P port and routes around
//!   the proxy. CometBFT authenticates peers by node ID in its secret
//!   handshake, not by address, so a forwarded link is an ordinary one. Every
//!   connection between `i` and `j` goes through `(i, j)` or `(j, i)`:
//!   [`P2pMesh::partition`] closes those between the sides and refuses new
//!   ones until [`P2pMesh::heal`].
//! - [`Link`] is one such forwarder on its own, for anything else (a
//!   relay's hub endpoint): [`Link::cut`] and [`Link::heal`].
//!
//! A refused connection is accepted and closed at once, so the dialer sees
//! the peer vanish rather than wait for a timeout.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

/// What every forwarder of one set shares: which pairs are cut, the open
/// connections (with their pair), how many were refused.
#[derive(Debug, Default)]
struct Shared {
    cut: BTreeSet<(usize, usize)>,
    open: Vec<((usize, usize), TcpStream, TcpStream)>,
    refused: u64,
    stop: bool,
}

fn pair(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

type State = Arc<Mutex<Shared>>;

fn lock(s: &State) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Closes every open connection of a cut pair.
fn drop_cut(s: &mut Shared) {
    let cut = s.cut.clone();
    s.open.retain(|(p, a, b)| {
        if cut.contains(p) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
            false
        } else {
            true
        }
    });
}

/// Copies `from` to `to` until either side closes, then closes both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// One listening forwarder for pair `key` to `upstream`.
fn serve(listener: TcpListener, upstream: String, key: (usize, usize), state: State) {
    for inbound in listener.incoming() {
        let Ok(inbound) = inbound else { continue };
        {
            let mut s = lock(&state);
            if s.stop {
                return;
            }
            if s.cut.contains(&key) {
                s.refused += 1;
                let _ = inbound.shutdown(Shutdown::Both);
                continue;
            }
        }
        let Ok(outbound) = TcpStream::connect(&upstream) else {
            let _ = inbound.shutdown(Shutdown::Both);
            continue;
        };
        let _ = inbound.set_nodelay(true);
        let _ = outbound.set_nodelay(true);
        let clones = (inbound.try_clone(), outbound.try_clone());
        let (Ok(in2), Ok(out2)) = clones else {
            continue;
        };
        {
            let mut s = lock(&state);
            // A cut between the accept and here: do not keep it.
            if s.cut.contains(&key) {
                let _ = inbound.shutdown(Shutdown::Both);
                let _ = outbound.shutdown(Shutdown::Both);
                continue;
            }
            if let (Ok(a), Ok(b)) = (inbound.try_clone(), outbound.try_clone()) {
                s.open.retain(|(_, a, _)| a.peer_addr().is_ok());
                s.open.push((key, a, b));
            }
        }
        std::thread::spawn(move || pump(inbound, out2));
        std::thread::spawn(move || pump(outbound, in2));
    }
}

/// A set of forwarders that stop (and close their connections) on drop.
#[derive(Debug)]
struct Forwarders {
    state: State,
    ports: Vec<u16>,
    threads: Vec<JoinHandle<()>>,
}

impl Forwarders {
    fn new() -> Self {
        Self {
            state: State::default(),
            ports: Vec::new(),
            threads: Vec::new(),
        }
    }

    fn add(&mut self, listen_port: u16, upstream: String, key: (usize, usize)) -> Result<u16> {
        let l = TcpListener::bind(("127.0.0.1", listen_port))
            .with_context(|| format!("binding the forwarder on port {listen_port}"))?;
        let port = l.local_addr()?.port();
        let state = self.state.clone();
        self.threads
            .push(std::thread::spawn(move || serve(l, upstream, key, state)));
        self.ports.push(port);
        Ok(port)
    }

    fn set_cut(&self, pairs: impl IntoIterator<Item = (usize, usize)>, cut: bool) {
        let mut s = lock(&self.state);
        for p in pairs {
            if cut {
                s.cut.insert(p);
            } else {
                s.cut.remove(&p);
            }
        }
        drop_cut(&mut s);
    }
}

impl Drop for Forwarders {
    fn drop(&mut self) {
        {
            let mut s = lock(&self.state);
            s.stop = true;
            for (_, a, b) in s.open.drain(..) {
                let _ = a.shutdown(Shutdown::Both);
                let _ = b.shutdown(Shutdown::Both);
            }
        }
        // Wake each accept loop so that it sees `stop`.
        for p in &self.ports {
            let _ = TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], *p)),
                Duration::from_millis(200),
            );
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The proxies on every P2P link of an `n`-validator localnet.
#[derive(Debug)]
pub struct P2pMesh {
    n: usize,
    base: u16,
    fw: Forwarders,
}

impl P2pMesh {
    /// The environment `localnet/up.sh` reads to peer through a mesh at
    /// `base`.
    pub const ENV: &'static str = "TALLY_P2P_PROXY_BASE";

    /// Listens on `base + n*i + j` for every `i != j`, forwarding to
    /// `127.0.0.1:p2p_port(j)`.
    pub fn start(n: usize, base: u16, p2p_port: impl Fn(usize) -> u16) -> Result<Self> {
        let mut fw = Forwarders::new();
        for i in 0..n {
            for j in (0..n).filter(|j| *j != i) {
                let port = base + (n * i + j) as u16;
                fw.add(port, format!("127.0.0.1:{}", p2p_port(j)), pair(i, j))?;
            }
        }
        Ok(Self { n, base, fw })
    }

    /// The first port (what `TALLY_P2P_PROXY_BASE` must say).
    pub fn base(&self) -> u16 {
        self.base
    }

    /// Cuts every link between a validator of `a` and one of `b` (closing
    /// open connections, refusing new ones), adding to any cut already made.
    pub fn partition(&self, a: &[usize], b: &[usize]) {
        let pairs: Vec<_> = a
            .iter()
            .flat_map(|x| b.iter().map(move |y| pair(*x, *y)))
            .filter(|(x, y)| x != y)
            .collect();
        self.fw.set_cut(pairs, true);
    }

    /// Isolates validator `i` from every other.
    pub fn isolate(&self, i: usize) {
        let others: Vec<usize> = (0..self.n).filter(|j| *j != i).collect();
        self.partition(&[i], &others);
    }

    /// Restores every link.
    pub fn heal(&self) {
        let all: Vec<_> = lock(&self.fw.state).cut.iter().copied().collect();
        self.fw.set_cut(all, false);
    }

    /// Open connections per pair `(low, high)` now.
    pub fn open_links(&self) -> BTreeSet<(usize, usize)> {
        let s = lock(&self.fw.state);
        s.open
            .iter()
            .filter(|(_, a, _)| a.peer_addr().is_ok())
            .map(|(p, _, _)| *p)
            .collect()
    }

    /// Connections refused because their pair was cut, so far.
    pub fn refused(&self) -> u64 {
        lock(&self.fw.state).refused
    }
}

/// One cuttable TCP forwarder on an ephemeral loopback port.
#[derive(Debug)]
pub struct Link {
    port: u16,
    fw: Forwarders,
}

impl Link {
    /// Forwards a fresh loopback port to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Result<Self> {
        let mut fw = Forwarders::new();
        let port = fw.add(0, upstream.to_string(), (0, 0))?;
        Ok(Self { port, fw })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Closes open connections and refuses new ones.
    pub fn cut(&self) {
        self.fw.set_cut([(0, 0)], true);
    }

    /// Accepts again.
    pub fn heal(&self) {
        self.fw.set_cut([(0, 0)], false);
    }

    /// Connections refused while cut, so far.
    pub fn refused(&self) -> u64 {
        lock(&self.fw.state).refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> (u16, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            for s in l.incoming().take(4) {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut b = [0u8; 64];
                    while let Ok(n) = s.read(&mut b) {
                        if n == 0 || s.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (port, t)
    }

    fn round_trip(port: u16) -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"ping")?;
        let mut b = [0u8; 4];
        s.read_exact(&mut b)?;
        Ok(b.to_vec())
    }

    #[test]
    fn link_forwards_cuts_and_heals() {
        let (port, _t) = echo_server();
        let link = Link::start(&format!("127.0.0.1:{port}")).unwrap();
        let mut open = TcpStream::connect(("127.0.0.1", link.port)).unwrap();
        open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        open.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        open.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        link.cut();
        // The open connection is closed, a new one refused.
        let _ = open.write_all(b"ping");
        assert!(matches!(open.read(&mut b), Ok(0) | Err(_)));
        assert!(round_trip(link.port).is_err());
        assert_eq!(link.refused(), 1);
        link.heal();
        assert_eq!(round_trip(link.port).unwrap(), b"ping");
    }
}

//! Emulated latency on the P2P links of a benchmark network, in userspace.
//!
//! The QA runs (docs/qa.md) want every validator-to-validator packet to
//! take about as long as between data centres. `tc netem` would do that in
//! the kernel, but this machine's kernel has no `sch_netem` (`tc qdisc add
//! ... netem` answers "Specified qdisc kind is unknown"), so the links run
//! through forwarders instead, as `tests/src/partition.rs` does for cuts:
//! validator `i` reaches validator `j` at `listen_host:base + n*i + j`,
//! which forwards to `j`'s real P2P address; CometBFT authenticates peers by
//! node ID, not address, and `pex` is off so no node learns a real address.
//!
//! Each direction of each connection has a reader and a writer: the reader
//! stamps every chunk it reads with a release time, `now + delay + jitter`
//! (jitter normal with the given deviation, cut at ±3 deviations), never
//! before the previous chunk's (a TCP stream cannot reorder), and the writer
//! sends it at that time. So one way between two validators costs `delay`
//! ± `jitter` plus loopback time, and a round trip twice that, whatever the
//! load; bandwidth is not limited. RPC traffic from the load generator is
//! not delayed (clients sit next to their node).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::Rng;

/// One-way latency of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// Mean delay.
    pub delay: Duration,
    /// Standard deviation of the delay.
    pub jitter: Duration,
}

impl Latency {
    /// A delay drawn for one chunk: `delay + N(0, jitter)`, cut at ±3
    /// deviations and at 0.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        // Box-Muller: one standard normal from two uniforms.
        let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
        let z =
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()).clamp(-3.0, 3.0);
        let s = self.delay.as_secs_f64() + z * self.jitter.as_secs_f64();
        Duration::from_secs_f64(s.max(0.0))
    }
}

/// Forwards `from` to `to`, each chunk released `lat` after it was read and
/// never before the one before it; closes both when either side does.
fn pump(mut from: TcpStream, to: TcpStream, lat: Latency, stop: Arc<AtomicBool>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut writer_to = match to.try_clone() {
        Ok(t) => t,
        Err(_) => return,
    };
    let writer = std::thread::spawn(move || {
        for (at, chunk) in rx {
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if writer_to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = writer_to.shutdown(Shutdown::Write);
    });
    let mut rng = rand::thread_rng();
    let mut last = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let at = (Instant::now() + lat.sample(&mut rng)).max(last);
                last = at;
                if tx.send((at, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// The delaying forwarders on every P2P link of an `n`-validator network;
/// dropping it closes every listener and connection.
#[derive(Debug)]
pub struct DelayMesh {
    addrs: Vec<(String, u16)>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    threads: Vec<JoinHandle<()>>,
}

impl DelayMesh {
    /// Listens on `listen_host:base + n*i + j` for every `i != j`,
    /// forwarding to `upstream(j)` with `lat` each way.
    pub fn start(
        n: usize,
        listen_host: &str,
        base: u16,
        upstream: impl Fn(usize) -> String,
        lat: Latency,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        // Bind every listener before starting any thread, so that a port
        // in use fails the start with nothing left running.
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..n {
            for j in (0..n).filter(|j| *j != i) {
                let port = Self::port_of(base, n, i, j);
                let l = TcpListener::bind((listen_host, port))
                    .with_context(|| format!("binding the delay forwarder {listen_host}:{port}"))?;
                addrs.push((listen_host.to_string(), port));
                listeners.push((j, l));
            }
        }
        let mut threads = Vec::new();
        for (j, l) in listeners {
            let (up, stop, open) = (upstream(j), stop.clone(), open.clone());
            threads.push(std::thread::spawn(move || {
                for inbound in l.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(inbound) = inbound else { continue };
                    let Ok(outbound) = TcpStream::connect(&up) else {
                        let _ = inbound.shutdown(Shutdown::Both);
                        continue;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (Ok(i2), Ok(o2), Ok(i3), Ok(o3)) = (
                        inbound.try_clone(),
                        outbound.try_clone(),
                        inbound.try_clone(),
                        outbound.try_clone(),
                    ) else {
                        continue;
                    };
                    if let Ok(mut o) = open.lock() {
                        o.retain(|s| s.peer_addr().is_ok());
                        o.push(i3);
                        o.push(o3);
                    }
                    let s1 = stop.clone();
                    std::thread::spawn(move || pump(inbound, o2, lat, s1));
                    let s2 = stop.clone();
                    std::thread::spawn(move || pump(outbound, i2, lat, s2));
                }
            }));
        }
        Ok(Self {
            addrs,
            stop,
            open,
            threads,
        })
    }

    /// The port validator `i` dials to reach validator `j`.
    pub fn port_of(base: u16, n: usize, i: usize, j: usize) -> u16 {
        base + (n * i + j) as u16
    }
}

impl Drop for DelayMesh {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Ok(mut o) = self.open.lock() {
            for s in o.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        // Wake each accept loop so that it sees `stop`.
        for (h, p) in &self.addrs {
            let _ = TcpStream::connect_timeout(
                &format!("{h}:{p}")
                    .parse()
                    .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], *p))),
                Duration::from_millis(200),
            );
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn samples_centre_on_the_delay_within_three_deviations() {
        let lat = Latency {
            delay: Duration::from_millis(50),
            jitter: Duration::from_millis(10),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let v: Vec<f64> = (0..20_000)
            .map(|_| lat.sample(&mut rng).as_secs_f64() * 1000.0)
            .collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        assert!((mean - 50.0).abs() < 0.5, "mean {mean}");
        assert!((sd - 10.0).abs() < 0.5, "deviation {sd}");
        assert!(v.iter().all(|x| (20.0..=80.0).contains(x)));
    }

    /// A round trip through the mesh (1 -> 0 and back) takes at least
    /// twice the shortest delay, and bytes arrive whole and in order.
    #[test]
    fn a_round_trip_costs_twice_the_delay_and_keeps_order() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_port = echo.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in echo.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let mut w = s;
                    let _ = std::io::copy(&mut r, &mut w);
                });
            }
        });
        let lat = Latency {
            delay: Duration::from_millis(40),
            jitter: Duration::from_millis(5),
        };
        // Ports below the kernel's ephemeral range (32768..) so that no
        // other test's client socket can take them between the pick and
        // the bind; a port some other test listens on moves to the next.
        let mut rng = rand::thread_rng();
        let (mesh, base) = (0..50)
            .find_map(|_| {
                let base = rng.gen_range(22_000u16..32_000);
                DelayMesh::start(
                    2,
                    "127.0.0.1",
                    base,
                    |_| format!("127.0.0.1:{echo_port}"),
                    lat,
                )
                .ok()
                .map(|m| (m, base))
            })
            .expect("no free pair of ports in 50 tries");
        let mut s = TcpStream::connect(("127.0.0.1", DelayMesh::port_of(base, 2, 1, 0))).unwrap();
        let msg: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let t = Instant::now();
        s.write_all(&msg).unwrap();
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back).unwrap();
        let rtt = t.elapsed();
        assert_eq!(back, msg);
        // Each way at least 40 - 3 x 5 ms (the cut of the jitter).
        assert!(rtt >= Duration::from_millis(50), "{rtt:?}");
        drop(mesh);
    }
}

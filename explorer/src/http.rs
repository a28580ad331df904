//! The one small HTTP server of the node's pages: [`serve`] answers every
//! request with a handler's [`Answer`] on a few threads over `tiny_http`,
//! until the [`Server`] it returns is dropped. The explorer's page and the
//! node's `/metrics` page (`tally_node::metrics`) are both served by it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One HTTP answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Headers, in order (`Content-Type` among them when there is one).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Turns a request's method and target (path and query) into an answer.
pub type Handler = dyn Fn(&str, &str) -> Answer + Send + Sync;

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[error("{what} {addr}: {msg}")]
pub struct ServeError {
    what: &'static str,
    addr: String,
    msg: String,
}

/// A running server; dropping it stops serving and closes the port.
pub struct Server {
    server: Arc<tiny_http::Server>,
    stopping: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.local_addr())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// The address it listens on (useful when asked for port 0).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.server_addr().to_ip()
    }

    /// Blocks until the server stops (it does not stop on its own).
    pub fn wait(mut self) {
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        for _ in &self.threads {
            self.server.unblock();
        }
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
    }
}

/// Serves `handler` at `addr` on `workers` threads named `<name>-<i>`
/// (`<name>` alone for one); `what` names the server in errors and logs
/// (e.g. `"explorer on"`, `"metrics endpoint"`).
pub fn serve(
    what: &'static str,
    name: &str,
    addr: &str,
    workers: usize,
    handler: Arc<Handler>,
) -> Result<Server, ServeError> {
    let err = |msg: String| ServeError {
        what,
        addr: addr.into(),
        msg,
    };
    let server = Arc::new(tiny_http::Server::http(addr).map_err(|e| err(e.to_string()))?);
    let stopping = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::with_capacity(workers);
    for i in 0..workers {
        let (s, stop, h) = (server.clone(), stopping.clone(), handler.clone());
        let thread_name = if workers == 1 {
            name.to_string()
        } else {
            format!("{name}-{i}")
        };
        let t = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || answer_requests(what, &s, &stop, h.as_ref()))
            .map_err(|e| err(e.to_string()))?;
        threads.push(t);
    }
    Ok(Server {
        server,
        stopping,
        threads,
    })
}

fn answer_requests(
    what: &'static str,
    server: &tiny_http::Server,
    stopping: &AtomicBool,
    handler: &Handler,
) {
    loop {
        let rq = match server.recv() {
            Ok(rq) => rq,
            Err(_) if stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                tracing::debug!(error = %e, "{what}: accept failed");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        let method = rq.method().as_str().to_string();
        let target = rq.url().to_string();
        let answer = handler(&method, &target);
        tracing::debug!(%method, target = %target.chars().take(200).collect::<String>(), status = answer.status, "{what}: request");
        let mut resp = tiny_http::Response::from_data(answer.body).with_status_code(answer.status);
        for (k, v) in &answer.headers {
            if let Ok(h) = tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()) {
                resp.add_header(h);
            }
        }
        if let Err(e) = rq.respond(resp) {
            tracing::debug!(error = %e, "{what}: answer not sent");
        }
    }
}

//! The two networks of the benchmark: 4 validators on loopback made by
//! `cometbft testnet`, configured by the localnet's own
//! `configure_cometbft` (localnet/lib.sh) plus the benchmark's mempool and
//! p2p settings, identical for both; one runs `tallyd` as the app, the
//! other CometBFT's built-in kvstore. Dropping a [`Net`] stops every
//! process; a watchdog stops them if the benchmark dies without dropping it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ed25519_dalek::SigningKey;

use super::delay::{DelayMesh, Latency};
use crate::localnet::repo_root;

/// Which application the validators run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum App {
    /// `tallyd` over ABCI.
    Tally,
    /// `cometbft node --proxy_app=kvstore`.
    Kvstore,
}

impl App {
    /// Its name in options and output.
    pub fn name(self) -> &'static str {
        match self {
            App::Tally => "tally",
            App::Kvstore => "kvstore",
        }
    }
}

/// Validators per network unless `--validators` says otherwise.
pub const VALIDATORS: usize = 4;

/// How the validators are laid out: how many, whether each has its own
/// network namespace, and the latency on their P2P links.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Layout {
    /// Validators.
    pub validators: usize,
    /// Each validator in its own network namespace (`scripts/qa-netns.sh`,
    /// root): validator `i` at `10.77.0.<i+1>`, the host at `10.77.0.254`.
    pub netns: bool,
    /// Emulated one-way latency on every P2P link ([`DelayMesh`]).
    pub latency: Option<Latency>,
    /// The app version Tally's genesis starts at (the localnet's default:
    /// the newest this build carries).
    pub app_version: u64,
}

/// The host side of the namespaces' bridge.
const BRIDGE_HOST: &str = "10.77.0.254";
/// The delay forwarders' ports start this far above the network's base.
const MESH_OFFSET: u16 = 500;
/// Chain id of both networks.
pub const CHAIN_ID: &str = "tally-netbench";
/// The consensus interval, as the localnet's.
pub const TIMEOUT_COMMIT: &str = "1s";

/// `config.toml` values the benchmark sets on both networks, on top of
/// `configure_cometbft`: (section, key, value as TOML).
pub const COMET_SETTINGS: &[(&str, &str, &str)] = &[
    ("mempool", "size", "5000"),
    ("mempool", "max_txs_bytes", "1073741824"),
    ("mempool", "max_tx_bytes", "1048576"),
    ("mempool", "cache_size", "10000"),
    ("mempool", "recheck", "true"),
    ("p2p", "send_rate", "20480000"),
    ("p2p", "recv_rate", "20480000"),
    ("rpc", "max_open_connections", "900"),
    ("rpc", "max_body_bytes", "4000000"),
    ("", "log_level", "\"info\""),
];

/// What a process of the network is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A `tallyd`.
    App,
    /// A `cometbft node`.
    Comet,
}

/// One running process.
#[derive(Debug)]
pub struct Proc {
    /// Its kind.
    pub kind: Kind,
    /// Its validator.
    pub node: usize,
    child: Child,
}

impl Proc {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// A running network.
#[derive(Debug)]
pub struct Net {
    /// The application.
    pub app: App,
    dir: tempfile::TempDir,
    base: u16,
    /// Every process, CometBFT's first.
    pub procs: Vec<Proc>,
    watchdog: Option<Child>,
    /// When the processes were started.
    pub started: Instant,
    /// The layout.
    pub layout: Layout,
    /// The delay forwarders (with `layout.latency`).
    mesh: Option<DelayMesh>,
}

const WATCHDOG: &str = r#"trap '' INT TERM HUP
while kill -0 "$1" 2>/dev/null; do sleep 1; done
shift; dir="$1"; shift
kill "$@" 2>/dev/null; sleep 2; kill -9 "$@" 2>/dev/null
case "$dir" in */tally-netbench-*) rm -rf -- "$dir" ;; esac
[ -n "${NETNS_SCRIPT:-}" ] && bash "$NETNS_SCRIPT" down
"#;

/// Replaces `key = ...` in `[section]` (`""`: before the first section)
/// of a TOML text; an error if the key is not there.
pub fn set_toml(text: &str, section: &str, key: &str, value: &str) -> Result<String> {
    let mut cur = String::new();
    let mut found = false;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') && t.ends_with(']') {
            cur = t.trim_matches(|c| c == '[' || c == ']').to_string();
        }
        let is_key = t
            .split_once('=')
            .is_some_and(|(k, _)| k.trim() == key && !t.starts_with('#'));
        if cur == section && is_key && !found {
            out.push_str(&format!("{key} = {value}"));
            found = true;
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if !found {
        bail!("no {key} in [{section}]");
    }
    Ok(out)
}

/// The value of `key` in `[section]` of a TOML text, as written.
pub fn get_toml(text: &str, section: &str, key: &str) -> Option<String> {
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') && t.ends_with(']') {
            cur = t.trim_matches(|c| c == '[' || c == ']').to_string();
        } else if cur == section && !t.starts_with('#') {
            if let Some((k, v)) = t.split_once('=') {
                if k.trim() == key {
                    return Some(v.trim().to_string());
                }
            }
        }
    }
    None
}

/// `tallyd`: `$TALLYD`, else beside the running benchmark binary, else
/// where the tests find it.
fn tallyd_path() -> Result<PathBuf> {
    if std::env::var_os("TALLYD").is_none() {
        if let Some(p) = std::env::current_exe()?.parent().map(|d| d.join("tallyd")) {
            if p.exists() {
                return Ok(p);
            }
        }
    }
    crate::localnet::tallyd_path()
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Net {
    /// Port of validator `i` at `off` (0 p2p, 1 RPC, 2 ABCI, 3 pprof,
    /// 4 CometBFT metrics, 5 tallyd metrics), as the localnet numbers them.
    pub fn port(&self, i: usize, off: usize) -> u16 {
        self.base + (10 * i + off) as u16
    }

    /// Validators.
    pub fn validators(&self) -> usize {
        self.layout.validators
    }

    /// The address validator `i` listens on: its namespace's, or loopback.
    pub fn host(&self, i: usize) -> String {
        if self.layout.netns {
            format!("10.77.0.{}", i + 1)
        } else {
            "127.0.0.1".into()
        }
    }

    /// RPC URLs of the validators.
    pub fn rpc_urls(&self) -> Vec<String> {
        (0..self.validators())
            .map(|i| format!("http://{}:{}", self.host(i), self.port(i, 1)))
            .collect()
    }

    /// CometBFT's metrics page of validator `i`.
    pub fn metrics_url(&self, i: usize) -> String {
        format!("http://{}:{}/metrics", self.host(i), self.port(i, 4))
    }

    /// The network namespace script.
    fn netns_script() -> PathBuf {
        repo_root().join("scripts").join("qa-netns.sh")
    }

    /// Home directory of validator `i`.
    pub fn home(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node{i}"))
    }

    /// Creates and starts a network of `app` with ports from `base` in a
    /// fresh directory under `parent`; `gateway` and `users` go into Tally's
    /// genesis (registered gateway; funded users who allow it).
    pub fn start(
        app: App,
        base: u16,
        parent: &Path,
        gateway: &SigningKey,
        users: &[String],
        layout: Layout,
    ) -> Result<Self> {
        if !(1..=50).contains(&layout.validators) {
            bail!("--validators must be 1..=50, got {}", layout.validators);
        }
        if !layout.netns {
            for i in 0..layout.validators {
                for off in 0..6 {
                    let p = base + (10 * i + off) as u16;
                    if std::net::TcpListener::bind(("127.0.0.1", p)).is_err() {
                        bail!("port {p} is in use (another benchmark running?)");
                    }
                }
            }
        }
        fs::create_dir_all(parent)?;
        let dir = tempfile::Builder::new()
            .prefix("tally-netbench-")
            .tempdir_in(parent)?;
        let mut net = Net {
            app,
            dir,
            base,
            procs: Vec::new(),
            watchdog: None,
            started: Instant::now(),
            layout,
            mesh: None,
        };
        if layout.netns {
            run(Command::new("bash").arg(Self::netns_script()).args([
                "up",
                &layout.validators.to_string(),
                "0",
                "0",
            ]))
            .context("creating the network namespaces (needs root)")?;
        }
        if let Some(lat) = layout.latency {
            let (n, listen) = (layout.validators, net.mesh_host());
            let upstream = |j: usize| format!("{}:{}", net.host(j), net.port(j, 0));
            net.mesh = Some(DelayMesh::start(
                n,
                &listen,
                base + MESH_OFFSET,
                upstream,
                lat,
            )?);
        }
        net.create(gateway, users)?;
        net.launch()?;
        net.started = Instant::now();
        Ok(net)
    }

    /// Where the delay forwarders listen: the bridge's host side, or
    /// loopback.
    fn mesh_host(&self) -> String {
        if self.layout.netns {
            BRIDGE_HOST.into()
        } else {
            "127.0.0.1".into()
        }
    }

    /// `persistent_peers` of validator `i`: every other validator, directly
    /// or through its delay forwarder.
    fn peers_of(&self, i: usize, ids: &[String]) -> String {
        let n = self.validators();
        (0..n)
            .filter(|j| *j != i)
            .map(|j| match &self.layout.latency {
                Some(_) => format!(
                    "{}@{}:{}",
                    ids[j],
                    self.mesh_host(),
                    DelayMesh::port_of(self.base + MESH_OFFSET, n, i, j)
                ),
                None => format!("{}@{}:{}", ids[j], self.host(j), self.port(j, 0)),
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    fn create(&self, gateway: &SigningKey, users: &[String]) -> Result<()> {
        let d = self.dir.path();
        let n = self.validators();
        run(Command::new("cometbft")
            .args(["testnet", "--v", &n.to_string(), "--o"])
            .arg(d)
            .arg("--populate-persistent-peers=false"))?;
        let mut ids = Vec::new();
        for i in 0..n {
            let id = run(Command::new("cometbft")
                .args(["show-node-id", "--home"])
                .arg(self.home(i)))?;
            ids.push(id.trim().to_string());
        }
        // One genesis, node0's, for every validator.
        let g0 = self.home(0).join("config").join("genesis.json");
        let mut genesis: serde_json::Value = serde_json::from_str(&fs::read_to_string(&g0)?)?;
        genesis["chain_id"] = CHAIN_ID.into();
        if self.app == App::Tally {
            let state = crate::traffic::app_state(gateway, users, u64::MAX / 16, 60);
            genesis["app_state"] = serde_json::from_str(&state)?;
            genesis["consensus_params"]["version"]["app"] =
                self.layout.app_version.to_string().into();
        }
        fs::write(&g0, serde_json::to_string_pretty(&genesis)?)?;
        if self.app == App::Tally {
            run(Command::new(tallyd_path()?)
                .arg("--home")
                .arg(self.home(0))
                .args(["genesis", "validate"]))?;
        }
        let lib = repo_root().join("localnet").join("lib.sh");
        for i in 0..n {
            let peers = self.peers_of(i, &ids);
            let h = self.home(i);
            let cfg = h.join("config");
            if i > 0 {
                fs::copy(&g0, cfg.join("genesis.json"))?;
            }
            // The localnet's settings: ports, loopback peers, timeout_commit.
            run(Command::new("bash")
                .arg("-c")
                .arg(r#"source "$1"; configure_cometbft "$2" "$3" "$4""#)
                .arg("netbench")
                .arg(&lib)
                .arg(cfg.join("config.toml"))
                .arg(self.port(i, 0).to_string())
                .arg(&peers)
                .env("TALLY_TIMEOUT_COMMIT", TIMEOUT_COMMIT))?;
            let path = cfg.join("config.toml");
            let mut text = fs::read_to_string(&path)?;
            for (sec, key, val) in COMET_SETTINGS {
                text = set_toml(&text, sec, key, val)?;
            }
            text = set_toml(&text, "", "moniker", &format!("\"validator{i}\""))?;
            if self.layout.latency.is_some() {
                // Only the forwarders' addresses: no node may learn a real
                // one and route around the delay.
                text = set_toml(&text, "p2p", "pex", "false")?;
            }
            if self.layout.netns {
                // Reachable from the host (load, metrics, forwarders).
                let host = self.host(i);
                for (sec, key, off) in [("p2p", "laddr", 0), ("rpc", "laddr", 1)] {
                    let v = format!("\"tcp://{host}:{}\"", self.port(i, off));
                    text = set_toml(&text, sec, key, &v)?;
                }
                let v = format!("\"{host}:{}\"", self.port(i, 4));
                text = set_toml(&text, "instrumentation", "prometheus_listen_addr", &v)?;
                let v = format!("\"tcp://{host}:{}\"", self.port(i, 2));
                text = set_toml(&text, "", "proxy_app", &v)?;
            }
            if self.app == App::Kvstore {
                text = set_toml(&text, "", "proxy_app", "\"kvstore\"")?;
            }
            fs::write(&path, text)?;
            if self.app == App::Tally {
                run(Command::new(tallyd_path()?)
                    .arg("--home")
                    .arg(&h)
                    .args(["init", "--force", "--abci-listen"])
                    .arg(format!("{}:{}", self.host(i), self.port(i, 2))))?;
                let app = cfg.join("app.toml");
                let mut t = fs::read_to_string(&app)?;
                // No state-sync snapshots: the benchmark measures the report path.
                t = set_toml(&t, "", "snapshot_interval", "0")?;
                t = set_toml(
                    &t,
                    "",
                    "metrics_listen",
                    &format!("\"{}:{}\"", self.host(i), self.port(i, 5)),
                )?;
                fs::write(&app, t)?;
            }
        }
        Ok(())
    }

    fn spawn(&mut self, kind: Kind, i: usize) -> Result<()> {
        let h = self.home(i);
        let (prog, log) = match kind {
            Kind::App => (tallyd_path()?, "tallyd.log"),
            Kind::Comet => (PathBuf::from("cometbft"), "cometbft.log"),
        };
        let log = fs::File::create(h.join(log))?;
        // In its namespace: `ip netns exec` execs the program itself, so
        // the child's pid is the program's.
        let mut cmd = if self.layout.netns {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &format!("tqa{i}")]).arg(prog);
            c
        } else {
            Command::new(prog)
        };
        match kind {
            Kind::App => cmd.arg("start").arg("--home").arg(&h),
            Kind::Comet => cmd.arg("node").arg("--home").arg(&h),
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {kind:?} of validator {i}"))?;
        self.procs.push(Proc {
            kind,
            node: i,
            child,
        });
        Ok(())
    }

    fn launch(&mut self) -> Result<()> {
        let n = self.validators();
        if self.app == App::Tally {
            for i in 0..n {
                self.spawn(Kind::App, i)?;
            }
            // CometBFT dials the app at start: wait for the ABCI ports.
            let start = Instant::now();
            for i in 0..n {
                while std::net::TcpStream::connect((self.host(i).as_str(), self.port(i, 2)))
                    .is_err()
                {
                    if start.elapsed() > Duration::from_secs(30) {
                        bail!(
                            "tallyd of validator {i} does not listen; see {}",
                            self.home(i).join("tallyd.log").display()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        for i in 0..n {
            self.spawn(Kind::Comet, i)?;
        }
        let pids: Vec<String> = self.procs.iter().map(|p| p.pid().to_string()).collect();
        self.watchdog = Some(
            Command::new("bash")
                .arg("-c")
                .arg(WATCHDOG)
                .arg("tally-netbench-watchdog")
                .arg(std::process::id().to_string())
                .arg(self.dir.path())
                .args(&pids)
                .envs(
                    self.layout
                        .netns
                        .then(|| ("NETNS_SCRIPT", Self::netns_script())),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting the watchdog")?,
        );
        Ok(())
    }

    /// The `config.toml` values that matter to throughput, as validator 0
    /// has them, and the genesis block size limits.
    pub fn settings(&self) -> Result<Vec<(String, String)>> {
        let text = fs::read_to_string(self.home(0).join("config").join("config.toml"))?;
        let mut v = Vec::new();
        for (sec, key) in [
            ("consensus", "timeout_propose"),
            ("consensus", "timeout_commit"),
            ("consensus", "create_empty_blocks"),
            ("", "proxy_app"),
        ] {
            let name = if sec.is_empty() {
                key.to_string()
            } else {
                format!("{sec}.{key}")
            };
            v.push((name, get_toml(&text, sec, key).unwrap_or_default()));
        }
        for (sec, key, _) in COMET_SETTINGS {
            let name = if sec.is_empty() {
                key.to_string()
            } else {
                format!("{sec}.{key}")
            };
            v.push((name, get_toml(&text, sec, key).unwrap_or_default()));
        }
        let g: serde_json::Value = serde_json::from_str(&fs::read_to_string(
            self.home(0).join("config").join("genesis.json"),
        )?)?;
        let block = &g["consensus_params"]["block"];
        v.push((
            "genesis block.max_bytes".into(),
            block["max_bytes"].to_string(),
        ));
        v.push(("genesis block.max_gas".into(), block["max_gas"].to_string()));
        Ok(v)
    }

    /// Stops every process (CometBFT first), SIGTERM then SIGKILL.
    pub fn stop(&mut self) {
        for p in &self.procs {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(p.pid().to_string())
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in &mut self.procs {
            while Instant::now() < deadline && matches!(p.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        self.procs.clear();
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        self.mesh = None;
        if self.layout.netns {
            let _ = Command::new("bash")
                .arg(Self::netns_script())
                .arg("down")
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Whether every process still runs; the first that exited otherwise.
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.procs {
            if let Ok(Some(st)) = p.child.try_wait() {
                let log = if p.kind == Kind::App {
                    "tallyd.log"
                } else {
                    "cometbft.log"
                };
                bail!(
                    "{:?} of validator {} exited ({st}); see {}",
                    p.kind,
                    p.node,
                    self.dir
                        .path()
                        .join(format!("node{}", p.node))
                        .join(log)
                        .display()
                );
            }
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_keys_are_set_in_their_section_only() {
        let t = "moniker = \"a\"\n[rpc]\nladdr = \"x\"\n# size = 1\n[mempool]\nsize = 5000\nrecheck = true\n[p2p]\nladdr = \"y\"\n";
        let t2 = set_toml(t, "mempool", "size", "7").unwrap();
        assert_eq!(get_toml(&t2, "mempool", "size").as_deref(), Some("7"));
        assert_eq!(get_toml(&t2, "p2p", "laddr").as_deref(), Some("\"y\""));
        let t3 = set_toml(&t2, "p2p", "laddr", "\"z\"").unwrap();
        assert_eq!(get_toml(&t3, "rpc", "laddr").as_deref(), Some("\"x\""));
        assert_eq!(get_toml(&t3, "p2p", "laddr").as_deref(), Some("\"z\""));
        assert!(set_toml(t, "rpc", "size", "1").is_err());
        assert_eq!(
            get_toml(&set_toml(t, "", "moniker", "\"b\"").unwrap(), "", "moniker").as_deref(),
            Some("\"b\"")
        );
    }
}

//! A real CometBFT localnet on loopback for end-to-end tests, driven by the
//! same `localnet/` scripts operators use. Dropping it stops every process;
//! a watchdog process stops them too when the test process dies without
//! dropping it (killed, or interrupted with Ctrl-C).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ed25519_dalek::SigningKey;
use tally_node::rpc::Rpc;

/// A running localnet in a temporary directory.
#[derive(Debug)]
pub struct Localnet {
    dir: tempfile::TempDir,
    port_base: u16,
    /// Number of validators.
    pub validators: usize,
    tallyd: PathBuf,
    hub_bin: PathBuf,
    window_secs: u64,
    /// [`Options::env`] and [`Options::node_bins`], for every script run.
    env: Vec<(String, String)>,
    watchdog: Option<Child>,
    /// The proxies on every P2P link ([`Options::p2p_mesh`]); dropped after
    /// the nodes stop.
    mesh: Option<crate::partition::P2pMesh>,
}

/// What a localnet runs besides the defaults of [`Localnet::start`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Extra environment for `up.sh` only (e.g. `TALLY_HUB_ENDPOINTS`).
    pub up_env: Vec<(String, String)>,
    /// Extra environment for every script run, so also for the validators
    /// `node.sh` restarts (e.g. what a test-only binary reads).
    pub env: Vec<(String, String)>,
    /// Validators whose app runs another binary than `tallyd`, with
    /// `tallyd`'s command line (`start --home H`): the scripts'
    /// `TALLYD_<i>`.
    pub node_bins: Vec<(usize, PathBuf)>,
    /// Every validator reaches every other through a proxy that can cut
    /// the link ([`crate::partition::P2pMesh`], [`Localnet::mesh`]), on
    /// ports from `port_base + 200`.
    pub p2p_mesh: bool,
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs the `tallyd` CLI with `args` (without `TALLY_NODE`/`TALLY_HOME`
/// from the test's environment); its output, whatever the exit status.
pub fn run_tallyd(args: &[&str]) -> Result<std::process::Output> {
    Command::new(tallyd_path()?)
        .args(args)
        .env_remove("TALLY_NODE")
        .env_remove("TALLY_HOME")
        .output()
        .with_context(|| format!("running tallyd {args:?}"))
}

/// Runs the `tallyd` CLI, which must succeed; its stdout.
pub fn tallyd_ok(args: &[&str]) -> Result<String> {
    let out = run_tallyd(args)?;
    anyhow::ensure!(
        out.status.success(),
        "tallyd {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `tallyd` binary: `$TALLYD`, or in the profile directory of the running
/// executable's target dir.
pub fn tallyd_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TALLYD") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let dir = profile_dir(&exe).context("cannot locate the target directory")?;
    let p = dir.join("tallyd");
    if !p.exists() {
        bail!(
            "{} does not exist: build it first (cargo build --release --workspace --all-targets)",
            p.display()
        );
    }
    Ok(p)
}

/// The cargo profile directory (`<target>/release`) an executable was built
/// into: a test binary lives in `<target>/release/deps/`, a binary such as
/// `tally-bench` (what `scripts/chaos.sh` runs) in `<target>/release/` itself.
fn profile_dir(exe: &Path) -> Option<&Path> {
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent()
    } else {
        Some(dir)
    }
}

/// The `tally-hub` binary: `$TALLY_HUB_BIN` (the variable the localnet
/// scripts read), or beside `tallyd`.
pub fn hub_path() -> Result<PathBuf> {
    beside_tallyd(
        "TALLY_HUB_BIN",
        "tally-hub",
        "cargo build --release --workspace --all-targets",
    )
}

/// The test-only `tallyd-byzantine`: `$TALLY_BYZANTINE_BIN`, or beside
/// `tallyd` (`scripts/test.sh` builds it).
pub fn byzantine_path() -> Result<PathBuf> {
    beside_tallyd(
        "TALLY_BYZANTINE_BIN",
        "tallyd-byzantine",
        "cargo build --release -p tally-node --features byzantine --bin tallyd-byzantine",
    )
}

/// The binary `$var` names, or `name` beside `tallyd`; an error naming
/// `build` (how to make it) if it does not exist.
fn beside_tallyd(var: &str, name: &str, build: &str) -> Result<PathBuf> {
    let p = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => tallyd_path()?.with_file_name(name),
    };
    if !p.exists() {
        bail!(
            "{} does not exist: build it first ({build}) or set {var}",
            p.display()
        );
    }
    Ok(p)
}

/// The first of `preferred`, `preferred + 400`, `preferred + 800`, ...
/// (eight tries) at which every loopback port a localnet of `validators`
/// validators and the hub would use is free, so that two test runs on one
/// machine (two worktrees, say) do not collide.
pub fn free_port_base(preferred: u16, validators: usize) -> Result<u16> {
    let free = |base: u16| {
        let node_ports = (0..validators as u16).flat_map(|i| (0..6).map(move |off| 10 * i + off));
        let hub_ports = (0..6).map(|off| 100 + off);
        node_ports.chain(hub_ports).all(|off| {
            base.checked_add(off)
                .is_some_and(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
    };
    (0..8u16)
        .filter_map(|k| preferred.checked_add(400 * k))
        .find(|b| free(*b))
        .with_context(|| format!("no free block of localnet ports from {preferred}"))
}

/// Runs in the background beside a localnet: once the test process is gone
/// (however it ended), stops the network and removes its directory. It
/// ignores the terminal's Ctrl-C, which the test process's group receives.
/// The users end-to-end tests charge: each gets a key and an allowance for
/// the localnet's gateway in genesis (`localnet/up.sh`, `TALLY_USERS`).
pub const E2E_USERS: &str = "alice bob carol dave erin frank byz-alice byz-bob \
    user-0 user-1 user-2 user-3 user-4 user-5 load-user-0 load-user-1 load-user-2 load-user-3 load-user-4";

const WATCHDOG: &str = r#"trap '' INT TERM HUP
while kill -0 "$1" 2>/dev/null; do sleep 1; done
bash "$2" >/dev/null 2>&1
case "$TALLY_LOCALNET_DIR" in */tally-e2e-*) rm -rf -- "$TALLY_LOCALNET_DIR" ;; esac
"#;

impl Localnet {
    /// Starts `validators` validators with ports from `port_base` and
    /// `timeout_commit`, without demo traffic.
    pub fn start(
        validators: usize,
        port_base: u16,
        timeout_commit: &str,
        window_secs: u64,
    ) -> Result<Self> {
        Self::start_with(validators, port_base, timeout_commit, window_secs, &[])
    }

    /// Like [`Localnet::start`] with extra environment for `up.sh` (e.g.
    /// `TALLY_HUB_ENDPOINTS`).
    pub fn start_with(
        validators: usize,
        port_base: u16,
        timeout_commit: &str,
        window_secs: u64,
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let opts = Options {
            up_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Options::default()
        };
        Self::launch(validators, port_base, timeout_commit, window_secs, &opts)
    }

    /// Like [`Localnet::start`] with [`Options`]. Every user in
    /// [`E2E_USERS`] lets the localnet's gateway charge it (genesis
    /// allowances); `TALLY_USERS` in the options' script environment
    /// replaces the list.
    pub fn launch(
        validators: usize,
        port_base: u16,
        timeout_commit: &str,
        window_secs: u64,
        opts: &Options,
    ) -> Result<Self> {
        let mut env = opts.env.clone();
        for (i, bin) in &opts.node_bins {
            if !bin.exists() {
                bail!("{} (validator {i}'s app) does not exist", bin.display());
            }
            env.push((format!("TALLYD_{i}"), bin.display().to_string()));
        }
        let mut net = Self {
            dir: tempfile::Builder::new().prefix("tally-e2e-").tempdir()?,
            port_base,
            validators,
            tallyd: tallyd_path()?,
            hub_bin: hub_path()?,
            window_secs,
            env,
            watchdog: None,
            mesh: None,
        };
        let mut up_env = opts.up_env.clone();
        if opts.p2p_mesh {
            let mesh = crate::partition::P2pMesh::start(validators, port_base + 200, |j| {
                port_base + 10 * j as u16
            })?;
            up_env.push((
                crate::partition::P2pMesh::ENV.into(),
                mesh.base().to_string(),
            ));
            net.mesh = Some(mesh);
        }
        // From here on, Drop (or the watchdog, if Drop never runs) stops
        // whatever the script started.
        net.watchdog = Some(
            Command::new("bash")
                .arg("-c")
                .arg(WATCHDOG)
                .arg("tally-e2e-watchdog")
                .arg(std::process::id().to_string())
                .arg(repo_root().join("localnet").join("down.sh"))
                .envs(net.script_env())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting the localnet watchdog")?,
        );
        let out = net
            .script("up.sh")
            .args(["--no-build", "--no-demo"])
            .env("TALLY_TIMEOUT_COMMIT", timeout_commit)
            .env("TALLY_USERS", E2E_USERS)
            .envs(up_env)
            .output()
            .context("running localnet/up.sh")?;
        if !out.status.success() {
            bail!(
                "localnet/up.sh failed:\n{}\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                net.logs_tail()
            );
        }
        Ok(net)
    }

    /// The environment the localnet scripts need for this network.
    pub fn script_env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "TALLY_LOCALNET_DIR".into(),
                self.dir.path().display().to_string(),
            ),
            ("TALLY_PORT_BASE".into(), self.port_base.to_string()),
            ("TALLY_VALIDATORS".into(), self.validators.to_string()),
            ("TALLY_WINDOW_SECS".into(), self.window_secs.to_string()),
            ("TALLYD".into(), self.tallyd.display().to_string()),
            ("TALLY_HUB_BIN".into(), self.hub_bin.display().to_string()),
        ];
        env.extend(self.env.iter().cloned());
        env
    }

    /// Runs `localnet/NAME ARGS...` for this network; its output.
    pub fn script_output(&self, name: &str, args: &[&str]) -> Result<std::process::Output> {
        self.script(name)
            .args(args)
            .output()
            .with_context(|| format!("running localnet/{name}"))
    }

    fn script(&self, name: &str) -> Command {
        let mut c = Command::new("bash");
        c.arg(repo_root().join("localnet").join(name))
            .envs(self.script_env());
        c
    }

    /// The first port: validator `i` uses `port_base + 10 i` and the next
    /// five (p2p, RPC, ABCI, pprof, CometBFT metrics, relay metrics), the hub
    /// `port_base + 100` and the next five.
    pub fn port_base(&self) -> u16 {
        self.port_base
    }

    /// The P2P proxies, when started with [`Options::p2p_mesh`].
    pub fn mesh(&self) -> Result<&crate::partition::P2pMesh> {
        self.mesh
            .as_ref()
            .context("this localnet was started without Options::p2p_mesh")
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// RPC URL of validator `i`.
    pub fn rpc_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.port_base as usize + 10 * i + 1)
    }

    /// RPC URL of the hub chain's node.
    pub fn hub_rpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port_base as usize + 101)
    }

    /// An RPC client of validator `i`.
    pub fn rpc(&self, i: usize) -> Rpc {
        Rpc::new(&self.rpc_url(i))
    }

    /// The gateway key registered in genesis.
    pub fn gateway_key(&self) -> Result<SigningKey> {
        let (_, k) = tally_node::keyfile::load(&self.dir().join("gateway.key"))?;
        Ok(k)
    }

    /// Deposits `amount` for `user` through the hub's faucet
    /// (`tally-hub deposit`, see [`hub_path`]).
    pub fn hub_deposit(&self, user: &str, amount: u64) -> Result<()> {
        let out = Command::new(&self.hub_bin)
            .args(["deposit", "--user", user, "--amount", &amount.to_string()])
            .args(["--node", &self.hub_rpc_url()])
            .output()
            .context("running tally-hub deposit")?;
        if !out.status.success() {
            bail!("hub deposit: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// `user`'s balance on validator `i`.
    pub fn balance(&self, i: usize, user: &str) -> Result<u64> {
        let r = self.rpc(i).abci_query(&format!("/balance/{user}"))?;
        let v: serde_json::Value = serde_json::from_slice(&r.value)?;
        Ok(v["balance"].as_u64().unwrap_or(0))
    }

    /// Runs `localnet/node.sh ACTION i` (start, stop, kill).
    pub fn node(&self, action: &str, i: usize) -> Result<()> {
        self.node_sh(action, &i.to_string())
    }

    /// Runs `localnet/node.sh ACTION hub` (start, stop, kill the hub chain).
    pub fn hub(&self, action: &str) -> Result<()> {
        self.node_sh(action, "hub")
    }

    /// Runs `localnet/node.sh ACTION i` with extra environment (start a
    /// validator with other settings than the network's).
    pub fn node_with_env(&self, action: &str, i: usize, env: &[(&str, &str)]) -> Result<()> {
        self.node_sh_env(action, &i.to_string(), env)
    }

    /// Runs `localnet/node.sh add`: one more validator node (index
    /// [`Localnet::validators`] for the first) from the same genesis,
    /// caught up with the chain; its output (the consensus key and the
    /// proposal commands).
    pub fn add_node(&self) -> Result<String> {
        let out = self.script("node.sh").arg("add").output()?;
        if !out.status.success() {
            bail!(
                "node.sh add: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.logs_tail()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn node_sh(&self, action: &str, who: &str) -> Result<()> {
        self.node_sh_env(action, who, &[])
    }

    fn node_sh_env(&self, action: &str, who: &str, env: &[(&str, &str)]) -> Result<()> {
        let out = self
            .script("node.sh")
            .args([action, who])
            .envs(env.iter().copied())
            .output()?;
        if !out.status.success() {
            bail!(
                "node.sh {action} {who}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.logs_tail()
            );
        }
        Ok(())
    }

    /// Stops (`action` "stop" or "kill") validator `i`, or the hub for
    /// `None`, and returns a guard that starts it again when dropped, unless
    /// [`Restart::now`] already did: a test that fails while a node is down
    /// leaves the network whole for the next test.
    pub fn take_down(&self, action: &str, i: Option<usize>) -> Result<Restart<'_>> {
        let who = i.map_or_else(|| "hub".to_string(), |i| i.to_string());
        self.node_sh(action, &who)?;
        Ok(Restart {
            net: self,
            who,
            done: false,
        })
    }

    /// Latest height of validator `i` (0 if unreachable).
    pub fn height(&self, i: usize) -> u64 {
        self.rpc(i).status().map(|s| s.height).unwrap_or(0)
    }

    /// Runs the governance proposal `args` (`tallyd tx params propose ...`,
    /// `tallyd tx gateway propose ...`) from validator 0 and approves it
    /// from validators 1 and 2 (3 of 4 equal powers); the proposal as
    /// `/proposals` shows it then.
    pub fn pass_proposal(&self, args: &[&str]) -> Result<serde_json::Value> {
        let home = |i: usize| self.dir().join(format!("node{i}")).display().to_string();
        let mut all = args.to_vec();
        let (h0, u0) = (home(0), self.rpc_url(0));
        all.extend_from_slice(&["--home", &h0, "--node", &u0]);
        let id = tallyd_ok(&all)?.trim().to_string();
        ensure!(id.parse::<u64>().is_ok(), "no proposal id: {id}");
        // Approvals go through validator 0 too (each signed with its own
        // home's key): a validator a block behind would not know the
        // proposal yet.
        for i in 1..=2 {
            let (h, u) = (home(i), self.rpc_url(0));
            tallyd_ok(&[
                "tx",
                "validator",
                "approve",
                "--id",
                &id,
                "--home",
                &h,
                "--node",
                &u,
            ])?;
        }
        // The last approval is committed, but the state may answer it a
        // moment later: ask until the proposal is no longer open (10 s).
        let t = std::time::Instant::now();
        loop {
            let r = self.rpc(0).abci_query(&format!("/proposals?from={id}"))?;
            let v: serde_json::Value = serde_json::from_slice(&r.value)?;
            let p = v["proposals"][0].clone();
            if p["status"] != "open" || t.elapsed() > Duration::from_secs(10) {
                return Ok(p);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until validator 0's `/dkg` shows a threshold key (epoch 1 or
    /// later), at most `timeout`.
    pub fn wait_for_key(&self, timeout: Duration) -> Result<()> {
        let t = std::time::Instant::now();
        loop {
            let epoch = self
                .rpc(0)
                .abci_query("/dkg")
                .ok()
                .filter(|a| a.code == 0)
                .and_then(|a| serde_json::from_slice::<serde_json::Value>(&a.value).ok())
                .and_then(|d| d["epoch"].as_u64())
                .unwrap_or(0);
            if epoch >= 1 {
                return Ok(());
            }
            if t.elapsed() > timeout {
                bail!("no threshold key after {timeout:?}\n{}", self.logs_tail());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Node `v`'s app hash at its last height equals the one node `with`
    /// holds in its header of the next block (the app hash the network
    /// agreed on for that height); waits up to 30 s for that header.
    pub fn app_hash_agrees(&self, v: usize, with: usize) -> Result<()> {
        use base64::Engine;
        let info = self.rpc(v).call("abci_info", serde_json::json!({}))?;
        let resp = &info["response"];
        let h: u64 = resp["last_block_height"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .context("abci_info without a height")?;
        let mine = resp["last_block_app_hash"].as_str().unwrap_or_default();
        let mine = hex::encode_upper(base64::engine::general_purpose::STANDARD.decode(mine)?);
        self.wait_height(with, h + 1, Duration::from_secs(30))?;
        let block = self
            .rpc(with)
            .call("block", serde_json::json!({"height": (h + 1).to_string()}))?;
        let theirs = block["block"]["header"]["app_hash"]
            .as_str()
            .unwrap_or_default();
        ensure!(
            mine == theirs,
            "node{v}'s app hash at {h} is {mine}, node{with}'s header says {theirs}"
        );
        Ok(())
    }

    /// Waits until validator `i` reaches `h`.
    pub fn wait_height(&self, i: usize, h: u64, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        while self.height(i) < h {
            if start.elapsed() > timeout {
                bail!(
                    "node{i} did not reach height {h} in {timeout:?} (at {})\n{}",
                    self.height(i),
                    self.logs_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// The last lines of every node's logs, for failure messages.
    pub fn logs_tail(&self) -> String {
        let mut s = String::new();
        // The genesis validators and any node added since (node.sh add|join).
        let mut nodes: Vec<usize> = std::fs::read_dir(self.dir())
            .map(|d| {
                d.filter_map(|e| {
                    e.ok()?
                        .file_name()
                        .to_str()?
                        .strip_prefix("node")?
                        .parse()
                        .ok()
                })
                .collect()
            })
            .unwrap_or_default();
        nodes.sort_unstable();
        let dirs = nodes
            .into_iter()
            .map(|i| (format!("node{i}"), ["tallyd.log", "cometbft.log"]))
            .chain(std::iter::once((
                "hub".to_string(),
                ["tally-hub.log", "cometbft.log"],
            )));
        for (d, files) in dirs {
            for f in files {
                let p = self.dir().join(&d).join(f);
                if let Ok(t) = std::fs::read_to_string(&p) {
                    let lines: Vec<_> = t.lines().rev().take(8).collect();
                    s.push_str(&format!("--- {}\n", p.display()));
                    for l in lines.into_iter().rev() {
                        s.push_str(l);
                        s.push('\n');
                    }
                }
            }
        }
        s
    }
}

impl Drop for Localnet {
    fn drop(&mut self) {
        let _ = self.script("down.sh").output();
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// Starts a validator (or the hub) that [`Localnet::take_down`] stopped,
/// at [`Restart::now`] or when dropped.
#[derive(Debug)]
pub struct Restart<'a> {
    net: &'a Localnet,
    who: String,
    done: bool,
}

impl Restart<'_> {
    /// Starts it now. If that fails (the test fails with the error), the
    /// guard tries once more when dropped, for the tests that follow.
    pub fn now(mut self) -> Result<()> {
        self.net.node_sh("start", &self.who)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Restart<'_> {
    fn drop(&mut self) {
        if !self.done {
            eprintln!("starting {} again after a failed test", self.who);
            std::thread::sleep(Duration::from_secs(1));
            if let Err(e) = self.net.node_sh("start", &self.who) {
                eprintln!("could not start {}: {e:#}", self.who);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::profile_dir;
    use std::path::Path;

    #[test]
    fn profile_dir_of_tests_and_of_binaries() {
        // A test executable: target/release/deps/<name>-<hash>.
        assert_eq!(
            profile_dir(Path::new("/t/target/release/deps/e2e_faults-0123abcd")),
            Some(Path::new("/t/target/release"))
        );
        // A binary: target/release/tally-bench (scripts/chaos.sh). The old
        // rule (two levels up) gave /t/target here.
        assert_eq!(
            profile_dir(Path::new("/t/target/release/tally-bench")),
            Some(Path::new("/t/target/release"))
        );
    }
}

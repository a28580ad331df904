//! A tiny W3C WebDriver client (HTTP + JSON through `ureq`) driving
//! Debian's headless Chromium through `chromedriver`, for tests of web
//! pages; and [`Group`], a child process in a process group of its own that
//! is stopped with everything it started when dropped, or by a watchdog
//! when the test process dies without dropping it.
//!
//! Only what the tests use: new session, navigate, execute a script,
//! resize the window, take a screenshot, delete the session.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine;
use serde_json::{json, Value};

/// The Chromium binary the browser runs.
pub const CHROMIUM: &str = "chromium";
/// Its WebDriver server.
pub const CHROMEDRIVER: &str = "chromedriver";

/// Why a browser test cannot run here: `chromium` or `chromedriver` is not
/// on `PATH` (`localnet/install-deps.sh` installs both on Debian).
pub fn skip_reason() -> Option<String> {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .filter(|b| !crate::harness::on_path(b))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{} not found on PATH (Debian packages chromium chromium-driver; localnet/install-deps.sh installs them)",
            missing.join(" and ")
        )
    })
}

/// Stops the process group `$2` once process `$1` (the test) is gone.
const WATCHDOG: &str = r#"trap '' INT TERM HUP
while kill -0 "$1" 2>/dev/null; do sleep 1; done
kill -TERM -- "-$2" 2>/dev/null; sleep 2; kill -KILL -- "-$2" 2>/dev/null
"#;

/// A child process leading a process group of its own. Dropping it sends
/// SIGTERM to the whole group (so also to what it started, such as
/// chromedriver's Chromium), then SIGKILL to what is left.
#[derive(Debug)]
pub struct Group {
    child: Child,
    watchdog: Option<Child>,
    name: String,
}

impl Group {
    /// Spawns `cmd` as the leader of a new process group, with a watchdog
    /// that stops the group if this process dies first.
    pub fn spawn(name: &str, mut cmd: Command) -> Result<Self> {
        use std::os::unix::process::CommandExt;
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let watchdog = Command::new("bash")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("tally-group-watchdog")
            .arg(std::process::id().to_string())
            .arg(child.id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut g = Self {
            child,
            watchdog: None,
            name: name.to_string(),
        };
        g.watchdog = Some(watchdog.context("starting a watchdog")?);
        Ok(g)
    }

    /// The leader's process id (= the group id).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the leader has exited (its status, if so).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn signal_group(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, "--", &format!("-{}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Whether any process of the group is still alive.
    fn group_alive(&self) -> bool {
        Command::new("kill")
            .args(["-0", "--", &format!("-{}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal_group("-TERM");
        let start = Instant::now();
        let _ = self.child.try_wait();
        while self.group_alive() && start.elapsed() < Duration::from_secs(5) {
            let _ = self.child.try_wait();
            std::thread::sleep(Duration::from_millis(50));
        }
        if self.group_alive() {
            eprintln!("{}: still running 5 s after SIGTERM, killing", self.name);
            self.signal_group("-KILL");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// A WebDriver error or an unexpected answer.
fn driver_error(what: &str, v: &Value) -> anyhow::Error {
    anyhow::anyhow!(
        "webdriver {what}: {} {}",
        v["value"]["error"].as_str().unwrap_or("?"),
        v["value"]["message"]
            .as_str()
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("")
    )
}

/// Headless Chromium under chromedriver, with one session. Dropping it ends
/// the session, then stops chromedriver and Chromium.
pub struct Browser {
    session: Option<String>,
    base: String,
    agent: ureq::Agent,
    // Dropped after the session is deleted (fields drop in this order).
    driver: Group,
    profile: tempfile::TempDir,
    log: PathBuf,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("base", &self.base)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl Browser {
    /// Starts chromedriver on `127.0.0.1:port` and a headless Chromium
    /// session with a fresh profile and a `width` x `height` window.
    pub fn start(port: u16, width: u32, height: u32) -> Result<Self> {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            bail!("port {port} for chromedriver is in use");
        }
        let profile = tempfile::Builder::new()
            .prefix("tally-chromium-")
            .tempdir()?;
        let log = profile.path().join("chromedriver.log");
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let driver = Group::spawn("chromedriver", cmd)?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .timeout(Duration::from_secs(60))
            .build();
        let mut b = Self {
            session: None,
            base: format!("http://127.0.0.1:{port}"),
            agent,
            driver,
            profile,
            log,
        };
        b.wait_ready()?;
        let data_dir = b.profile.path().join("data");
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--hide-scrollbars".into(),
            format!("--user-data-dir={}", data_dir.display()),
            format!("--window-size={width},{height}"),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": which(CHROMIUM)?, "args": args},
        }}});
        let v = b.call("POST", "/session", Some(caps))?;
        let id = v["value"]["sessionId"]
            .as_str()
            .with_context(|| format!("no session id in {v}"))?;
        b.session = Some(id.to_string());
        Ok(b)
    }

    /// The profile directory (Chromium's `--user-data-dir` is `data/` in
    /// it).
    pub fn profile_dir(&self) -> &Path {
        self.profile.path()
    }

    /// chromedriver's process group id.
    pub fn driver_pgid(&self) -> u32 {
        self.driver.id()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Ok(v) = self.call("GET", "/status", None) {
                if v["value"]["ready"] == true {
                    return Ok(());
                }
            }
            if let Some(st) = self.driver.exited() {
                bail!("chromedriver exited ({st}): {}", self.log_tail());
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!("chromedriver not ready after 20 s: {}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of chromedriver's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().rev().take(15).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// One WebDriver command; the answer's JSON (an error answer is an
    /// error).
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let req = self.agent.request(method, &url);
        let res = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match res {
            Ok(r) => r
                .into_json()
                .with_context(|| format!("webdriver {method} {path}: not JSON")),
            Err(ureq::Error::Status(_, r)) => {
                let v: Value = r.into_json().unwrap_or(Value::Null);
                Err(driver_error(&format!("{method} {path}"), &v))
            }
            Err(e) => Err(anyhow::anyhow!("webdriver {method} {path}: {e}")),
        }
    }

    fn session_path(&self, rest: &str) -> Result<String> {
        let id = self.session.as_deref().context("no browser session")?;
        Ok(format!("/session/{id}{rest}"))
    }

    /// Navigates to `url` and waits for it to load.
    pub fn goto(&self, url: &str) -> Result<()> {
        self.call(
            "POST",
            &self.session_path("/url")?,
            Some(json!({ "url": url })),
        )?;
        Ok(())
    }

    /// Runs `script` (a function body; `arguments[i]` are `args`) in the
    /// page; what it returns.
    pub fn execute(&self, script: &str, args: Value) -> Result<Value> {
        let v = self.call(
            "POST",
            &self.session_path("/execute/sync")?,
            Some(json!({ "script": script, "args": args })),
        )?;
        Ok(v["value"].clone())
    }

    /// Runs `script` until it returns something other than `null` or
    /// `false`; that value.
    pub fn wait_for(&self, script: &str, timeout: Duration) -> Result<Value> {
        let start = Instant::now();
        loop {
            let v = self.execute(script, json!([]))?;
            if !v.is_null() && v != false {
                return Ok(v);
            }
            if start.elapsed() > timeout {
                bail!("waited {timeout:?} for the page: {script}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Resizes the window.
    pub fn set_window_size(&self, width: u32, height: u32) -> Result<()> {
        self.call(
            "POST",
            &self.session_path("/window/rect")?,
            Some(json!({ "width": width, "height": height })),
        )?;
        Ok(())
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self) -> Result<Vec<u8>> {
        let v = self.call("GET", &self.session_path("/screenshot")?, None)?;
        let b64 = v["value"].as_str().context("no screenshot data")?;
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .context("screenshot is not base64")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Ok(p) = self.session_path("") {
            // Closes Chromium; chromedriver and anything left are stopped
            // by the process group's drop.
            if let Err(e) = self.call("DELETE", &p, None) {
                eprintln!("closing the browser session: {e:#}");
            }
        }
        self.session = None;
    }
}

/// The full path of `name` on `PATH`.
fn which(name: &str) -> Result<String> {
    let path = std::env::var_os("PATH").context("no PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .with_context(|| format!("{name} not found on PATH"))
}

/// Where tests keep files for people to look at afterwards:
/// `$CARGO_TARGET_DIR/test-artifacts`, or `test-artifacts` in the target
/// directory the running test binary is in.
pub fn artifacts_dir() -> Result<PathBuf> {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            // target/release/deps/<test> -> target
            let exe = std::env::current_exe()?;
            exe.ancestors()
                .nth(3)
                .map(Path::to_path_buf)
                .context("cannot locate the target directory")?
        }
    };
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

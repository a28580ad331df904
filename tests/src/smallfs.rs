//! A small filesystem that fills up, for full-disk faults (`e2e_disk`,
//! `scripts/chaos.sh`).
//!
//! A validator's tallyd writes everything it keeps under its home's `data/`
//! (the RocksDB store `tally.db`, `snapshots/`, the DKG's round keys and
//! epoch share files). [`move_tallyd_data`] stops the node, moves
//! CometBFT's own files out of `data/` to `cometbft-data/` on the ordinary
//! disk (and names them so in `config.toml`), mounts a tmpfs of a given
//! size over `data/`, copies tallyd's files onto it and starts the node
//! again: the fault then lands on tallyd's writes only. [`fill`] writes a
//! ballast file until the kernel answers ENOSPC; removing the ballast
//! frees the space again.
//!
//! A tmpfs needs root (there is no unprivileged way to a real ENOSPC from
//! the kernel): callers check [`is_root`] and skip (tests, loudly) or log
//! (chaos) without it. The mount is detached lazily when the [`SmallFs`]
//! is dropped and, should the process die first, by a watchdog process
//! that outlives it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use crate::localnet::Localnet;

/// Whether this process runs as root (needed to mount a tmpfs).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// A tmpfs mounted at a directory; unmounted when dropped, or by a
/// watchdog process once this process is gone (however it ended).
#[derive(Debug)]
pub struct SmallFs {
    at: PathBuf,
    watchdog: Child,
}

impl SmallFs {
    /// Mounts a tmpfs of `size` (mount's syntax: `48m`, `1g`) at `at`.
    pub fn mount(at: &Path, size: &str) -> Result<Self> {
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "mount -t tmpfs {}: {}",
                at.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let watchdog = Command::new("bash")
            .arg("-c")
            .arg("trap '' INT TERM HUP; while kill -0 \"$1\" 2>/dev/null; do sleep 1; done; umount -l \"$2\"")
            .arg("tally-disk-watchdog")
            .arg(std::process::id().to_string())
            .arg(at)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let watchdog = match watchdog {
            Ok(w) => w,
            Err(e) => {
                let _ = Command::new("umount").arg("-l").arg(at).status();
                return Err(e).context("starting the unmount watchdog");
            }
        };
        Ok(Self {
            at: at.to_path_buf(),
            watchdog,
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.at
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}

/// CometBFT's files in a home's `data/`: moved to `cometbft-data/` so
/// that only tallyd's writes meet the small filesystem.
const COMETBFT_DATA: [&str; 6] = [
    "blockstore.db",
    "state.db",
    "evidence.db",
    "tx_index.db",
    "cs.wal",
    "priv_validator_state.json",
];

/// Stops node `v`, puts its tallyd's `data/` on a tmpfs of `size`
/// (CometBFT's files beside it on the ordinary disk) and starts it again;
/// returns once it has caught up with validator 0.
pub fn move_tallyd_data(net: &Localnet, v: usize, size: &str) -> Result<SmallFs> {
    let home = net.dir().join(format!("node{v}"));
    net.node("stop", v)?;
    let data = home.join("data");
    let cmt = home.join("cometbft-data");
    std::fs::create_dir_all(&cmt)?;
    for name in COMETBFT_DATA {
        let p = data.join(name);
        if p.exists() {
            std::fs::rename(&p, cmt.join(name))?;
        }
    }
    let cfg = home.join("config/config.toml");
    let text = std::fs::read_to_string(&cfg)?
        .replace("db_dir = \"data\"", "db_dir = \"cometbft-data\"")
        .replace(
            "\"data/priv_validator_state.json\"",
            "\"cometbft-data/priv_validator_state.json\"",
        )
        .replace("\"data/cs.wal/wal\"", "\"cometbft-data/cs.wal/wal\"");
    ensure!(
        text.matches("cometbft-data").count() == 3,
        "config.toml names CometBFT's data otherwise than expected"
    );
    std::fs::write(&cfg, text)?;
    let old = home.join("data.disk");
    std::fs::rename(&data, &old)?;
    std::fs::create_dir(&data)?;
    let fs = SmallFs::mount(&data, size)?;
    let st = Command::new("cp")
        .arg("-a")
        .arg(old.join("."))
        .arg(&data)
        .status()?;
    ensure!(st.success(), "copying tallyd's data onto the tmpfs");
    std::fs::remove_dir_all(&old)?;
    net.node("start", v)?;
    let h = net.height(0);
    net.wait_height(v, h, Duration::from_secs(90))?;
    Ok(fs)
}

/// Fills the filesystem of `dir` with `dir/ballast` until a write fails
/// with ENOSPC; the bytes written. Remove the file to free the space.
pub fn fill(dir: &Path) -> Result<u64> {
    let mut file = std::fs::File::create(dir.join("ballast"))?;
    let mut written = 0u64;
    for chunk in [1 << 20, 4 << 10, 512] {
        let buf = vec![0xa5u8; chunk];
        loop {
            match file.write(&buf) {
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => return Err(e).context("filling the tmpfs"),
            }
        }
    }
    Ok(written)
}

//! A wall clock off by a fixed offset for one process, with Debian's
//! libfaketime (`LD_PRELOAD`, `FAKETIME="+5m"`; `localnet/install-deps.sh`
//! installs the `faketime` package). It moves what `clock_gettime` and
//! `time` answer through the C library: Rust's `SystemTime` in `tallyd`
//! (app and relay) and in a gateway using the SDK. Monotonic clocks are
//! left alone (`FAKETIME_DONT_FAKE_MONOTONIC`), so timeouts and intervals
//! keep their length. Go programs (CometBFT) read the clock without the C
//! library, so a validator's consensus clock cannot be moved this way.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// Where Debian installs the preload library, for the usual architectures.
const CANDIDATES: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// The libfaketime preload library, if installed (`$TALLY_LIBFAKETIME`
/// first).
pub fn libfaketime() -> Option<PathBuf> {
    std::env::var_os("TALLY_LIBFAKETIME")
        .map(PathBuf::from)
        .into_iter()
        .chain(CANDIDATES.iter().map(PathBuf::from))
        .find(|p| p.exists())
}

/// The environment that offsets a process's wall clock by `offset`
/// (libfaketime's syntax: `+5m`, `-300s`, `+1h`).
pub fn env(offset: &str) -> Result<Vec<(String, String)>> {
    let lib = libfaketime().context("libfaketime is not installed (apt-get install faketime)")?;
    Ok(vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("FAKETIME".into(), offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        // Read FAKETIME once, not on every call.
        ("FAKETIME_NO_CACHE".into(), "0".into()),
    ])
}

/// `bin` as a command whose wall clock is off by `offset`.
pub fn command(bin: &Path, offset: &str) -> Result<Command> {
    let mut c = Command::new(bin);
    c.envs(env(offset)?);
    Ok(c)
}

/// Writes an executable script `dir/name` that runs `bin` with its
/// arguments and its wall clock off by `offset`: what the localnet scripts
/// take as a validator's app (`TALLYD_<i>`, [`crate::localnet::Options`]).
pub fn wrapper(dir: &Path, name: &str, bin: &Path, offset: &str) -> Result<PathBuf> {
    let mut script = String::from("#!/bin/sh\n");
    for (k, v) in env(offset)? {
        script.push_str(&format!("export {k}='{v}'\n"));
    }
    script.push_str(&format!("exec '{}' \"$@\"\n", bin.display()));
    let p = dir.join(name);
    std::fs::write(&p, script).with_context(|| format!("writing {}", p.display()))?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_runs_five_minutes_ahead() {
        if libfaketime().is_none() {
            eprintln!("libfaketime not installed: nothing to check");
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let out = command(Path::new("date"), "+5m")
            .unwrap()
            .arg("+%s")
            .output()
            .unwrap();
        let skewed: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let d = skewed - now;
        assert!((295..=310).contains(&d), "offset {d} s");
    }
}

//! The EVM hub contract's own checks, run from `cargo test` so CI runs
//! them (ADR 0022):
//!
//! 1. `the_checked_in_build_is_what_the_source_makes`: `node build.js
//!    --check` rebuilds `hub-evm/contract/build/TallyHub.json` with the
//!    pinned solc-js and fails if the checked-in ABI or bytecode differ
//!    (the Rust bindings and `tally-evm` deploy that file);
//! 2. `the_contract_passes_its_smoke_test_on_anvil`: `node test/smoke.js`
//!    deploys the contract on a real anvil (loopback, ports 28700-28799,
//!    always stopped) and checks every function, refusal and event against
//!    an independent oracle (py_ecc for BLS, hashlib for digests, its own
//!    ed25519 decompression); see `hub-evm/contract/README.md`.
//!
//! Needs node and the npm packages of `hub-evm/contract`
//! (`localnet/install-deps.sh` runs `npm ci` there) and, for the smoke
//! test, Python's py_ecc. Without them the tests are reported SKIPPED (and
//! fail with `TALLY_E2E_REQUIRED`, as CI sets).

use std::process::{Command, ExitCode};

use anyhow::{ensure, Result};
use tally_tests::harness::{self, on_path, skip, Test};
use tally_tests::localnet::repo_root;

const TESTS: [Test<()>; 2] = [
    Test {
        name: "the_checked_in_build_is_what_the_source_makes",
        needs: &[],
        run: build_check,
    },
    Test {
        name: "the_contract_passes_its_smoke_test_on_anvil",
        needs: &[],
        run: smoke,
    },
];

fn main() -> ExitCode {
    harness::run_unless(&TESTS, None, || Ok(()))
}

/// Runs `node ARGS` in `hub-evm/contract`; skipped when node or the npm
/// packages are missing.
fn node(args: &[&str]) -> Result<()> {
    let dir = repo_root().join("hub-evm/contract");
    if !on_path("node") {
        return Err(skip("node not found on PATH"));
    }
    if !dir.join("node_modules/solc").is_dir() {
        return Err(skip(
            "hub-evm/contract/node_modules is missing (localnet/install-deps.sh runs npm ci there)",
        ));
    }
    let out = Command::new("node").args(args).current_dir(&dir).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tail: Vec<&str> = text.lines().rev().take(40).collect();
    ensure!(
        out.status.success(),
        "node {} failed ({}):\n{}",
        args.join(" "),
        out.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    eprintln!("{}", text.lines().last().unwrap_or(""));
    Ok(())
}

fn build_check(_: &mut ()) -> Result<()> {
    node(&["build.js", "--check"])
}

fn smoke(_: &mut ()) -> Result<()> {
    let py_ecc = Command::new("python3")
        .args(["-c", "import py_ecc"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !py_ecc {
        return Err(skip(
            "python3 with py_ecc not found (localnet/install-deps.sh installs it)",
        ));
    }
    node(&["test/smoke.js"])
}

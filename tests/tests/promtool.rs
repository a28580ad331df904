//! `promtool` on the Prometheus files in `deploy/prometheus/`: the rules
//! and the example scrape config pass `promtool check`, and the alerts fire
//! (and stay quiet) as `tally-rules.test.yml` expects. Without `promtool`
//! on PATH every test is reported SKIPPED (counted apart by
//! scripts/test.sh; failed with `TALLY_E2E_REQUIRED`). Debian's
//! `prometheus` package ships it (`localnet/install-deps.sh` installs it).

use std::process::{Command, ExitCode};

use anyhow::{ensure, Result};
use tally_tests::harness::{self, on_path, Test};
use tally_tests::localnet::repo_root;

const TESTS: [Test<()>; 3] = [
    Test {
        name: "rules_pass_promtool_check",
        needs: &[],
        run: |_| promtool(&["check", "rules", "tally-rules.yml"]),
    },
    Test {
        name: "scrape_config_passes_promtool_check",
        needs: &[],
        run: |_| promtool(&["check", "config", "prometheus.yml"]),
    },
    Test {
        name: "alerts_fire_as_the_rule_tests_expect",
        needs: &[],
        run: |_| promtool(&["test", "rules", "tally-rules.test.yml"]),
    },
];

fn main() -> ExitCode {
    let skip = (!on_path("promtool"))
        .then(|| "promtool not found on PATH (apt-get install prometheus ships it)".to_string());
    harness::run_unless(&TESTS, skip, || Ok(()))
}

fn promtool(args: &[&str]) -> Result<()> {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo_root().join("deploy").join("prometheus"))
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", text.trim_end());
    ensure!(out.status.success(), "promtool {args:?} failed:\n{text}");
    Ok(())
}

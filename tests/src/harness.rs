//! A small test runner for the end-to-end tests (`harness = false` test
//! targets): named tests that run in a fixed order over one shared fixture
//! (a localnet), reported the way libtest reports them, with a third outcome,
//! *skipped*, for machines without CometBFT.
//!
//! Why not libtest: the tests share one localnet that takes a minute to
//! start, several of them kill validators or the hub, and some build on what
//! an earlier one left on the chain, so they must run one at a time in a
//! known order; the fixture must be stopped after the last one (a libtest
//! static is never dropped); and a test that cannot run must not be counted
//! as passed (libtest has no run-time skip).
//!
//! What the runner does:
//! - takes libtest's command line: name filters (substring, or `--exact`),
//!   `--skip`, `--list`; `--test-threads`, `--nocapture` and the other
//!   libtest flags are accepted and have no effect (the tests run in order on
//!   one thread, their output is never captured); `--ignored` and `--bench`
//!   select nothing;
//! - runs the selected tests in declaration order, adding the tests a
//!   selected one [`Test::needs`];
//! - starts the fixture at the first test that runs and drops it (which
//!   stops every process it started) after the last one, also when a test
//!   failed or panicked; a fixture that does not start fails every test with
//!   the reason;
//! - when the fixture cannot run on this machine ([`skip_reason`]), reports
//!   every selected test as `SKIPPED` with the reason, and counts it apart;
//!   with `TALLY_E2E_REQUIRED` set (CI does), it fails them instead;
//! - a test that finds a tool of its own missing returns [`skip`]`(why)`:
//!   it is reported `SKIPPED: why` and counted as skipped (failed with
//!   `TALLY_E2E_REQUIRED`), the other tests still run;
//! - prints `test NAME ... ok|FAILED|SKIPPED: why`, the failures with their
//!   messages, and a summary in libtest's shape with the skipped count added:
//!   `test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered
//!   out; 1 skipped; finished in 312.40s`. The exit code is 101 when a test
//!   failed (as libtest's), else 0.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// One named end-to-end test over a fixture `F`.
pub struct Test<F> {
    /// The name `cargo test` lists and filters on.
    pub name: &'static str,
    /// Tests that must run before this one when it is selected alone (what
    /// it checks depends on what they did to the chain).
    pub needs: &'static [&'static str],
    /// The test. An `Err` or a panic fails it; the fixture stays usable for
    /// the tests after it.
    pub run: fn(&mut F) -> anyhow::Result<()>,
}

impl<F> std::fmt::Debug for Test<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Test")
            .field("name", &self.name)
            .field("needs", &self.needs)
            .finish_non_exhaustive()
    }
}

/// What [`skip`] returns: a test that could not run here, and why.
#[derive(Debug)]
pub struct Skip(pub String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "skipped: {}", self.0)
    }
}

impl std::error::Error for Skip {}

/// The error a test returns when something it needs (a tool) is missing on
/// this machine: the runner reports the test `SKIPPED: why` and counts it
/// as skipped, never as passed (with `TALLY_E2E_REQUIRED` set, as failed).
pub fn skip(why: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Skip(why.into()))
}

/// Why the end-to-end tests cannot run here, if they cannot: `cometbft` not
/// on `PATH`, or `TALLY_SKIP_E2E` set.
pub fn skip_reason() -> Option<String> {
    if std::env::var_os("TALLY_SKIP_E2E").is_some() {
        return Some("TALLY_SKIP_E2E is set".into());
    }
    if !on_path("cometbft") {
        return Some(
            "cometbft not found on PATH (localnet/install-cometbft.sh installs it)".into(),
        );
    }
    None
}

/// Whether an executable file `name` is in a directory of `PATH`.
pub fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(name))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// What the command line asks for.
#[derive(Debug, Default)]
struct Args {
    filters: Vec<String>,
    skips: Vec<String>,
    exact: bool,
    list: bool,
    none: bool,
}

impl Args {
    fn parse(args: impl IntoIterator<Item = String>) -> Self {
        // libtest flags that take a value, as `--flag V` or `--flag=V`.
        const WITH_VALUE: [&str; 7] = [
            "--test-threads",
            "--skip",
            "--format",
            "--color",
            "--logfile",
            "--shuffle-seed",
            "-Z",
        ];
        let mut a = Args::default();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with('-') => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            if WITH_VALUE.contains(&flag.as_str()) {
                let value = inline.or_else(|| it.next()).unwrap_or_default();
                if flag == "--skip" {
                    a.skips.push(value);
                }
                continue;
            }
            match flag.as_str() {
                "--exact" => a.exact = true,
                "--list" => a.list = true,
                "--ignored" | "--bench" => a.none = true,
                _ if flag.starts_with('-') => {} // --nocapture, --quiet, --include-ignored, ...
                _ => a.filters.push(arg),
            }
        }
        a
    }

    fn matches(&self, pattern: &str, name: &str) -> bool {
        if self.exact {
            pattern == name
        } else {
            name.contains(pattern)
        }
    }

    fn selects(&self, name: &str) -> bool {
        !self.none
            && (self.filters.is_empty() || self.filters.iter().any(|f| self.matches(f, name)))
            && !self.skips.iter().any(|s| self.matches(s, name))
    }
}

/// How one test ended.
#[derive(Debug)]
enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

/// A line on stdout, flushed (through `println!`, which libtest captures in
/// this module's own unit tests).
fn out(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panicked".into())
}

/// Runs `tests` over the fixture `start` makes, as the command line asks;
/// returns the process's exit code. Call it from the test target's `main`.
pub fn run<F>(tests: &[Test<F>], start: impl FnOnce() -> anyhow::Result<F>) -> ExitCode {
    run_unless(tests, skip_reason(), start)
}

/// Like [`run`], with the caller's own reason to skip (`None`: run). A
/// skip is printed and counted as skipped, never as passed; with
/// `TALLY_E2E_REQUIRED` set it fails the tests instead.
pub fn run_unless<F>(
    tests: &[Test<F>],
    skip: Option<String>,
    start: impl FnOnce() -> anyhow::Result<F>,
) -> ExitCode {
    let args = Args::parse(std::env::args().skip(1));
    if args.list {
        let selected: Vec<&Test<F>> = tests.iter().filter(|t| args.selects(t.name)).collect();
        for t in &selected {
            out(&format!("{}: test", t.name));
        }
        out(&format!("\n{} tests, 0 benchmarks", selected.len()));
        return ExitCode::SUCCESS;
    }
    // Where the end-to-end tests must run (CI sets TALLY_E2E_REQUIRED), a
    // reason to skip them fails them instead.
    let summary = match skip {
        Some(why) if std::env::var_os("TALLY_E2E_REQUIRED").is_some() => {
            let start = move || -> anyhow::Result<F> {
                anyhow::bail!("{why}, and TALLY_E2E_REQUIRED is set: failing, not skipping")
            };
            execute(tests, &args, || None, start)
        }
        why => execute(tests, &args, move || why, start),
    };
    if summary.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(101)
    }
}

/// Counts of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Summary {
    passed: usize,
    failed: usize,
    skipped: usize,
}

/// Runs the tests `args` select (and what they need) in order, printing
/// each outcome and the summary.
fn execute<F>(
    tests: &[Test<F>],
    args: &Args,
    skip_reason: impl FnOnce() -> Option<String>,
    start: impl FnOnce() -> anyhow::Result<F>,
) -> Summary {
    // Add what the selected tests need, keeping declaration order.
    let mut chosen: Vec<bool> = tests.iter().map(|t| args.selects(t.name)).collect();
    for (i, t) in tests.iter().enumerate().rev() {
        if chosen[i] {
            for need in t.needs {
                if let Some(j) = tests.iter().position(|u| u.name == *need) {
                    if !chosen[j] {
                        chosen[j] = true;
                        eprintln!("note: running {need} too: {} needs it", t.name);
                    }
                }
            }
        }
    }
    let to_run: Vec<&Test<F>> = tests
        .iter()
        .zip(&chosen)
        .filter_map(|(t, c)| c.then_some(t))
        .collect();
    let filtered_out = tests.len() - to_run.len();
    let started = Instant::now();
    out(&format!(
        "\nrunning {} test{}",
        to_run.len(),
        if to_run.len() == 1 { "" } else { "s" }
    ));

    let skip = if to_run.is_empty() {
        None
    } else {
        skip_reason()
    };
    let mut fixture: Option<Result<F, String>> = None;
    let mut results: Vec<(&'static str, Outcome, Duration)> = Vec::new();
    let mut start = Some(start);
    for t in &to_run {
        if let Some(why) = &skip {
            out(&format!("test {} ... SKIPPED: {why}", t.name));
            results.push((t.name, Outcome::Skipped(why.clone()), Duration::ZERO));
            continue;
        }
        let fx = fixture.get_or_insert_with(|| {
            eprintln!("[e2e] starting the localnet");
            let begun = Instant::now();
            let made = match start.take() {
                Some(f) => catch_unwind(AssertUnwindSafe(f))
                    .map_err(|p| panic_message(p.as_ref()))
                    .and_then(|r| r.map_err(|e| format!("{e:#}"))),
                None => Err("the fixture was already started".into()),
            };
            match &made {
                Ok(_) => eprintln!("[e2e] localnet up in {:.1}s", begun.elapsed().as_secs_f64()),
                Err(e) => eprintln!("[e2e] the localnet did not start: {e}"),
            }
            made
        });
        eprintln!("[e2e] {} ...", t.name);
        let begun = Instant::now();
        let outcome = match fx {
            Err(e) => Outcome::Failed(format!("the localnet did not start: {e}")),
            Ok(f) => match catch_unwind(AssertUnwindSafe(|| (t.run)(f))) {
                Ok(Ok(())) => Outcome::Passed,
                Ok(Err(e)) if e.downcast_ref::<Skip>().is_some() => {
                    let why = e
                        .downcast_ref::<Skip>()
                        .map(|s| s.0.clone())
                        .unwrap_or_default();
                    if std::env::var_os("TALLY_E2E_REQUIRED").is_some() {
                        Outcome::Failed(format!(
                            "{why}, and TALLY_E2E_REQUIRED is set: failing, not skipping"
                        ))
                    } else {
                        Outcome::Skipped(why)
                    }
                }
                // The error and its context chain, without a backtrace.
                Ok(Err(e)) => Outcome::Failed(format!("{e:#}")),
                Err(p) => Outcome::Failed(format!("panicked: {}", panic_message(p.as_ref()))),
            },
        };
        let took = begun.elapsed();
        let word = match &outcome {
            Outcome::Passed => "ok",
            Outcome::Failed(msg) => {
                eprintln!("[e2e] {} failed: {msg}", t.name);
                "FAILED"
            }
            Outcome::Skipped(_) => "SKIPPED",
        };
        match &outcome {
            Outcome::Skipped(why) => out(&format!("test {} ... SKIPPED: {why}", t.name)),
            _ => out(&format!(
                "test {} ... {word} ({:.1}s)",
                t.name,
                took.as_secs_f64()
            )),
        }
        results.push((t.name, outcome, took));
    }
    // Stop every process the fixture started before reporting.
    if let Some(Ok(f)) = fixture.take() {
        eprintln!("[e2e] stopping the fixture (the localnet, if any)");
        drop(f);
    }

    let failed: Vec<_> = results
        .iter()
        .filter_map(|(n, o, _)| match o {
            Outcome::Failed(msg) => Some((n, msg)),
            _ => None,
        })
        .collect();
    let passed = results
        .iter()
        .filter(|(_, o, _)| matches!(o, Outcome::Passed))
        .count();
    let skipped = results
        .iter()
        .filter(|(_, o, _)| matches!(o, Outcome::Skipped(_)))
        .count();
    if !failed.is_empty() {
        out("\nfailures:\n");
        for (name, msg) in &failed {
            out(&format!("---- {name} ----\n{msg}\n"));
        }
        out("failures:");
        for (name, _) in &failed {
            out(&format!("    {name}"));
        }
    }
    if skipped > 0 {
        if skip.is_none() {
            out("");
            for (name, o, _) in &results {
                if let Outcome::Skipped(why) = o {
                    out(&format!("SKIPPED: {name}: {why}"));
                }
            }
        }
        if let Some(why) = &skip {
            out(&format!(
                "\nSKIPPED: {why}: {skipped} test{} did not run",
                if skipped == 1 { "" } else { "s" }
            ));
        }
    }
    out(&format!(
        "\ntest result: {}. {passed} passed; {} failed; 0 ignored; 0 measured; {filtered_out} filtered out; {skipped} skipped; finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len(),
        started.elapsed().as_secs_f64()
    ));
    Summary {
        passed,
        failed: failed.len(),
        skipped,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{execute, Args, Summary, Test};

    static DROPPED: AtomicUsize = AtomicUsize::new(0);

    /// A fixture that records what ran and counts its drops.
    struct Fixture(Vec<&'static str>);

    impl Drop for Fixture {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::SeqCst);
        }
    }

    const TESTS: [Test<Fixture>; 4] = [
        Test {
            name: "first_passes",
            needs: &[],
            run: |f| {
                f.0.push("first");
                Ok(())
            },
        },
        Test {
            name: "second_fails",
            needs: &["first_passes"],
            run: |f| {
                f.0.push("second");
                anyhow::bail!("second went wrong")
            },
        },
        Test {
            name: "third_panics",
            needs: &[],
            run: |f| {
                f.0.push("third");
                panic!("third panicked")
            },
        },
        Test {
            name: "fourth_sees_the_others",
            needs: &[],
            run: |f| {
                anyhow::ensure!(f.0 == ["first", "second", "third"], "{:?}", f.0);
                Ok(())
            },
        },
    ];

    #[test]
    fn runs_in_order_past_failures_and_stops_the_fixture_once() {
        let before = DROPPED.load(Ordering::SeqCst);
        let s = execute(&TESTS, &args(&[]), || None, || Ok(Fixture(Vec::new())));
        assert_eq!(
            s,
            Summary {
                passed: 2,
                failed: 2,
                skipped: 0
            }
        );
        assert_eq!(DROPPED.load(Ordering::SeqCst), before + 1);
    }

    #[test]
    fn skips_without_starting_the_fixture() {
        let s = execute(
            &TESTS,
            &args(&[]),
            || Some("no cometbft".into()),
            || -> anyhow::Result<Fixture> { panic!("must not start") },
        );
        assert_eq!(
            s,
            Summary {
                passed: 0,
                failed: 0,
                skipped: 4
            }
        );
    }

    #[test]
    fn a_fixture_that_does_not_start_fails_the_selected_tests() {
        let s = execute(
            &TESTS,
            &args(&["second"]),
            || None,
            || anyhow::bail!("no tallyd"),
        );
        // second_fails needs first_passes: both run, both fail.
        assert_eq!(
            s,
            Summary {
                passed: 0,
                failed: 2,
                skipped: 0
            }
        );
    }

    #[test]
    fn a_test_may_skip_itself_and_the_others_still_run() {
        const T: [Test<()>; 2] = [
            Test {
                name: "needs_a_tool",
                needs: &[],
                run: |_| Err(super::skip("the tool is not installed")),
            },
            Test {
                name: "runs",
                needs: &[],
                run: |_| Ok(()),
            },
        ];
        let s = execute(&T, &args(&[]), || None, || Ok(()));
        let required = std::env::var_os("TALLY_E2E_REQUIRED").is_some();
        assert_eq!(
            s,
            Summary {
                passed: 1,
                failed: usize::from(required),
                skipped: usize::from(!required)
            }
        );
    }

    fn args(a: &[&str]) -> Args {
        Args::parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn filters_and_flags() {
        let a = args(&["--test-threads", "2", "hub", "--nocapture"]);
        assert!(a.selects("hub_outage_settles_after_return"));
        assert!(!a.selects("records_reach_every_validator"));
        let a = args(&["--test-threads=2"]);
        assert!(a.selects("anything"));
        let a = args(&["--exact", "hub"]);
        assert!(!a.selects("hub_outage_settles_after_return"));
        let a = args(&["--skip", "hub"]);
        assert!(!a.selects("hub_outage_settles_after_return"));
        assert!(a.selects("records_reach_every_validator"));
        assert!(!args(&["--ignored"]).selects("x"));
        assert!(!args(&["--bench"]).selects("x"));
        assert!(args(&["--list"]).list);
    }
}

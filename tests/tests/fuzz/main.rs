//! Fuzz loops (proptest-driven; `cargo fuzz` needs a nightly toolchain and
//! a crate this workspace does not carry) over the four inputs a peer or a
//! client controls: transaction bytes (CheckTx), vote extensions
//! (VerifyVoteExtension), proposals with system transactions
//! (ProcessProposal, FinalizeBlock) and query paths. Each target feeds
//! arbitrary bytes and structure-aware mutations of valid inputs to both
//! the state machine (`tally_settlement`) and the ABCI adapter
//! (`TallyApp`), and checks them against an oracle written here.
//!
//! Cases per target: `TALLY_FUZZ_CASES` (default [`DEFAULT_CASES`], a few
//! seconds in release) times the target's weight. Longer runs and the
//! failure corpus (`*.proptest-regressions` beside each target, replayed
//! first on every run): `docs/fuzzing.md`.

mod env;
mod extension;
mod mutate;
mod oracle;
mod proposal;
mod query;
mod spec;
mod tx;

use proptest::test_runner::{Config, FileFailurePersistence, TestError, TestRunner};

/// Base number of cases per target when `TALLY_FUZZ_CASES` is unset.
pub const DEFAULT_CASES: u32 = 256;

/// Base number of cases: `TALLY_FUZZ_CASES` or [`DEFAULT_CASES`].
pub fn base_cases() -> u32 {
    std::env::var("TALLY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// A runner for the target in `source_file` (its failing seeds persist in
/// `<source>.proptest-regressions`), running `weight` times the base cases.
pub fn runner(source_file: &'static str, weight: u32) -> TestRunner {
    TestRunner::new(Config {
        cases: base_cases().saturating_mul(weight).max(1),
        source_file: Some(source_file),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        // Shrinking re-runs pairings; keep it bounded.
        max_shrink_iters: 2048,
        ..Config::default()
    })
}

/// Panics with the minimal failing input, if the run failed.
pub fn report<T: std::fmt::Debug>(what: &str, r: Result<(), TestError<T>>) {
    match r {
        Ok(()) => {}
        Err(TestError::Fail(why, input)) => {
            panic!("fuzz target {what} failed: {why}\nminimal input: {input:#?}")
        }
        Err(TestError::Abort(why)) => panic!("fuzz target {what} aborted: {why}"),
    }
}

//! `tallyd-byzantine`: TEST-ONLY. `tallyd` with a byzantine vote-extension
//! mode, for the end-to-end tests (`tests/tests/e2e_byzantine.rs`). Built
//! only with the `byzantine` feature:
//!
//! ```text
//! cargo build --release -p tally-node --features byzantine --bin tallyd-byzantine
//! ```
//!
//! Every command is `tallyd`'s; `start` runs exactly what `tallyd start`
//! runs, but serves `tally_node::byzantine::Byzantine` around the app, whose
//! vote extensions misbehave as `TALLY_BYZANTINE_MODE` says (`foreign-index`,
//! `oversized`, `garbage` or `silent`; required).

use clap::Parser;
use tally_node::byzantine::{Byzantine, Mode};
use tally_node::cli;

fn main() {
    if let Err(e) = run(cli::Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: cli::Cli) -> anyhow::Result<()> {
    let cli::Cli { home, command } = cli;
    match command {
        cli::Commands::Start(start) => {
            let mode = Mode::from_env()?;
            let address = hex::decode(tally_node::dealer::validator_address(&home)?)?;
            let ctx = cli::Context { home };
            start.execute_with(&ctx, |app| Byzantine::new(app, mode, address))
        }
        command => cli::Cli { home, command }.run(),
    }
}

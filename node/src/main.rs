//! `tallyd`: run a Tally node and talk to one. The commands are in [`cli`].

use clap::Parser;

mod cli;

fn main() {
    let cli = cli::Cli::parse();
    if let Err(e) = cli.run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

//! `tallyd`: run a Tally node and talk to one. The commands are in
//! [`tally_node::cli`].

use clap::Parser;
use tally_node::cli;

fn main() {
    let cli = cli::Cli::parse();
    if let Err(e) = cli.run() {
        // `tallyd status` printed its report; only its exit code is left.
        if let Some(u) = e.downcast_ref::<cli::status::Unhealthy>() {
            std::process::exit(i32::from(u.0));
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

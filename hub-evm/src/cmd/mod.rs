//! The `tally-evm` commands: one module per subcommand, each an `Args`
//! struct (clap derive) with `run`; [`common`] holds the argument groups
//! they share (endpoint, key, contract, the three together as the sender
//! of a hub transaction, sending) and the value parsers.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod address;
mod common;
mod deploy;
mod deposit;
mod govern_key;
mod hub_name;
mod keygen;
mod query;
mod withdraw;

/// Tally's EVM hub: deploy and operate the settlement contract.
#[derive(Debug, Parser)]
#[command(name = "tally-evm", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Deploy a hub contract; prints its address and hub name.
    Deploy(deploy::Args),
    /// Escrow credits for a user (sends credits * weiPerCredit wei).
    Deposit(deposit::Args),
    /// Read the hub's state.
    Query(query::Args),
    /// Approve a governed key rotation (as a governor).
    GovernKey(govern_key::Args),
    /// Take what withdrawals credited to the key's address.
    Withdraw(withdraw::Args),
    /// Make a new relay key file (mode 0600); prints its address.
    Keygen(keygen::Args),
    /// Print a key file's address.
    Address(address::Args),
    /// The hub name a contract deployed by an account at a nonce will have.
    HubName(hub_name::Args),
}

impl Command {
    fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Deploy(a) => a.run(),
            Command::Deposit(a) => a.run(),
            Command::Query(a) => a.run(),
            Command::GovernKey(a) => a.run(),
            Command::Withdraw(a) => a.run(),
            Command::Keygen(a) => a.run(),
            Command::Address(a) => a.run(),
            Command::HubName(a) => a.run(),
        }
    }
}

/// Parses the command line and runs the command; errors go to stderr
/// with their causes, exit code 1 (clap's own: 2).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tally-evm: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests;

//! `tally-evm`: the operator tool of Tally's EVM hub (deploy the contract,
//! deposit, query it, govern its key, withdraw, make a relay key). The
//! commands are in `cmd/`, one module each.

mod cmd;

fn main() -> std::process::ExitCode {
    cmd::main()
}

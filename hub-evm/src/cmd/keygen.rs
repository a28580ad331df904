//! `tally-evm keygen --out FILE`: a new random relay key, written 0600;
//! refuses to overwrite. Prints the address to fund.

use std::path::PathBuf;

use tally_hub_evm::RelayKey;

/// Arguments of `keygen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the key (must not exist).
    #[arg(long)]
    out: PathBuf,
}

impl Args {
    pub fn run(self) -> anyhow::Result<()> {
        let key = RelayKey::create(&self.out)?;
        println!("{}", key.address());
        Ok(())
    }
}

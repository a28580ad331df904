//! `tally-evm address --key FILE`: the key file's account address.

use super::common::Key;

/// Arguments of `address`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    key: Key,
}

impl Args {
    pub fn run(self) -> anyhow::Result<()> {
        println!("{}", self.key.load()?.address());
        Ok(())
    }
}

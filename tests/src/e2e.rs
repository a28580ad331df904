//! Helpers several end-to-end suites share: an ABCI query as JSON, a
//! poll with a deadline that shows the nodes' logs when it runs out, and
//! CometBFT's own view of the validator set.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine;
use sha2::{Digest, Sha256};
use tally_node::rpc::Rpc;

use crate::localnet::Localnet;

pub fn query(rpc: &Rpc, path: &str) -> Result<serde_json::Value> {
    let a = rpc.abci_query(path)?;
    ensure!(a.code == 0, "{path}: code {} {}", a.code, a.log);
    Ok(serde_json::from_slice(&a.value)?)
}

/// Polls `f` every 300 ms until it gives a value.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    net: &Localnet,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let mut last_err = String::new();
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = format!("{e:#}"),
        }
        if start.elapsed() > timeout {
            bail!(
                "{what}: not after {timeout:?} (last error: {last_err})\n{}",
                net.logs_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// CometBFT's own validator set on node `i`: lowercase hex address, hex
/// consensus key, power. The test's oracle for who validates.
pub fn comet_validators(net: &Localnet, i: usize) -> Result<Vec<(String, String, u64)>> {
    let v = net
        .rpc(i)
        .call("validators", serde_json::json!({"per_page": "100"}))?;
    let list = v["validators"].as_array().context("no validators")?;
    list.iter()
        .map(|x| {
            let pk = base64::engine::general_purpose::STANDARD
                .decode(x["pub_key"]["value"].as_str().unwrap_or(""))?;
            // CometBFT's address of an ed25519 key: SHA-256, first 20 bytes.
            let addr = hex::encode(&Sha256::digest(&pk)[..20]);
            ensure!(
                x["address"].as_str().map(str::to_lowercase) == Some(addr.clone()),
                "address of {x}"
            );
            let power = x["voting_power"].as_str().unwrap_or("0").parse()?;
            Ok((addr, hex::encode(pk), power))
        })
        .collect()
}

//! A batch signature made by Tally's code verifies in py_ecc (the Ethereum
//! reference BLS library) from docs/signing.md and the group key alone:
//! the Python side rebuilds the digest and message itself.

use std::process::{Command, ExitCode};

use anyhow::Context;

use tally_tests::harness::{self, Test};

use tally_settlement::bls::{self, deal, Kind};
use tally_settlement::dkg::types::ProposalAction;
use tally_settlement::proto::HubCall;
use tally_settlement::sync::batch_digest;

const TESTS: [Test<()>; 2] = [
    Test {
        name: "batch_signature_verifies_in_py_ecc",
        needs: &[],
        run: batch_signature_verifies_in_py_ecc,
    },
    Test {
        name: "rekeyed_key_and_batch_verify_in_py_ecc",
        needs: &[],
        run: rekeyed_key_and_batch_verify_in_py_ecc,
    },
];

/// Runs under the workspace's test runner so that `TALLY_SKIP_INTEROP`
/// shows up as a skip (counted apart by scripts/test.sh), never a pass.
fn main() -> ExitCode {
    let skip = std::env::var_os("TALLY_SKIP_INTEROP")
        .is_some()
        .then(|| "TALLY_SKIP_INTEROP is set".to_string());
    harness::run_unless(&TESTS, skip, || Ok(()))
}

fn batch_signature_verifies_in_py_ecc(_: &mut ()) -> anyhow::Result<()> {
    let coeffs: Vec<[u8; 64]> = (0..3u8)
        .map(|i| [i.wrapping_mul(31).wrapping_add(5); 64])
        .collect();
    let (pubs, shares) = deal(4, 3, &coeffs)?;
    let calls = vec![
        HubCall {
            id: 7,
            user: "alice".into(),
            provider: "acme-ai".into(),
            amount: 48,
            window: 29_933_635,
            kind: 0,
        },
        HubCall {
            id: 8,
            user: "bob".into(),
            provider: "acme-ai".into(),
            amount: 12,
            window: 29_933_635,
            kind: 0,
        },
    ];
    let chain_id = "tally-localnet";
    let digest = batch_digest("hub", 3, &calls);
    let msg = bls::message(chain_id, Kind::Batch, &digest);
    let parts: Vec<_> = shares[1..].iter().map(|s| s.sign(&msg)).collect();
    let sig = pubs.combine(&msg, &parts)?;
    let vector = serde_json::json!({
        "chain_id": chain_id,
        "group_key": hex::encode(pubs.group.compress()),
        "dst": String::from_utf8_lossy(bls::DST),
        "batch": {
            "chain": "hub", "nonce": 3,
            "calls": calls.iter().map(|c| serde_json::json!({
                "id": c.id, "user": c.user, "provider": c.provider, "amount": c.amount, "window": c.window,
            })).collect::<Vec<_>>(),
            "signature": hex::encode(sig.compress()),
        },
    });
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("vector.json");
    std::fs::write(&path, vector.to_string())?;
    let script = tally_tests::localnet::repo_root().join("tests/interop/verify_batch.py");
    let out = Command::new("python3").arg(&script).arg(&path).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "py_ecc did not verify the batch (install it with: python3 -m pip install py_ecc):\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(
        text.contains(&hex::encode(digest)),
        "py_ecc rebuilt another digest: {text}"
    );

    // And a tampered batch is refused.
    let mut bad = vector.clone();
    bad["batch"]["calls"][0]["amount"] = serde_json::json!(49);
    std::fs::write(&path, bad.to_string())?;
    let out = Command::new("python3").arg(&script).arg(&path).output()?;
    anyhow::ensure!(!out.status.success(), "py_ecc accepted a tampered batch");
    Ok(())
}

/// Runs `verify_batch.py` on `vector`; Ok with its output if it verified.
fn py_ecc(vector: &serde_json::Value) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("vector.json");
    std::fs::write(&path, vector.to_string())?;
    let script = tally_tests::localnet::repo_root().join("tests/interop/verify_batch.py");
    let out = Command::new("python3").arg(&script).arg(&path).output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    anyhow::ensure!(
        out.status.success(),
        "py_ecc did not verify:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

/// After two set changes (4 -> 5 -> 6 validators) the key rotated twice:
/// py_ecc verifies a batch signed by the third committee under the key the
/// hub holds after the two rotations (and not under the first key).
fn rekeyed_key_and_batch_verify_in_py_ecc(_: &mut ()) -> anyhow::Result<()> {
    use tally_tests::dkgnet::{DkgNet, CHAIN};
    let mut net = DkgNet::new(4, 3)?;
    net.until(14, |s| Ok(s.epoch()? == 1))?;
    let first = net.pin_hub()?;
    let mut group = first.clone();
    let mut members: Vec<usize> = (0..4).collect();
    for _ in 0..2 {
        let i = net.net.add_node()?;
        members.push(i);
        group = net.change(ProposalAction::Add, i, &group, &members)?;
    }
    anyhow::ensure!(net.epoch()? == 3, "two re-keys make epoch 3");
    anyhow::ensure!(group != first, "the key did not rotate");
    let switched = net.net.height as u64;
    // A batch formed after the switch: only the third committee signed it.
    let after = |s: &DkgNet| {
        s.net.hub.as_ref().and_then(|h| {
            h.settled
                .iter()
                .find(|(_, b)| b.formed_height > switched)
                .map(|(n, b)| (*n, b.clone()))
        })
    };
    net.until(120, |s| Ok(after(s).is_some()))?;
    let (nonce, b) = after(&net).context("a batch formed after the switch")?;
    let kv = net.net.nodes[0].app.committed_state();
    let mut calls = Vec::new();
    for id in &b.call_ids {
        calls.push(tally_settlement::sync::hub_call(kv, *id)?.context("call")?);
    }
    let vector = serde_json::json!({
        "chain_id": CHAIN,
        "group_key": hex::encode(&group),
        "dst": String::from_utf8_lossy(bls::DST),
        "batch": {
            "chain": b.chain, "nonce": nonce,
            "calls": calls.iter().map(|c| serde_json::json!({
                "id": c.id, "user": c.user, "provider": c.provider, "amount": c.amount, "window": c.window,
            })).collect::<Vec<_>>(),
            "signature": hex::encode(&b.signature),
        },
    });
    let text = py_ecc(&vector)?;
    anyhow::ensure!(
        text.contains(&hex::encode(&b.digest)),
        "py_ecc rebuilt another digest: {text}"
    );
    println!("batch {nonce} settled after the second re-key (switch at height {switched}) verifies in py_ecc");
    // The same signature under another key, or the first key, is refused.
    let mut bad = vector.clone();
    let other = tally_settlement::bls::deal(1, 1, &[[3u8; 64]])?.0.group;
    bad["group_key"] = serde_json::json!(hex::encode(other.compress()));
    anyhow::ensure!(
        py_ecc(&bad).is_err(),
        "py_ecc accepted the signature under another key"
    );
    bad["group_key"] = serde_json::json!(hex::encode(&first));
    anyhow::ensure!(
        py_ecc(&bad).is_err(),
        "py_ecc accepted the new committee's signature under the first key"
    );
    Ok(())
}

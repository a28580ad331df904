//! Governed parameters and gateways after genesis (ADR 0020) through the
//! in-process driver, on a keyed net of 4 whose genesis starts at app
//! version 3. The oracles: hand-computed windows (block time / 60 s) and
//! result codes, the test's own ledger of reports, and the driver's check
//! that every node reaches the same app hash at every height.

use anyhow::{ensure, Context, Result};
use ed25519_dalek::SigningKey;
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::proto::{
    AllowanceChange, GatewayChange, Outcome as CallOutcome, ParamChange, ParamValue, ReportUsage,
    UsageRecord, ValidatorProposal,
};
use tally_settlement::{sign_report, Code};
use tally_tests::dkgnet::{user_key, DkgNet, CHAIN};

/// A keyed net at app version 3 with its key made.
fn ready() -> Result<DkgNet> {
    let mut net = DkgNet::new_at(4, 3, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    Ok(net)
}

/// Proposes `p` from node 0 and approves it from 1 and 2 (3 of 4 equal
/// powers: more than 2/3); the proposal's id and final status.
fn pass(net: &mut DkgNet, p: ValidatorProposal) -> Result<(u64, ProposalStatus)> {
    let (code, id, log) = net.propose_gov(0, p)?;
    ensure!(code == Code::Ok, "proposal refused: {code:?} {log}");
    for v in [1, 2] {
        if net.status(id)? != ProposalStatus::Open {
            break;
        }
        ensure!(net.approve(v, id)? == Code::Ok, "approval by {v}");
    }
    Ok((id, net.status(id)?))
}

fn params(from_window: u64, values: &[(&str, &str)]) -> ValidatorProposal {
    ValidatorProposal {
        action: ProposalAction::Params.into(),
        params: Some(ParamChange {
            from_window,
            values: values
                .iter()
                .map(|(n, v)| ParamValue {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
        }),
        ..ValidatorProposal::default()
    }
}

fn gateway(op: u32, name: &str, key: Option<&SigningKey>) -> ValidatorProposal {
    ValidatorProposal {
        action: ProposalAction::Gateway.into(),
        gateway: Some(GatewayChange {
            op,
            name: name.into(),
            pubkey: key.map_or(Vec::new(), |k| k.verifying_key().to_bytes().to_vec()),
        }),
        ..ValidatorProposal::default()
    }
}

/// A report of `n` unbilled transient failures (no allowance needed),
/// signed by `key` with id `id`.
fn report(key: &SigningKey, id: u64, n: usize, now: u64) -> Vec<u8> {
    let mut rid = [0u8; 16];
    rid[..8].copy_from_slice(b"govtest!");
    rid[8..].copy_from_slice(&id.to_be_bytes());
    let rec = UsageRecord {
        user: "user-0".into(),
        provider: "prov-gov".into(),
        model: "m".into(),
        route: "r".into(),
        outcome: CallOutcome::Transient.into(),
        units: 1,
        amount: 0,
        ..Default::default()
    };
    sign_report(
        key,
        &ReportUsage {
            chain_id: CHAIN.into(),
            report_id: rid.to_vec(),
            expires_at: now + 300,
            records: vec![rec; n],
            route_calls: Vec::new(),
        },
    )
}

/// Runs a block carrying `tx`; its result code.
fn send(net: &mut DkgNet, tx: &[u8]) -> Result<Code> {
    let o = net.block(false, vec![tx.to_vec()])?;
    let pos = o
        .block
        .txs
        .iter()
        .position(|t| t.as_ref() == tx)
        .context("tx not included")?;
    Code::from_value(o.tx_results[pos].code).context("unknown code")
}

/// Runs a block carrying a report of `n` calls signed by `key` with id
/// `id`, expiring 300 s after the block; its result code.
fn report_from(net: &mut DkgNet, key: &SigningKey, id: u64, n: usize) -> Result<Code> {
    let r = report(key, id, n, net.net.now as u64);
    send(net, &r)
}

fn window_of(net: &DkgNet) -> u64 {
    net.net.now as u64 / 60
}

#[test]
fn a_parameter_change_takes_effect_at_its_window_on_every_node() -> Result<()> {
    let mut net = ready()?;
    let gw = tally_tests::traffic::gateway_key(3);
    // The next block's window is the one its header time falls in.
    let w = window_of(&net) + 2;
    // Into the running window: refused when proposed.
    let (code, _, log) = net.propose_gov(
        0,
        params(window_of(&net) - 1, &[("max_report_records", "3")]),
    )?;
    ensure!(
        code == Code::BadProposal && log.contains("not after the current window"),
        "{log}"
    );
    // Out of range: refused.
    let (code, _, log) = net.propose_gov(0, params(w, &[("max_report_records", "1001")]))?;
    ensure!(
        code == Code::BadProposal && log.contains("1..=1000"),
        "{log}"
    );
    let (id, status) = pass(&mut net, params(w, &[("max_report_records", "3")]))?;
    ensure!(
        status == ProposalStatus::Applied,
        "proposal {id}: {status:?}"
    );

    let mut next_id = 1;
    let mut changed_at = None;
    while window_of(&net) <= w {
        let now = net.net.now as u64;
        let in_w = window_of(&net) >= w;
        let code = report_from(&mut net, &gw, next_id, 5)?;
        next_id += 1;
        let want = if in_w { Code::TooManyRecords } else { Code::Ok };
        ensure!(
            code == want,
            "a 5-record report in window {}: {code:?}, want {want:?}",
            now / 60
        );
        let o = net.last.as_ref().context("no block")?;
        if o.events.iter().any(|e| e.r#type == "params_changed") {
            changed_at.get_or_insert(o.block.height);
        }
    }
    ensure!(changed_at.is_some(), "no params_changed event");
    for i in 0..4 {
        let p = tally_settlement::params(net.net.nodes[i].app.committed_state())?;
        ensure!(
            p.max_report_records == 3,
            "node{i}: {}",
            p.max_report_records
        );
    }
    ensure!(report_from(&mut net, &gw, next_id, 3)? == Code::Ok);
    Ok(())
}

#[test]
fn a_version_1_chain_refuses_governance_it_does_not_have() -> Result<()> {
    let mut net = DkgNet::new(4, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    let w = window_of(&net) + 2;
    let (code, _, log) = net.propose_gov(0, params(w, &[("max_report_records", "3")]))?;
    ensure!(
        code == Code::BadProposal && log.contains("needs app version 3"),
        "{log}"
    );
    let k = SigningKey::from_bytes(&[42; 32]);
    let (code, _, log) = net.propose_gov(0, gateway(1, "gw-new", Some(&k)))?;
    ensure!(
        code == Code::BadProposal && log.contains("needs app version 3"),
        "{log}"
    );
    Ok(())
}

#[test]
fn gateways_join_rotate_pause_and_leave_and_each_report_lands_once() -> Result<()> {
    let mut net = ready()?;
    let old = SigningKey::from_bytes(&[21; 32]);
    let new = SigningKey::from_bytes(&[22; 32]);

    // Unknown before it is added.
    ensure!(report_from(&mut net, &old, 1, 1)? == Code::UnknownGateway);
    let (_, s) = pass(&mut net, gateway(1, "gw-late", Some(&old)))?;
    ensure!(s == ProposalStatus::Applied, "add: {s:?}");
    // user-0 gives the new gateway an allowance, as to any other.
    let grant = tally_settlement::sign_allowance(
        &user_key("user-0"),
        &AllowanceChange {
            chain_id: CHAIN.into(),
            user: "user-0".into(),
            gateway: "gw-late".into(),
            max_per_window: 1_000,
            expires_at: net.net.now as u64 + 86_400,
            sequence: 1,
        },
    );
    ensure!(send(&mut net, &grant)? == Code::Ok, "allowance");
    ensure!(report_from(&mut net, &old, 1, 1)? == Code::Ok);
    // Adding the name or the key again is refused.
    let (code, _, log) = net.propose_gov(0, gateway(1, "gw-late", Some(&new)))?;
    ensure!(
        code == Code::BadProposal && log.contains("exists already"),
        "{log}"
    );

    // Rotation: the same report id signed again with the new key is still
    // a duplicate; the old key reports during its grace.
    let (_, s) = pass(&mut net, gateway(2, "gw-late", Some(&new)))?;
    ensure!(s == ProposalStatus::Applied, "rotate: {s:?}");
    let rotated_at = net.net.now as u64;
    ensure!(report_from(&mut net, &new, 1, 1)? == Code::DuplicateReport);
    ensure!(report_from(&mut net, &old, 2, 1)? == Code::Ok);
    ensure!(report_from(&mut net, &new, 3, 1)? == Code::Ok);
    // A second rotation waits for the first one's grace.
    let third = SigningKey::from_bytes(&[23; 32]);
    let (code, _, log) = net.propose_gov(0, gateway(2, "gw-late", Some(&third)))?;
    ensure!(code == Code::BadProposal && log.contains("grace"), "{log}");
    // After the grace (max_report_expiry_secs = 600 from the rotation).
    net.net.now = (rotated_at + 600) as i64;
    ensure!(report_from(&mut net, &old, 4, 1)? == Code::GatewayKeyRetired);
    ensure!(report_from(&mut net, &new, 5, 1)? == Code::Ok);

    // Suspended, resumed, removed.
    pass(&mut net, gateway(3, "gw-late", None))?;
    ensure!(report_from(&mut net, &new, 6, 1)? == Code::GatewayInactive);
    pass(&mut net, gateway(4, "gw-late", None))?;
    ensure!(report_from(&mut net, &new, 7, 1)? == Code::Ok);
    pass(&mut net, gateway(5, "gw-late", None))?;
    ensure!(report_from(&mut net, &new, 8, 1)? == Code::GatewayInactive);
    let (code, _, log) = net.propose_gov(0, gateway(4, "gw-late", None))?;
    ensure!(
        code == Code::BadProposal && log.contains("was removed"),
        "{log}"
    );

    // What it reported stays: 5 accepted reports of one transient call
    // each (ids 1, 2, 3, 5, 7), on every node.
    for i in 0..4 {
        let kv = net.net.nodes[i].app.committed_state();
        let r = tally_settlement::query::query(kv, "/sla/provider/prov-gov");
        ensure!(r.code == Code::Ok, "node{i}: {}", r.log);
        let v: serde_json::Value = serde_json::from_slice(&r.value)?;
        let transient: u64 = v["records"]
            .as_array()
            .context("no records")?
            .iter()
            .map(|r| r["transient"].as_u64().unwrap_or(0))
            .sum();
        ensure!(transient == 5, "node{i}: {transient} transient calls: {v}");
    }
    Ok(())
}

//! Software upgrades (ADR 0019) through the in-process driver: a plan
//! approved by more than 2/3 of the power switches every node to app
//! version 2 at its height, with version 2's migration (report ids move to
//! expiry buckets) run first thing in that block. The oracles are the
//! driver's model of CometBFT (the header of H + 1 carries the version
//! FinalizeBlock(H) returned; Info must answer the next header's version;
//! app hashes agree on every node at every height, replayed or not), the
//! replay rule (a report accepted before the switch is still a duplicate
//! after it, with the body hash it was accepted with) and the test's own
//! ledger of what it sent. Another test does the same for app version
//! 6, whose ids are side state (ADR 0025), and the last switches to app
//! version 7 and prunes old windows' SLA records by a params proposal
//! (ADR 0026), the horizon checked against the test's own window count.

use anyhow::{ensure, Context, Result};
use tally_abci::HaltReason;
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::proto::{ParamChange, ParamValue, UpgradePlan, ValidatorProposal};
use tally_settlement::upgrade::{applied_plan, pending_plan, CANCEL_MARGIN_BLOCKS};
use tally_settlement::{state, Code};
use tally_store::KvRead;
use tally_tests::dkgnet::DkgNet;
use tendermint_abci::Application;
use tendermint_proto::v0_38::abci::{RequestFinalizeBlock, RequestInfo, RequestProcessProposal};

fn plan(name: &str, version: u64, height: u64) -> UpgradePlan {
    UpgradePlan {
        name: name.into(),
        app_version: version,
        height,
        binary_sha256: vec![0xab; 32],
        info: "tally v2: report ids in expiry buckets".into(),
    }
}

/// Proposes `p` from node 0 and approves it from 1 and 2 (3 of 4 equal
/// powers: more than 2/3); returns the proposal id.
fn schedule(net: &mut DkgNet, p: UpgradePlan) -> Result<u64> {
    let (code, id, log) = net.propose_upgrade(0, ProposalAction::Upgrade, p)?;
    ensure!(code == Code::Ok, "plan refused: {code:?} {log}");
    for v in [1, 2] {
        ensure!(net.approve(v, id)? == Code::Ok, "approval by {v}");
    }
    ensure!(
        net.status(id)? == ProposalStatus::Applied,
        "plan {id} is {:?}",
        net.status(id)?
    );
    Ok(id)
}

fn count(kv: &impl KvRead, prefix: &[u8]) -> Result<usize> {
    Ok(kv.scan_prefix(prefix, usize::MAX)?.len())
}

fn total_balance(net: &DkgNet) -> Result<u64> {
    let kv = net.net.nodes[0].app.committed_state();
    let mut sum = 0;
    for u in &net.traffic.users {
        sum += tally_settlement::balance(kv, u)?;
    }
    Ok(sum)
}

/// A keyed net of 4 with its key made and every hub deposit credited.
fn ready() -> Result<DkgNet> {
    ready_at(0)
}

/// [`ready`] with genesis at app `version` (0: not set, version 1).
fn ready_at(version: u64) -> Result<DkgNet> {
    let mut net = DkgNet::new_at(4, 3, version)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    net.pin_hub()?;
    net.until(40, |s| Ok(s.settled() >= 1))?;
    Ok(net)
}

/// Schedules app `version` 25 blocks ahead and runs blocks until the
/// header after its height carries it; returns the height.
fn switch_to(net: &mut DkgNet, version: u64) -> Result<u64> {
    let h = net.net.height as u64 + 25;
    schedule(net, plan(&format!("v{version}"), version, h))?;
    while (net.net.height as u64) < h + 1 {
        net.block(true, Vec::new())?;
    }
    ensure!(net.net.header_version_at(h as i64 + 1) == version);
    Ok(h)
}

/// A node joins by state sync from a snapshot taken after height `h` and
/// follows the chain (its app hash checked against the others').
fn join_after(net: &mut DkgNet, h: u64) -> Result<()> {
    net.net.serve_snapshots(0, 5)?;
    for _ in 0..6 {
        net.block(true, Vec::new())?;
    }
    let mut synced = net.net.join_by_state_sync(0)?;
    ensure!(
        synced.restored as u64 > h,
        "snapshot from before the switch"
    );
    net.block(true, Vec::new())?;
    synced.follow(&net.net)?;
    Ok(())
}

/// Runs a block carrying `report` (and no other usage); its result code.
fn send_report(net: &mut DkgNet, report: &[u8]) -> Result<Code> {
    let o = net.block(false, vec![report.to_vec()])?;
    let pos = o
        .block
        .txs
        .iter()
        .position(|t| t.as_ref() == report)
        .context("report not included")?;
    Code::from_value(o.tx_results[pos].code).context("unknown code")
}

/// Sends three reports of 4 calls, one a block; each must be accepted.
fn accepted_reports(net: &mut DkgNet) -> Result<Vec<Vec<u8>>> {
    let mut early = Vec::new();
    for _ in 0..3 {
        let recs = net.traffic.records(4, 20);
        let now = net.net.now as u64;
        let r = net.traffic.report(recs, now, 300);
        ensure!(send_report(net, &r)? == Code::Ok, "early report refused");
        early.push(r);
    }
    Ok(early)
}

/// Each of `reports`, sent again, is a duplicate (code 7) whose result
/// carries the body hash it was accepted with.
fn ensure_duplicates(net: &mut DkgNet, reports: &[Vec<u8>]) -> Result<()> {
    for r in reports {
        let o = net.block(false, vec![r.clone()])?;
        let pos = o.block.txs.iter().position(|t| t.as_ref() == r.as_slice());
        let res = &o.tx_results[pos.context("not included")?];
        ensure!(
            res.code == Code::DuplicateReport.value(),
            "code {}",
            res.code
        );
        ensure!(res.data.len() == 32, "duplicate without the body hash");
    }
    Ok(())
}

#[test]
fn every_node_switches_at_the_height_with_the_migration_first() -> Result<()> {
    let mut net = ready()?;
    // Reports accepted under version 1, kept to be sent again later.
    let early = accepted_reports(&mut net)?;
    let kv = net.net.nodes[0].app.committed_state();
    ensure!(
        count(kv, b"rid/")? >= 3 && count(kv, b"rb/")? == 0,
        "version 1 layout"
    );
    let h = net.net.height as u64 + 25;
    schedule(&mut net, plan("v2", 2, h))?;
    let pending = pending_plan(net.net.nodes[0].app.committed_state())?.context("no plan")?;
    ensure!(pending.height == h && pending.app_version == 2);

    // Node 3 is down from H - 1 on (it restarts exactly at H); node 1
    // crashes in H after FinalizeBlock and before Commit.
    let before = total_balance(&net)?;
    while (net.net.height as u64) < h - 2 {
        net.block(true, Vec::new())?;
    }
    net.net.stop(3);
    net.block(true, Vec::new())?;
    ensure!(net.net.height as u64 == h - 1);
    let o = net.net.block_crashing(Vec::new(), 5, 1)?;
    ensure!(o.block.height as u64 == h);
    let applied = o
        .events
        .iter()
        .find(|e| e.r#type == "upgrade_applied")
        .context("no upgrade_applied event at H")?;
    let migrated = applied
        .attributes
        .iter()
        .find(|a| a.key == "migrated")
        .map(|a| a.value.clone())
        .unwrap_or_default();
    ensure!(migrated.parse::<u64>()? >= 3, "migrated {migrated}");
    net.net.restart(3)?;

    // The header of H carries version 1, the header of H + 1 version 2.
    ensure!(net.net.header_version_at(h as i64) == 1);
    ensure!(net.net.header_version_at(h as i64 + 1) == 2);
    for i in 0..4 {
        net.net.ensure_app_version(i)?;
        let kv = net.net.nodes[i].app.committed_state();
        ensure!(state::chain::app_version(kv)? == 2, "node{i}");
        ensure!(
            count(kv, b"rid/")? == 0 && count(kv, b"rexp/")? == 0,
            "node{i} kept v1 ids"
        );
        ensure!(count(kv, b"rb/")? >= 3, "node{i} has no bucketed ids");
        let done = applied_plan(kv, "v2")?.context("no applied record")?;
        ensure!(done.height == h);
        ensure!(pending_plan(kv)?.is_none());
    }

    // A report accepted under version 1 is still a duplicate, with the
    // body hash it was accepted with; a fresh one lands once.
    ensure_duplicates(&mut net, &early)?;
    let recs = net.traffic.records(4, 20);
    let now = net.net.now as u64;
    let fresh = net.traffic.report(recs, now, 300);
    ensure!(send_report(&mut net, &fresh)? == Code::Ok);
    ensure!(send_report(&mut net, &fresh)? == Code::DuplicateReport);

    // Usage kept flowing through the switch (the `true` blocks), and
    // batches keep settling, each once, under version 2.
    let settled = net.settled();
    net.until(60, |s| Ok(s.settled() > settled))?;
    ensure!(
        total_balance(&net)? < before,
        "no usage was charged across the switch"
    );

    // A node replaying from genesis and a node joining by state sync
    // after H reach the same app hashes (and the same app version).
    let joined = net.net.add_node()?;
    net.net.ensure_app_version(joined)?;
    net.net.serve_snapshots(0, 5)?;
    for _ in 0..6 {
        net.block(true, Vec::new())?;
    }
    let mut synced = net.net.join_by_state_sync(0)?;
    ensure!(synced.restored as u64 > h, "snapshot from before H");
    net.block(true, Vec::new())?;
    synced.follow(&net.net)?;
    // A release without version 2 restoring a snapshot taken after H stops
    // at the first block it would run, instead of running version 2 state.
    while net.net.height % 5 != 2 {
        net.block(true, Vec::new())?;
    }
    let err = net
        .net
        .join_by_state_sync_as(0, 1)
        .err()
        .context("a release without version 2 ran version 2 state")?;
    ensure!(format!("{err:#}").contains("UpgradeNeeded"), "{err:#}");
    Ok(())
}

#[test]
fn a_node_without_the_version_stops_before_the_height_and_the_new_binary_goes_on() -> Result<()> {
    let mut net = ready()?;
    // Node 3 runs a release that carries app version 1 only.
    net.net.nodes[3].app.set_max_app_version(1);
    let h = net.net.height as u64 + 25;
    schedule(&mut net, plan("v2", 2, h))?;
    while (net.net.height as u64) < h - 1 {
        net.block(true, Vec::new())?;
    }
    let old = &net.net.nodes[3].app;
    // Started now, it would refuse to run (tallyd exits 4).
    let stop = old.upgrade_stop().context("the old release would start")?;
    ensure!(
        stop.height == h && stop.message.contains("app version 2"),
        "{stop:?}"
    );
    // It refuses H's proposal and halts with the plan, before executing
    // anything of H: it votes for nothing it cannot run.
    let r = old.process_proposal(RequestProcessProposal {
        height: h as i64,
        ..Default::default()
    });
    ensure!(r.status == 2, "status {}", r.status);
    let halts = net.net.nodes[3].halts.events();
    ensure!(
        halts.len() == 1 && halts[0].reason == HaltReason::UpgradeNeeded,
        "{halts:?}"
    );
    let info: serde_json::Value = serde_json::from_str(
        halts[0]
            .upgrade_info
            .as_deref()
            .context("no upgrade info")?,
    )?;
    ensure!(info["name"] == "v2" && info["app_version"] == 2 && info["height"] == h);
    let f = old.finalize_block(RequestFinalizeBlock {
        height: h as i64,
        ..Default::default()
    });
    ensure!(f.app_hash.is_empty(), "the old release executed H");
    ensure!(old.info(RequestInfo::default()).last_block_height == h as i64 - 1);

    // The other three go on; the operator swaps the binary and node 3
    // replays H and what followed to the network's hashes.
    net.net.stop(3);
    for _ in 0..3 {
        net.block(true, Vec::new())?;
    }
    net.net.restart(3)?;
    ensure!(
        net.net.nodes[3].app.max_app_version() == tally_settlement::upgrade::LATEST_APP_VERSION
    );
    net.block(true, Vec::new())?;
    ensure!(state::chain::app_version(net.net.nodes[3].app.committed_state())? == 2);
    Ok(())
}

#[test]
fn plans_are_refused_when_they_do_not_fit_and_cancelled_only_before_the_margin() -> Result<()> {
    let mut net = DkgNet::new(4, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    let now = net.net.height as u64;
    let refused = [
        (plan("v3", 3, now + 40), "not the next version"),
        (plan("v2", 2, now + 5), "less than 20 blocks"),
        (plan("Bad Name", 2, now + 40), "not 1 to 64 bytes"),
        (
            UpgradePlan {
                binary_sha256: vec![1; 31],
                ..plan("v2", 2, now + 40)
            },
            "not 32",
        ),
    ];
    for (p, why) in refused {
        let (code, _, log) = net.propose_upgrade(0, ProposalAction::Upgrade, p)?;
        ensure!(
            code == Code::BadProposal && log.contains(why),
            "{code:?} {log}"
        );
    }

    // Two plans open at once: the first accepted wins; the second is
    // checked again when accepted and refused with the reason.
    let h = net.net.height as u64 + 60;
    let (c1, first, _) = net.propose_upgrade(0, ProposalAction::Upgrade, plan("v2", 2, h))?;
    let (c2, second, _) = net.propose_upgrade(1, ProposalAction::Upgrade, plan("v2b", 2, h + 5))?;
    ensure!(c1 == Code::Ok && c2 == Code::Ok);
    for v in [1, 2] {
        net.approve(v, first)?;
    }
    for v in [0, 2] {
        net.approve(v, second)?;
    }
    ensure!(net.status(first)? == ProposalStatus::Applied);
    ensure!(net.status(second)? == ProposalStatus::Refused);
    let kv = net.net.nodes[0].app.committed_state();
    let reason = tally_settlement::dkg::state::proposal(kv, second)?
        .context("second")?
        .reason;
    ensure!(reason.contains("already pending"), "{reason}");

    // Cancelled well before the height: no plan, nothing switches.
    let (code, cancel, log) = net.propose_upgrade(
        2,
        ProposalAction::CancelUpgrade,
        UpgradePlan {
            name: "v2".into(),
            ..UpgradePlan::default()
        },
    )?;
    ensure!(code == Code::Ok, "{log}");
    for v in [0, 1] {
        net.approve(v, cancel)?;
    }
    ensure!(net.status(cancel)? == ProposalStatus::Applied);
    ensure!(pending_plan(net.net.nodes[0].app.committed_state())?.is_none());
    while (net.net.height as u64) <= h {
        net.block(true, Vec::new())?;
    }
    ensure!(state::chain::app_version(net.net.nodes[0].app.committed_state())? == 1);
    ensure!(net.net.header_version_at(h as i64 + 1) == 1);

    // A cancellation inside the margin is refused; the plan runs.
    let h2 = net.net.height as u64 + 25;
    schedule(&mut net, plan("v2c", 2, h2))?;
    while (net.net.height as u64) < h2 - CANCEL_MARGIN_BLOCKS - 1 {
        net.block(true, Vec::new())?;
    }
    let (code, late, _) = net.propose_upgrade(
        0,
        ProposalAction::CancelUpgrade,
        UpgradePlan {
            name: "v2c".into(),
            ..UpgradePlan::default()
        },
    )?;
    // Opened at h2 - 10: already inside the margin.
    ensure!(code == Code::BadProposal && late == 0, "{code:?}");
    while (net.net.height as u64) <= h2 {
        net.block(true, Vec::new())?;
    }
    ensure!(state::chain::app_version(net.net.nodes[0].app.committed_state())? == 2);
    ensure!(net.net.header_version_at(h2 as i64 + 1) == 2);
    Ok(())
}

/// App version 6 (ADR 0025): a network at version 5 switches by plan; the
/// ids version 5 filed in the tree stay there and are still duplicates
/// (with their body hashes) until their buckets end, new ids are side
/// state with digests in the tree, a node joining by state sync after the
/// switch checks them and follows, and once the last version-5 bucket
/// ends no tree id and no marker is left on any node.
#[test]
fn version_5_ids_stay_duplicates_across_the_switch_to_side_state() -> Result<()> {
    let mut net = ready_at(5)?;
    let early = accepted_reports(&mut net)?;
    let kv = net.net.nodes[0].app.committed_state();
    ensure!(
        count(kv, b"rb/")? >= 3 && count(kv, b"\x01rb/")? == 0,
        "version 5 layout"
    );
    let h = switch_to(&mut net, 6)?;
    for i in 0..4 {
        net.net.ensure_app_version(i)?;
        let kv = net.net.nodes[i].app.committed_state();
        ensure!(state::chain::app_version(kv)? == 6, "node{i}");
        ensure!(count(kv, b"meta/tree_ids")? == 1, "node{i}: no marker");
        ensure!(count(kv, b"rb/")? >= 3, "node{i} dropped version-5 ids");
        ensure!(count(kv, b"\x01rb/")? >= 1, "node{i} has no side ids");
        ensure!(count(kv, b"rbd/")? >= 1, "node{i} has no digests");
        ensure!(
            tally_settlement::state::replay::check_side_ids(kv).is_ok(),
            "node{i}'s side ids do not match its digests"
        );
    }
    ensure_duplicates(&mut net, &early)?;
    let recs = net.traffic.records(4, 20);
    let now = net.net.now as u64;
    let fresh = net.traffic.report(recs, now, 300);
    ensure!(send_report(&mut net, &fresh)? == Code::Ok);
    ensure!(send_report(&mut net, &fresh)? == Code::DuplicateReport);

    join_after(&mut net, h)?;

    // Past the last bucket a version-5 id can be in: nothing of them left.
    let end = net.net.now + 900;
    while net.net.now < end {
        net.block(true, Vec::new())?;
    }
    for i in 0..4 {
        let kv = net.net.nodes[i].app.committed_state();
        ensure!(count(kv, b"rb/")? == 0, "node{i} kept version-5 ids");
        ensure!(count(kv, b"meta/tree_ids")? == 0, "node{i} kept the marker");
        ensure!(count(kv, b"\x01rb/")? >= 1, "node{i}: usage stopped");
    }
    Ok(())
}

/// A `params` proposal setting `sla_keep_windows` from `from_window`.
fn keep_windows(from_window: u64, keep: u64) -> ValidatorProposal {
    ValidatorProposal {
        action: ProposalAction::Params.into(),
        params: Some(ParamChange {
            from_window,
            values: vec![ParamValue {
                name: "sla_keep_windows".into(),
                value: keep.to_string(),
            }],
        }),
        ..ValidatorProposal::default()
    }
}

/// The windows of a node's route records (`rr/`: the last 8 bytes, as
/// docs/proofs.md gives the layout).
fn record_windows(kv: &impl KvRead) -> Result<Vec<u64>> {
    Ok(kv
        .scan_prefix(b"rr/", usize::MAX)?
        .iter()
        .map(|(k, _)| u64::from_be_bytes(k[k.len() - 8..].try_into().unwrap()))
        .collect())
}

#[test]
fn version_7_prunes_old_windows_once_a_proposal_sets_the_parameter() -> Result<()> {
    const SECS: u64 = 60;
    const KEEP: u64 = 2;
    let mut net = ready_at(6)?;
    let window = |net: &DkgNet| net.net.now as u64 / SECS;
    // Before version 7 the parameter is refused when proposed.
    let w = window(&net);
    let (code, _, log) = net.propose_gov(0, keep_windows(w + 2, KEEP))?;
    ensure!(
        code != Code::Ok && log.contains("from app version 7"),
        "{code:?} {log}"
    );
    let h = switch_to(&mut net, 7)?;
    let oldest = *record_windows(net.net.nodes[0].app.committed_state())?
        .iter()
        .min()
        .context("no records")?;

    let from = window(&net) + 1;
    let (code, id, log) = net.propose_gov(0, keep_windows(from, KEEP))?;
    ensure!(code == Code::Ok, "proposal refused: {code:?} {log}");
    for v in [1, 2] {
        if net.status(id)? == ProposalStatus::Open {
            ensure!(net.approve(v, id)? == Code::Ok, "approval by {v}");
        }
    }
    // Reports for KEEP + 2 more windows after the change.
    let until = (from + KEEP + 2) * SECS;
    while (net.net.now as u64) < until {
        net.block(true, Vec::new())?;
    }
    let last = (net.net.now as u64 - 1) / SECS;
    let kept = last - KEEP;
    ensure!(
        kept > oldest,
        "nothing to prune: oldest {oldest}, kept {kept}"
    );
    let provider = net.traffic.records(1, 1)[0].provider.clone();
    let path = |w: u64| format!("/sla/provider/{provider}/{w}");
    for i in 0..4 {
        let app = &net.net.nodes[i].app;
        let kv = app.committed_state();
        ensure!(
            tally_settlement::state::prune::kept_from(kv)? == kept,
            "node{i}: horizon"
        );
        let windows = record_windows(kv)?;
        ensure!(
            windows.iter().all(|w| *w >= kept) && windows.contains(&last),
            "node{i}: record windows {:?}",
            windows.iter().min()
        );
        let r = app.query_path(&path(oldest));
        ensure!(r.code == Code::HeightUnavailable, "node{i}: {}", r.log);
        let r = app.query_path("/windows");
        let v: serde_json::Value = serde_json::from_slice(&r.value)?;
        ensure!(v["kept_from"] == kept && v["windows"][0]["window"].as_u64() >= Some(kept));
    }

    // A node that joins by state sync after the switch follows.
    join_after(&mut net, h)?;
    Ok(())
}

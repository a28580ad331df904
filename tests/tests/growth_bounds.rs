//! State growth over many windows and epochs (issue 32, item 4), through
//! the in-process driver: 55 settlement windows of usage on four keyed
//! validators at app version 3, with a re-key every ten windows up to the
//! 45th (five key epochs after the first), a proposal every seven windows that
//! nobody else approves and that expires, a hub deposit every five
//! windows, and every closed window's calls settled on the modelled hub.
//!
//! After every window from the tenth on, the keys of each state namespace
//! (the prefixes of `keys::LAYOUT`) are counted on validator 0's committed
//! store. Namespaces that hold working state must stay under a bound
//! written here from the parameters and the traffic's shape, not read
//! from the code: DKG round data of at most two rounds (the running one
//! and the last that made a key), replay ids of the reports not yet
//! expired, allowance use one entry per (user, gateway), hub calls and
//! retention entries of at most `settled_retention_windows` + 2 windows,
//! open proposals of the schedule below. And the largest count in windows
//! 40 to 55 may not exceed the largest in windows 10 to 25 by more than a
//! small constant. Namespaces that are history by design (route records
//! and their indexes and totals, ADR 0005; key rotations, ADR 0017;
//! proposals; batch records) must grow exactly as the activity that
//! writes them: one rotation per re-key, one proposal record per
//! proposal, one batch record per nonce.
//!
//! Validator 0 also runs `tallyd`'s DKG participant (`tally_node`) on a
//! real temporary home after every block: after each key switch the home
//! holds the share file of the active epoch (and of a key waiting to
//! activate), never one of an older epoch, and no round key of a round
//! that is over.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use tally_settlement::dkg::state as dst;
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::keys::LAYOUT;
use tally_store::KvRead;
use tally_tests::dkgnet::{user_key, DkgNet, CHAIN, STEP, T0};
use tally_tests::driver::{round_key, Net};
use tally_tests::hub::Hub;
use tally_tests::traffic::{gateway_key, Traffic};

const N: usize = 4;
const WINDOW: i64 = 60;
const RETENTION: u64 = 3;
const EXPIRY_BLOCKS: u64 = 24;
/// Seconds a report's id is remembered (`DkgNet::block`'s report ttl).
const REPORT_TTL: u64 = 120;
const WINDOWS: usize = 55;

fn net() -> Result<DkgNet> {
    let key = gateway_key(3);
    let traffic = Traffic::new(11, key.clone(), CHAIN, [4, 2, 2, 2]);
    let mut net = Net::keyed(N, CHAIN, T0)?;
    net.genesis_version = 3;
    let state = serde_json::json!({
        "params": {
            "settlement_window_secs": WINDOW, "hub_chain": "hub", "max_batch_calls": 50,
            "dkg_phase_blocks": 3, "settled_retention_windows": RETENTION,
            "proposal_expiry_blocks": EXPIRY_BLOCKS,
        },
        "gateways": [{"name": "gw-test", "pubkey": hex::encode(key.verifying_key().to_bytes())}],
        "allowances": tally_tests::traffic::allowances(&traffic.users, "gw-test"),
        "balances": traffic.users.iter().map(|u| serde_json::json!({"user": u, "amount": 10_000_000})).collect::<Vec<_>>(),
        "users": traffic.users.iter().map(|u| serde_json::json!({"name": u, "pubkey": hex::encode(user_key(u).verifying_key().to_bytes())})).collect::<Vec<_>>(),
    });
    net.init(&state.to_string())?;
    net.hub = Some(Hub::default());
    Ok(DkgNet {
        net,
        traffic,
        last: None,
    })
}

/// Keys per `LAYOUT` prefix (the longest prefix that matches), and the
/// keys no prefix names.
fn count(kv: &impl KvRead) -> Result<(BTreeMap<String, u64>, u64)> {
    let mut out: BTreeMap<String, u64> = LAYOUT
        .iter()
        .map(|(p, _)| (String::from_utf8_lossy(p).into_owned(), 0))
        .collect();
    let mut stray = 0u64;
    // Store metadata and the tree live under 0x00: scans skip them.
    kv.for_each(&[0x01], &[0xff], &mut |k, _| {
        let best = LAYOUT
            .iter()
            .filter(|(p, _)| k.starts_with(p))
            .max_by_key(|(p, _)| p.len());
        match best {
            Some((p, _)) => {
                *out.entry(String::from_utf8_lossy(p).into_owned())
                    .or_default() += 1
            }
            None => stray += 1,
        }
        true
    })?;
    Ok((out, stray))
}

/// The participant of validator 0 on a real home, given the driver's
/// round keys (as its own files) so that it derives the chain's shares.
struct Files {
    home: tempfile::TempDir,
    p: tally_node::participant::Participant,
}

impl Files {
    fn new(net: &DkgNet) -> Result<Self> {
        let home = tempfile::tempdir()?;
        std::fs::create_dir_all(home.path().join("data"))?;
        let node = &net.net.nodes[0];
        let key = node.consensus.clone().context("keyed")?;
        let p = tally_node::participant::Participant::new(
            node.app.clone(),
            home.path(),
            // Nothing listens: its sends fail, as a node whose CometBFT is
            // down; the driver sends node 0's messages.
            "http://127.0.0.1:9",
            key,
            Vec::new(),
        );
        Ok(Self { home, p })
    }

    /// Writes node 0's key of the running round where `tallyd` keeps it,
    /// then runs the participant's step for height `h`.
    fn step(&mut self, net: &DkgNet, h: u64) -> Result<()> {
        let kv = net.net.nodes[0].app.committed_state();
        if let Some(c) = dst::ceremony(kv)? {
            let path = tally_node::dkgkey::round_key_path(self.home.path(), c.round);
            if !path.exists() && c.end > h {
                let seed = net.net.nodes[0].enc.as_ref().context("seed")?;
                let k = round_key(seed, c.round);
                let text = serde_json::json!({
                    "secret": hex::encode(k.to_bytes()),
                    "public_key": hex::encode(k.public().compress()),
                });
                std::fs::write(&path, text.to_string())?;
            }
        }
        self.p.step(h);
        Ok(())
    }

    fn share_epochs(&self) -> Vec<u64> {
        let mut e: Vec<u64> =
            tally_node::dkgkey::newest_epoch_share_files(self.home.path(), usize::MAX)
                .into_iter()
                .map(|(e, _)| e)
                .collect();
        e.sort_unstable();
        e
    }

    fn round_files(&self) -> Vec<u64> {
        tally_node::dkgkey::round_key_files(self.home.path())
    }

    fn path(&self) -> &Path {
        self.home.path()
    }
}

/// Every file rule after a block: no share of an epoch below the active
/// one; the active epoch's share once derived; round keys only of the
/// running round or of the last one while its share is not held.
fn check_files(files: &Files, net: &DkgNet) -> Result<()> {
    let kv = net.net.nodes[0].app.committed_state();
    let Some(active) = dst::active_key_record(kv)? else {
        return Ok(());
    };
    let epochs = files.share_epochs();
    let next = dst::next_key(kv)?
        .map(|n| dst::next_key_record(&n).map(|k| k.epoch))
        .transpose()?;
    let allowed: Vec<u64> = std::iter::once(active.epoch).chain(next).collect();
    ensure!(
        epochs.iter().all(|e| allowed.contains(e)),
        "share files {epochs:?} in {} with epoch {} active (next {next:?})",
        files.path().display(),
        active.epoch
    );
    ensure!(
        epochs.contains(&active.epoch),
        "no share file of the active epoch {}: {epochs:?}",
        active.epoch
    );
    let running = dst::ceremony(kv)?.map(|c| c.round);
    let last = dst::last_ceremony(kv)?.map(|c| c.round);
    for r in files.round_files() {
        ensure!(
            Some(r) == running || Some(r) == last,
            "round key {r} kept (running {running:?}, last {last:?})"
        );
    }
    Ok(())
}

/// Upper bounds of the working-state namespaces, from the parameters and
/// the traffic's shape (users U, providers P, one gateway).
fn bounds(users: u64, providers: u64) -> BTreeMap<&'static str, u64> {
    let n = N as u64;
    let pairs = users * providers;
    let blocks_per_window = (WINDOW / STEP) as u64;
    // A report id lives REPORT_TTL seconds; version 2+ buckets them by 120
    // s, so one may stay up to a bucket longer.
    let ids = (REPORT_TTL + 120) / STEP as u64 + 2;
    // Calls: the windows not yet settled (the closing one and the one
    // being batched) and those kept for RETENTION windows.
    let call_windows = RETENTION + 3;
    let batches_per_window = pairs.div_ceil(50) + 1;
    BTreeMap::from([
        ("cer/k/", 2 * n),
        ("cer/d/", 2 * n),
        ("cer/a/", 2 * n * n),
        ("cer/r/", 2 * n * n),
        ("propopen/", 2),
        ("val/", n),
        ("rb/", ids),
        ("aspent/", users),
        ("allow/", users),
        ("bal/", users),
        ("ukey/", users),
        ("useq/", users),
        ("owed/", 2 * pairs),
        ("closing/", 2),
        ("hcp/", 2 * pairs),
        ("hc/", call_windows * pairs),
        ("sret/", call_windows * batches_per_window),
        // Partials: a message's partials expire after partial_expiry_blocks
        // (50); at most one batch, one hub result, one deposit range and
        // one rotation are signed at a time, each by at most n signers.
        ("pmsg/", 4 * (50 / blocks_per_window + 2)),
        ("pexp/", 4 * (50 / blocks_per_window + 2)),
        ("psig/", 4 * n * (50 / blocks_per_window + 2)),
        ("sync/", 1),
        ("hubcur/", 1),
        ("depseq/", 1),
    ])
}

#[test]
fn state_stays_bounded_over_fifty_five_windows_and_six_epochs() -> Result<()> {
    let mut net = net()?;
    let mut files = Files::new(&net)?;
    while net.epoch()? == 0 {
        ensure!(net.net.height < 20, "no first key");
        net.block(true, Vec::new())?;
        let h = net.net.height as u64;
        files.step(&net, h)?;
        check_files(&files, &net).with_context(|| format!("height {h}"))?;
    }
    net.pin_hub()?;
    let users = net.traffic.users.clone();
    let providers = net.traffic.providers.len() as u64;
    let limits = bounds(users.len() as u64, providers);
    let mut samples: Vec<(usize, BTreeMap<String, u64>)> = Vec::new();
    let mut proposals = 0u64;
    let mut rekeys = 0u64;
    let mut deposits = 0u64;
    let first_window = net.net.now / WINDOW;
    for w in 1..=WINDOWS {
        // Run to the first block of the next window.
        while net.net.now / WINDOW < first_window + w as i64 {
            net.block(true, Vec::new())?;
            let h = net.net.height as u64;
            if let Some(hub) = net.net.hub.as_mut() {
                hub.tip = h;
            }
            files.step(&net, h)?;
            check_files(&files, &net).with_context(|| format!("height {h}"))?;
        }
        if w % 10 == 5 && w < 50 {
            let (code, id) = net.propose(0, ProposalAction::Rekey, 0, 0)?;
            ensure!(code.value() == 0, "re-key refused: {code:?}");
            ensure!(net.approve(1, id)?.value() == 0 && net.approve(2, id)?.value() == 0);
            ensure!(net.status(id)? == ProposalStatus::Accepted);
            proposals += 1;
            rekeys += 1;
        }
        if w % 7 == 3 {
            // Nobody else approves: it expires EXPIRY_BLOCKS later.
            let (code, _) = net.propose(1, ProposalAction::Remove, 3, 0)?;
            ensure!(code.value() == 0, "removal proposal refused: {code:?}");
            proposals += 1;
        }
        if w % 5 == 0 && w <= 50 {
            let h = net.net.height as u64 + 1;
            let u = &users[w % users.len()];
            net.net.hub.as_mut().context("hub")?.deposit(h, u, 500);
            deposits += 1;
        }
        if w >= 10 {
            let kv = net.net.nodes[0].app.committed_state();
            let (c, stray) = count(kv)?;
            ensure!(stray == 0, "{stray} keys under no LAYOUT prefix");
            for (ns, max) in &limits {
                let got = c.get(*ns).copied().unwrap_or(0);
                ensure!(
                    got <= *max,
                    "window {w}: {got} keys under {ns}, bound {max} ({c:?})"
                );
            }
            samples.push((w, c));
        }
    }
    if let (Some(a), Some(b)) = (samples.first(), samples.last()) {
        eprintln!("keys per namespace at window {}: {:?}", a.0, a.1);
        eprintln!("keys per namespace at window {}: {:?}", b.0, b.1);
    }
    // The early and late maxima of every bounded namespace.
    let max_in = |from: usize, to: usize, ns: &str| {
        samples
            .iter()
            .filter(|(w, _)| (from..=to).contains(w))
            .map(|(_, c)| c.get(ns).copied().unwrap_or(0))
            .max()
            .unwrap_or(0)
    };
    for ns in limits.keys() {
        let (early, late) = (max_in(10, 25, ns), max_in(40, 55, ns));
        ensure!(
            late <= early + 2,
            "{ns}: at most {early} keys in windows 10-25, {late} in 40-55"
        );
    }
    // History grows exactly with the activity that writes it.
    let kv = net.net.nodes[0].app.committed_state().clone();
    let (c, _) = count(&kv)?;
    let epoch = net.epoch()?;
    ensure!(epoch == 1 + rekeys, "epoch {epoch} after {rekeys} re-keys");
    ensure!(rekeys == 5, "{rekeys} re-keys");
    ensure!(
        c["rot/"] == rekeys,
        "{} rotations for {rekeys} re-keys",
        c["rot/"]
    );
    ensure!(
        c["prop/"] == proposals,
        "{} proposal records, {proposals} made",
        c["prop/"]
    );
    let st = tally_settlement::sync::sync_state(&kv, "hub")?;
    let formed = if st.current_nonce != 0 {
        st.current_nonce
    } else {
        st.next_nonce - 1
    };
    ensure!(
        c["batch/"] == formed,
        "{} batch records, {formed} nonces formed",
        c["batch/"]
    );
    let hub = net.net.hub.as_ref().context("hub")?;
    ensure!(
        hub.settled.len() as u64 + 1 >= formed && formed >= WINDOWS as u64 - 5,
        "{} settled of {formed} formed",
        hub.settled.len()
    );
    ensure!(
        tally_settlement::sync::hub_cursor(&kv, "hub")?.deposit_seq == deposits + 1,
        "deposits credited"
    );
    // Every switch left the home with the active epoch's share only (or
    // with the next one beside it).
    let files_now = files.share_epochs();
    ensure!(
        files_now.first() == Some(&epoch),
        "share files {files_now:?} at epoch {epoch}"
    );
    Ok(())
}

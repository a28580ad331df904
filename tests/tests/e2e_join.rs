//! End to end on real CometBFT: issue 32's state sync while a DKG ceremony
//! is in flight, and a state-synced node becoming a validator. One
//! 4-validator localnet with the hub (ports from 17656), ceremonies of
//! 4 x 10 blocks (so that a snapshot is taken, and chosen by a joiner,
//! while one runs), snapshots every 10 blocks. The tests, in order:
//!
//! 1. `state_sync_join_during_a_rekey`: a re-key (`tx validator propose
//!    --rekey`, approved by 3 of 4) starts a ceremony whose round and
//!    heights `/dkg` shows on validator 0; once the first snapshot height
//!    inside it has passed, a full node joins by state sync (`localnet/
//!    node.sh join 4`). The snapshot it restored (the height in its
//!    tallyd's "snapshot restored" line; CometBFT holds no block at or
//!    below it) lies in `[start_height, end)` of that ceremony, and the
//!    joiner's own store at that height holds the ceremony in flight
//!    (`/key cer/cur` at the snapshot height, decoded: the same round,
//!    epoch and heights). After the ceremony, with the key active on the
//!    validators (epoch one above the test's starting epoch, a group key
//!    other than the old one, the hub holding it), the joiner's `/dkg`
//!    shows the same epoch, group key, public shares and signers, and its
//!    app hash equals every validator's.
//! 2. `state_synced_node_becomes_a_validator`: that joiner is proposed by
//!    the governance path of `e2e_validators.rs` (`tx validator propose
//!    --add --candidate-home` its home, `--power` the power every
//!    validator has in CometBFT's `/validators`, approved by 3 of 4).
//!    CometBFT's `/validators` then lists it with exactly that power
//!    among five; `/dkg` shows the next epoch on all five nodes, signed
//!    by exactly CometBFT's set; the joiner's `data/bls_share_epoch_<E>.json`
//!    is for the index `/dkg` and `/validators` give its address, and its
//!    secret times the G1 generator (blst) is that index's on-chain public
//!    share. Bob's usage of 13 + 29 credits, reported through the new
//!    validator after the change, forms a batch whose signature verifies
//!    under the new group key and no older one, which the joiner's secret
//!    signs under its own public share only; the hub pays the batch
//!    exactly its calls' sum, with no shortfall, and the provider exactly
//!    42, once; bob's balance drops by exactly 42 on every node; the
//!    batch is `settled` under the same nonce on all five, and their app
//!    hashes are equal.
//!
//! Seen failing: (1) with the join moved before the re-key's proposal (so
//! the newest snapshot predates the ceremony): "node4 restored the
//! snapshot of height 50, outside the ceremony [76, 116)"; (2) with the
//! share checked against the next index's public share: "node4's secret
//! times G1 is 8d2073..., the on-chain public share of index 1 is
//! b6338a...". Both runs: 2 failed.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED),
//! built `tallyd` and `tally-hub`.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine;
use prost::Message;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tally_node::records::build_report;
use tally_node::rpc::Rpc;
use tally_settlement::bls::{self, Kind, PublicShares};
use tally_settlement::proto::{Ceremony, Outcome, UsageRecord};
use tally_tests::e2e::{comet_validators, query, wait_for};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, tallyd_ok, Localnet, Options};

/// Ports from here (validator i: +10 i, the joiner +40; hub +100), or the
/// next free block.
const PORT_BASE: u16 = 17656;
const WINDOW_SECS: u64 = 15;
/// Snapshots every 10 blocks.
const SNAPSHOT_INTERVAL: u64 = 10;
/// Blocks per DKG phase: a ceremony of 40 blocks (~25 s at 500 ms), so a
/// snapshot falls inside it with room for the joiner to choose it.
const PHASE_BLOCKS: &str = "10";
/// What a ceremony may take, proposal to active key.
const RESHARE_TIMEOUT: Duration = Duration::from_secs(150);
/// The node that joins by state sync, then validates.
const JOINER: usize = 4;
/// Test 2's user (up.sh gives bob credits) and provider, and the two
/// charges the test sends.
const USER: &str = "bob";
const PROVIDER: &str = "join-prov";
const CHARGES: [u64; 2] = [13, 29];

const TESTS: [Test<Net>; 2] = [
    Test {
        name: "state_sync_join_during_a_rekey",
        needs: &[],
        run: state_sync_join_during_a_rekey,
    },
    Test {
        name: "state_synced_node_becomes_a_validator",
        needs: &["state_sync_join_during_a_rekey"],
        run: state_synced_node_becomes_a_validator,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture.
struct Net {
    net: Localnet,
    chain_id: String,
    /// Every group key the chain had, oldest first (hex).
    keys: Vec<String>,
}

impl Net {
    fn start() -> Result<Self> {
        // Five nodes' ports: the joiner's too.
        let base = free_port_base(PORT_BASE, JOINER + 1)?;
        let opts = Options {
            up_env: vec![("TALLY_DKG_PHASE_BLOCKS".into(), PHASE_BLOCKS.into())],
            env: vec![(
                "TALLY_SNAPSHOT_INTERVAL".into(),
                SNAPSHOT_INTERVAL.to_string(),
            )],
            ..Options::default()
        };
        let net = Localnet::launch(4, base, "500ms", WINDOW_SECS, &opts)?;
        net.wait_for_key(Duration::from_secs(120))?;
        let chain_id = net.rpc(0).status()?.chain_id;
        let g = query(&net.rpc(0), "/dkg")?["group_key"]
            .as_str()
            .context("no group key")?
            .to_string();
        Ok(Self {
            net,
            chain_id,
            keys: vec![g],
        })
    }
}

/// `tallyd tx validator ARGS` signed by validator `i`, sent to its node,
/// again for up to 5 s while the node answers "no proposal" (an approval
/// reaching a node a block behind the proposal's).
fn validator_tx(net: &Localnet, i: usize, args: &[&str]) -> Result<String> {
    let home = net.dir().join(format!("node{i}")).display().to_string();
    let url = net.rpc_url(i);
    let mut all = vec!["tx", "validator"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--home", &home, "--node", &url]);
    let t = Instant::now();
    loop {
        match tallyd_ok(&all) {
            Err(e)
                if e.to_string().contains("no proposal")
                    && t.elapsed() < Duration::from_secs(5) =>
            {
                std::thread::sleep(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// Proposes `args` from validator 0 and approves the newest proposal of
/// `action` for `pubkey` from validators 1 and 2 (3 of 4 equal powers).
fn pass(net: &Localnet, args: &[&str], pubkey: Option<&str>, action: &str) -> Result<u64> {
    let mut all = vec!["propose"];
    all.extend_from_slice(args);
    validator_tx(net, 0, &all)?;
    let p = query(&net.rpc(0), "/proposals")?;
    let id = p["proposals"]
        .as_array()
        .context("proposals")?
        .iter()
        .filter(|x| x["pubkey"] == serde_json::json!(pubkey) && x["action"] == action)
        .filter_map(|x| x["id"].as_u64())
        .max()
        .with_context(|| format!("no {action} proposal for {pubkey:?}: {p}"))?;
    for i in [1, 2] {
        validator_tx(net, i, &["approve", "--id", &id.to_string()])?;
    }
    Ok(id)
}

/// Node `i`'s consensus key as its CometBFT reports it (hex).
fn consensus_key(net: &Localnet, i: usize) -> Result<String> {
    let st = net.rpc(i).call("status", serde_json::json!({}))?;
    let pk = base64::engine::general_purpose::STANDARD.decode(
        st["validator_info"]["pub_key"]["value"]
            .as_str()
            .unwrap_or(""),
    )?;
    ensure!(pk.len() == 32, "node{i}: consensus key {st}");
    Ok(hex::encode(pk))
}

/// The app hash in the header at `height` on node `i`.
fn header_app_hash(net: &Localnet, i: usize, height: u64) -> Result<String> {
    let v = net
        .rpc(i)
        .call("block", serde_json::json!({"height": height.to_string()}))?;
    v["block"]["header"]["app_hash"]
        .as_str()
        .map(str::to_string)
        .context("no app_hash in the header")
}

/// Every node of `nodes` has the app hash node 0 has, in a header all of
/// them hold.
fn same_app_hash(net: &Localnet, nodes: &[usize]) -> Result<u64> {
    let top = net.height(0) + 1;
    for &i in nodes {
        net.wait_height(i, top, Duration::from_secs(30))?;
    }
    let want = header_app_hash(net, 0, top)?;
    for &i in nodes {
        let got = header_app_hash(net, i, top)?;
        ensure!(
            got == want,
            "node{i}: app hash {got} in header {top}, node0 {want}"
        );
    }
    Ok(top)
}

/// The raw state value of `key` at `height` on node `i` (`None`: absent).
fn raw_at(net: &Localnet, i: usize, key: &[u8], height: u64) -> Result<Option<Vec<u8>>> {
    let r = net.rpc(i).call(
        "abci_query",
        serde_json::json!({"path": "/key", "data": hex::encode(key),
            "height": height.to_string(), "prove": false}),
    )?;
    let resp = &r["response"];
    let code = resp["code"].as_u64().unwrap_or(0);
    ensure!(
        resp["height"].as_str() == Some(height.to_string().as_str()),
        "node{i}: /key answered for another height than {height}: {resp}"
    );
    match code {
        0 => Ok(Some(
            base64::engine::general_purpose::STANDARD
                .decode(resp["value"].as_str().context("no value")?)?,
        )),
        22 => Ok(None),
        _ => bail!("node{i}: /key {} at {height}: {resp}", hex::encode(key)),
    }
}

/// Waits until node 0's `/dkg` shows key epoch `epoch` active, with no
/// ceremony running and no key waiting, and the hub holding that key;
/// the key (hex).
fn wait_active(net: &Localnet, epoch: u64) -> Result<String> {
    let t = Instant::now();
    let g = wait_for(&format!("key epoch {epoch}"), RESHARE_TIMEOUT, net, || {
        let d = query(&net.rpc(0), "/dkg")?;
        let quiet = d["ceremony"].is_null() && d["next_key"].is_null();
        Ok((d["epoch"] == epoch && quiet)
            .then(|| d["group_key"].as_str().map(str::to_string))
            .flatten())
    })?;
    let hub = Rpc::new(&net.hub_rpc_url());
    wait_for(
        "the hub to hold the key",
        Duration::from_secs(60),
        net,
        || {
            let keys = query(&hub, "/keys/hub")?;
            let last = keys["keys"].as_array().and_then(|k| k.last()).cloned();
            Ok(last.filter(|k| k["group_key"] == g.as_str()).map(drop))
        },
    )?;
    eprintln!(
        "[e2e] key epoch {epoch} active {:?} after asking",
        t.elapsed()
    );
    Ok(g)
}

/// The height of the snapshot node `i` restored, from its tallyd log.
fn restored_height(net: &Localnet, i: usize) -> Result<u64> {
    let path = net.dir().join(format!("node{i}")).join("tallyd.log");
    let log = std::fs::read_to_string(&path)?;
    let line = log
        .lines()
        .find(|l| l.contains("snapshot restored"))
        .with_context(|| format!("{}: no snapshot restored", path.display()))?;
    // tracing's fields, with or without colours: `height=H` or `height\e[0m\e[2m=\e[0mH`.
    let plain: String = {
        let mut s = String::new();
        let mut esc = false;
        for c in line.chars() {
            match (esc, c) {
                (false, '\u{1b}') => esc = true,
                (true, 'm') => esc = false,
                (true, _) => {}
                (false, c) => s.push(c),
            }
        }
        s
    };
    let h = plain
        .split_whitespace()
        .find_map(|w| w.strip_prefix("height="))
        .with_context(|| format!("no height in {plain:?}"))?;
    Ok(h.parse()?)
}

fn state_sync_join_during_a_rekey(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let before = query(&net.rpc(0), "/dkg")?;
    let epoch = before["epoch"].as_u64().context("no epoch")? + 1;
    pass(net, &["--rekey"], None, "rekey")?;
    // The ceremony, as validator 0 shows it.
    let c = wait_for("the re-key ceremony", Duration::from_secs(30), net, || {
        let d = query(&net.rpc(0), "/dkg")?;
        Ok(Some(d["ceremony"].clone()).filter(|c| c["kind"] == "rekey" && c["epoch"] == epoch))
    })?;
    let field = |k: &str| c[k].as_u64().with_context(|| format!("{k}: {c}"));
    let (round, start, end) = (field("round")?, field("start_height")?, field("end")?);
    eprintln!("[e2e] re-key round {round}: heights {start} to {end}");
    // The first snapshot after the ceremony started, and the two blocks
    // that verify it; the joiner then finds no newer snapshot for a while.
    let snap = (start / SNAPSHOT_INTERVAL + 1) * SNAPSHOT_INTERVAL;
    ensure!(
        snap + 10 < end,
        "the ceremony [{start}, {end}) is too short for a join inside it"
    );
    net.wait_height(0, snap + 2, Duration::from_secs(60))?;
    let t = Instant::now();
    net.node("join", JOINER).context("localnet/node.sh join")?;
    let caught_up = net.height(JOINER);
    eprintln!(
        "[e2e] node{JOINER} joined in {:.1} s, at height {caught_up} (ceremony ends at {end})",
        t.elapsed().as_secs_f64()
    );

    // The snapshot it restored was taken inside the ceremony.
    let h = restored_height(net, JOINER)?;
    eprintln!("[e2e] node{JOINER} restored the snapshot of height {h}");
    ensure!(
        (start..end).contains(&h),
        "node{JOINER} restored the snapshot of height {h}, outside the ceremony [{start}, {end})"
    );
    let st = net.rpc(JOINER).call("status", serde_json::json!({}))?["sync_info"].clone();
    let earliest: u64 = st["earliest_block_height"]
        .as_str()
        .and_then(|x| x.parse().ok())
        .with_context(|| format!("earliest_block_height: {st}"))?;
    ensure!(
        earliest > h,
        "node{JOINER} holds blocks from {earliest}: not restored from the snapshot at {h}"
    );
    // Its own store at that height holds the ceremony in flight.
    let raw = raw_at(net, JOINER, b"cer/cur", h)?
        .with_context(|| format!("node{JOINER} holds no running ceremony at height {h}"))?;
    let held = Ceremony::decode(raw.as_slice())?;
    ensure!(
        (held.round, held.epoch, held.start_height, held.end) == (round, epoch, start, end),
        "node{JOINER}'s ceremony at {h}: round {} epoch {} heights {} to {}",
        held.round,
        held.epoch,
        held.start_height,
        held.end
    );

    // After the ceremony: the same key on the joiner as on the validators.
    let g = wait_active(net, epoch)?;
    ensure!(
        Some(&g) != f.keys.last(),
        "the re-key kept the group key {g}"
    );
    let top = same_app_hash(net, &[0, 1, 2, 3, JOINER])?;
    let want = query(&net.rpc(0), "/dkg")?;
    let got = query(&net.rpc(JOINER), "/dkg")?;
    for k in [
        "epoch",
        "group_key",
        "public_shares",
        "signers",
        "threshold",
    ] {
        ensure!(
            got[k] == want[k],
            "node{JOINER}'s /dkg {k} is {}, validator 0's {}",
            got[k],
            want[k]
        );
    }
    ensure!(
        got["epoch"] == epoch,
        "epoch {} after the re-key",
        got["epoch"]
    );
    eprintln!("[e2e] node{JOINER} holds key epoch {epoch} with the validators' app hash at {top}");
    f.keys.push(g);
    Ok(())
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The nonce and status of the batch on node `i` holding a call for
/// [`PROVIDER`], if one was formed.
fn batch_of(net: &Localnet, i: usize) -> Result<Option<(u64, String)>> {
    let s = query(&net.rpc(i), "/sync/hub")?;
    let last = s["nonce"]
        .as_u64()
        .unwrap_or(0)
        .max(s["settled_batches"].as_u64().unwrap_or(0));
    for n in 1..=last {
        let a = net.rpc(i).abci_query(&format!("/batch/hub/{n}"))?;
        if a.code != 0 {
            continue;
        }
        let b: Value = serde_json::from_slice(&a.value)?;
        let mine = b["calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["provider"] == PROVIDER));
        if mine {
            return Ok(Some((n, b["status"].as_str().unwrap_or("").to_string())));
        }
    }
    Ok(None)
}

/// Whether `sig` over `msg` verifies under the hex group key `key`.
fn verifies(key: &str, msg: &[u8], sig: &blst::min_pk::Signature) -> Result<bool> {
    let pubs = PublicShares {
        threshold: 1,
        group: bls::parse_public_key(&hex::decode(key)?)?,
        shares: Vec::new(),
    };
    Ok(pubs.verify_group(msg, sig))
}

/// The joiner is made a validator: CometBFT lists it with the proposed
/// power and the reshare names it; the key epoch it made (with the
/// joiner's share index).
fn promote_the_joiner(f: &mut Net) -> Result<(u64, usize, u64)> {
    let net = &f.net;
    let pk = consensus_key(net, JOINER)?;
    let address = hex::encode(&Sha256::digest(&hex::decode(&pk)?)[..20]);
    let comet = comet_validators(net, 0)?;
    let power = comet.first().map(|v| v.2).context("no validators")?;
    ensure!(
        comet.len() == 4 && comet.iter().all(|v| v.2 == power),
        "not four equal powers: {comet:?}"
    );
    let before = query(&net.rpc(0), "/dkg")?;
    let epoch = before["epoch"].as_u64().context("no epoch")? + 1;
    let home = net
        .dir()
        .join(format!("node{JOINER}"))
        .display()
        .to_string();
    let p = power.to_string();
    let args = ["--add", "--candidate-home", &home, "--power", &p];
    pass(net, &args, Some(&pk), "add")?;
    let g = wait_active(net, epoch)?;
    // CometBFT takes the set two blocks after the key's rotation is signed.
    let comet = wait_for(
        "five validators in CometBFT",
        Duration::from_secs(30),
        net,
        || Ok(Some(comet_validators(net, 0)?).filter(|c| c.len() != 4)),
    )?;
    let switched_at = net.height(0);
    ensure!(
        comet.len() == 5 && comet.contains(&(address.clone(), pk.clone(), power)),
        "CometBFT's validators after the change: {comet:?}, want node{JOINER} ({address}) at power {power} among five"
    );
    // Every node, the new validator too, shows that key signed by exactly
    // CometBFT's set.
    let set: Vec<String> = comet.iter().map(|v| v.0.clone()).collect();
    for i in 0..=JOINER {
        net.wait_height(i, switched_at, Duration::from_secs(30))?;
        let d = query(&net.rpc(i), "/dkg")?;
        let mut signers: Vec<String> = d["signers"]
            .as_array()
            .context("signers")?
            .iter()
            .filter_map(|s| s.as_str().map(str::to_lowercase))
            .collect();
        signers.sort();
        let mut want = set.clone();
        want.sort();
        ensure!(
            d["epoch"] == epoch && d["group_key"] == g.as_str() && signers == want,
            "node{i}: /dkg epoch {} key {} signers {signers:?}; want {epoch} {g} {want:?}",
            d["epoch"],
            d["group_key"]
        );
        let n = set.len();
        ensure!(
            d["threshold"] == 2 * n / 3 + 1,
            "node{i}: threshold {} for {n} validators",
            d["threshold"]
        );
    }
    let d = query(&net.rpc(JOINER), "/dkg")?;
    let index = d["signers"]
        .as_array()
        .context("signers")?
        .iter()
        .position(|s| s.as_str().map(str::to_lowercase).as_deref() == Some(&address))
        .context("the new validator signs no share")?
        + 1;
    let vals = query(&net.rpc(0), "/validators")?;
    let row = vals["validators"]
        .as_array()
        .context("validators")?
        .iter()
        .find(|v| v["address"] == address.as_str())
        .with_context(|| format!("/validators has no {address}: {vals}"))?;
    ensure!(
        row["share_index"] == index && row["power"] == power,
        "/validators: {row}, want share index {index} and power {power}"
    );
    f.keys.push(g);
    Ok((epoch, index, switched_at))
}

/// The joiner's share file of `epoch`: its secret, checked against the
/// on-chain public share of `index` with blst; the secret and every
/// public share.
fn joiners_share(
    f: &Net,
    epoch: u64,
    index: usize,
) -> Result<(blst::min_pk::SecretKey, Vec<blst::min_pk::PublicKey>)> {
    let net = &f.net;
    let d = query(&net.rpc(0), "/dkg")?;
    let shares: Vec<String> = d["public_shares"]
        .as_array()
        .context("public shares")?
        .iter()
        .map(|s| s.as_str().map(str::to_lowercase).context("public share"))
        .collect::<Result<_>>()?;
    let path = net
        .dir()
        .join(format!("node{JOINER}"))
        .join("data")
        .join(format!("bls_share_epoch_{epoch}.json"));
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?,
    )?;
    ensure!(
        file["index"] == index && file["epoch"] == epoch,
        "{}: index {} epoch {}, want {index} {epoch}",
        path.display(),
        file["index"],
        file["epoch"]
    );
    let secret = blst::min_pk::SecretKey::from_bytes(&hex::decode(
        file["secret"].as_str().context("no secret")?,
    )?)
    .map_err(|e| anyhow::anyhow!("{}: secret {e:?}", path.display()))?;
    let public = hex::encode(secret.sk_to_pk().compress());
    ensure!(
        public == shares[index - 1],
        "node{JOINER}'s secret times G1 is {public}, the on-chain public share of index {index} is {}",
        shares[index - 1]
    );
    let on_chain = shares
        .iter()
        .map(|s| Ok(bls::parse_public_key(&hex::decode(s)?)?))
        .collect::<Result<_>>()?;
    Ok((secret, on_chain))
}

fn state_synced_node_becomes_a_validator(f: &mut Net) -> Result<()> {
    // No ceremony left running by the test before.
    wait_for("no ceremony running", RESHARE_TIMEOUT, &f.net, || {
        let d = query(&f.net.rpc(0), "/dkg")?;
        Ok((d["ceremony"].is_null() && d["next_key"].is_null()).then_some(()))
    })?;
    let (epoch, index, switched_at) = promote_the_joiner(f)?;
    let (secret, shares) = joiners_share(f, epoch, index)?;
    let net = &f.net;
    let nodes = [0, 1, 2, 3, JOINER];

    // Usage after the change, reported through the new validator.
    let balances: Vec<u64> = nodes
        .iter()
        .map(|&i| net.balance(i, USER))
        .collect::<Result<_>>()?;
    let records = CHARGES
        .iter()
        .map(|&amount| UsageRecord {
            user: USER.into(),
            provider: PROVIDER.into(),
            model: "org/join".into(),
            route: "/v1/join".into(),
            outcome: Outcome::Ok as i32,
            units: 3,
            amount,
            ..Default::default()
        })
        .collect();
    let built = build_report(&net.gateway_key()?, &f.chain_id, records, now_unix() + 300);
    let r = net.rpc(JOINER).broadcast_tx_commit(&built.tx)?;
    ensure!(r.final_code() == 0, "report refused: {}", r.final_log());
    let sent: u64 = CHARGES.iter().sum();
    let nonce = wait_for(
        "the batch settled",
        Duration::from_secs(WINDOW_SECS * 3 + 120),
        net,
        || {
            Ok(match batch_of(net, 0)? {
                Some((n, s)) if s == "settled" => Some(n),
                _ => None,
            })
        },
    )?;
    let b = query(&net.rpc(0), &format!("/batch/hub/{nonce}"))?;
    ensure!(
        b["formed_height"].as_u64().unwrap_or(0) >= switched_at,
        "batch {nonce} formed at {} before the change at {switched_at}",
        b["formed_height"]
    );
    let calls = b["calls"].as_array().context("calls")?;
    let total: u64 = calls.iter().filter_map(|c| c["amount"].as_u64()).sum();
    let mine: u64 = calls
        .iter()
        .filter(|c| c["provider"] == PROVIDER)
        .filter_map(|c| c["amount"].as_u64())
        .sum();
    ensure!(
        mine == sent,
        "batch {nonce} owes {PROVIDER} {mine}, sent {sent}: {b}"
    );

    // Signed by the new key, which the joiner holds a share of.
    let digest: [u8; 32] = hex::decode(b["digest"].as_str().unwrap_or(""))?
        .try_into()
        .map_err(|_| anyhow::anyhow!("digest is not 32 bytes"))?;
    let sig = bls::parse_signature(&hex::decode(b["signature"].as_str().unwrap_or(""))?)?;
    let msg = bls::message(&f.chain_id, Kind::Batch, &digest);
    let (new, old) = f.keys.split_last().context("no keys")?;
    ensure!(
        verifies(new, &msg, &sig)?,
        "batch {nonce} not signed by the new key"
    );
    for k in old {
        ensure!(
            !verifies(k, &msg, &sig)?,
            "batch {nonce} verifies under the old key {k}"
        );
    }
    let dkg = query(&net.rpc(0), "/dkg")?;
    let dst = dkg["dst"].as_str().context("dst")?.as_bytes();
    let mine_sig = secret.sign(&msg, dst, &[]);
    for (i, share) in shares.iter().enumerate() {
        let ok =
            mine_sig.verify(true, &msg, dst, &[], share, true) == blst::BLST_ERROR::BLST_SUCCESS;
        ensure!(
            ok == (i + 1 == index),
            "node{JOINER}'s signature of batch {nonce} {} under the public share of index {}",
            if ok { "verifies" } else { "does not verify" },
            i + 1
        );
    }

    // Paid exactly once, exactly what was sent.
    let hub = Rpc::new(&net.hub_rpc_url());
    let h = query(&hub, &format!("/batch/hub/{nonce}"))?;
    ensure!(
        h["paid"].as_u64() == Some(total)
            && h["shortfall"].as_u64().unwrap_or(0) == 0
            && h["calls"].as_u64() == Some(calls.len() as u64),
        "batch {nonce}: chain {b}\nhub {h}"
    );
    let paid = query(&hub, &format!("/payout/{PROVIDER}"))?["paid"].as_u64();
    ensure!(
        paid == Some(sent),
        "hub paid {PROVIDER} {paid:?}, sent {sent}"
    );
    for (k, &i) in nodes.iter().enumerate() {
        net.wait_height(i, net.height(0), Duration::from_secs(30))?;
        let now = net.balance(i, USER)?;
        ensure!(
            now + sent == balances[k],
            "node{i}: {USER}'s balance {now}, was {}, charged {sent}",
            balances[k]
        );
        ensure!(
            batch_of(net, i)? == Some((nonce, "settled".into())),
            "node{i}: batch {:?}",
            batch_of(net, i)?
        );
    }
    same_app_hash(net, &nodes)?;
    Ok(())
}

//! End to end with real CometBFT processes: the validators make their
//! threshold key on chain and change their set by proposals; every change
//! makes a new key, which the old key hands to the hub by a signed
//! rotation (ADR 0017). One localnet (four validators and the hub chain, made by
//! `localnet/up.sh` with its on-chain DKG default) is shared by the named
//! tests below, which run in this order (the runner is
//! `tally_tests::harness`):
//!
//! 1. `key_made_on_chain`: `/dkg` shows epoch 1 with a group key G, signed
//!    by exactly CometBFT's four validators with threshold 2n/3 + 1, and
//!    the hub's genesis holds the same G;
//! 2. `a_power_above_cometbfts_cap_is_refused`: issue 26's reproduction
//!    (`--update --power 1152921504606846975`, which used to stop every
//!    node a minute after its approvals; updates are gone since ADR 0018)
//!    as an addition at that power: refused (code 33), the chain goes on;
//! 3. `fifth_validator_added`: `localnet/node.sh add` starts a fifth node;
//!    the proposal and approval commands it prints (node0 proposes, node1
//!    and node2 approve: 3 of 4 equal powers) make it a validator: CometBFT's
//!    `/validators` lists five, `/dkg` shows epoch 2 with a new key G2 and
//!    five signers, the same five; `/rotations` holds the rotation G -> G2
//!    signed by G, and the hub's `/keys/hub` ends at G2;
//! 4. `batch_settles_after_add`: usage reported after the switch forms a
//!    batch the five-validator set signs; its signature verifies against G2
//!    here, not against G, and the hub (which now holds G2) settles it.
//!    The fifth node holds a share of G2 (four of the old set would sign
//!    without it): its `data/bls_share_epoch_2.json` is for the index
//!    `/dkg` gives its address, its secret times the generator is that
//!    index's on-chain public share, its signature of the batch verifies
//!    under that share only, and every 4 of the 5 public shares
//!    interpolate (by hand in the test, in the exponent) to G2;
//! 5. `fifth_validator_removed`: a removal proposal approved by four of five
//!    (4 of 5 equal powers): four validators again, epoch 3, a new key G3
//!    handed to the hub the same way;
//! 6. `batch_settles_after_removal`: as 3, with the four and G3 (refused
//!    under G and G2);
//! 7. `recovery_through_the_hubs_governors` (ADR 0018): nodes 2 and 3 lose
//!    every share and round-key file, so 2 of 4 signers are left (t = 3);
//!    `tx validator propose --recover`, approved by 3 of 4, makes epoch 4
//!    with a new key G4 that activates unsigned (`/rotations`: governed, no
//!    signature) and that all four hold; the hub still holds G3 until two of
//!    the localnet hub's three governors sign the rotation with `tally-hub
//!    governor sign` and send it with `tally-hub govern-key`; then `/keys/hub`
//!    ends at G4 (`by: governors`) and a batch signed by G4 settles.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED)
//! and built `tallyd` and `tally-hub` binaries (`$TALLYD`,
//! `$TALLY_HUB_BIN`, or beside the test binary).

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use base64::Engine;
use ed25519_dalek::SigningKey;
use sha2::{Digest, Sha256};
use tally_node::records::build_report;
use tally_node::rpc::Rpc;
use tally_settlement::bls::{self, Kind, PublicShares};
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::e2e::{comet_validators, query, wait_for};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, tallyd_ok, Localnet};

/// Ports from here (validator i: +10 i; the fifth node +40; hub +100), or
/// the next free block.
const PORT_BASE: u16 = 25656;
const WINDOW_SECS: u64 = 8;
/// Blocks per ceremony phase: a ceremony takes 9 blocks (~5 s at 500 ms).
const PHASE_BLOCKS: &str = "3";
/// What a reshare may take, proposal to active key.
const RESHARE_TIMEOUT: Duration = Duration::from_secs(120);
const USER: &str = "alice";

const TESTS: [Test<Net>; 7] = [
    Test {
        name: "key_made_on_chain",
        needs: &[],
        run: key_made_on_chain,
    },
    Test {
        name: "a_power_above_cometbfts_cap_is_refused",
        needs: &["key_made_on_chain"],
        run: a_power_above_cometbfts_cap_is_refused,
    },
    Test {
        name: "fifth_validator_added",
        needs: &["key_made_on_chain"],
        run: fifth_validator_added,
    },
    Test {
        name: "batch_settles_after_add",
        needs: &["fifth_validator_added"],
        run: batch_settles_after_add,
    },
    Test {
        name: "fifth_validator_removed",
        needs: &["fifth_validator_added"],
        run: fifth_validator_removed,
    },
    Test {
        name: "batch_settles_after_removal",
        needs: &["fifth_validator_removed"],
        run: batch_settles_after_removal,
    },
    Test {
        name: "recovery_through_the_hubs_governors",
        needs: &["fifth_validator_removed"],
        run: recovery_through_the_hubs_governors,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture.
struct Net {
    net: Localnet,
    key: SigningKey,
    chain_id: String,
    /// The active group key (hex).
    group_key: String,
    /// The keys before it, oldest first (hex).
    old_keys: Vec<String>,
    /// The added node's consensus key (hex) and the height at which the
    /// latest set change was seen active.
    fifth: Option<String>,
    switched_at: u64,
}

impl Net {
    fn start() -> Result<Self> {
        let t0 = Instant::now();
        let base = free_port_base(PORT_BASE, 5)?;
        let net = Localnet::start_with(
            4,
            base,
            "500ms",
            WINDOW_SECS,
            &[("TALLY_DKG_PHASE_BLOCKS", PHASE_BLOCKS)],
        )?;
        eprintln!("localnet up (key made on chain) in {:?}", t0.elapsed());
        let key = net.gateway_key()?;
        let chain_id = net.rpc(0).status()?.chain_id;
        // up.sh deposited hub escrow for alice and waited until it was
        // credited: her balance pays the usage below.
        ensure!(net.balance(0, USER)? > 0, "{USER} has no credits");
        Ok(Self {
            net,
            key,
            chain_id,
            group_key: String::new(),
            old_keys: Vec::new(),
            fifth: None,
            switched_at: 0,
        })
    }
}

/// Checks `/dkg` on every node in `nodes`: active epoch `epoch`, group key
/// `g`, signers exactly CometBFT's validators, threshold 2n/3 + 1.
fn check_key(net: &Localnet, nodes: &[usize], epoch: u64, g: &str) -> Result<()> {
    let comet: BTreeSet<String> = comet_validators(net, 0)?
        .into_iter()
        .map(|(a, _, _)| a)
        .collect();
    let n = comet.len() as u64;
    for &i in nodes {
        let d = query(&net.rpc(i), "/dkg")?;
        ensure!(
            d["epoch"] == epoch,
            "node{i}: epoch {} want {epoch}",
            d["epoch"]
        );
        ensure!(
            d["group_key"] == g,
            "node{i}: group key {} want {g}",
            d["group_key"]
        );
        let signers: BTreeSet<String> = d["signers"]
            .as_array()
            .context("signers")?
            .iter()
            .filter_map(|s| s.as_str().map(str::to_lowercase))
            .collect();
        ensure!(
            signers == comet,
            "node{i}: key signers {signers:?}, CometBFT validators {comet:?}"
        );
        ensure!(
            d["threshold"] == 2 * n / 3 + 1,
            "node{i}: threshold {} for {n} validators",
            d["threshold"]
        );
        ensure!(
            d["public_shares"].as_array().map(Vec::len) == Some(n as usize),
            "node{i}: public shares"
        );
    }
    Ok(())
}

fn key_made_on_chain(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let d = query(&net.rpc(0), "/dkg")?;
    ensure!(
        d["epoch"] == 1,
        "epoch {} after the first ceremony",
        d["epoch"]
    );
    let g = d["group_key"].as_str().context("no group key")?.to_string();
    ensure!(comet_validators(net, 0)?.len() == 4, "four validators");
    check_key(net, &[0, 1, 2, 3], 1, &g)?;
    // The hub settles against the key it got in genesis: the same G.
    let hub_genesis = Rpc::new(&net.hub_rpc_url()).call("genesis", serde_json::json!({}))?;
    ensure!(
        hub_genesis["genesis"]["app_state"]["group_key"] == g.as_str(),
        "hub genesis group key {} vs /dkg {g}",
        hub_genesis["genesis"]["app_state"]["group_key"]
    );
    // Nothing dealt it: the settlement genesis has no key.
    let genesis = Rpc::new(&net.rpc_url(0)).call("genesis", serde_json::json!({}))?;
    ensure!(
        genesis["genesis"]["app_state"]["dkg"].is_null(),
        "settlement genesis has a dealt key"
    );
    f.group_key = g;
    Ok(())
}

fn a_power_above_cometbfts_cap_is_refused(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let before = net.height(0);
    let stranger = hex::encode(
        ed25519_dalek::SigningKey::from_bytes(&[7; 32])
            .verifying_key()
            .to_bytes(),
    );
    let r = validator_tx(
        net,
        0,
        &[
            "propose",
            "--add",
            "--pubkey",
            &stranger,
            "--power",
            "1152921504606846975",
        ],
    );
    let e = r.err().context("the proposal was accepted")?.to_string();
    ensure!(e.contains("code 33"), "refused otherwise: {e}");
    net.wait_height(0, before + 3, Duration::from_secs(30))?;
    ensure!(comet_validators(net, 0)?.len() == 4, "the set changed");
    Ok(())
}

/// The id of the newest proposal for `pubkey` (`None` for a re-key or a
/// recovery, which name no validator) of `action` (`add`, `remove`,
/// `recover`).
fn proposal_id(net: &Localnet, pubkey: Option<&str>, action: &str) -> Result<u64> {
    let p = query(&net.rpc(0), "/proposals")?;
    p["proposals"]
        .as_array()
        .context("proposals")?
        .iter()
        .filter(|x| x["pubkey"] == serde_json::json!(pubkey) && x["action"] == action)
        .filter_map(|x| x["id"].as_u64())
        .max()
        .with_context(|| format!("no {action} proposal for {pubkey:?}: {p}"))
}

/// `tallyd tx validator ARGS` signed by validator `i`, sent to its node.
fn validator_tx(net: &Localnet, i: usize, args: &[&str]) -> Result<String> {
    let home = net.dir().join(format!("node{i}")).display().to_string();
    let url = net.rpc_url(i);
    let mut all = vec!["tx", "validator"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--home", &home, "--node", &url]);
    tallyd_settled(&all)
}

/// [`tallyd_ok`], again for up to 5 s while the node answers "no
/// proposal": an approval sent to a node a block behind the one that
/// committed the proposal.
fn tallyd_settled(args: &[&str]) -> Result<String> {
    let t = Instant::now();
    loop {
        match tallyd_ok(args) {
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

/// Runs a command line node.sh printed (`tallyd tx validator ...`).
fn run_printed(line: &str) -> Result<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    ensure!(
        words.len() > 2 && words[0].ends_with("tallyd"),
        "not a tallyd command: {line}"
    );
    tallyd_settled(&words[1..])
}

/// Waits until CometBFT on node 0 lists `n` validators and `/dkg` shows
/// `epoch` with a new group key on every node of `nodes`, signed over by
/// the old key's rotation, and the hub holds it; returns the height seen
/// then (the new key becomes `f.group_key`).
fn wait_switch(f: &mut Net, n: usize, epoch: u64, nodes: &[usize]) -> Result<u64> {
    let net = &f.net;
    let t = Instant::now();
    wait_for(
        &format!("{n} validators and key epoch {epoch}"),
        RESHARE_TIMEOUT,
        net,
        || {
            let d = query(&net.rpc(0), "/dkg")?;
            Ok((comet_validators(net, 0)?.len() == n && d["epoch"] == epoch).then_some(()))
        },
    )?;
    eprintln!("set of {n}, epoch {epoch} after {:?}", t.elapsed());
    let h = net.height(0);
    // Every node got there (the added one too, if it is a node here).
    for &i in nodes {
        net.wait_height(i, h, Duration::from_secs(30))?;
    }
    let new_key = query(&net.rpc(0), "/dkg")?["group_key"]
        .as_str()
        .context("no group key")?
        .to_string();
    ensure!(new_key != f.group_key, "epoch {epoch} kept the group key");
    check_key(net, nodes, epoch, &new_key)?;
    check_rotation(f, epoch, &new_key)?;
    let hub = Rpc::new(&net.hub_rpc_url());
    let held = wait_for(
        "the hub to hold the new key",
        Duration::from_secs(60),
        net,
        || {
            let keys = query(&hub, "/keys/hub")?;
            let last = keys["keys"].as_array().and_then(|k| k.last()).cloned();
            Ok(last.filter(|k| k["group_key"] == new_key.as_str()))
        },
    )?;
    eprintln!(
        "hub holds the epoch {epoch} key from hub height {}",
        held["height"]
    );
    f.old_keys
        .push(std::mem::replace(&mut f.group_key, new_key));
    // The old key's shares are gone from every node's disk (their
    // participants delete them once the new key is active).
    for &i in nodes {
        let data = net.dir().join(format!("node{i}")).join("data");
        wait_for(
            &format!("node{i} to delete its retired shares"),
            Duration::from_secs(20),
            net,
            || {
                let mut epochs = Vec::new();
                for e in std::fs::read_dir(&data)? {
                    let name = e?.file_name().to_string_lossy().to_string();
                    if let Some(n) = name
                        .strip_prefix("bls_share_epoch_")
                        .and_then(|r| r.strip_suffix(".json"))
                    {
                        epochs.push(n.parse::<u64>()?);
                    }
                }
                Ok((epochs.iter().all(|e| *e >= epoch) && epochs.contains(&epoch)).then_some(()))
            },
        )?;
    }
    Ok(h)
}

/// `/rotations` on node 0 ends with a rotation to `new_key` at `epoch`,
/// whose signature the previous key (`f.group_key`) verifies over the
/// rotation digest and no other key does.
fn check_rotation(f: &Net, epoch: u64, new_key: &str) -> Result<()> {
    let rots = query(&f.net.rpc(0), "/rotations")?;
    let r = rots["rotations"]
        .as_array()
        .and_then(|r| r.last())
        .cloned()
        .context("no rotation")?;
    ensure!(
        r["epoch"] == epoch && r["group_key"] == new_key,
        "rotation {r}"
    );
    let group_key = hex::decode(new_key)?;
    let digest = tally_settlement::sync::rotation_digest(
        "hub",
        r["nonce"].as_u64().context("nonce")?,
        epoch,
        &group_key,
    );
    let sig = bls::parse_signature(&hex::decode(r["signature"].as_str().context("unsigned")?)?)?;
    let msg = bls::message(&f.chain_id, Kind::KeyRotation, &digest);
    ensure!(
        verifies(&f.group_key, &msg, &sig)?,
        "the rotation is not signed by the old key"
    );
    ensure!(
        !verifies(new_key, &msg, &sig)?,
        "the rotation verifies under the new key"
    );
    Ok(())
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

fn fifth_validator_added(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let out = net.add_node()?;
    eprintln!("{out}");
    let pk = out
        .lines()
        .find_map(|l| l.strip_prefix("consensus pubkey: "))
        .context("node.sh add printed no consensus pubkey")?
        .trim()
        .to_string();
    // The key node.sh printed is node4's as its CometBFT reports it.
    let st = net.rpc(4).call("status", serde_json::json!({}))?;
    let pk4 = base64::engine::general_purpose::STANDARD.decode(
        st["validator_info"]["pub_key"]["value"]
            .as_str()
            .unwrap_or(""),
    )?;
    ensure!(hex::encode(pk4) == pk, "printed key {pk} is not node4's");
    // The commands it printed: propose (node0), approve (node1, node2).
    let propose = out
        .lines()
        .find(|l| l.contains(" tx validator propose "))
        .context("no propose command printed")?;
    run_printed(propose)?;
    let id = proposal_id(net, Some(&pk), "add")?;
    let approvals: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(" tx validator approve "))
        .collect();
    ensure!(approvals.len() == 3, "approve commands: {approvals:?}");
    for line in &approvals[..2] {
        run_printed(&line.replace("<proposal id>", &id.to_string()))?;
    }
    f.switched_at = wait_switch(f, 5, 2, &[0, 1, 2, 3, 4])?;
    f.fifth = Some(pk);
    Ok(())
}

/// Reports `amount` credits of usage by [`USER`] and waits until a batch
/// formed after the last switch is settled on the hub with exactly them;
/// returns the bytes its group signature signs.
fn settle_one(f: &Net, amount: u64) -> Result<Vec<u8>> {
    let net = &f.net;
    let sync = query(&net.rpc(0), "/sync/hub")?;
    let first_new = sync["next_nonce"].as_u64().unwrap_or(1);
    let rec = UsageRecord {
        user: USER.into(),
        provider: "valset-prov".into(),
        model: "org/valset".into(),
        route: "/v1/chat".into(),
        outcome: Outcome::Ok as i32,
        units: 7,
        amount,
        ..Default::default()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let built = build_report(&f.key, &f.chain_id, vec![rec], now + 300);
    let r = net.rpc(1).broadcast_tx_commit(&built.tx)?;
    ensure!(r.final_code() == 0, "report refused: {}", r.final_log());
    let t = Instant::now();
    let nonce = wait_for(
        "a batch of the new set settled on the hub",
        Duration::from_secs(WINDOW_SECS * 3 + 90),
        net,
        || {
            for nonce in first_new..first_new + 4 {
                let h = Rpc::new(&net.hub_rpc_url()).abci_query(&format!("/batch/hub/{nonce}"))?;
                if h.code != 0 {
                    continue;
                }
                let b = query(&net.rpc(0), &format!("/batch/hub/{nonce}"))?;
                if b["status"] == "settled" {
                    return Ok(Some(nonce));
                }
            }
            Ok(None)
        },
    )?;
    eprintln!("batch {nonce} settled {:?} after the report", t.elapsed());
    let b = query(&net.rpc(2), &format!("/batch/hub/{nonce}"))?;
    ensure!(
        b["formed_height"].as_u64().unwrap_or(0) >= f.switched_at,
        "batch {nonce} formed at {} before the switch at {}",
        b["formed_height"],
        f.switched_at
    );
    ensure!(b["total"] == amount, "batch {nonce}: {b}");
    let digest: [u8; 32] = hex::decode(b["digest"].as_str().unwrap_or(""))?
        .try_into()
        .map_err(|_| anyhow::anyhow!("digest is not 32 bytes"))?;
    let sig = bls::parse_signature(&hex::decode(b["signature"].as_str().unwrap_or(""))?)?;
    let msg = bls::message(&f.chain_id, Kind::Batch, &digest);
    ensure!(
        verifies(&f.group_key, &msg, &sig)?,
        "batch {nonce} signature does not verify against the active group key"
    );
    for old in &f.old_keys {
        ensure!(
            !verifies(old, &msg, &sig)?,
            "batch {nonce} verifies under the old key {old}"
        );
    }
    let h = query(
        &Rpc::new(&net.hub_rpc_url()),
        &format!("/batch/hub/{nonce}"),
    )?;
    ensure!(
        h["paid"].as_u64() == Some(amount),
        "hub paid for batch {nonce}: {h}"
    );
    Ok(msg)
}

fn batch_settles_after_add(f: &mut Net) -> Result<()> {
    let msg = settle_one(f, 41)?;
    new_validator_holds_a_share(f, &msg)
}

/// The added validator holds a share of the active key, not just a seat:
/// `t` of the old four would sign and settle a batch without it. Its
/// `data/bls_share_epoch_<E>.json` is for the index `/dkg` and
/// `/validators` give its address; the secret in it times the generator
/// is the on-chain public share of that index (blst, not Tally's code);
/// that secret's signature of the batch `msg` verifies under that public
/// share (blst and `PublicShares::verify_partial`) and under no other
/// index's; and the on-chain public shares are one polynomial of degree
/// `t - 1` whose value at 0 is the group key: for every `t` of them,
/// Lagrange interpolation at 0 done in this test in the exponent (integer
/// coefficients scaled by a common denominator, so no field inverse) gives
/// the group key.
fn new_validator_holds_a_share(f: &Net, msg: &[u8]) -> Result<()> {
    use blst::min_pk::{PublicKey, SecretKey, Signature};
    use blst::BLST_ERROR;
    let net = &f.net;
    let pk = hex::decode(f.fifth.as_deref().context("no fifth validator")?)?;
    let address = hex::encode(&Sha256::digest(&pk)[..20]);
    let d = query(&net.rpc(4), "/dkg")?;
    let epoch = d["epoch"].as_u64().context("epoch")?;
    let t = d["threshold"].as_u64().context("threshold")? as usize;
    let dst = d["dst"].as_str().context("dst")?.as_bytes().to_vec();
    let g = bls::parse_public_key(&hex::decode(d["group_key"].as_str().context("group key")?)?)?;
    ensure!(
        d["group_key"] == f.group_key.as_str(),
        "node4's /dkg key {} is not the active {}",
        d["group_key"],
        f.group_key
    );
    let shares: Vec<String> = d["public_shares"]
        .as_array()
        .context("public shares")?
        .iter()
        .map(|s| s.as_str().map(str::to_lowercase).context("public share"))
        .collect::<Result<_>>()?;
    let n = shares.len();
    let index = d["signers"]
        .as_array()
        .context("signers")?
        .iter()
        .position(|s| s.as_str().map(str::to_lowercase).as_deref() == Some(&address))
        .with_context(|| format!("the added validator {address} signs no share of the key"))?
        + 1;
    let vals = query(&net.rpc(0), "/validators")?;
    let row = vals["validators"]
        .as_array()
        .context("validators")?
        .iter()
        .find(|v| v["address"] == address.as_str())
        .with_context(|| format!("/validators has no {address}"))?;
    ensure!(
        row["share_index"] == index,
        "/validators gives {address} share index {}, /dkg {index}",
        row["share_index"]
    );
    // Its share file, as the node wrote it.
    let path = net
        .dir()
        .join("node4")
        .join("data")
        .join(format!("bls_share_epoch_{epoch}.json"));
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?,
    )?;
    ensure!(
        file["index"] == index && file["epoch"] == epoch,
        "{}: index {} epoch {}, want {index} {epoch}",
        path.display(),
        file["index"],
        file["epoch"]
    );
    let secret =
        SecretKey::from_bytes(&hex::decode(file["secret"].as_str().context("no secret")?)?)
            .map_err(|e| anyhow::anyhow!("{}: secret {e:?}", path.display()))?;
    let public = secret.sk_to_pk();
    ensure!(
        hex::encode(public.compress()) == shares[index - 1],
        "node4's secret times G1 is {}, the on-chain public share of index {index} is {}",
        hex::encode(public.compress()),
        shares[index - 1]
    );
    // Its signature of the batch verifies under its public share only.
    let sig: Signature = secret.sign(msg, &dst, &[]);
    let on_chain: Vec<PublicKey> = shares
        .iter()
        .map(|s| Ok(bls::parse_public_key(&hex::decode(s)?)?))
        .collect::<Result<_>>()?;
    for (i, share) in on_chain.iter().enumerate() {
        let ok = sig.verify(true, msg, &dst, &[], share, true) == BLST_ERROR::BLST_SUCCESS;
        ensure!(
            ok == (i + 1 == index),
            "node4's signature of the batch {} under the public share of index {}",
            if ok { "verifies" } else { "does not verify" },
            i + 1
        );
    }
    let pubs = PublicShares {
        threshold: t as u32,
        group: g,
        shares: on_chain.clone(),
    };
    let partial = bls::Partial::from_bytes(index as u32, &sig.compress())?;
    ensure!(
        pubs.verify_partial(msg, &partial),
        "Tally's verify_partial refuses node4's partial"
    );
    // Every t of the n public shares interpolate to the group key at 0.
    ensure!((1..=n).contains(&t) && n <= 16, "threshold {t} of {n}");
    let mut subsets = 0;
    for mask in 0u32..(1 << n) {
        if mask.count_ones() as usize != t {
            continue;
        }
        let xs: Vec<i128> = (1..=n as i128)
            .filter(|x| (mask >> (x - 1)) & 1 == 1)
            .collect();
        ensure!(
            interpolates_to(&xs, &on_chain, &g)?,
            "public shares {xs:?} interpolate to another key than the group key"
        );
        subsets += 1;
    }
    eprintln!(
        "node4 holds share {index} of epoch {epoch}; {subsets} subsets of {t} of {n} public shares give the group key"
    );
    Ok(())
}

/// Whether the public shares of indices `xs` interpolate to `g` at 0, in
/// the exponent, with `blst` point additions only: `Σ_i (D λ_i) P_{x_i}
/// = D g`, where `λ_i = Π_{j≠i} x_j / (x_j - x_i)` are the Lagrange
/// coefficients at 0 and `D`, the product of their denominators' sizes,
/// makes every `D λ_i` an integer (so no inverse mod r is needed).
fn interpolates_to(
    xs: &[i128],
    shares: &[blst::min_pk::PublicKey],
    g: &blst::min_pk::PublicKey,
) -> Result<bool> {
    let dens: Vec<i128> = xs
        .iter()
        .map(|&xi| {
            xs.iter()
                .filter(|&&xj| xj != xi)
                .map(|&xj| xj - xi)
                .product()
        })
        .collect();
    let d: i128 = dens.iter().map(|x| x.abs()).product();
    // Positive terms on the left; D g and the negative terms' sizes on
    // the right (the coefficients sum to D, so the left is never empty).
    let mut lhs: Option<blst::min_pk::AggregatePublicKey> = None;
    let mut rhs = times(g, d.unsigned_abs()).context("D is 0")?;
    for (&xi, &den) in xs.iter().zip(&dens) {
        let num: i128 = xs.iter().filter(|&&xj| xj != xi).product();
        ensure!((num * d) % den == 0, "D lambda is not an integer");
        let c = num * d / den;
        let p = shares
            .get(usize::try_from(xi - 1)?)
            .context("index out of range")?;
        let term = times(p, c.unsigned_abs()).context("zero coefficient")?;
        if c < 0 {
            rhs.add_aggregate(&term);
        } else if let Some(l) = &mut lhs {
            l.add_aggregate(&term);
        } else {
            lhs = Some(term);
        }
    }
    Ok(lhs.map(|l| l.to_public_key()) == Some(rhs.to_public_key()))
}

/// `k · p` by double and add (`None` for `k = 0`).
fn times(p: &blst::min_pk::PublicKey, k: u128) -> Option<blst::min_pk::AggregatePublicKey> {
    let base = blst::min_pk::AggregatePublicKey::from_public_key(p);
    let mut acc: Option<blst::min_pk::AggregatePublicKey> = None;
    for bit in (0..128).rev() {
        if let Some(a) = &mut acc {
            let twice = *a;
            a.add_aggregate(&twice);
        }
        if (k >> bit) & 1 == 1 {
            match &mut acc {
                Some(a) => a.add_aggregate(&base),
                None => acc = Some(base),
            }
        }
    }
    acc
}

fn fifth_validator_removed(f: &mut Net) -> Result<()> {
    let net = &f.net;
    let pk = f.fifth.clone().context("no fifth validator")?;
    validator_tx(net, 0, &["propose", "--remove", "--pubkey", &pk])?;
    let id = proposal_id(net, Some(&pk), "remove")?.to_string();
    // The proposer and three approvers: 4 of 5 equal powers, more than 2/3.
    for i in 1..=3 {
        validator_tx(net, i, &["approve", "--id", &id])?;
    }
    f.switched_at = wait_switch(f, 4, 3, &[0, 1, 2, 3])?;
    let left: Vec<String> = comet_validators(&f.net, 0)?
        .into_iter()
        .map(|(_, k, _)| k)
        .collect();
    ensure!(!left.contains(&pk), "the removed key still validates");
    Ok(())
}

fn batch_settles_after_removal(f: &mut Net) -> Result<()> {
    settle_one(f, 43).map(drop)
}

/// Runs `tally-hub ARGS`; its stdout, or an error with its stderr.
fn tally_hub(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(tally_tests::localnet::hub_path()?)
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "tally-hub {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The hub's newest key record.
fn hub_key(net: &Localnet) -> Result<serde_json::Value> {
    let keys = query(&Rpc::new(&net.hub_rpc_url()), "/keys/hub")?;
    keys["keys"]
        .as_array()
        .and_then(|k| k.last())
        .cloned()
        .context("no hub key")
}

fn recovery_through_the_hubs_governors(f: &mut Net) -> Result<()> {
    let net = &f.net;
    // Two validators lose their disks' keys: every share and round key.
    for i in [2, 3] {
        let down = net.take_down("stop", Some(i))?;
        let data = net.dir().join(format!("node{i}")).join("data");
        for e in std::fs::read_dir(&data)? {
            let p = e?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().to_string());
            if name
                .is_some_and(|n| n.starts_with("bls_share_epoch_") || n.starts_with("dkg_round_"))
            {
                std::fs::remove_file(&p)?;
            }
        }
        down.now()?;
    }
    validator_tx(net, 0, &["propose", "--recover"])?;
    let id = proposal_id(net, None, "recover")?.to_string();
    for i in [1, 2] {
        validator_tx(net, i, &["approve", "--id", &id])?;
    }
    let t = Instant::now();
    wait_for("key epoch 4", RESHARE_TIMEOUT, net, || {
        Ok((query(&net.rpc(0), "/dkg")?["epoch"] == 4).then_some(()))
    })?;
    eprintln!("recovered key active {:?} after the approvals", t.elapsed());
    let new_key = query(&net.rpc(0), "/dkg")?["group_key"]
        .as_str()
        .context("no group key")?
        .to_string();
    check_key(net, &[0, 1, 2, 3], 4, &new_key)?;
    let r = query(&net.rpc(0), "/rotations")?["rotations"]
        .as_array()
        .and_then(|r| r.last())
        .cloned()
        .context("no rotation")?;
    ensure!(
        r["governed"] == true && r["signature"].is_null() && r["group_key"] == new_key.as_str(),
        "rotation {r}"
    );
    // The hub still holds G3: only its governors can hand it G4.
    ensure!(
        hub_key(net)?["group_key"] == f.group_key.as_str(),
        "the hub moved on its own"
    );
    let nonce = r["nonce"].as_u64().context("nonce")?.to_string();
    let rotation = [
        "--nonce",
        nonce.as_str(),
        "--epoch",
        "4",
        "--group-key",
        new_key.as_str(),
    ];
    let governors = net.dir().join("hub").join("governors");
    let mut approvals = Vec::new();
    for g in ["gov1.json", "gov2.json"] {
        let key = governors.join(g).display().to_string();
        let mut args = vec![
            "governor",
            "sign",
            "--key",
            &key,
            "--settlement-chain-id",
            &f.chain_id,
        ];
        args.extend_from_slice(&rotation);
        approvals.push(tally_hub(&args)?);
    }
    let hub_url = net.hub_rpc_url();
    let mut args = vec!["govern-key", "--node", hub_url.as_str()];
    args.extend_from_slice(&rotation);
    for a in &approvals {
        args.extend_from_slice(&["--approval", a.as_str()]);
    }
    tally_hub(&args)?;
    let held = hub_key(net)?;
    ensure!(
        held["group_key"] == new_key.as_str() && held["by"] == "governors",
        "hub key {held}"
    );
    f.old_keys
        .push(std::mem::replace(&mut f.group_key, new_key));
    f.switched_at = net.height(0);
    settle_one(f, 47).map(drop)
}

//! End to end on the EVM hub (ADR 0022): four validators on real CometBFT
//! settle on the hub contract deployed on a real anvil (`TALLY_HUB=evm
//! localnet/up.sh`), with the audits of the reference hub's end-to-end
//! tests. One localnet is shared by the named tests below, which run in
//! this order (the runner is `tally_tests::harness`); the books the test
//! keeps (what it deposited, what it billed whom) are the oracle every
//! audit compares the contract and every validator against:
//!
//! 1. `deposits_are_credited_once_on_every_validator`: a plain deposit and
//!    one that binds a new user's key are read back from the contract's
//!    logs as sent, credited on all four validators, and still exactly
//!    once after the chain's deposit cursor has moved well past them;
//! 2. `batches_are_paid_exactly_once`: billed usage settles; every
//!    provider's payout equals what the test billed it, every user's escrow
//!    equals its deposits less its charges and equals its balance on every
//!    validator, and the contract's last nonce equals the batches the chain
//!    counts as settled, each with a settlement block;
//! 3. `anvil_killed_mid_batch_restarts_from_its_state`: anvil is killed
//!    with SIGKILL while a batch is signed and being submitted, restarted
//!    from its state file, and the batch is paid once (same audit);
//! 4. `hub_down_for_minutes_then_paid_once`: anvil is stopped for 150 s
//!    while a batch waits; attempts fail (the chain counts them) and the
//!    ~60 s cooldown runs; once anvil is back the batch is paid once (same
//!    audit);
//! 5. `a_withdrawal_leaves_through_the_contract`: the newcomer of test 1 is
//!    billed and withdraws the rest; the contract credits the address that
//!    funded it, whose `withdraw()` receives exactly that many wei.
//!
//! Needs `cometbft` on PATH (without it every test is reported SKIPPED),
//! npm (the localnet installs anvil from `hub-evm/contract`), and built
//! `tallyd` and `tally-evm` binaries.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tally_hub_evm::{At, EthRpc, EvmHub, HubName, RelayKey, SendOptions, U256};
use tally_node::rpc::Rpc;
use tally_settlement::proto::{Outcome, UsageRecord};
use tally_tests::harness::{self, Test};
use tally_tests::localnet::{free_port_base, tallyd_ok, Localnet, Options};
use tally_tests::sdk::send_all;

/// Ports from here, or the next free block; below Linux's ephemeral range.
const PORT_BASE: u16 = 31456;
const WINDOW_SECS: u64 = 10;
/// EVM blocks (1 s each) a deposit range must be under before it is
/// credited.
const CONFIRMATIONS: u64 = 2;
/// Credits up.sh deposits for each demo user.
const DEMO_ESCROW: u64 = 1_000_000;
const NEWBIE: &str = "evm-newbie";

const TESTS: [Test<Net>; 5] = [
    Test {
        name: "deposits_are_credited_once_on_every_validator",
        needs: &[],
        run: deposits_are_credited_once_on_every_validator,
    },
    Test {
        name: "batches_are_paid_exactly_once",
        needs: &[],
        run: batches_are_paid_exactly_once,
    },
    Test {
        name: "anvil_killed_mid_batch_restarts_from_its_state",
        needs: &[],
        run: anvil_killed_mid_batch_restarts_from_its_state,
    },
    Test {
        name: "hub_down_for_minutes_then_paid_once",
        needs: &[],
        run: hub_down_for_minutes_then_paid_once,
    },
    Test {
        name: "a_withdrawal_leaves_through_the_contract",
        needs: &["deposits_are_credited_once_on_every_validator"],
        run: a_withdrawal_leaves_through_the_contract,
    },
];

fn main() -> ExitCode {
    harness::run(&TESTS, Net::start)
}

/// The shared fixture: the localnet, the contract, and the test's books.
struct Net {
    net: Localnet,
    chain_id: String,
    hub: EvmHub,
    /// `hub_chain`, the contract's name.
    hub_name: String,
    /// anvil's development account 1, which up.sh deposited from.
    depositor: RelayKey,
    /// The newcomer's ed25519 key file.
    newbie_key: std::path::PathBuf,
    /// Credits deposited per user (what the contract credited).
    deposited: BTreeMap<String, u64>,
    /// Credits billed per (user, provider) by this test.
    billed: BTreeMap<(String, String), u64>,
    /// Credits withdrawn per user.
    withdrawn: BTreeMap<String, u64>,
}

impl Net {
    fn start() -> Result<Self> {
        let base = free_port_base(PORT_BASE, 4)?;
        let confirmations = CONFIRMATIONS.to_string();
        let opts = Options {
            up_env: vec![
                ("TALLY_HUB".into(), "evm".into()),
                ("TALLY_HUB_CONFIRMATIONS".into(), confirmations),
            ],
            // node.sh (the hub's kill and start) must know it too.
            env: vec![("TALLY_HUB".into(), "evm".into())],
            ..Options::default()
        };
        let net = Localnet::launch(4, base, "500ms", WINDOW_SECS, &opts)?;
        let chain_id = net.rpc(0).status()?.chain_id;
        let params = query(&net.rpc(0), "/params")?;
        let hub_name = params["hub_chain"]
            .as_str()
            .with_context(|| format!("no hub_chain in /params: {params}"))?
            .to_string();
        let name: HubName = hub_name.parse()?;
        let eth = EthRpc::new(tally_client::rpc::RpcClient::new(
            &net.hub_rpc_url(),
            Duration::from_secs(2),
            Duration::from_secs(10),
        ));
        let hub = EvmHub::connect(eth, name.address)?;
        ensure!(
            hub.name().to_string() == hub_name,
            "the contract at {} calls itself {}, the chain {hub_name}",
            name.address,
            hub.name()
        );
        let depositor = RelayKey::load(&net.dir().join("hub/keys/dev1.key"))?;
        let newbie_key = net.dir().join("evm-newbie.key");
        tally_node::keyfile::write(&newbie_key, NEWBIE, &SigningKey::from_bytes(&[0x5e; 32]))?;
        let deposited = ["alice", "bob", "carol"]
            .iter()
            .map(|u| (u.to_string(), DEMO_ESCROW))
            .collect();
        Ok(Self {
            net,
            chain_id,
            hub,
            hub_name,
            depositor,
            newbie_key,
            deposited,
            billed: BTreeMap::new(),
            withdrawn: BTreeMap::new(),
        })
    }

    fn sync(&self, i: usize) -> Result<Value> {
        query(&self.net.rpc(i), &format!("/sync/{}", self.hub_name))
    }

    fn settled(&self, i: usize) -> u64 {
        self.sync(i)
            .map(|s| s["settled_batches"].as_u64().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Polls `done` every 300 ms until it holds, at most `secs`.
    fn wait(&self, secs: u64, what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
        let t = Instant::now();
        loop {
            if done()? {
                return Ok(());
            }
            ensure!(
                t.elapsed() < Duration::from_secs(secs),
                "{what}: not after {secs} s\n{}",
                self.net.logs_tail()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Bills `n` calls of `amount` to `user` for `provider` through the
    /// SDK (every one must land) and books them.
    fn bill(
        &mut self,
        key: SigningKey,
        user: &str,
        provider: &str,
        n: usize,
        amount: u64,
    ) -> Result<()> {
        let r = UsageRecord {
            user: user.into(),
            provider: provider.into(),
            model: "org/evm".into(),
            route: "/v1/chat".into(),
            outcome: Outcome::Ok as i32,
            units: 1,
            amount,
            ..Default::default()
        };
        let endpoints = vec![self.net.rpc_url(0), self.net.rpc_url(1)];
        let flush = Some(Duration::from_millis(300));
        send_all(
            endpoints,
            &self.chain_id,
            key,
            vec![r; n],
            flush,
            Duration::from_secs(120),
        )?;
        *self
            .billed
            .entry((user.to_string(), provider.to_string()))
            .or_default() += amount * n as u64;
        Ok(())
    }

    /// Waits until everything billed or withdrawn has settled: a charge
    /// leaves a user's balance on the chain at once but its escrow on the
    /// contract only when its batch is paid, so the two agree for every
    /// user only then; and no call is pending or in flight on validator 1.
    fn wait_all_settled(&self, secs: u64) -> Result<()> {
        let (eth, at) = (self.hub.eth(), self.hub.address());
        self.wait(
            secs,
            "every charge and withdrawal settled on the hub",
            || {
                let s = self.sync(1)?;
                if s["pending_calls"].as_u64() != Some(0) || s["nonce"].is_u64() {
                    return Ok(false);
                }
                for u in self.deposited.keys() {
                    let Ok(escrow) = eth.escrow(at, u, At::Latest) else {
                        return Ok(false);
                    };
                    if self.net.balance(1, u)? != escrow {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
    }

    /// The books: every provider's payout is what the test billed it,
    /// every user's escrow is its deposits less charges and withdrawals and
    /// equals its balance on every validator, and every nonce up to the
    /// contract's last settled once (a settlement block each; the chain
    /// counts exactly those).
    fn audit(&self) -> Result<()> {
        let (eth, at) = (self.hub.eth(), self.hub.address());
        let mut per_provider: BTreeMap<&str, u64> = BTreeMap::new();
        let mut per_user: BTreeMap<&str, u64> = BTreeMap::new();
        for ((u, p), amount) in &self.billed {
            *per_provider.entry(p).or_default() += amount;
            *per_user.entry(u).or_default() += amount;
        }
        for (p, owed) in &per_provider {
            let paid = eth.payout(at, p, At::Latest)?;
            ensure!(paid == *owed, "provider {p}: paid {paid}, billed {owed}");
        }
        for (u, dep) in &self.deposited {
            let charged = per_user.get(u.as_str()).copied().unwrap_or(0);
            let out = self.withdrawn.get(u).copied().unwrap_or(0);
            let want = dep - charged - out;
            let escrow = eth.escrow(at, u, At::Latest)?;
            ensure!(
                escrow == want,
                "{u}: escrow {escrow}, deposited {dep} - billed {charged} - withdrawn {out} = {want}"
            );
            for i in 0..4 {
                let b = self.net.balance(i, u)?;
                ensure!(
                    b == want,
                    "node{i}: {u} has {b}, the contract escrows {want}"
                );
            }
            let w = eth.withdrawn(at, u, At::Latest)?;
            ensure!(
                w == out,
                "{u}: the contract says {w} withdrawn, the test {out}"
            );
        }
        let last = eth.last_nonce(at, At::Latest)?;
        for n in 1..=last {
            ensure!(
                eth.settled_at(at, n, At::Latest)? > 0,
                "nonce {n} <= last {last} has no settlement block"
            );
        }
        ensure!(
            eth.settled_at(at, last + 1, At::Latest)? == 0,
            "nonce {} settled beyond the last",
            last + 1
        );
        for i in 0..4 {
            let s = self.settled(i);
            ensure!(
                s == last,
                "node{i} counts {s} settled batches, the contract {last}"
            );
        }
        eprintln!(
            "[e2e] books exact: {} batches, providers {per_provider:?}",
            last
        );
        Ok(())
    }
}

fn query(rpc: &Rpc, path: &str) -> Result<Value> {
    let r = rpc.abci_query(path)?;
    ensure!(r.code == 0, "{path}: code {} {}", r.code, r.log);
    Ok(serde_json::from_slice(&r.value)?)
}

fn deposits_are_credited_once_on_every_validator(f: &mut Net) -> Result<()> {
    let opts = SendOptions::default();
    let at = f.hub.address();
    let count_before = f.hub.eth().deposit_count(at, At::Latest)?;
    let fee = f.hub.eth().registration_fee(at, At::Latest)?;
    // A plain deposit, and one that binds the newcomer's key (it pays the
    // registration fee).
    let plain = f.hub.deposit(&f.depositor, "erin", 55, &[], &opts)?;
    let (_, newbie) = tally_node::keyfile::load(&f.newbie_key)?;
    let pubkey = newbie.verifying_key().to_bytes();
    let keyed = f
        .hub
        .deposit(&f.depositor, NEWBIE, 10_000 + fee, &pubkey, &opts)?;
    f.deposited.insert("erin".into(), 55);
    f.deposited.insert(NEWBIE.into(), 10_000);
    let (from, to) = (plain.receipt.block_number, keyed.receipt.block_number);
    // Read back from the logs as sent.
    let logs = f.hub.eth().deposits(at, from, to)?;
    let got: Vec<_> = logs
        .iter()
        .map(|l| {
            (
                l.deposit.seq,
                l.deposit.user.as_str(),
                l.deposit.amount,
                l.deposit.pubkey.clone(),
                l.fee,
            )
        })
        .collect();
    let want = vec![
        (count_before + 1, "erin", 55, Vec::new(), 0),
        (count_before + 2, NEWBIE, 10_000, pubkey.to_vec(), fee),
    ];
    ensure!(got == want, "deposit logs {got:?}, sent {want:?}");
    ensure!(f.hub.eth().deposit_count(at, At::Latest)? == count_before + 2);
    f.wait(90, "both deposits credited on every validator", || {
        Ok((0..4).all(|i| {
            f.net.balance(i, "erin").is_ok_and(|b| b == 55)
                && f.net.balance(i, NEWBIE).is_ok_and(|b| b == 10_000)
        }))
    })?;
    // The key bound on the chain.
    let key_hex = hex::encode(pubkey);
    f.wait(30, "the newcomer's key bound on every validator", || {
        Ok((0..4).all(|i| {
            query(&f.net.rpc(i), &format!("/allowances/{NEWBIE}"))
                .is_ok_and(|a| a["key"] == key_hex.as_str())
        }))
    })?;
    // Once: the deposit cursor moves well past the deposits' block (each
    // range is credited at most once, so a second credit would show by
    // now), and the balances are still exactly what was sent.
    f.wait(60, "the deposit cursor 5 blocks past the deposits", || {
        Ok((0..4).all(|i| {
            f.sync(i)
                .is_ok_and(|s| s["hub_cursor"].as_u64().unwrap_or(0) > to + 5)
        }))
    })?;
    for i in 0..4 {
        ensure!(
            f.net.balance(i, "erin")? == 55,
            "node{i}: erin credited twice?"
        );
        ensure!(f.net.balance(i, NEWBIE)? == 10_000, "node{i}: {NEWBIE}");
        let s = f.sync(i)?;
        let credited = s["next_deposit_seq"]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(1);
        ensure!(
            credited == count_before + 2,
            "node{i} credited {credited} deposits, the contract made {}",
            count_before + 2
        );
    }
    Ok(())
}

fn batches_are_paid_exactly_once(f: &mut Net) -> Result<()> {
    let key = f.net.gateway_key()?;
    f.bill(key.clone(), "alice", "evm-prov-a", 6, 7)?;
    f.bill(key.clone(), "bob", "evm-prov-a", 3, 11)?;
    f.bill(key, "carol", "evm-prov-b", 4, 5)?;
    // Settlement latency: from the close of the window the last call was
    // billed in (block times follow the wall clock here) to the contract
    // showing the batch paid.
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    let close = ((now / WINDOW_SECS as f64).floor() + 1.0) * WINDOW_SECS as f64;
    f.wait_all_settled(120)?;
    let paid = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
    eprintln!(
        "[e2e] window close -> batch paid on anvil: {:.1} s",
        paid - close
    );
    f.audit()
}

/// The chain's current batch on validator 1 is signed: (nonce, attempt).
fn signed_batch(f: &Net) -> Result<Option<(u64, u64)>> {
    let s = f.sync(1)?;
    let Some(nonce) = s["nonce"].as_u64() else {
        return Ok(None);
    };
    let b = query(&f.net.rpc(1), &format!("/batch/{}/{nonce}", f.hub_name))?;
    Ok((!b["signature"].is_null()).then(|| (nonce, s["attempt"].as_u64().unwrap_or(0))))
}

fn anvil_killed_mid_batch_restarts_from_its_state(f: &mut Net) -> Result<()> {
    let key = f.net.gateway_key()?;
    f.bill(key, "alice", "evm-prov-kill", 5, 9)?;
    // Wait for the batch to be signed (a relay submits within a poll).
    let mut signed = None;
    f.wait(90, "the batch signed", || {
        signed = signed_batch(f)?;
        Ok(signed.is_some())
    })?;
    let (nonce, _) = signed.context("no batch")?;
    f.net.hub("kill")?;
    eprintln!("[e2e] anvil killed (SIGKILL) with batch {nonce} signed");
    std::thread::sleep(Duration::from_secs(2));
    f.net.hub("start")?;
    let t = Instant::now();
    f.wait_all_settled(180)?;
    eprintln!(
        "[e2e] batch {nonce} settled {:.1} s after anvil restarted",
        t.elapsed().as_secs_f64()
    );
    f.audit()
}

fn hub_down_for_minutes_then_paid_once(f: &mut Net) -> Result<()> {
    const DOWN: Duration = Duration::from_secs(150);
    let failures_before = f.sync(1)?["failures"].as_u64().unwrap_or(0);
    f.net.hub("stop")?;
    let down = Instant::now();
    let key = f.net.gateway_key()?;
    f.bill(key, "bob", "evm-prov-down", 4, 13)?;
    f.wait(120, "an attempt failed while the hub is down", || {
        Ok(f.sync(1)?["failures"].as_u64().unwrap_or(0) > failures_before)
    })?;
    std::thread::sleep(DOWN.saturating_sub(down.elapsed()));
    ensure!(
        f.net.balance(1, "bob")? < DEMO_ESCROW,
        "bob was not charged while the hub was down"
    );
    f.net.hub("start")?;
    let back = Instant::now();
    // After the cooldown (about 60 s) and an attempt deadline (30 s).
    f.wait_all_settled(150)?;
    let failures = f.sync(1)?["failures"].as_u64().unwrap_or(0) - failures_before;
    eprintln!(
        "[e2e] hub down {:.0} s: {failures} failed attempts; paid {:.1} s after it was back",
        DOWN.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );
    f.audit()
}

fn a_withdrawal_leaves_through_the_contract(f: &mut Net) -> Result<()> {
    let (eth, at) = (f.hub.eth().clone(), f.hub.address());
    let from = f.newbie_key.display().to_string();
    let url = f.net.rpc_url(0);
    tallyd_ok(&[
        "tx",
        "allowance",
        "grant",
        "--from",
        &from,
        "--user",
        NEWBIE,
        "--gateway",
        "demo-gateway",
        "--max-per-window",
        "100000",
        "--expires-in",
        "3600",
        "--node",
        &url,
    ])?;
    f.bill(f.net.gateway_key()?, NEWBIE, "evm-prov-w", 10, 35)?;
    f.wait(30, "350 charged on every node", || {
        Ok((0..4).all(|i| f.net.balance(i, NEWBIE).is_ok_and(|b| b == 9_650)))
    })?;
    let before = eth.withdrawable(at, f.depositor.address(), At::Latest)?;
    tallyd_ok(&[
        "tx", "withdraw", "--from", &from, "--user", NEWBIE, "--amount", "9650", "--node", &url,
    ])?;
    f.withdrawn.insert(NEWBIE.into(), 9_650);
    f.wait(150, "the contract paid the withdrawal", || {
        Ok(eth.withdrawn(at, NEWBIE, At::Latest)? == 9_650)
    })?;
    f.wait_all_settled(120)?;
    f.audit()?;
    // The funding address may now take the wei.
    let per_credit = eth.wei_per_credit(at, At::Latest)?;
    let owed = eth.withdrawable(at, f.depositor.address(), At::Latest)?;
    ensure!(
        owed == before + per_credit * U256::from(9_650u64),
        "withdrawable {owed}, expected {before} + 9650 x {per_credit}"
    );
    let wallet = eth.balance(f.depositor.address(), At::Latest)?;
    let sent = f.hub.withdraw(&f.depositor, &SendOptions::default())?;
    let gas = U256::from(sent.receipt.gas_used) * U256::from(sent.receipt.effective_gas_price);
    let after = eth.balance(f.depositor.address(), At::Number(sent.receipt.block_number))?;
    ensure!(
        after + gas == wallet + owed,
        "wallet {wallet} + owed {owed} != after {after} + gas {gas}"
    );
    ensure!(eth.withdrawable(at, f.depositor.address(), At::Latest)? == U256::ZERO);
    // Once: a second withdrawal on Tally finds nothing to take.
    let again = tally_tests::localnet::run_tallyd(&[
        "tx", "withdraw", "--from", &from, "--user", NEWBIE, "--amount", "1", "--node", &url,
    ])?;
    if again.status.success() {
        bail!("a second withdrawal was accepted with a zero balance");
    }
    Ok(())
}

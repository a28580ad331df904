//! The EVM hub end to end on a real anvil (the one `npm ci` installs in
//! `hub-evm/contract/node_modules`), with group keys and signatures made
//! by Tally's own BLS code (`tally_settlement::bls`) over the digests and
//! message framing the chain signs (`tally_settlement::sync`).
//!
//! Every test starts its own anvil on 127.0.0.1 at a free port in
//! 28800-28899 (killed by a Drop guard) and deploys its own hub. When
//! anvil or the contract artifact cannot be had, a test prints a line
//! starting `SKIPPED:` and passes, unless `TALLY_E2E_REQUIRED=1`, when it
//! fails.
//!
//! Run with `--nocapture` to see the gas figures.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;
use tally_client::rpc::RpcClient;
use tally_hub_evm::abi::{self, DeployArgs, Refusal, RefusalCode, Revert};
use tally_hub_evm::rpc::CallRequest;
use tally_hub_evm::{Address, At, EthRpc, EvmHub, HubError, HubName, RelayKey, SendOptions, U256};
use tally_settlement::bls::{self, Kind, PublicShares, SecretShare};
use tally_settlement::proto::HubCall;
use tally_settlement::sync::{batch_digest, rotation_digest};

const TALLY_CHAIN: &str = "tally-localnet";
const WEI_PER_CREDIT: u64 = 1_000_000_000;
/// The standard proof-of-possession ciphersuite's tag: not Tally's.
const STANDARD_DST: &[u8] = b"BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_";

// ---------------------------------------------------------------- anvil

/// A running anvil, killed when dropped.
struct Anvil {
    child: Child,
    url: String,
}

impl Drop for Anvil {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn contract_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contract")
}

/// anvil from `node_modules/@foundry-rs/anvil-<platform>/bin/anvil`.
fn find_anvil() -> Option<PathBuf> {
    let dir = contract_dir().join("node_modules/@foundry-rs");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin/anvil"))
        .find(|p| p.is_file())
}

/// anvil, running `npm ci` in `contract/` first when it is not installed
/// (once per test process: the tests run in parallel).
fn anvil_binary() -> Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(install_anvil).clone()
}

fn install_anvil() -> Result<PathBuf, String> {
    if let Some(p) = find_anvil() {
        return Ok(p);
    }
    let status = Command::new("npm")
        .arg("ci")
        .current_dir(contract_dir())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("anvil is not installed and npm cannot run: {e}"))?;
    if !status.success() {
        return Err(format!(
            "anvil is not installed and `npm ci` failed ({status})"
        ));
    }
    find_anvil().ok_or_else(|| "`npm ci` ran but installed no anvil".into())
}

/// Ports handed out in this process (tests run in parallel threads).
static NEXT_PORT: AtomicU16 = AtomicU16::new(28800);

fn start_anvil(bin: &Path) -> Result<Anvil, String> {
    loop {
        let port = NEXT_PORT.fetch_add(1, Ordering::SeqCst);
        if port > 28899 {
            return Err("no free port in 28800-28899".into());
        }
        // Free now (another process may hold it: then try the next).
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--chain-id", "31337", "--silent"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut anvil = Anvil {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let eth = eth_of(&anvil.url);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if eth.chain_id().is_ok() {
                return Ok(anvil);
            }
            if let Ok(Some(_)) = anvil.child.try_wait() {
                break; // lost the port: try the next
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(anvil);
    }
}

fn eth_of(url: &str) -> EthRpc {
    EthRpc::new(RpcClient::new(
        url,
        Duration::from_secs(2),
        Duration::from_secs(30),
    ))
}

/// A test's world: anvil, a funded relay key, the endpoint.
struct World {
    _anvil: Anvil,
    eth: EthRpc,
    key: RelayKey,
    _dir: tempfile::TempDir,
}

impl World {
    fn fund(&self, who: Address) {
        self.eth
            .client()
            .call(
                "anvil_setBalance",
                json!([who.to_string(), "0x3635c9adc5dea00000"]), // 1000 ether
            )
            .unwrap();
    }

    fn new_key(&self, name: &str) -> RelayKey {
        let k = RelayKey::create(&self._dir.path().join(name)).unwrap();
        self.fund(k.address());
        k
    }

    fn deploy(&self, group: &Group, tweak: impl FnOnce(&mut DeployArgs)) -> EvmHub {
        let mut args = DeployArgs {
            tally_chain_id: TALLY_CHAIN.into(),
            group_key: group.key(),
            last_rotation: 0,
            wei_per_credit: U256::from(WEI_PER_CREDIT),
            registration_fee: 0,
            governors: vec![],
            governor_threshold: 0,
        };
        tweak(&mut args);
        let (hub, sent) =
            EvmHub::deploy(self.eth.clone(), &self.key, &args, &SendOptions::default()).unwrap();
        println!("gas: deploy {}", sent.receipt.gas_used);
        hub
    }
}

/// The test's anvil, or `None` after a `SKIPPED:` line (a failure when
/// `TALLY_E2E_REQUIRED=1`).
fn world(test: &str) -> Option<World> {
    let skip = |why: String| {
        let required = std::env::var("TALLY_E2E_REQUIRED").is_ok_and(|v| v == "1");
        println!("SKIPPED: {test}: {why}");
        eprintln!("SKIPPED: {test}: {why}");
        assert!(
            !required,
            "TALLY_E2E_REQUIRED=1 but {test} cannot run: {why}"
        );
    };
    if let Err(e) = abi::artifact() {
        skip(e.to_string());
        return None;
    }
    let bin = match anvil_binary() {
        Ok(b) => b,
        Err(e) => {
            skip(e);
            return None;
        }
    };
    let anvil = match start_anvil(&bin) {
        Ok(a) => a,
        Err(e) => {
            skip(e);
            return None;
        }
    };
    let eth = eth_of(&anvil.url);
    let dir = tempfile::tempdir().unwrap();
    let key = RelayKey::create(&dir.path().join("relay.key")).unwrap();
    let w = World {
        _anvil: anvil,
        eth,
        key,
        _dir: dir,
    };
    w.fund(w.key.address());
    Some(w)
}

// ------------------------------------------------------------ BLS group

/// A dealt t-of-n group: signs by combining t partials, as the chain does.
struct Group {
    pubs: PublicShares,
    shares: Vec<SecretShare>,
}

impl Group {
    fn dealt(n: u32, t: u32, seed: u8) -> Group {
        let randomness: Vec<[u8; 64]> = (0..t)
            .map(|i| {
                let mut b = [0u8; 64];
                for (j, x) in b.iter_mut().enumerate() {
                    *x = seed
                        .wrapping_mul(31)
                        .wrapping_add(i as u8)
                        .wrapping_mul(7)
                        .wrapping_add(j as u8);
                }
                b
            })
            .collect();
        let (pubs, shares) = bls::deal(n, t, &randomness).unwrap();
        Group { pubs, shares }
    }

    fn key(&self) -> Vec<u8> {
        self.pubs.group.compress().to_vec()
    }

    /// The group signature of `kind` over `payload` on Tally's chain.
    fn sign(&self, kind: Kind, payload: &[u8; 32]) -> [u8; 96] {
        let msg = bls::message(TALLY_CHAIN, kind, payload);
        let t = self.pubs.threshold as usize;
        let partials: Vec<_> = self.shares[self.shares.len() - t..]
            .iter()
            .map(|s| s.sign(&msg))
            .collect();
        self.pubs.combine(&msg, &partials).unwrap().compress()
    }

    fn sign_batch(&self, hub: &HubName, nonce: u64, calls: &[HubCall]) -> [u8; 96] {
        self.sign(Kind::Batch, &batch_digest(&hub.to_string(), nonce, calls))
    }

    /// Signs `calls` as batch `nonce` of `hub` and submits them from `key`.
    fn submit(
        &self,
        hub: &EvmHub,
        key: &RelayKey,
        nonce: u64,
        calls: &[HubCall],
    ) -> Result<tally_hub_evm::Sent, HubError> {
        let sig = self.sign_batch(&hub.name(), nonce, calls);
        hub.submit_batch(key, nonce, calls, &sig, &opts())
    }
}

fn pay(id: u64, user: &str, provider: &str, amount: u64) -> HubCall {
    HubCall {
        id,
        user: user.into(),
        provider: provider.into(),
        amount,
        window: 30_000_000 + id,
        kind: 0,
    }
}

fn withdrawal(id: u64, user: &str, amount: u64) -> HubCall {
    HubCall {
        id,
        user: user.into(),
        provider: String::new(),
        amount,
        window: 30_000_000 + id,
        kind: 1,
    }
}

fn opts() -> SendOptions {
    SendOptions {
        receipt_timeout: Duration::from_secs(30),
        poll_every: Duration::from_millis(50),
        ..SendOptions::default()
    }
}

/// The refusal a hub operation met in simulation (nothing sent).
fn refused(r: Result<tally_hub_evm::Sent, HubError>) -> Refusal {
    match r {
        Err(HubError::Simulated(Revert::Refused(x))) => x,
        other => panic!("expected a refusal in simulation, got {other:?}"),
    }
}

fn at(hub: &EvmHub) -> (Address, &EthRpc) {
    (hub.address(), hub.eth())
}

// ---------------------------------------------------------------- tests

#[test]
fn a_signed_batch_pays_exactly_once_and_withdrawals_reach_the_depositor() {
    let Some(w) = world("a_signed_batch_pays_exactly_once") else {
        return;
    };
    let g = Group::dealt(4, 3, 1);
    let hub = w.deploy(&g, |_| {});
    let (c, eth) = at(&hub);
    // The contract names itself as the Rust side does.
    assert_eq!(eth.hub_name(c, At::Latest).unwrap(), hub.name().to_string());
    assert_eq!(eth.tally_chain_id(c, At::Latest).unwrap(), TALLY_CHAIN);
    assert_eq!(eth.group_key(c, At::Latest).unwrap(), g.key());
    assert_eq!(
        EvmHub::connect(w.eth.clone(), c).unwrap().name(),
        hub.name()
    );

    let d = hub.deposit(&w.key, "alice", 100, &[], &opts()).unwrap();
    println!("gas: deposit (first, no key) {}", d.receipt.gas_used);
    let d = hub.deposit(&w.key, "bob", 50, &[], &opts()).unwrap();
    println!("gas: deposit (second user) {}", d.receipt.gas_used);

    let calls = vec![
        pay(1, "alice", "acme-ai", 36),
        pay(2, "bob", "acme-ai", 20),
        pay(3, "alice", "beta", 14),
        withdrawal(4, "bob", 5),
    ];
    let sig = g.sign_batch(&hub.name(), 1, &calls);
    let sent = hub.submit_batch(&w.key, 1, &calls, &sig, &opts()).unwrap();
    println!(
        "gas: submit batch of {} calls {} (limit {})",
        calls.len(),
        sent.receipt.gas_used,
        sent.gas_limit
    );
    let b = At::Number(sent.receipt.block_number);
    assert_eq!(eth.payout(c, "acme-ai", b).unwrap(), 56);
    assert_eq!(eth.payout(c, "beta", b).unwrap(), 14);
    assert_eq!(eth.escrow(c, "alice", b).unwrap(), 100 - 36 - 14);
    assert_eq!(eth.escrow(c, "bob", b).unwrap(), 50 - 20 - 5);
    assert_eq!(eth.withdrawn(c, "bob", b).unwrap(), 5);
    assert_eq!(eth.last_nonce(c, b).unwrap(), 1);
    assert_eq!(eth.settled_at(c, 1, b).unwrap(), sent.receipt.block_number);
    assert_eq!(eth.settled_at(c, 2, b).unwrap(), 0);

    // The same batch again: refused in simulation, nothing sent.
    let before = eth.next_nonce(w.key.address()).unwrap();
    let again = refused(hub.submit_batch(&w.key, 1, &calls, &sig, &opts()));
    assert_eq!(again, Refusal::AlreadySettled { nonce: 1, last: 1 });
    assert_eq!(again.code(), RefusalCode::AlreadySettled);
    assert_eq!(eth.next_nonce(w.key.address()).unwrap(), before);
    assert_eq!(eth.payout(c, "acme-ai", At::Latest).unwrap(), 56);

    // Bob's withdrawal went to the address that first funded bob.
    let wei = U256::from(5 * WEI_PER_CREDIT);
    assert_eq!(
        eth.withdrawable(c, w.key.address(), At::Latest).unwrap(),
        wei
    );
    let bal = eth.balance(w.key.address(), At::Latest).unwrap();
    let out = hub.withdraw(&w.key, &opts()).unwrap();
    let bal2 = eth.balance(w.key.address(), At::Latest).unwrap();
    let gas_paid = bal + wei - bal2;
    assert!(gas_paid > U256::ZERO && gas_paid < U256::from(10u64.pow(16)));
    println!("gas: withdraw {}", out.receipt.gas_used);
    assert!(matches!(
        hub.withdraw(&w.key, &opts()),
        Err(HubError::Simulated(Revert::NothingToWithdraw))
    ));
}

#[test]
fn tampered_calls_and_a_foreign_dst_are_bad_signatures() {
    let Some(w) = world("tampered_calls_and_a_foreign_dst_are_bad_signatures") else {
        return;
    };
    let g = Group::dealt(1, 1, 2); // one share: the group secret, for the foreign DST
    let hub = w.deploy(&g, |_| {});
    let (c, eth) = at(&hub);
    hub.deposit(&w.key, "alice", 100, &[], &opts()).unwrap();
    let calls = vec![pay(1, "alice", "acme-ai", 36)];
    let sig = g.sign_batch(&hub.name(), 1, &calls);

    let mut tampered = calls.clone();
    tampered[0].amount = 37;
    let r = refused(hub.submit_batch(&w.key, 1, &tampered, &sig, &opts()));
    assert_eq!(
        (r.clone(), r.code()),
        (Refusal::BadSignature, RefusalCode::BadSignature)
    );
    let mut other_provider = calls.clone();
    other_provider[0].provider = "mallory".into();
    assert_eq!(
        refused(hub.submit_batch(&w.key, 1, &other_provider, &sig, &opts())),
        Refusal::BadSignature
    );

    // The same message under the standard ciphersuite's tag.
    let sk = blst::min_pk::SecretKey::from_bytes(&g.shares[0].to_bytes()).unwrap();
    let msg = bls::message(
        TALLY_CHAIN,
        Kind::Batch,
        &batch_digest(&hub.name().to_string(), 1, &calls),
    );
    let foreign = sk.sign(&msg, STANDARD_DST, &[]).compress();
    assert_ne!(foreign, sig);
    assert_eq!(
        refused(hub.submit_batch(&w.key, 1, &calls, &foreign, &opts())),
        Refusal::BadSignature
    );
    // Signed for another hub name (the reference hub's "hub").
    let elsewhere = g.sign(Kind::Batch, &batch_digest("hub", 1, &calls));
    assert_eq!(
        refused(hub.submit_batch(&w.key, 1, &calls, &elsewhere, &opts())),
        Refusal::BadSignature
    );
    // Nothing was paid; the right signature still pays.
    assert_eq!(eth.payout(c, "acme-ai", At::Latest).unwrap(), 0);
    hub.submit_batch(&w.key, 1, &calls, &sig, &opts()).unwrap();
    assert_eq!(eth.payout(c, "acme-ai", At::Latest).unwrap(), 36);
}

#[test]
fn a_gap_is_bad_nonce_and_an_overdraft_pays_nothing() {
    let Some(w) = world("a_gap_is_bad_nonce_and_an_overdraft_pays_nothing") else {
        return;
    };
    let g = Group::dealt(3, 2, 3);
    let hub = w.deploy(&g, |_| {});
    let (c, eth) = at(&hub);
    hub.deposit(&w.key, "alice", 10, &[], &opts()).unwrap();
    hub.deposit(&w.key, "bob", 10, &[], &opts()).unwrap();

    let calls = vec![pay(1, "alice", "acme-ai", 4)];
    let gap = refused(g.submit(&hub, &w.key, 2, &calls));
    assert_eq!(
        gap,
        Refusal::NonceGap {
            nonce: 2,
            expected: 1
        }
    );
    assert_eq!(gap.code(), RefusalCode::BadNonce);

    // Alice owes 6 + 5 = 11 of her 10; bob's call alone would be fine.
    let over = vec![
        pay(1, "alice", "acme-ai", 6),
        pay(2, "bob", "acme-ai", 3),
        pay(3, "alice", "beta", 5),
    ];
    let r = refused(g.submit(&hub, &w.key, 1, &over));
    assert_eq!(
        r,
        Refusal::InsufficientEscrow {
            user: "alice".into(),
            owed: 11,
            escrow: 10
        }
    );
    assert_eq!(r.code(), RefusalCode::InsufficientEscrow);
    for (who, want) in [("alice", 10), ("bob", 10)] {
        assert_eq!(eth.escrow(c, who, At::Latest).unwrap(), want);
    }
    assert_eq!(eth.payout(c, "acme-ai", At::Latest).unwrap(), 0);
    assert_eq!(eth.last_nonce(c, At::Latest).unwrap(), 0);
}

/// Whatever gas limit a valid batch is given, it either pays or fails
/// as LowGas / out of gas: never as a bad signature. Also the same sent
/// for real: simulation catches it and nothing is sent.
#[test]
fn too_little_gas_is_low_gas_never_bad_signature() {
    let Some(w) = world("too_little_gas_is_low_gas_never_bad_signature") else {
        return;
    };
    let g = Group::dealt(4, 3, 4);
    let hub = w.deploy(&g, |_| {});
    hub.deposit(&w.key, "alice", 100, &[], &opts()).unwrap();
    let calls = vec![pay(1, "alice", "acme-ai", 36), pay(2, "alice", "beta", 1)];
    let sig = g.sign_batch(&hub.name(), 1, &calls);
    let data = abi::submit_batch_calldata(1, &calls, &sig).unwrap();
    let mut req = CallRequest {
        from: Some(w.key.address()),
        to: Some(hub.address()),
        data,
        ..CallRequest::default()
    };
    let est = w.eth.estimate_gas(&req, At::Latest).unwrap();
    println!("gas: estimate for a 2-call batch {est}");
    // Below the transaction's intrinsic cost (calldata included) the node
    // refuses the call outright; from there on the contract runs.
    let (mut intrinsic, mut low, mut empty, mut ok) = (0, 0, 0, 0);
    let mut a_low_gas = None;
    let mut gas = 21_000;
    while gas <= est + 20_000 {
        req.gas = Some(gas);
        match w.eth.eth_call(&req, At::Latest) {
            Ok(_) => ok += 1,
            Err(tally_hub_evm::EthError::Node { message, .. })
                if message.contains("intrinsic gas") && low + empty + ok == 0 =>
            {
                intrinsic += 1
            }
            Err(e) => match e.revert() {
                Some(r @ Revert::LowGas { .. }) => {
                    low += 1;
                    a_low_gas = Some((gas, r.clone()));
                    assert_eq!(r.code(), None);
                }
                Some(Revert::Empty) => empty += 1,
                other => panic!("gas {gas}: {other:?} ({e})"),
            },
        }
        gas += 5_000;
    }
    println!(
        "gas sweep 21k..{} by 5k: {intrinsic} below intrinsic, {low} LowGas, {empty} out of gas, {ok} ok",
        est + 20_000
    );
    let (lg, r) = a_low_gas.expect("some gas limit meets the LowGas check");
    println!("gas: LowGas at limit {lg}: {r}");
    assert!(ok > 0);

    // Sent with that limit: refused in simulation as LowGas, not sent.
    let before = w.eth.next_nonce(w.key.address()).unwrap();
    let low_opts = SendOptions {
        gas_limit: Some(lg),
        ..opts()
    };
    let e = hub
        .submit_batch(&w.key, 1, &calls, &sig, &low_opts)
        .unwrap_err();
    let r = e.revert().expect("a revert");
    assert!(r.is_low_gas(), "{e}");
    assert_ne!(r.code(), Some(RefusalCode::BadSignature));
    assert_eq!(w.eth.next_nonce(w.key.address()).unwrap(), before);
    // With the estimate's margin it pays.
    hub.submit_batch(&w.key, 1, &calls, &sig, &opts()).unwrap();
}

/// Two relays submit the same batch into one block: one pays, the
/// other's mined transaction reverts and is reported as AlreadySettled
/// (the replay on the state its block left).
#[test]
fn two_relays_racing_one_pays_the_other_reads_already_settled() {
    let Some(w) = world("two_relays_racing") else {
        return;
    };
    let g = Group::dealt(4, 3, 5);
    let hub = w.deploy(&g, |_| {});
    hub.deposit(&w.key, "alice", 100, &[], &opts()).unwrap();
    let calls = vec![pay(1, "alice", "acme-ai", 36)];
    let sig = g.sign_batch(&hub.name(), 1, &calls);
    let a = w.new_key("a.key");
    let b = w.new_key("b.key");
    let rpc = w.eth.client();
    rpc.call("evm_setAutomine", json!([false])).unwrap();
    let fixed = SendOptions {
        gas_limit: Some(1_000_000),
        ..opts()
    };
    let hub = Arc::new(hub);
    let (calls, sig) = (Arc::new(calls), Arc::new(sig));
    let spawn = |key: RelayKey| {
        let (hub, calls, sig, fixed) = (hub.clone(), calls.clone(), sig.clone(), fixed);
        std::thread::spawn(move || hub.submit_batch(&key, 1, &calls, &*sig, &fixed))
    };
    let pending = |k: &RelayKey| w.eth.next_nonce(k.address()).unwrap();
    let wait_pending = |k: &RelayKey| {
        let start = Instant::now();
        while pending(k) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "tx not in the pool"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let ta = spawn(a.clone());
    wait_pending(&a);
    let tb = spawn(b.clone());
    wait_pending(&b);
    rpc.call("evm_mine", json!([])).unwrap();
    let results = [ta.join().unwrap(), tb.join().unwrap()];
    rpc.call("evm_setAutomine", json!([true])).unwrap();
    let oks = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(oks, 1, "{results:?}");
    let failed = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    match failed {
        HubError::Reverted(m) => assert_eq!(
            &m.revert,
            &Some(Revert::Refused(Refusal::AlreadySettled {
                nonce: 1,
                last: 1
            }))
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        hub.eth()
            .payout(hub.address(), "acme-ai", At::Latest)
            .unwrap(),
        36
    );
}

#[test]
fn a_rotation_signed_by_the_current_key_hands_over_to_the_new_one() {
    let Some(w) = world("a_rotation_hands_over") else {
        return;
    };
    let old = Group::dealt(4, 3, 6);
    let new = Group::dealt(3, 2, 7);
    let hub = w.deploy(&old, |_| {});
    let (c, eth) = at(&hub);
    let name = hub.name().to_string();
    hub.deposit(&w.key, "alice", 100, &[], &opts()).unwrap();

    // Signed by the new key instead of the current one: refused.
    let digest = rotation_digest(&name, 1, 2, &new.key());
    let by_new = new.sign(Kind::KeyRotation, &digest);
    let r = refused(hub.rotate_key(&w.key, 1, 2, &new.key(), &by_new, &opts()));
    assert_eq!(r, Refusal::BadSignature);
    // A gap.
    let gap_sig = old.sign(Kind::KeyRotation, &rotation_digest(&name, 2, 2, &new.key()));
    let r = refused(hub.rotate_key(&w.key, 2, 2, &new.key(), &gap_sig, &opts()));
    assert_eq!(
        r,
        Refusal::RotationGap {
            nonce: 2,
            expected: 1
        }
    );
    assert_eq!(r.code(), RefusalCode::BadNonce);

    let by_old = old.sign(Kind::KeyRotation, &digest);
    let sent = hub
        .rotate_key(&w.key, 1, 2, &new.key(), &by_old, &opts())
        .unwrap();
    println!("gas: rotate key {}", sent.receipt.gas_used);
    assert_eq!(eth.group_key(c, At::Latest).unwrap(), new.key());
    assert_eq!(eth.last_rotation(c, At::Latest).unwrap(), 1);
    let r = refused(hub.rotate_key(&w.key, 1, 2, &new.key(), &by_old, &opts()));
    assert_eq!(r, Refusal::RotationApplied { nonce: 1, last: 1 });
    assert_eq!(r.code(), RefusalCode::AlreadySettled);

    // Batches: the old key no longer, the new key yes.
    let calls = vec![pay(1, "alice", "acme-ai", 36)];
    let r = refused(old.submit(&hub, &w.key, 1, &calls));
    assert_eq!(r, Refusal::BadSignature);
    new.submit(&hub, &w.key, 1, &calls).unwrap();
    assert_eq!(eth.payout(c, "acme-ai", At::Latest).unwrap(), 36);
}

#[test]
fn governors_take_a_key_at_their_threshold_and_no_one_else_can() {
    let Some(w) = world("governors_take_a_key") else {
        return;
    };
    let old = Group::dealt(2, 2, 8);
    let new = Group::dealt(2, 1, 9);
    let g1 = w.new_key("g1.key");
    let g2 = w.new_key("g2.key");
    let g3 = w.new_key("g3.key");
    let hub = w.deploy(&old, |a| {
        a.governors = vec![g1.address(), g2.address(), g3.address()];
        a.governor_threshold = 2;
    });
    let (c, eth) = at(&hub);
    let r = refused(hub.govern_key(&w.key, 1, 4, &new.key(), &opts()));
    assert_eq!(
        r,
        Refusal::NotGovernor {
            caller: w.key.address()
        }
    );
    assert_eq!(r.code(), RefusalCode::NotGoverned);
    let s = hub.govern_key(&g1, 1, 4, &new.key(), &opts()).unwrap();
    println!("gas: govern key (first approval) {}", s.receipt.gas_used);
    assert_eq!(eth.last_rotation(c, At::Latest).unwrap(), 0);
    assert_eq!(eth.group_key(c, At::Latest).unwrap(), old.key());
    let s = hub.govern_key(&g2, 1, 4, &new.key(), &opts()).unwrap();
    println!(
        "gas: govern key (approval at threshold) {}",
        s.receipt.gas_used
    );
    assert_eq!(eth.last_rotation(c, At::Latest).unwrap(), 1);
    assert_eq!(eth.group_key(c, At::Latest).unwrap(), new.key());
    hub.deposit(&w.key, "alice", 10, &[], &opts()).unwrap();
    let calls = vec![pay(1, "alice", "acme-ai", 3)];
    new.submit(&hub, &w.key, 1, &calls).unwrap();
    assert_eq!(eth.payout(c, "acme-ai", At::Latest).unwrap(), 3);
}

#[test]
fn deposits_read_back_from_logs_equal_what_was_sent() {
    let Some(w) = world("deposits_read_back") else {
        return;
    };
    let g = Group::dealt(1, 1, 10);
    let hub = w.deploy(&g, |a| a.registration_fee = 3);
    let (c, eth) = at(&hub);
    let first = eth.block_number().unwrap() + 1;
    let key_a = ed25519_point(1);
    let sent = [
        hub.deposit(&w.key, "alice", 10, &key_a, &opts()).unwrap(),
        hub.deposit(&w.key, "alice", 5, &[], &opts()).unwrap(),
        hub.deposit(&w.key, "bob", 8, &[], &opts()).unwrap(),
    ];
    println!("gas: deposit binding a key {}", sent[0].receipt.gas_used);
    // Refused deposits: zero credits, a key of the wrong size, a second key.
    // Keys: one not a point (the chain could not credit it, so the hub
    // must not take it), and alice already bound to another key.
    for (user, credits, pk) in [
        ("carol", 0, vec![]),
        ("carol", 5, vec![7u8; 31]),
        ("carol", 5, not_ed25519_point()),
        ("alice", 5, ed25519_point(2)),
    ] {
        let r = refused(hub.deposit(&w.key, user, credits, &pk, &opts()));
        assert!(matches!(r, Refusal::BadDeposit { .. }), "{r:?}");
        assert_eq!(r.code(), RefusalCode::BadDeposit);
    }
    let last = eth.block_number().unwrap();
    let logs = eth.deposits(c, first, last).unwrap();
    let got: Vec<_> = logs
        .iter()
        .map(|d| {
            (
                d.deposit.seq,
                d.deposit.user.as_str(),
                d.deposit.amount,
                d.deposit.pubkey.clone(),
                d.fee,
                d.from,
            )
        })
        .collect();
    let me = w.key.address();
    assert_eq!(
        got,
        vec![
            (1, "alice", 7, key_a.clone(), 3, me),
            (2, "alice", 5, vec![], 0, me),
            (3, "bob", 8, vec![], 0, me),
        ]
    );
    for (d, s) in logs.iter().zip(&sent) {
        assert_eq!(d.block_number, s.receipt.block_number);
        assert_eq!(d.tx_hash, s.receipt.tx_hash);
        // The count at each deposit's block is its seq.
        assert_eq!(
            eth.deposit_count(c, At::Number(d.block_number)).unwrap(),
            d.deposit.seq
        );
    }
    assert_eq!(eth.escrow(c, "alice", At::Latest).unwrap(), 12);
    assert_eq!(eth.user_key(c, "alice", At::Latest).unwrap(), key_a);
    // A sub-range holds only its own deposits; an empty range none.
    let mid = eth
        .deposits(
            c,
            sent[1].receipt.block_number,
            sent[1].receipt.block_number,
        )
        .unwrap();
    assert_eq!(mid.len(), 1);
    assert_eq!(mid[0].deposit.seq, 2);
    assert!(eth.deposits(c, 0, first - 1).unwrap().is_empty());
}

/// docs/signing.md section 4, end to end: the worked example's digest
/// and message bytes from Tally's own functions, then the same batch
/// under the deployment's hub name, signed and paid on chain.
#[test]
fn the_signing_docs_worked_example_verifies_on_chain() {
    let call = HubCall {
        id: 1,
        user: "alice".into(),
        provider: "acme-ai".into(),
        amount: 36,
        window: 30_000_000,
        kind: 0,
    };
    let d = batch_digest("hub", 1, std::slice::from_ref(&call));
    assert_eq!(
        hex::encode(d),
        "7a89b4145545b1eed1de2c0044301dadaff6992c332e0b3baafbafdbe5b66c0b"
    );
    assert_eq!(
        hex::encode(bls::message(TALLY_CHAIN, Kind::Batch, &d)),
        "74616c6c792f76310e74616c6c792d6c6f63616c6e657401\
         7a89b4145545b1eed1de2c0044301dadaff6992c332e0b3baafbafdbe5b66c0b"
    );
    let Some(w) = world("the_signing_docs_worked_example_verifies_on_chain") else {
        return;
    };
    let g = Group::dealt(4, 3, 11);
    let hub = w.deploy(&g, |_| {});
    let (c, eth) = at(&hub);
    let name = eth.hub_name(c, At::Latest).unwrap();
    assert_eq!(name.parse::<HubName>().unwrap(), hub.name());
    hub.deposit(&w.key, "alice", 36, &[], &opts()).unwrap();
    let calls = [call];
    let sig = g.sign(Kind::Batch, &batch_digest(&name, 1, &calls));
    let sent = hub.submit_batch(&w.key, 1, &calls, &sig, &opts()).unwrap();
    println!("gas: submit batch of 1 call {}", sent.receipt.gas_used);
    assert_eq!(eth.payout(c, "acme-ai", At::Latest).unwrap(), 36);
    assert_eq!(eth.escrow(c, "alice", At::Latest).unwrap(), 0);
}

#[test]
fn bad_keys_are_refused_before_and_by_the_contract() {
    let Some(w) = world("bad_keys_are_refused") else {
        return;
    };
    let g = Group::dealt(1, 1, 12);
    let other = Group::dealt(1, 1, 13);
    let mut args = DeployArgs {
        tally_chain_id: TALLY_CHAIN.into(),
        group_key: vec![0xc0; 48],
        last_rotation: 0,
        wei_per_credit: U256::from(WEI_PER_CREDIT),
        registration_fee: 0,
        governors: vec![],
        governor_threshold: 0,
    };
    // Not a point: refused here, nothing sent.
    let e = EvmHub::deploy(w.eth.clone(), &w.key, &args, &opts()).unwrap_err();
    assert!(matches!(e, HubError::Abi(abi::AbiError::Point(_))), "{e:?}");
    assert_eq!(w.eth.next_nonce(w.key.address()).unwrap(), 0);
    // Compressed and uncompressed forms of different keys: the contract's
    // BadKey (simulated by hand, since DeployArgs cannot express it).
    args.group_key = g.key();
    let mut code = abi::artifact().unwrap().bytecode.clone();
    let mut ctor = abi::constructor_args(&args).unwrap();
    let good_point = tally_hub_evm::points::g1_to_eip2537(&g.key()).unwrap();
    let other_point = tally_hub_evm::points::g1_to_eip2537(&other.key()).unwrap();
    let at = ctor
        .windows(128)
        .position(|x| x == good_point)
        .expect("the point is in the arguments");
    ctor[at..at + 128].copy_from_slice(&other_point);
    code.extend_from_slice(&ctor);
    let e = w
        .eth
        .eth_call(
            &CallRequest {
                from: Some(w.key.address()),
                data: code,
                ..CallRequest::default()
            },
            At::Latest,
        )
        .unwrap_err();
    assert_eq!(e.revert(), Some(&Revert::Refused(Refusal::BadKey)), "{e}");
    // A rotation to a key whose point is not on the curve never leaves.
    let hub = w.deploy(&g, |_| {});
    let e = hub
        .rotate_key(&w.key, 1, 1, &[0x80; 48], &[0u8; 96], &opts())
        .unwrap_err();
    assert!(matches!(e, HubError::Point(_)), "{e:?}");
    // A contract that is not a hub is not connected to.
    assert!(EvmHub::connect(w.eth.clone(), Address::repeat_byte(9)).is_err());
}

/// Gas of batches of growing size (printed for the report).
#[test]
fn gas_of_batches_by_size() {
    let Some(w) = world("gas_of_batches_by_size") else {
        return;
    };
    let g = Group::dealt(4, 3, 14);
    let hub = w.deploy(&g, |_| {});
    hub.deposit(&w.key, "alice", 1_000_000, &[], &opts())
        .unwrap();
    let mut id = 0;
    for (nonce, n) in [(1u64, 1u64), (2, 10), (3, 50), (4, 100)] {
        let calls: Vec<_> = (0..n)
            .map(|i| {
                id += 1;
                pay(id, "alice", &format!("provider-{i}"), 1)
            })
            .collect();
        let s = g.submit(&hub, &w.key, nonce, &calls).unwrap();
        println!(
            "gas: batch of {n} calls (one user, distinct new providers) {} (limit {})",
            s.receipt.gas_used, s.gas_limit
        );
    }
    // ADR 0022's worst case: every call a distinct user and a new provider.
    let n = 400u64;
    for i in 0..n {
        hub.deposit(&w.key, &format!("user-{i}"), 1, &[], &opts())
            .unwrap();
    }
    let calls: Vec<_> = (0..n)
        .map(|i| {
            id += 1;
            pay(id, &format!("user-{i}"), &format!("new-provider-{i}"), 1)
        })
        .collect();
    let s = g.submit(&hub, &w.key, 5, &calls).unwrap();
    println!(
        "gas: batch of {n} calls (distinct users, new providers) {} (limit {})",
        s.receipt.gas_used, s.gas_limit
    );
    assert!(s.gas_limit <= tally_hub_evm::hub::MAX_GAS);
}

/// Two real ed25519 public keys (of the secret seeds 32 x 0x01 and 32 x
/// 0x02, computed with Python's `cryptography`).
fn ed25519_point(k: u8) -> Vec<u8> {
    let hex = match k {
        1 => "8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c",
        _ => "8139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b394",
    };
    hex::decode(hex).unwrap()
}

/// 32 bytes that are not an ed25519 point (y = 2: (y^2 - 1)/(d y^2 + 1)
/// is not a square mod 2^255 - 19), which the settlement chain's
/// `check_deposit_key` refuses.
fn not_ed25519_point() -> Vec<u8> {
    let mut b = vec![0u8; 32];
    b[0] = 2;
    b
}

/// Runs `tally-evm` with `args`: (success, stdout, stderr).
fn tally_evm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally-evm"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The operator tool end to end: keygen, deploy, deposit, queries, and
/// its errors for a key file open to others and an endpoint that is down.
#[test]
fn the_tally_evm_tool_deploys_deposits_and_queries() {
    let Some(w) = world("the_tally_evm_tool") else {
        return;
    };
    let url = w._anvil.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("op.key");
    let key = key.to_str().unwrap();
    let (ok, out, err) = tally_evm(&["keygen", "--out", key]);
    assert!(ok, "{err}");
    let address: Address = out.trim().parse().unwrap();
    w.fund(address);
    let (_, out2, _) = tally_evm(&["address", "--key", key]);
    assert_eq!(out2, out);

    let g = Group::dealt(1, 1, 15);
    let gk = hex::encode(g.key());
    let (ok, out, err) = tally_evm(&[
        "deploy",
        "--rpc",
        &url,
        "--key",
        key,
        "--tally-chain-id",
        TALLY_CHAIN,
        "--group-key",
        &gk,
        "--registration-fee",
        "2",
    ]);
    assert!(ok, "{err}");
    let line = |prefix: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {out}"))
            .to_string()
    };
    let contract = line("contract ");
    let want_addr = tally_hub_evm::create_address(address, 0);
    assert_eq!(contract.parse::<Address>().unwrap(), want_addr);
    assert_eq!(
        line("hub_name "),
        HubName::new(31337, want_addr).to_string()
    );

    let pk = hex::encode(ed25519_point(1));
    let deposit = |rest: &[&str]| {
        let mut args = vec![
            "deposit",
            "--rpc",
            &url,
            "--key",
            key,
            "--contract",
            &contract,
        ];
        args.extend_from_slice(rest);
        tally_evm(&args)
    };
    let (ok, out, err) = deposit(&["--user", "alice", "--amount", "12", "--pubkey", &pk]);
    assert!(ok, "{err}");
    assert!(out.contains("alice now holds 10 credits"), "{out}");
    let q = |what: &[&str]| -> String {
        let mut args = vec!["query", "--rpc", &url, "--contract", &contract];
        args.extend_from_slice(what);
        let (ok, out, err) = tally_evm(&args);
        assert!(ok, "{what:?}: {err}");
        out.trim().to_string()
    };
    assert_eq!(q(&["escrow", "alice"]), "10");
    assert_eq!(q(&["deposit-count"]), "1");
    assert_eq!(q(&["last-nonce"]), "0");
    assert_eq!(q(&["group-key"]), gk);
    assert_eq!(q(&["hub-name"]), HubName::new(31337, want_addr).to_string());
    let dep: serde_json::Value = serde_json::from_str(&q(&["deposits", "0", "100"])).unwrap();
    assert_eq!(
        (
            dep["seq"].as_u64(),
            dep["user"].as_str(),
            dep["amount"].as_u64(),
            dep["fee"].as_u64()
        ),
        (Some(1), Some("alice"), Some(10), Some(2))
    );
    assert_eq!(dep["pubkey"], pk);

    // Errors: a deposit the hub refuses, a key open to others, a node
    // that is down.
    let (ok, _, err) = deposit(&["--user", "bad user", "--amount", "1"]);
    assert!(!ok);
    assert!(err.contains("bad deposit"), "{err}");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, _, err) = deposit(&["--user", "alice", "--amount", "1"]);
    assert!(!ok);
    assert!(err.contains("too open"), "{err}");
    let (ok, _, err) = tally_evm(&[
        "query",
        "--rpc",
        "http://127.0.0.1:28899",
        "--contract",
        &contract,
        "last-nonce",
    ]);
    assert!(!ok);
    assert!(err.contains("unreachable"), "{err}");
}

/// Blocks by tag and number, a future block, an unknown receipt, state
/// read above the tip (a node error, not a revert), and a transaction
/// that is not mined in time.
#[test]
fn blocks_receipts_and_a_transaction_not_mined_in_time() {
    let Some(w) = world("blocks_receipts_and_a_transaction_not_mined_in_time") else {
        return;
    };
    let g = Group::dealt(1, 1, 16);
    let hub = w.deploy(&g, |_| {});
    let sent = hub.deposit(&w.key, "alice", 3, &[], &opts()).unwrap();
    let eth = &w.eth;
    assert_eq!(eth.chain_id().unwrap(), 31337);
    let tip = eth.block_number().unwrap();
    let latest = eth.block(At::Latest).unwrap().unwrap();
    assert_eq!(latest.number, tip);
    assert_eq!(latest.number, sent.receipt.block_number);
    assert_eq!(latest.hash, sent.receipt.block_hash);
    assert!(latest.base_fee.is_some());
    let by_number = eth.block(At::Number(tip)).unwrap().unwrap();
    assert_eq!(by_number, latest);
    let finalized = eth.block(At::Finalized).unwrap().unwrap();
    assert!(finalized.number <= tip);
    assert_eq!(eth.block(At::Number(tip + 100)).unwrap(), None);
    let fees = eth.fees().unwrap();
    assert!(fees.max_fee_per_gas >= fees.max_priority_fee_per_gas);
    assert_eq!(
        eth.receipt(tally_hub_evm::B256::repeat_byte(7)).unwrap(),
        None
    );
    // State above the tip: the node refuses; it is no revert.
    let e = eth
        .escrow(hub.address(), "alice", At::Number(tip + 100))
        .unwrap_err();
    assert!(matches!(e, tally_hub_evm::EthError::Node { .. }), "{e:?}");
    assert_eq!(
        eth.escrow(hub.address(), "alice", At::Number(tip)).unwrap(),
        3
    );
    assert_eq!(
        eth.escrow(hub.address(), "alice", At::Number(tip - 1))
            .unwrap(),
        0
    );

    // Not mined within the timeout: NoReceipt (with the hash to look for).
    eth.client()
        .call("evm_setAutomine", json!([false]))
        .unwrap();
    let quick = SendOptions {
        receipt_timeout: Duration::from_millis(500),
        ..opts()
    };
    let e = hub.deposit(&w.key, "alice", 1, &[], &quick).unwrap_err();
    let HubError::NoReceipt { tx_hash, .. } = e else {
        panic!("{e:?}");
    };
    eth.client().call("evm_mine", json!([])).unwrap();
    let r = eth.receipt(tx_hash).unwrap().expect("mined now");
    assert!(r.success);
    assert_eq!(eth.escrow(hub.address(), "alice", At::Latest).unwrap(), 4);
}

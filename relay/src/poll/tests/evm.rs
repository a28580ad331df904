//! The relay against a fake EVM hub: a JSON-RPC endpoint on 127.0.0.1
//! that answers the `eth_*` calls of `tally_hub_evm::EthRpc` from a
//! script, with the contract's answers ABI-encoded by hand (one 32-byte
//! word per `uint64`; the `Deposited` log's head-and-tail layout) and its
//! selectors written out (the first four bytes of the keccak-256 of each
//! signature). What the relay hands in, what it sends and what the
//! metrics count are worked out by hand from the script.

use super::*;
use crate::config::{EvmConfig, EvmTip, HubKind};
use crate::hub::Tip;

const NAME: &str = "evm:31337:0x5fbdb2315678afecb367f032d93f642f64180aa3";
const CHAIN_ID: u64 = 31337;

// Selectors: keccak256("lastNonce()"), ("settledAt(uint64)"),
// ("depositCount()"), ("lastRotation()"), first four bytes.
const LAST_NONCE: &str = "52631ab4";
const SETTLED_AT: &str = "ce1a4333";
const DEPOSIT_COUNT: &str = "2dfdf0b5";
const LAST_ROTATION: &str = "e1f017eb";
// Custom errors: AlreadySettled(uint64,uint64), LowGas(uint256,uint256),
// BadSignature().
const ALREADY_SETTLED: &str = "3d89cf75";
const LOW_GAS: &str = "e99dff16";
const BAD_SIGNATURE: &str = "5cd5d233";

/// Lowercase hex of `b` (the relay has no hex crate).
fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of hex string `s`.
fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn word(n: u64) -> Vec<u8> {
    let mut w = vec![0u8; 24];
    w.extend_from_slice(&n.to_be_bytes());
    w
}

fn hex0x(b: &[u8]) -> String {
    format!("0x{}", to_hex(b))
}

fn qty(n: u64) -> String {
    format!("{n:#x}")
}

/// `selector` followed by `words`.
fn error_data(selector: &str, words: &[u64]) -> Vec<u8> {
    let mut d = from_hex(selector);
    for w in words {
        d.extend(word(*w));
    }
    d
}

/// Bytes padded to whole words, after their length word.
fn tail(b: &[u8]) -> Vec<u8> {
    let mut t = word(b.len() as u64);
    t.extend_from_slice(b);
    t.resize(32 + b.len().div_ceil(32) * 32, 0);
    t
}

/// The data of `Deposited(seq, user, amount, pubkey, fee, from)` without
/// its indexed `seq`: `(string user, uint64 amount, bytes pubkey, uint64
/// fee, address from)`, five head words then the two tails.
fn deposited_data(user: &str, amount: u64, pubkey: &[u8]) -> Vec<u8> {
    let user_tail = tail(user.as_bytes());
    let mut d = word(5 * 32);
    d.extend(word(amount));
    d.extend(word((5 * 32 + user_tail.len()) as u64));
    d.extend(word(0));
    d.extend(word(0x1234));
    d.extend(user_tail);
    d.extend(tail(pubkey));
    d
}

/// How a mined transaction ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mined {
    Success,
    /// Not mined (yet): no receipt.
    Pending,
    /// Reverted; its replay reverts with `LowGas`.
    LowGas,
}

/// The fake EVM hub's script and what it was asked.
#[derive(Debug)]
struct Evm {
    chain_id: u64,
    latest: u64,
    last_nonce: u64,
    /// (block, seq, user, amount).
    deposits: Vec<(u64, u64, &'static str, u64)>,
    /// The lowest block whose state it still answers.
    state_from: u64,
    /// What simulating a submission reverts with (`None`: it succeeds).
    simulate: Option<Vec<u8>>,
    /// How the n-th transaction sent ends (the last entry for the rest).
    mined: Vec<Mined>,
    /// Methods asked, in order (`eth_call` with its selector).
    log: Vec<String>,
    /// `eth_call` block parameters of `depositCount()`.
    count_blocks: Vec<String>,
    /// Raw transactions sent.
    sent: Vec<String>,
}

impl Default for Evm {
    fn default() -> Self {
        Self {
            chain_id: CHAIN_ID,
            latest: 100,
            last_nonce: NONCE - 1,
            deposits: Vec::new(),
            state_from: 0,
            simulate: None,
            mined: vec![Mined::Success],
            log: Vec::new(),
            count_blocks: Vec::new(),
            sent: Vec::new(),
        }
    }
}

fn ok(req: &Value, v: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": req["id"], "result": v})
}

fn err(req: &Value, code: i64, message: &str, data: Option<String>) -> Value {
    let mut e = json!({"code": code, "message": message});
    if let Some(d) = data {
        e["data"] = json!(d);
    }
    json!({"jsonrpc": "2.0", "id": req["id"], "error": e})
}

fn block_of(s: &Evm, v: &Value) -> u64 {
    match v.as_str() {
        Some("latest") | Some("pending") | None => s.latest,
        Some(h) => u64::from_str_radix(h.trim_start_matches("0x"), 16).unwrap(),
    }
}

fn eth_call(s: &mut Evm, req: &Value) -> Value {
    let call = &req["params"][0];
    let data = from_hex(call["data"].as_str().unwrap().trim_start_matches("0x"));
    let selector = to_hex(&data[..4]);
    s.log.push(format!("eth_call {selector}"));
    let at = block_of(s, &req["params"][1]);
    let value = match selector.as_str() {
        LAST_NONCE => word(s.last_nonce),
        SETTLED_AT => word(0),
        LAST_ROTATION => word(0),
        DEPOSIT_COUNT => {
            s.count_blocks
                .push(req["params"][1].as_str().unwrap().into());
            if at < s.state_from {
                return err(req, -32000, "missing trie node", None);
            }
            word(s.deposits.iter().filter(|d| d.0 <= at).count() as u64)
        }
        // A submission: a replay (it names a gas limit) of a mined revert,
        // or a simulation.
        _ if call.get("gas").is_some() => {
            let d = error_data(LOW_GAS, &[400_000, 90_000]);
            return err(req, 3, "execution reverted", Some(hex0x(&d)));
        }
        _ => match &s.simulate {
            Some(d) => return err(req, 3, "execution reverted", Some(hex0x(d))),
            None => Vec::new(),
        },
    };
    ok(req, json!(hex0x(&value)))
}

fn answer_evm(s: &mut Evm, req: &Value) -> Value {
    let method = req["method"].as_str().unwrap_or("").to_string();
    if method != "eth_call" {
        s.log.push(method.clone());
    }
    let hash = |n: u64| hex0x(&[n as u8; 32]);
    match method.as_str() {
        "eth_chainId" => ok(req, json!(qty(s.chain_id))),
        "eth_blockNumber" => ok(req, json!(qty(s.latest))),
        "eth_getBlockByNumber" => ok(
            req,
            json!({"number": qty(s.latest), "hash": hash(1), "baseFeePerGas": "0x3b9aca00"}),
        ),
        "eth_maxPriorityFeePerGas" => ok(req, json!("0x3b9aca00")),
        "eth_estimateGas" => ok(req, json!(qty(300_000))),
        "eth_getTransactionCount" => ok(req, json!(qty(s.sent.len() as u64))),
        "eth_call" => eth_call(s, req),
        "eth_sendRawTransaction" => {
            s.sent.push(req["params"][0].as_str().unwrap().into());
            ok(req, json!(hash(2)))
        }
        "eth_getTransactionReceipt" => {
            let n = s.sent.len();
            if n == 0 {
                return ok(req, Value::Null);
            }
            let how = s.mined.get(n - 1).or(s.mined.last()).copied().unwrap();
            if how == Mined::Pending {
                return ok(req, Value::Null);
            }
            let gas_used = if how == Mined::Success {
                250_000
            } else {
                200_000
            };
            ok(
                req,
                json!({"transactionHash": req["params"][0], "blockNumber": qty(s.latest),
                       "blockHash": hash(3), "status": if how == Mined::Success { "0x1" } else { "0x0" },
                       "gasUsed": qty(gas_used), "contractAddress": null}),
            )
        }
        "eth_getLogs" => {
            let f = &req["params"][0];
            let (from, to) = (block_of(s, &f["fromBlock"]), block_of(s, &f["toBlock"]));
            let logs: Vec<Value> = s
                .deposits
                .iter()
                .filter(|d| (from..=to).contains(&d.0))
                .map(|&(block, seq, user, amount)| {
                    json!({"address": f["address"], "topics": [f["topics"][0], hex0x(&word(seq))],
                           "data": hex0x(&deposited_data(user, amount, &[])),
                           "blockNumber": qty(block), "transactionHash": hash(4), "removed": false})
                })
                .collect();
            ok(req, json!(logs))
        }
        m => panic!("fake EVM hub: unexpected method {m}"),
    }
}

/// An EVM JSON-RPC endpoint answering from its [`Evm`].
type FakeEvm = Fake<Evm>;

impl FakeEvm {
    fn start(script: Evm) -> FakeEvm {
        Fake::serve(script, |s, req| (200, answer_evm(s, req)))
    }

    fn asked(&self, what: &str) -> usize {
        self.with(|s| s.log.iter().filter(|l| l.as_str() == what).count())
    }
}

/// [`config`] for the EVM hub at `endpoints`.
fn evm_config(endpoints: Vec<String>, test: &str) -> RelayConfig {
    let mut cfg = config(endpoints);
    cfg.hub = HubKind::Evm(EvmConfig {
        tip: EvmTip::Latest,
        key_file: crate::hub::evm::tests::key_file(test, 0o600),
    });
    cfg
}

fn evm_params() -> Params {
    Params {
        hub_chain: NAME.into(),
        ..Params::default()
    }
}

/// A group signature that is a valid G2 point (the fake does not verify
/// it, but the relay converts it to EIP-2537 form before sending).
fn real_signature() -> Vec<u8> {
    let mut seed = [0u8; 32];
    seed[31] = 7;
    let share = tally_settlement::bls::SecretShare::from_bytes(1, &seed).unwrap();
    share.sign(b"a batch").sig_bytes().to_vec()
}

/// Chain state of the EVM hub: nonce 7's attempt `attempt` started now,
/// its batch (call 1) signed.
fn evm_chain_with_signed_batch(attempt: u32) -> Arc<MemBackend> {
    let backend = Arc::new(MemBackend::new());
    commit(&backend, |kv| {
        chain_state::put_params(kv, &evm_params()).unwrap();
        sync_state::put_sync_state(kv, NAME, &sync_at(attempt));
        sync_state::put_pending_call(kv, NAME, &call());
        let batch = BatchRecord {
            chain: NAME.into(),
            signature: real_signature(),
            ..signed_batch()
        };
        sync_state::put_batch(kv, NAME, NONCE, &batch);
    });
    backend
}

fn evm_chain_with_cursor(height: u64, seq: u64) -> Arc<MemBackend> {
    let backend = Arc::new(MemBackend::new());
    commit(&backend, |kv| {
        chain_state::put_params(kv, &evm_params()).unwrap();
        sync_state::put_hub_height(kv, NAME, height);
        sync_state::put_deposit_seq(kv, NAME, seq);
    });
    backend
}

fn deposits_evm(latest: u64) -> Evm {
    Evm {
        latest,
        deposits: vec![(2, 1, "alice", 5), (10, 2, "bob", 7), (11, 3, "carol", 9)],
        ..Evm::default()
    }
}

fn dep(seq: u64, user: &str, amount: u64) -> HubDeposit {
    HubDeposit {
        seq,
        user: user.into(),
        amount,
        pubkey: Vec::new(),
    }
}

#[tokio::test]
async fn evm_deposits_are_handed_in_with_the_hubs_count() {
    let hub = FakeEvm::start(deposits_evm(40));
    let backend = evm_chain_with_cursor(1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let cfg = evm_config(vec![hub.url.clone()], "deposits");
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    // Range 1..=10: the logs of deposits 1 and 2, and depositCount() read
    // at block 10 (not at the tip), which is 2.
    assert_eq!(
        app.held().blocks(),
        [HubBlock {
            chain: NAME.into(),
            from_height: 1,
            to_height: 10,
            deposits: vec![dep(1, "alice", 5), dep(2, "bob", 7)],
            more: false,
            deposit_count: 2,
        }]
    );
    assert_eq!(hub.with(|s| s.count_blocks.clone()), ["0xa"]);
    // The chain id was asked once, not at every read.
    assert_eq!(hub.asked("eth_chainId"), 1);
}

#[tokio::test]
async fn evm_a_stale_endpoint_is_refused() {
    // State before block 20 is gone: depositCount() at block 10 fails.
    let hub = FakeEvm::start(Evm {
        state_from: 20,
        ..deposits_evm(40)
    });
    let backend = evm_chain_with_cursor(1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let cfg = evm_config(vec![hub.url.clone()], "stale");
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    assert!(app.held().blocks().is_empty());
    let refused = |reason: &str| {
        sample(
            &metrics.encode(),
            &format!("tally_hub_deposit_answers_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(refused("stale"), Some(1.0));
    // An endpoint whose latest block is below the range's end is stale
    // too (it would list the range's logs short).
    hub.with(|s| {
        s.latest = 9;
        s.state_from = 0;
    });
    let tip = Tip {
        endpoint: 0,
        height: 40,
    };
    let e = r.hub.deposits(NAME, tip, 1, 10).unwrap_err();
    assert!(
        matches!(
            e,
            HubError::Stale {
                height: 9,
                want: 10,
                ..
            }
        ),
        "{e}"
    );
    // Once it answers state at block 10, the range is handed in.
    hub.with(|s| s.latest = 40);
    r.poll().await;
    assert_eq!(app.held().blocks().len(), 1);
    assert_eq!(app.held().blocks()[0].deposit_count, 2);
    assert_eq!(refused("stale"), Some(1.0));
}

/// Submits nonce 7 to a fake EVM hub scripted by `evm`; the hub and what
/// the metrics counted.
async fn submit_to(evm: Evm, test: &str) -> (FakeEvm, TallyApp, Metrics) {
    let hub = FakeEvm::start(evm);
    let backend = evm_chain_with_signed_batch(1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut r = relay(
        app.clone(),
        evm_config(vec![hub.url.clone()], test),
        &metrics,
    );
    r.poll().await;
    settle(&mut r).await;
    (hub, app, metrics)
}

#[tokio::test]
async fn evm_a_refused_simulation_hands_in_failed_and_sends_nothing() {
    let (hub, app, metrics) = submit_to(
        Evm {
            simulate: Some(error_data(BAD_SIGNATURE, &[])),
            ..Evm::default()
        },
        "refused",
    )
    .await;
    assert_eq!(
        app.held().results(),
        [HubResult {
            chain: NAME.into(),
            ..failed_result(1)
        }]
    );
    assert_eq!(outcome(&metrics, "refused"), Some(1.0));
    assert_eq!(hub.asked("eth_sendRawTransaction"), 0);
    assert_eq!(hub.asked("eth_estimateGas"), 0);
}

#[tokio::test]
async fn evm_already_settled_counts_as_delivered_with_nothing_sent() {
    // The last nonce read says 6, but by the simulation another relay's
    // transaction settled 7.
    let (hub, app, metrics) = submit_to(
        Evm {
            simulate: Some(error_data(ALREADY_SETTLED, &[NONCE, NONCE])),
            ..Evm::default()
        },
        "already",
    )
    .await;
    assert!(app.held().results().is_empty());
    assert_eq!(outcome(&metrics, "already_settled"), Some(1.0));
    assert_eq!(outcome(&metrics, "refused"), Some(0.0));
    assert_eq!(hub.asked("eth_sendRawTransaction"), 0);
}

#[tokio::test]
async fn evm_low_gas_is_retried_with_more_gas_never_a_bad_signature() {
    // The first transaction is mined reverted (its replay says LowGas);
    // the second, sent with more gas, settles.
    let (hub, app, metrics) = submit_to(
        Evm {
            mined: vec![Mined::LowGas, Mined::Success],
            ..Evm::default()
        },
        "lowgas",
    )
    .await;
    assert_eq!(hub.asked("eth_sendRawTransaction"), 2);
    assert!(
        app.held().results().is_empty(),
        "no failed, no bad signature"
    );
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
    assert_eq!(outcome(&metrics, "refused"), Some(0.0));
    assert_eq!(
        sample(
            &metrics.encode(),
            "tally_retries_total{layer=\"transport\"}"
        ),
        Some(1.0)
    );
    // The second transaction has at least twice the first one's gas.
    let gas: Vec<u64> = hub.with(|s| s.sent.iter().map(|t| tx_field(t, 4)).collect());
    assert!(gas[1] >= 2 * gas[0], "{gas:?}");
}

#[tokio::test]
async fn evm_a_transaction_without_a_receipt_is_replaced_not_queued_behind() {
    // The first transaction gets no receipt within its try (0.9 s of the
    // 1 s per-try timeout); the next try finds none either and sends a
    // replacement at the same account nonce with higher fees, which is
    // mined.
    let hub = FakeEvm::start(Evm {
        mined: vec![Mined::Pending, Mined::Success],
        ..Evm::default()
    });
    let backend = evm_chain_with_signed_batch(1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let mut cfg = evm_config(vec![hub.url.clone()], "replace");
    cfg.policy.per_try_timeout = Duration::from_secs(1);
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    settle(&mut r).await;
    assert_eq!(outcome(&metrics, "ok"), Some(1.0));
    assert!(app.held().results().is_empty());
    let sent = hub.with(|s| s.sent.clone());
    assert_eq!(sent.len(), 2);
    // (nonce, max priority fee, max fee) of each.
    let fields: Vec<[u64; 3]> = sent
        .iter()
        .map(|t| [tx_field(t, 1), tx_field(t, 2), tx_field(t, 3)])
        .collect();
    assert_eq!(fields[0][0], fields[1][0], "the same account nonce");
    assert!(
        fields[1][1] > fields[0][1] && fields[1][2] > fields[0][2],
        "{fields:?}"
    );
}

/// Item `index` (a number) of a raw EIP-1559 transaction (`0x02 ||
/// rlp([chain id, nonce, priority fee, max fee, gas limit, ...])`).
fn tx_field(raw: &str, index: usize) -> u64 {
    let b = from_hex(raw.trim_start_matches("0x"));
    assert_eq!(b[0], 2, "type 2");
    // The list header (long form: 0xf8..0xff then the length's bytes).
    let mut at = 2 + usize::from(b[1].saturating_sub(0xf7));
    let item = |at: &mut usize| -> Vec<u8> {
        let h = b[*at];
        let (start, len) = match h {
            0..=0x7f => (*at, 1),
            0x80..=0xb7 => (*at + 1, usize::from(h - 0x80)),
            _ => panic!("a long item before item {index}"),
        };
        *at = start + len;
        b[start..start + len].to_vec()
    };
    for _ in 0..index {
        item(&mut at);
    }
    item(&mut at)
        .iter()
        .fold(0u64, |n, x| (n << 8) | u64::from(*x))
}

#[tokio::test]
async fn evm_an_endpoint_on_another_chain_is_not_used() {
    let (wrong, right) = (
        FakeEvm::start(Evm {
            chain_id: 1,
            ..deposits_evm(40)
        }),
        FakeEvm::start(deposits_evm(40)),
    );
    let backend = evm_chain_with_cursor(1, 1);
    let app = app(&backend);
    let metrics = Metrics::new("tally");
    let cfg = evm_config(vec![wrong.url.clone(), right.url.clone()], "chain");
    let mut r = relay(app.clone(), cfg, &metrics);
    r.poll().await;
    assert_eq!(app.held().blocks().len(), 1);
    // The wrong chain was asked its id only, and counted as a failure.
    assert_eq!(wrong.with(|s| s.log.clone()), ["eth_chainId"]);
    assert_eq!(right.asked("eth_getLogs"), 1);
}

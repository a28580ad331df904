//! `tally-bench dkg`: the cost of one on-chain DKG ceremony at n
//! validators, on one node's state (in memory), every validator's messages
//! made by the same code `tallyd`'s participant runs
//! ([`tally_settlement::dkg::next_messages`]).
//!
//! Per n it prints: bytes on chain (round keys, dealings, acks and
//! reveals), the blocks a
//! ceremony takes, the CPU one node spends executing the dealing and ack
//! blocks and the finalisation, one player's CPU to decrypt and check all
//! dealings, and one dealer's CPU to deal.
//!
//! The node is modelled as `tallyd` runs: every transaction passes its
//! CheckTx (the mempool) against committed state before the block that
//! holds it, through the node's memory of verified signatures and
//! validated G1 points (`tally_abci::sigcache::SignatureCache`), and
//! FinalizeBlock runs with that memory. The dealing block is also run
//! cold, with no memory (a node that never saw the dealings before the
//! block: caught up by block sync, or handed a block whose proposer put in
//! dealings that were never gossiped), on the same state; both runs must
//! give the same results and app hash, or the benchmark fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ed25519_dalek::SigningKey;
use tally_abci::sigcache::SignatureCache;
use tally_settlement::dkg::crypto::EncKey;
use tally_settlement::dkg::{self, Me};
use tally_settlement::proto::validator_msg::Sum;
use tally_settlement::types::TxResult;
use tally_settlement::{
    begin_block, check_tx_claim_with, deliver_tx_with, init_chain, Block, Code, Genesis, KeyCache,
    VerifiedSignatures, VerifyAll,
};
use tally_store::{MemBackend, Pending};

use crate::driver::{consensus_key, enc_key, round_key};

/// One ceremony's figures.
#[derive(Debug, Default)]
pub struct Figures {
    /// Validators.
    pub n: usize,
    /// Threshold of the key made.
    pub t: u32,
    /// Bytes of round-key transactions.
    pub key_bytes: usize,
    /// Bytes of dealing transactions.
    pub deal_bytes: usize,
    /// Bytes of ack transactions.
    pub ack_bytes: usize,
    /// Bytes of reveal transactions.
    pub reveal_bytes: usize,
    /// Transactions.
    pub txs: usize,
    /// One node's FinalizeBlock CPU for the dealing block, its mempool
    /// having checked the dealings (CheckTx) before.
    pub deal_block: Duration,
    /// The same block on the same state with no memory of earlier checks.
    pub deal_block_cold: Duration,
    /// The CheckTx CPU of all dealings (spread over the dealing phase as
    /// they arrive).
    pub deal_check: Duration,
    /// One node's FinalizeBlock CPU for the ack block.
    pub ack_block: Duration,
    /// The finalisation (start of block `end`).
    pub finalise: Duration,
    /// One player's decrypt-and-check of every dealing.
    pub verify_all: Duration,
    /// One dealer making its dealing.
    pub deal_one: Duration,
    /// Blocks from start to the key.
    pub blocks: u64,
}

const CHAIN: &str = "tally-dkg-bench";
const PHASE: u64 = 3;

/// Runs one fresh ceremony with `n` honest validators.
pub fn ceremony(n: usize) -> Result<Figures> {
    let keys: Vec<(SigningKey, EncKey)> = (0..n).map(|i| (consensus_key(i), enc_key(i))).collect();
    let genesis: Genesis = serde_json::from_value(serde_json::json!({
        "params": {"dkg_phase_blocks": PHASE},
    }))?;
    let mut kv = Pending::open(Arc::new(MemBackend::new()))?;
    init_chain(&mut kv, CHAIN, &genesis)?;
    let vals: Vec<([u8; 32], u64)> = keys
        .iter()
        .map(|(c, _)| (c.verifying_key().to_bytes(), 10))
        .collect();
    dkg::init_validators(&mut kv, &vals)?;
    let mut f = Figures {
        n,
        ..Figures::default()
    };
    // The node's memory, shared by its CheckTx and FinalizeBlock.
    let node = SignatureCache::default();
    let mut txs: Vec<Vec<u8>> = Vec::new();
    for h in 1..=4 * PHASE + 2 {
        let block = Block {
            height: h,
            time: 1_800_000_000 + h,
        };
        if txs.iter().any(|t| kind_of(t) == 1) {
            // The dealing block cold first, then undone (as a repeated
            // FinalizeBlock is) and run below as the node runs it.
            let before = kv.changes().clone();
            let cold = finalize(&mut kv, &block, &txs, &VerifyAll)?;
            let cold_hash = kv.app_hash_at(h)?;
            kv.set_changes(before.clone());
            let warm = finalize(&mut kv, &block, &txs, &node)?;
            ensure!(
                cold.results == warm.results
                    && cold.events == warm.events
                    && cold_hash == kv.app_hash_at(h)?,
                "n = {n}: the dealing block gave other results or another app hash with the node's memory than without"
            );
            kv.set_changes(before);
            f.deal_block_cold = cold.took;
        }
        let ran = finalize(&mut kv, &block, &txs, &node)?;
        if let Some(r) = ran.results.iter().find(|r| r.code != Code::Ok) {
            bail!("n = {n}: a DKG tx failed: {}", r.log);
        }
        if ran.events.iter().any(|e| e.kind == "dkg_finalised") {
            f.finalise = ran.began;
            f.blocks = h - 1;
        }
        if ran.events.iter().any(|e| e.kind == "dkg_failed") {
            bail!("n = {n}: the ceremony failed");
        }
        let ran = ran.took;
        let mut kinds = (0, 0);
        for tx in txs.drain(..) {
            let kind = kind_of(&tx);
            match kind {
                1 => {
                    f.deal_bytes += tx.len();
                    kinds.0 += 1
                }
                2 => {
                    f.ack_bytes += tx.len();
                    kinds.1 += 1
                }
                4 => f.key_bytes += tx.len(),
                _ => f.reveal_bytes += tx.len(),
            }
            f.txs += 1;
        }
        if kinds.0 > 0 {
            f.deal_block = ran;
        }
        if kinds.1 > 0 {
            f.ack_block = ran;
        }
        kv.commit(h)?;
        let round = dkg::state::ceremony(&kv)?.map(|c| c.round);
        for (i, (c, e)) in keys.iter().enumerate() {
            let Some(round) = round else {
                break;
            };
            let enc = round_key(e, round);
            let me = Me {
                address: dkg::address_of(c.verifying_key().as_bytes()),
                enc: &enc,
            };
            let t0 = Instant::now();
            let msgs = dkg::next_messages(&kv, &me)?;
            let took = t0.elapsed();
            if i == 0 {
                match msgs.first().and_then(|m| m.sum.as_ref()) {
                    Some(Sum::Dealing(_)) => f.deal_one = took,
                    Some(Sum::Ack(_)) => f.verify_all = took,
                    _ => {}
                }
            }
            txs.extend(msgs.iter().map(|m| dkg::sign_validator_msg(c, m)));
        }
        // The mempool: CheckTx of each against committed state.
        for tx in &txs {
            let t0 = Instant::now();
            let r = check_tx_claim_with(&kv, tx, &node)?.result;
            let took = t0.elapsed();
            if kind_of(tx) == 1 {
                f.deal_check += took;
            }
            ensure!(r.code == Code::Ok, "n = {n}: CheckTx refused: {}", r.log);
        }
    }
    let key = tally_settlement::dkg::state::active_key_record(&kv)?.context("no key")?;
    f.t = key.threshold;
    Ok(f)
}

/// One block as FinalizeBlock runs it.
struct Ran {
    /// CPU of the whole block.
    took: Duration,
    /// CPU of the start-of-block work.
    began: Duration,
    /// Start-of-block events.
    events: Vec<tally_settlement::types::Event>,
    /// Each transaction's result.
    results: Vec<TxResult>,
}

/// Runs `block` with `txs` as FinalizeBlock does, with `memory` the
/// node's memory of verified signatures and points.
fn finalize(
    kv: &mut Pending,
    block: &Block,
    txs: &[Vec<u8>],
    memory: &dyn VerifiedSignatures,
) -> Result<Ran> {
    let keys = KeyCache::new();
    let t0 = Instant::now();
    let events = begin_block(kv, block)?;
    let began = t0.elapsed();
    let mut results = Vec::with_capacity(txs.len());
    for tx in txs {
        results.push(deliver_tx_with(kv, block, tx, memory, &keys)?);
    }
    Ok(Ran {
        took: t0.elapsed(),
        began,
        events,
        results,
    })
}

fn kind_of(tx: &[u8]) -> u8 {
    use prost::Message;
    let Ok(t) = tally_settlement::proto::Tx::decode(tx) else {
        return 0;
    };
    let Some(tally_settlement::proto::tx::Sum::Validator(v)) = t.sum else {
        return 0;
    };
    match tally_settlement::proto::ValidatorMsg::decode(v.body.as_slice()).map(|m| m.sum) {
        Ok(Some(Sum::Dealing(_))) => 1,
        Ok(Some(Sum::Ack(_))) => 2,
        Ok(Some(Sum::Key(_))) => 4,
        _ => 3,
    }
}

/// `tally-bench dkg [--sizes 4,16,64,100]`.
pub fn main(args: &[String]) -> Result<()> {
    let mut sizes = vec![4usize, 16, 64, 100];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sizes" => {
                sizes = it
                    .next()
                    .context("--sizes needs a list")?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .context("--sizes: numbers 1..=128")?;
                ensure!(
                    sizes.iter().all(|s| (1..=128).contains(s)),
                    "--sizes: 1..=128"
                );
            }
            other => {
                bail!("unknown argument {other:?}; usage: tally-bench dkg [--sizes 4,16,64,100]")
            }
        }
    }
    println!("one fresh DKG ceremony, phases of {PHASE} blocks, one node's in-memory state, this machine");
    println!("(blk ms: FinalizeBlock after the node's CheckTx of every tx; cold: the dealing block with no memory of CheckTx)");
    println!(
        "{:>4} {:>4} {:>8} {:>11} {:>10} {:>6} {:>7} {:>11} {:>12} {:>12} {:>11} {:>10} {:>13} {:>10}",
        "n",
        "t",
        "keys B",
        "dealing B",
        "ack B",
        "txs",
        "blocks",
        "deal blk ms",
        "cold deal ms",
        "deal chk ms",
        "ack blk ms",
        "final ms",
        "verify all ms",
        "deal ms"
    );
    for n in sizes {
        let f = ceremony(n)?;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:>4} {:>4} {:>8} {:>11} {:>10} {:>6} {:>7} {:>11.1} {:>12.1} {:>12.1} {:>11.1} {:>10.1} {:>13.1} {:>10.1}",
            f.n,
            f.t,
            f.key_bytes,
            f.deal_bytes,
            f.ack_bytes + f.reveal_bytes,
            f.txs,
            f.blocks,
            ms(f.deal_block),
            ms(f.deal_block_cold),
            ms(f.deal_check),
            ms(f.ack_block),
            ms(f.finalise),
            ms(f.verify_all),
            ms(f.deal_one)
        );
    }
    Ok(())
}

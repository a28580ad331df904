//! The worst block a byzantine proposer can get past ProcessProposal under
//! the caps of ADR 0010, measured on one app over RocksDB: a SubmitPartials
//! with `max_block_messages` distinct hub-block messages, each carrying
//! `max_block_deposits` deposits and partials from the given signers, and
//! one over the caps (refused before any pairing). Used by
//! `tally-bench worst`; numbers go into closing notes, never into
//! assertions.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Result};
use bytes::Bytes;
use prost::Message;
use tally_abci::{Halt, TallyApp};
use tally_settlement::bls::{self, deal, Kind, SecretShare};
use tally_settlement::proto::{tx, HubBlock, HubDeposit, PartialSig, SubmitPartials, Tx};
use tally_settlement::sync::block_digest;
use tally_store::RocksBackend;
use tendermint_abci::Application;
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::{
    response_process_proposal::ProposalStatus, RequestFinalizeBlock, RequestInitChain,
    RequestProcessProposal,
};

const CHAIN: &str = "tally-worst";
const T0: i64 = 1_800_000_000;

/// Latencies of one scenario, milliseconds.
#[derive(Debug, Clone)]
pub struct Timing {
    /// What was measured.
    pub name: String,
    /// Bytes of the system transaction.
    pub tx_bytes: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
}

fn ts(s: i64) -> Option<Timestamp> {
    Some(Timestamp {
        seconds: s,
        nanos: 0,
    })
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0.0)
}

fn summarize(name: &str, tx_bytes: usize, mut ms: Vec<f64>) -> Timing {
    ms.sort_by(|a, b| a.total_cmp(b));
    Timing {
        name: name.into(),
        tx_bytes,
        p50: pct(&ms, 0.5),
        p99: pct(&ms, 0.99),
        max: ms.last().copied().unwrap_or(0.0),
    }
}

/// `n` validators (threshold `2n/3 + 1`), default caps; `reps` runs each.
pub fn run(n: u32, reps: usize) -> Result<Vec<Timing>> {
    let t = 2 * n / 3 + 1;
    let coeffs: Vec<[u8; 64]> = (0..t).map(|i| [i as u8 ^ 0x5a; 64]).collect();
    let (pubs, shares) = deal(n, t, &coeffs)?;
    let hexkey = |k: &blst::min_pk::PublicKey| hex::encode(k.compress());
    let params = tally_settlement::Params::default();
    let max_msgs = params.max_block_messages as usize;
    let max_deps = params.max_block_deposits as usize;
    let app_state = serde_json::json!({
        "params": {"hub_chain": "hub"},
        "dkg": {
            "threshold": t,
            "group_key": hexkey(&pubs.group),
            "public_shares": pubs.shares.iter().map(hexkey).collect::<Vec<_>>(),
            "signers": crate::driver::signers(n as usize),
        },
    });
    let dir = tempfile::tempdir()?;
    let app = TallyApp::new(
        Arc::new(RocksBackend::open(dir.path())?),
        Halt::recording().0,
    )?;
    app.init_chain(RequestInitChain {
        time: ts(T0),
        chain_id: CHAIN.into(),
        app_state_bytes: Bytes::from(app_state.to_string()),
        initial_height: 1,
        ..Default::default()
    });
    app.finalize_block(RequestFinalizeBlock {
        height: 1,
        time: ts(T0),
        ..Default::default()
    });
    app.commit();
    // Distinct bodies for the same range, all awaited: every deposit list
    // numbered 1.. and full (`more`), differing in amounts.
    let bodies: Vec<HubBlock> = (0..=max_msgs as u64)
        .map(|k| HubBlock {
            chain: "hub".into(),
            from_height: 1,
            to_height: params.hub_block_range,
            deposits: (1..=max_deps as u64)
                .map(|seq| HubDeposit {
                    seq,
                    user: format!("depositor-{seq:05}-with-a-long-name-{k}"),
                    amount: seq + k,
                    pubkey: Vec::new(),
                })
                .collect(),
            more: true,
            // Any count above the list is awaited with `more`; the
            // largest takes the most bytes.
            deposit_count: u64::MAX,
        })
        .collect();
    let build = |msgs: usize, signers: &[SecretShare]| -> Vec<u8> {
        let mut sp = SubmitPartials::default();
        for b in bodies.iter().take(msgs) {
            let d = block_digest(b);
            let m = bls::message(CHAIN, Kind::HubBlock, &d);
            for s in signers {
                sp.partials.push(PartialSig {
                    epoch: 0,
                    index: s.index,
                    kind: Kind::HubBlock.value(),
                    digest: d.to_vec(),
                    signature: s.sign(&m).sig_bytes().to_vec(),
                });
            }
            sp.hub_blocks.push(b.clone());
        }
        Tx {
            sum: Some(tx::Sum::Partials(sp)),
        }
        .encode_to_vec()
    };
    let below = &shares[..(t as usize - 1)];
    let scenarios = [
        (
            format!(
                "{max_msgs} messages x {} partials (t-1, none combines)",
                t - 1
            ),
            build(max_msgs, below),
            true,
        ),
        (
            format!("{max_msgs} messages x {n} partials (first combines and credits)"),
            build(max_msgs, &shares),
            true,
        ),
        (
            format!("{} messages x {n} partials (over the cap)", max_msgs + 1),
            build(max_msgs + 1, &shares),
            false,
        ),
    ];
    let mut out = Vec::new();
    for (name, bytes, accept) in scenarios {
        let txs = vec![Bytes::from(bytes.clone())];
        let mut proc_ms = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t0 = Instant::now();
            let r = app.process_proposal(RequestProcessProposal {
                txs: txs.clone(),
                height: 2,
                time: ts(T0 + 1),
                ..Default::default()
            });
            proc_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            let want = if accept {
                ProposalStatus::Accept
            } else {
                ProposalStatus::Reject
            };
            ensure!(r.status == want as i32, "{name}: status {}", r.status);
        }
        out.push(summarize(
            &format!("ProcessProposal, {name}"),
            bytes.len(),
            proc_ms,
        ));
        if !accept {
            continue;
        }
        // FinalizeBlock of the same height again and again re-executes it
        // from the committed state (no Commit in between).
        let mut fin_ms = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t0 = Instant::now();
            let r = app.finalize_block(RequestFinalizeBlock {
                txs: txs.clone(),
                height: 2,
                time: ts(T0 + 1),
                ..Default::default()
            });
            fin_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            ensure!(
                r.tx_results.first().map(|x| x.code) == Some(0),
                "{name}: FinalizeBlock refused the transaction"
            );
        }
        out.push(summarize(
            &format!("FinalizeBlock, {name}"),
            bytes.len(),
            fin_ms,
        ));
    }
    Ok(out)
}

//! The DKG's failure paths and rejection codes through the in-process
//! driver (keyed validators, CometBFT's call sequence and its validator-set
//! rules, app hashes compared at every height): a first ceremony that
//! fails and runs again, a re-key that gives up after three rounds, a
//! proposal that expires, the events a fresh key and a re-key emit, power
//! changes a proposal cannot make, a byzantine dealer during a re-key, and
//! the removal of a validator that is offline.
//!
//! The oracles are worked out by hand from ADR 0015/0017/0018 and the
//! README's code table, not read from the DKG code: a ceremony started at
//! height `s` with phases of `p` blocks takes keys below `s + p`, dealings
//! below `s + 2p`, acks below `s + 3p`, reveals below `s + 4p` and
//! finalises at the start of `s + 4p`; the threshold of `n` players is
//! `n - (n - 1) / 3`; a re-key gives up after three failed rounds; codes
//! 29 `not_validator`, 30 `dkg_phase`, 31 `bad_dealing`, 32
//! `dkg_duplicate`, 33 `bad_proposal`; proposal status numbers 1 open,
//! 2 accepted, 3 applied, 4 refused. Transactions are identified by
//! decoding the block's bytes here (sender key and message kind), and a
//! group key is rebuilt by adding the qualified dealings' constant terms
//! with blst's own aggregation.

use std::collections::BTreeMap;

use anyhow::{bail, ensure, Context, Result};
use blst::min_pk::{AggregatePublicKey, PublicKey};
use prost::Message;
use tally_settlement::bls::{self, parse_public_key, Kind, Partial};
use tally_settlement::dkg::state as dst;
use tally_settlement::dkg::types::{ProposalAction, ProposalStatus};
use tally_settlement::proto::{
    tx, validator_msg::Sum, Dealing, DkgKey, DkgReveal, RevealedShare, Tx, ValidatorMsg,
    ValidatorProposal,
};
use tally_tests::dkgnet::{DkgNet, CHAIN};
use tally_tests::hub::Hub;
use tally_tests::traffic::{gateway_key, Traffic};

/// Blocks per DKG phase in every test here.
const PHASE: i64 = 3;

/// One event: its type and attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ev {
    kind: String,
    attrs: BTreeMap<String, String>,
}

fn ev(kind: &str, attrs: &[(&str, String)]) -> Ev {
    Ev {
        kind: kind.into(),
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    }
}

/// A validator transaction of a block, decoded here.
#[derive(Clone, Debug)]
struct VTx {
    /// Index of the sending node.
    from: usize,
    /// The message kind: key, dealing, ack, reveal, propose, approve.
    kind: &'static str,
    code: u32,
    log: String,
    events: Vec<Ev>,
}

/// What one height did.
#[derive(Clone, Debug)]
struct Height {
    height: i64,
    events: Vec<Ev>,
    /// Events of every transaction (system ones included).
    tx_events: Vec<Ev>,
    vtxs: Vec<VTx>,
}

fn events_of(list: &[tendermint_proto::v0_38::abci::Event]) -> Vec<Ev> {
    list.iter()
        .map(|e| Ev {
            kind: e.r#type.clone(),
            attrs: e
                .attributes
                .iter()
                .map(|a| (a.key.clone(), a.value.clone()))
                .collect(),
        })
        .collect()
}

/// The node whose consensus key is `pubkey`.
fn node_of(net: &DkgNet, pubkey: &[u8]) -> Option<usize> {
    (0..net.net.nodes.len()).find(|&i| net.net.pubkey(i).as_deref() == Some(pubkey))
}

/// A test net that records every height.
struct Run {
    net: DkgNet,
    seen: Vec<Height>,
}

impl Run {
    fn new(n: usize) -> Result<Self> {
        Ok(Self {
            net: DkgNet::new(n, PHASE as u64)?,
            seen: Vec::new(),
        })
    }

    /// One block with usage and `extra` transactions, recorded.
    fn block(&mut self, extra: Vec<Vec<u8>>) -> Result<Height> {
        let o = self.net.block(true, extra)?;
        let (block, results, events) = (o.block.clone(), o.tx_results.clone(), o.events.clone());
        let mut vtxs = Vec::new();
        for (bytes, r) in block.txs.iter().zip(&results) {
            let Ok(Tx {
                sum: Some(tx::Sum::Validator(s)),
            }) = Tx::decode(bytes.as_ref())
            else {
                continue;
            };
            let m = ValidatorMsg::decode(s.body.as_slice())?;
            let kind = match m.sum {
                Some(Sum::Key(_)) => "key",
                Some(Sum::Dealing(_)) => "dealing",
                Some(Sum::Ack(_)) => "ack",
                Some(Sum::Reveal(_)) => "reveal",
                Some(Sum::Propose(_)) => "propose",
                Some(Sum::Approve(_)) => "approve",
                None => "none",
            };
            let from = node_of(&self.net, &s.pubkey).context("a sender outside the net")?;
            vtxs.push(VTx {
                from,
                kind,
                code: r.code,
                log: r.log.clone(),
                events: events_of(&r.events),
            });
        }
        let h = Height {
            height: block.height,
            events: events_of(&events),
            tx_events: results.iter().flat_map(|r| events_of(&r.events)).collect(),
            vtxs,
        };
        self.seen.push(h.clone());
        Ok(h)
    }

    /// Blocks until `done`, at most `max`.
    fn until(&mut self, max: usize, mut done: impl FnMut(&DkgNet) -> Result<bool>) -> Result<()> {
        for _ in 0..max {
            self.block(Vec::new())?;
            if done(&self.net)? {
                return Ok(());
            }
        }
        bail!("not done in {max} blocks (height {})", self.net.net.height)
    }

    /// Blocks through height `h` (the last decided height becomes `h`).
    fn run_to(&mut self, h: i64) -> Result<()> {
        ensure!(
            self.net.net.height < h,
            "already at {}",
            self.net.net.height
        );
        while self.net.net.height < h {
            self.block(Vec::new())?;
        }
        Ok(())
    }

    /// Each `(from, sum)` signed by node `from`, all in the next block;
    /// returns that block's result for each (code, log).
    fn send_all(&mut self, msgs: Vec<(usize, Sum)>) -> Result<Vec<(u32, String)>> {
        let mut txs = Vec::new();
        for (from, sum) in msgs {
            let key = self.net.net.nodes[from]
                .consensus
                .clone()
                .context("keyed")?;
            txs.push(tally_settlement::dkg::sign_validator_msg(
                &key,
                &ValidatorMsg {
                    chain_id: CHAIN.into(),
                    sum: Some(sum),
                },
            ));
        }
        self.block(txs.clone())?;
        let o = self.net.last.as_ref().context("a block")?;
        let mut out = Vec::new();
        for tx in &txs {
            let pos = o
                .block
                .txs
                .iter()
                .position(|t| t.as_ref() == tx.as_slice())
                .context("the transaction was not included")?;
            out.push((o.tx_results[pos].code, o.tx_results[pos].log.clone()));
        }
        Ok(out)
    }

    /// Block events of `kind` with the heights they were emitted at.
    fn block_events(&self, kind: &str) -> Vec<(i64, Ev)> {
        self.seen
            .iter()
            .flat_map(|h| {
                h.events
                    .iter()
                    .filter(|e| e.kind == kind)
                    .map(|e| (h.height, e.clone()))
            })
            .collect()
    }

    /// Events of `kind`, of the block or of any transaction, with their
    /// heights.
    fn any_events(&self, kind: &str) -> Vec<(i64, Ev)> {
        self.seen
            .iter()
            .flat_map(|h| {
                h.events
                    .iter()
                    .chain(&h.tx_events)
                    .filter(|e| e.kind == kind)
                    .map(|e| (h.height, e.clone()))
            })
            .collect()
    }

    fn committed(&self) -> &std::sync::Arc<dyn tally_store::Backend> {
        self.net.net.nodes[0].app.committed_state()
    }
}

/// Hand-computed threshold of `n` players (ADR 0015).
fn threshold(n: usize) -> usize {
    n - (n - 1) / 3
}

/// Drops a node's dealings (it registers its key and acks others).
fn no_dealing(m: ValidatorMsg) -> Option<ValidatorMsg> {
    match m.sum {
        Some(Sum::Dealing(_)) => None,
        _ => Some(m),
    }
}

/// Truncates a dealing's commitment by one point: a malformed dealing.
fn short_commitment(m: ValidatorMsg) -> Option<ValidatorMsg> {
    let mut m = m;
    if let Some(Sum::Dealing(d)) = m.sum.as_mut() {
        d.commitment.pop();
    }
    Some(m)
}

/// The group key rebuilt from the last ceremony's qualified dealings
/// (sum of their constant-term commitments, blst aggregation).
fn rebuilt_group(kv: &impl tally_store::KvRead) -> Result<Vec<u8>> {
    let c = dst::last_ceremony(kv)?.context("no ceremony")?;
    let mut firsts: Vec<PublicKey> = Vec::new();
    for d in &c.qualified {
        let dealing = dst::dealing(kv, c.round, *d)?.context("dealing")?;
        firsts.push(parse_public_key(&dealing.commitment[0])?);
    }
    let refs: Vec<&PublicKey> = firsts.iter().collect();
    let sum = AggregatePublicKey::aggregate(&refs, false).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(sum.to_public_key().compress().to_vec())
}

/// Every member holds a share of the active key that matches its public
/// share, and `t` of them (first and last) combine into a signature the
/// group key verifies.
fn members_sign(net: &DkgNet) -> Result<()> {
    let key = net.key(0)?.context("no key")?;
    let msg = bls::message(CHAIN, Kind::Batch, &[3; 32]);
    let mut parts: Vec<Partial> = Vec::new();
    for (i, n) in net.net.nodes.iter().enumerate() {
        if !n.member {
            continue;
        }
        let (_, s) = n
            .epoch_shares
            .iter()
            .find(|(e, _)| *e == key.record.epoch)
            .with_context(|| format!("node{i} holds no share of epoch {}", key.record.epoch))?;
        let p = s.sign(&msg);
        ensure!(key.shares.verify_partial(&msg, &p), "node{i}'s share");
        parts.push(p);
    }
    let t = key.shares.threshold as usize;
    for w in [0, parts.len() - t] {
        let sig = key.shares.combine(&msg, &parts[w..w + t])?;
        ensure!(key.shares.verify_group(&msg, &sig), "combined signature");
    }
    Ok(())
}

fn group_hex(net: &DkgNet) -> Result<String> {
    Ok(hex::encode(
        net.key(0)?.context("no key")?.shares.group.compress(),
    ))
}

/// Proposes `action` on `target` from `proposer` and approves it from
/// `approvers` until accepted; returns the id and the height it was
/// accepted at.
fn accept(
    run: &mut Run,
    proposer: usize,
    action: ProposalAction,
    target: usize,
    power: u64,
    approvers: &[usize],
) -> Result<(u64, i64)> {
    let (code, id) = run.net.propose(proposer, action, target, power)?;
    ensure!(code.value() == 0, "proposal refused: {code:?}");
    for &a in approvers {
        if run.net.status(id)? != ProposalStatus::Open {
            break;
        }
        ensure!(run.net.approve(a, id)?.value() == 0, "approval by {a}");
    }
    ensure!(
        run.net.status(id)? == ProposalStatus::Accepted,
        "proposal {id} not accepted"
    );
    Ok((id, run.net.net.height))
}

#[test]
fn a_failed_first_ceremony_runs_again_as_the_next_round_and_its_retry_makes_the_key() -> Result<()>
{
    let mut run = Run::new(4)?;
    // Nodes 2 and 3 register their round keys and ack, but never deal:
    // two dealings for a threshold of three.
    run.net.net.nodes[2].dkg_filter = Some(no_dealing);
    run.net.net.nodes[3].dkg_filter = Some(no_dealing);
    // Round 1 starts at height 1 and finalises at 1 + 4p = 13.
    run.run_to(1 + 4 * PHASE)?;
    let failed = run.block_events("dkg_failed");
    let want = ev(
        "dkg_failed",
        &[
            ("round", "1".into()),
            ("qualified", "2".into()),
            ("needed", "3".into()),
        ],
    );
    ensure!(failed == vec![(13, want)], "{failed:?}");
    ensure!(run.block_events("dkg_finalised").is_empty());
    ensure!(run.net.key(0)?.is_none(), "a key formed from two dealings");
    // The same ceremony runs again as round 2 from height 13 (no new
    // dkg_started: it is the same ceremony), and round 1's data is gone.
    let kv = run.committed().clone();
    let c = dst::ceremony(&kv)?.context("no retry")?;
    ensure!(
        (
            c.round,
            c.attempt,
            c.start_height,
            c.keys_end,
            c.deal_end,
            c.ack_end,
            c.end
        ) == (2, 1, 13, 16, 19, 22, 25),
        "retry {c:?}"
    );
    ensure!(
        dst::round_counts(&kv, 1)? == [0; 4],
        "round 1 kept {:?}",
        dst::round_counts(&kv, 1)?
    );
    let started = run.block_events("dkg_started");
    ensure!(started.len() == 1 && started[0].0 == 1, "{started:?}");
    // The two deal this time.
    run.net.net.nodes[2].dkg_filter = None;
    run.net.net.nodes[3].dkg_filter = None;

    // Messages for a round that is over, or outside their phase, or from
    // a node that is not a player, or twice, are refused with their
    // codes. Round 2 takes keys at heights 13 to 15 (node 0's own lands
    // in 14).
    let outsider = run.net.net.add_node()?;
    let key_of = |round: u64| {
        Sum::Key(DkgKey {
            round,
            ..Default::default()
        })
    };
    let got = run.send_all(vec![
        (
            1,
            Sum::Dealing(Dealing {
                round: 2,
                ..Default::default()
            }),
        ),
        (outsider, key_of(2)),
    ])?;
    ensure!(run.net.net.height == 14);
    ensure!(got[0].0 == 30, "dealing in the keys phase: {:?}", got[0]);
    ensure!(got[1].0 == 29, "key of a non-player: {:?}", got[1]);
    let got = run.send_all(vec![(0, key_of(2))])?;
    ensure!(got[0].0 == 32, "second key: {:?}", got[0]);
    let got = run.send_all(vec![(0, key_of(1))])?;
    ensure!(
        got[0].0 == 30 && got[0].1.contains("round 1"),
        "stale round: {:?}",
        got[0]
    );
    // Reveals are taken from ack_end (22): every player acked node 0's
    // dealing, so revealing a share of player 2 is refused.
    run.run_to(22)?;
    let got = run.send_all(vec![(
        0,
        Sum::Reveal(DkgReveal {
            round: 2,
            shares: vec![RevealedShare {
                player: 2,
                share: vec![1; 32],
            }],
        }),
    )])?;
    ensure!(
        got[0].0 == 31 && got[0].1.contains("acked"),
        "reveal of an acked share: {:?}",
        got[0]
    );
    // The retry finalises at 25 with every dealer qualified.
    run.run_to(25)?;
    let fin = run.block_events("dkg_finalised");
    let want = ev(
        "dkg_finalised",
        &[
            ("round", "2".into()),
            ("epoch", "1".into()),
            ("qualified", "4".into()),
            ("group_key", group_hex(&run.net)?),
        ],
    );
    ensure!(fin == vec![(25, want)], "{fin:?}");
    ensure!(hex::encode(rebuilt_group(run.committed())?) == group_hex(&run.net)?);
    members_sign(&run.net)?;
    run.net.pin_hub()?;
    run.until(60, |n| Ok(n.settled() >= 1))?;
    Ok(())
}

#[test]
fn a_rekey_that_fails_three_rounds_gives_up_and_refuses_its_proposal() -> Result<()> {
    let mut run = Run::new(4)?;
    run.until(17, |n| Ok(n.epoch()? == 1))?;
    run.net.pin_hub()?;
    let group = group_hex(&run.net)?;
    let newcomer = run.net.net.add_node()?;
    // In the re-key's five players (threshold 4) only three deal.
    run.net.net.nodes[2].dkg_filter = Some(no_dealing);
    run.net.net.nodes[3].dkg_filter = Some(no_dealing);
    let (id, accepted_at) = accept(&mut run, 0, ProposalAction::Add, newcomer, 10, &[1, 2])?;
    let s = accepted_at + 1;
    run.run_to(s + 3 * 4 * PHASE)?;
    let started: Vec<_> = run
        .block_events("dkg_started")
        .into_iter()
        .filter(|(h, _)| *h > accepted_at)
        .collect();
    let want = ev(
        "dkg_started",
        &[
            ("round", "2".into()),
            ("kind", "rekey".into()),
            ("dealers", "5".into()),
            ("players", "5".into()),
            ("threshold", threshold(5).to_string()),
            ("end", (s + 4 * PHASE).to_string()),
        ],
    );
    ensure!(started == vec![(s, want)], "{started:?}");
    let failed = run.block_events("dkg_failed");
    let want: Vec<(i64, Ev)> = (0..3)
        .map(|k| {
            (
                s + (k + 1) * 4 * PHASE,
                ev(
                    "dkg_failed",
                    &[
                        ("round", (2 + k).to_string()),
                        ("qualified", "3".into()),
                        ("needed", "4".into()),
                    ],
                ),
            )
        })
        .collect();
    ensure!(failed == want, "{failed:?}");
    // The third failure refuses the proposal, with an event.
    let closed: Vec<_> = run
        .block_events("validator_proposal")
        .into_iter()
        .filter(|(h, _)| *h == s + 12 * PHASE)
        .collect();
    let reason = "its re-key failed 3 times".to_string();
    let want = ev(
        "validator_proposal",
        &[
            ("id", id.to_string()),
            ("status", "4".into()),
            ("reason", reason.clone()),
        ],
    );
    ensure!(closed == vec![(s + 12 * PHASE, want)], "{closed:?}");
    let kv = run.committed().clone();
    let p = dst::proposal(&kv, id)?.context("proposal")?;
    ensure!(p.reason == reason && run.net.status(id)? == ProposalStatus::Refused);
    ensure!(dst::ceremony(&kv)?.is_none(), "a fourth round started");
    for r in 2..=4 {
        ensure!(dst::round_counts(&kv, r)? == [0; 4], "round {r} kept data");
    }
    // Nothing changed: epoch 1, the same key, four validators in
    // CometBFT's set and the app's, no rotation.
    ensure!(run.net.epoch()? == 1 && group_hex(&run.net)? == group);
    ensure!(dst::validators(&kv)?.len() == 4 && dst::rotation(&kv, 1)?.is_none());
    let members: Vec<usize> = (0..5).filter(|&i| run.net.net.nodes[i].member).collect();
    ensure!(members == vec![0, 1, 2, 3], "{members:?}");
    // The old key still signs batches the hub settles.
    let before = run.net.settled();
    run.until(60, |n| Ok(n.settled() > before))?;
    Ok(())
}

/// A net whose proposals expire after `expiry` blocks (DkgNet's genesis
/// with that parameter).
fn net_with_expiry(expiry: u64) -> Result<DkgNet> {
    let key = gateway_key(3);
    let traffic = Traffic::new(11, key.clone(), CHAIN, [4, 2, 2, 2]);
    let mut net = tally_tests::driver::Net::keyed(4, CHAIN, tally_tests::dkgnet::T0)?;
    let state = serde_json::json!({
        "params": {
            "settlement_window_secs": 60, "hub_chain": "hub", "max_batch_calls": 50,
            "dkg_phase_blocks": PHASE, "proposal_expiry_blocks": expiry,
        },
        "gateways": [{"name": "gw-test", "pubkey": hex::encode(key.verifying_key().to_bytes())}],
        "allowances": tally_tests::traffic::allowances(&traffic.users, "gw-test"),
        "balances": traffic.users.iter().map(|u| serde_json::json!({"user": u, "amount": 100_000})).collect::<Vec<_>>(),
    });
    net.init(&state.to_string())?;
    net.hub = Some(Hub::default());
    Ok(DkgNet {
        net,
        traffic,
        last: None,
    })
}

#[test]
fn an_open_proposal_expires_at_its_height_and_is_closed_to_approvals() -> Result<()> {
    const EXPIRY: i64 = 20;
    let mut run = Run {
        net: net_with_expiry(EXPIRY as u64)?,
        seen: Vec::new(),
    };
    run.until(17, |n| Ok(n.epoch()? == 1))?;
    let newcomer = run.net.net.add_node()?;
    let (code, id) = run.net.propose(0, ProposalAction::Add, newcomer, 10)?;
    ensure!(code.value() == 0, "{code:?}");
    let opened = run.net.net.height;
    // 2 of 4 is not more than 2/3.
    ensure!(run.net.approve(1, id)?.value() == 0);
    run.run_to(opened + EXPIRY - 1)?;
    ensure!(
        run.net.status(id)? == ProposalStatus::Open,
        "closed before its height"
    );
    run.run_to(opened + EXPIRY)?;
    ensure!(
        run.net.status(id)? == ProposalStatus::Refused,
        "not expired"
    );
    let closed = run.block_events("validator_proposal");
    let want = ev(
        "validator_proposal",
        &[
            ("id", id.to_string()),
            ("status", "4".into()),
            ("reason", "expired without enough approvals".into()),
        ],
    );
    ensure!(closed == vec![(opened + EXPIRY, want)], "{closed:?}");
    let got = run.send_all(vec![(
        2,
        Sum::Approve(tally_settlement::proto::ProposalApproval { proposal: id }),
    )])?;
    ensure!(got[0].0 == 33, "approval after expiry: {:?}", got[0]);
    let kv = run.committed().clone();
    ensure!(
        dst::open_proposals(&kv)?.is_empty(),
        "still in the open index"
    );
    ensure!(dst::proposal(&kv, id)?.is_some(), "the record is kept");
    ensure!(!run.net.net.nodes[newcomer].member, "the newcomer joined");
    // The same change can be proposed again and now accepted.
    let (id2, _) = accept(&mut run, 0, ProposalAction::Add, newcomer, 10, &[1, 2])?;
    ensure!(id2 == id + 1);
    Ok(())
}

#[test]
fn a_fresh_key_and_a_rekey_emit_their_events_with_exact_attributes() -> Result<()> {
    let mut run = Run::new(4)?;
    run.run_to(1 + 4 * PHASE)?;
    let started = run.block_events("dkg_started");
    let want = ev(
        "dkg_started",
        &[
            ("round", "1".into()),
            ("kind", "fresh".into()),
            ("dealers", "4".into()),
            ("players", "4".into()),
            ("threshold", "3".into()),
            ("end", "13".into()),
        ],
    );
    ensure!(started == vec![(1, want)], "{started:?}");
    // Per-transaction events: one dkg_key per player in the keys phase
    // (heights below 4), one dkg_dealing per dealer in the dealings phase
    // (4 to 6), acks without events, no reveal.
    let mut keys = Vec::new();
    let mut dealings = Vec::new();
    for h in &run.seen {
        for t in &h.vtxs {
            ensure!(
                t.code == 0,
                "height {}: {} refused: {}",
                h.height,
                t.kind,
                t.log
            );
            match t.kind {
                "key" => {
                    ensure!(h.height < 4, "key at {}", h.height);
                    ensure!(t.events.len() == 1, "{:?}", t.events);
                    keys.push(t.events[0].clone());
                }
                "dealing" => {
                    ensure!((4..7).contains(&h.height), "dealing at {}", h.height);
                    ensure!(t.events.len() == 1, "{:?}", t.events);
                    dealings.push(t.events[0].clone());
                }
                // Acks are taken once a dealing is on chain, below
                // ack_end (10).
                "ack" => ensure!(t.events.is_empty() && (5..10).contains(&h.height)),
                other => bail!("unexpected {other}"),
            }
        }
    }
    keys.sort_by(|a, b| a.attrs.cmp(&b.attrs));
    dealings.sort_by(|a, b| a.attrs.cmp(&b.attrs));
    let want: Vec<Ev> = (1..=4)
        .map(|p| {
            ev(
                "dkg_key",
                &[("round", "1".into()), ("player", p.to_string())],
            )
        })
        .collect();
    ensure!(keys == want, "{keys:?}");
    let want: Vec<Ev> = (1..=4)
        .map(|d| {
            ev(
                "dkg_dealing",
                &[("round", "1".into()), ("dealer", d.to_string())],
            )
        })
        .collect();
    ensure!(dealings == want, "{dealings:?}");
    ensure!(run.block_events("dkg_reveal").is_empty());
    let g1 = hex::encode(rebuilt_group(run.committed())?);
    let fin = run.block_events("dkg_finalised");
    let want = ev(
        "dkg_finalised",
        &[
            ("round", "1".into()),
            ("epoch", "1".into()),
            ("qualified", "4".into()),
            ("group_key", g1.clone()),
        ],
    );
    ensure!(fin == vec![(13, want)], "{fin:?}");
    ensure!(
        run.block_events("key_epoch").is_empty(),
        "the first key activates without a key_epoch event"
    );
    run.net.pin_hub()?;

    // A re-key of the same set: proposal events, then the ceremony's,
    // the rotation's (signing, signed) and the switch.
    let (code, id) = run.net.propose(0, ProposalAction::Rekey, 0, 0)?;
    ensure!(code.value() == 0);
    let opened = run.net.net.height;
    ensure!(run.net.approve(1, id)?.value() == 0);
    ensure!(run.net.approve(2, id)?.value() == 0);
    let s = run.net.net.height + 1;
    run.until(60, |n| Ok(n.epoch()? == 2))?;
    let g2 = group_hex(&run.net)?;
    ensure!(g2 != g1, "the re-key kept the group key");
    ensure!(hex::encode(rebuilt_group(run.committed())?) == g2);
    let after = |k: &str| -> Vec<(i64, Ev)> {
        run.any_events(k)
            .into_iter()
            .filter(|(h, _)| *h > opened)
            .collect()
    };
    let want = ev(
        "dkg_started",
        &[
            ("round", "2".into()),
            ("kind", "rekey".into()),
            ("dealers", "4".into()),
            ("players", "4".into()),
            ("threshold", "3".into()),
            ("end", (s + 4 * PHASE).to_string()),
        ],
    );
    ensure!(
        after("dkg_started") == vec![(s, want)],
        "{:?}",
        after("dkg_started")
    );
    let end = s + 4 * PHASE;
    let want = ev(
        "dkg_finalised",
        &[
            ("round", "2".into()),
            ("epoch", "2".into()),
            ("qualified", "4".into()),
            ("group_key", g2.clone()),
        ],
    );
    ensure!(after("dkg_finalised") == vec![(end, want)]);
    let rot = after("key_rotation");
    ensure!(rot.len() == 2, "{rot:?}");
    let signing = ev(
        "key_rotation",
        &[
            ("nonce", "1".into()),
            ("epoch", "2".into()),
            ("group_key", g2.clone()),
            ("status", "signing".into()),
        ],
    );
    ensure!(rot[0] == (end, signing), "{:?}", rot[0]);
    let signed_at = rot[1].0;
    ensure!(signed_at > end, "signed at {signed_at}");
    let signed = ev(
        "key_rotation",
        &[
            ("nonce", "1".into()),
            ("epoch", "2".into()),
            ("group_key", g2.clone()),
            ("status", "signed".into()),
            ("activate_height", (signed_at + 2).to_string()),
        ],
    );
    ensure!(rot[1].1 == signed, "{:?}", rot[1]);
    let want = ev(
        "key_epoch",
        &[
            ("epoch", "2".into()),
            ("group_key", g2.clone()),
            ("signers", "4".into()),
        ],
    );
    ensure!(after("key_epoch") == vec![(signed_at + 2, want)]);
    ensure!(run.net.status(id)? == ProposalStatus::Applied);
    ensure!(after("dkg_failed").is_empty());
    members_sign(&run.net)?;
    Ok(())
}

#[test]
fn proposal_events_carry_id_status_and_approvals() -> Result<()> {
    let mut run = Run::new(4)?;
    run.until(17, |n| Ok(n.epoch()? == 1))?;
    let newcomer = run.net.net.add_node()?;
    run.block(Vec::new())?;
    let from = run.seen.len();
    let (code, id) = run.net.propose(0, ProposalAction::Add, newcomer, 10)?;
    ensure!(code.value() == 0);
    // DkgNet's helpers do not record; read the events of its last block.
    let tx_events = |net: &DkgNet| -> Vec<Ev> {
        let o = net.last.as_ref().expect("a block");
        o.tx_results
            .iter()
            .flat_map(|r| events_of(&r.events))
            .filter(|e| e.kind == "validator_proposal")
            .collect()
    };
    let prop = |status: u32, approvals: usize| {
        ev(
            "validator_proposal",
            &[
                ("id", id.to_string()),
                ("status", status.to_string()),
                ("approvals", approvals.to_string()),
            ],
        )
    };
    ensure!(tx_events(&run.net) == vec![prop(1, 1)]);
    ensure!(run.net.approve(1, id)?.value() == 0);
    ensure!(tx_events(&run.net) == vec![prop(1, 2)]);
    ensure!(run.net.approve(2, id)?.value() == 0);
    ensure!(tx_events(&run.net) == vec![prop(2, 3)]);
    ensure!(run.seen.len() == from, "the helpers recorded");
    Ok(())
}

#[test]
fn no_proposal_changes_a_validators_power() -> Result<()> {
    let mut run = Run::new(4)?;
    run.until(17, |n| Ok(n.epoch()? == 1))?;
    let newcomer = run.net.net.add_node()?;
    let next_before = dst::proposals_from(run.committed(), 1, 100)?.len();
    // Unequal power for a newcomer; a member "added" again at another
    // power (the update action is gone, ADR 0018); a removal or a re-key
    // carrying a power; an action number nobody defined.
    let cases: Vec<(ProposalAction, usize, u64)> = vec![
        (ProposalAction::Add, newcomer, 11),
        (ProposalAction::Add, newcomer, 0),
        (ProposalAction::Add, 1, 20),
        (ProposalAction::Remove, 1, 5),
        (ProposalAction::Rekey, 0, 10),
    ];
    for (action, target, power) in cases {
        let (code, id) = run.net.propose(0, action, target, power)?;
        ensure!(
            code.value() == 33 && id == 0,
            "{action:?} of {target} at {power}: {code:?}"
        );
    }
    let key = run.net.net.nodes[0].consensus.clone().context("keyed")?;
    let tx = tally_settlement::dkg::sign_validator_msg(
        &key,
        &ValidatorMsg {
            chain_id: CHAIN.into(),
            sum: Some(Sum::Propose(ValidatorProposal {
                action: 99,
                power: 20,
                valid_until_height: run.net.net.height as u64 + 10,
                ..Default::default()
            })),
        },
    );
    let o = run.net.block(false, vec![tx.clone()])?;
    let pos = o
        .block
        .txs
        .iter()
        .position(|t| t.as_ref() == tx.as_slice())
        .context("not included")?;
    ensure!(o.tx_results[pos].code == 33, "{:?}", o.tx_results[pos]);
    ensure!(dst::proposals_from(run.committed(), 1, 100)?.len() == next_before);
    for _ in 0..5 {
        run.block(Vec::new())?;
    }
    for (i, n) in run.net.net.nodes.iter().enumerate() {
        let vals = dst::validators(n.app.committed_state())?;
        ensure!(
            vals.len() == 4 && vals.iter().all(|(_, v)| v.power == 10),
            "node{i}: {vals:?}"
        );
    }
    let comet = run.net.net.comet.as_ref().context("comet set")?;
    ensure!(
        comet.members().len() == 4 && comet.members().iter().all(|(_, p)| *p == 10),
        "CometBFT's set {:?}",
        comet.members()
    );
    Ok(())
}

#[test]
fn a_byzantine_dealer_in_a_rekey_is_refused_and_the_honest_dealers_make_the_key() -> Result<()> {
    let mut run = Run::new(4)?;
    run.until(17, |n| Ok(n.epoch()? == 1))?;
    let g1 = run.net.pin_hub()?;
    run.until(60, |n| Ok(n.settled() >= 1))?;
    let newcomer = run.net.net.add_node()?;
    run.net.net.nodes[1].dkg_filter = Some(short_commitment);
    let (_, accepted_at) = accept(&mut run, 0, ProposalAction::Add, newcomer, 10, &[2, 3])?;
    run.until(80, |n| Ok(n.epoch()? == 2))?;
    // Node 1's dealings in the re-key (threshold 4 of 5) carry 3 points:
    // each refused with bad_dealing (31), none stored.
    let bad: Vec<&VTx> = run
        .seen
        .iter()
        .filter(|h| h.height > accepted_at)
        .flat_map(|h| h.vtxs.iter())
        .filter(|t| t.from == 1 && t.kind == "dealing")
        .collect();
    ensure!(!bad.is_empty(), "node 1 never dealt");
    for t in &bad {
        ensure!(
            t.code == 31
                && t.log
                    .contains("commitment has 3 points, the threshold is 4"),
            "{t:?}"
        );
    }
    let kv = run.committed().clone();
    let c = dst::last_ceremony(&kv)?.context("ceremony")?;
    let addr1 = run.net.net.addr(1);
    let pos1 = c
        .dealers
        .iter()
        .position(|d| d.address == addr1.as_ref())
        .context("node 1 is a dealer")? as u32
        + 1;
    ensure!(dst::dealing(&kv, c.round, pos1)?.is_none(), "stored");
    let mut q = c.qualified.clone();
    q.sort_unstable();
    let want: Vec<u32> = (1..=5).filter(|&d| d != pos1).collect();
    ensure!(q == want, "qualified {q:?}");
    ensure!(c.threshold == 4);
    // Every other dealer's dealing went in with code 0.
    for h in run.seen.iter().filter(|h| h.height > accepted_at) {
        for t in h.vtxs.iter().filter(|t| t.from != 1 || t.kind != "dealing") {
            ensure!(t.code == 0, "height {}: {t:?}", h.height);
        }
    }
    let g2 = run
        .net
        .key(0)?
        .context("key")?
        .shares
        .group
        .compress()
        .to_vec();
    ensure!(rebuilt_group(&kv)? == g2 && g2 != g1);
    // The byzantine dealer is still a player: all five hold shares.
    members_sign(&run.net)?;
    let members: Vec<usize> = (0..5).filter(|&i| run.net.net.nodes[i].member).collect();
    ensure!(members == vec![0, 1, 2, 3, 4], "{members:?}");
    let before = run.net.settled();
    run.until(60, |n| Ok(n.settled() > before))?;
    let hub = run.net.net.hub.as_ref().context("hub")?;
    ensure!(
        hub.pinned_group.as_deref() == Some(g2.as_slice()),
        "hub key"
    );
    Ok(())
}

#[test]
fn an_offline_validator_is_removed_and_returns_as_a_follower_without_a_share() -> Result<()> {
    let mut run = Run::new(4)?;
    run.until(17, |n| Ok(n.epoch()? == 1))?;
    let g1 = run.net.pin_hub()?;
    run.until(60, |n| Ok(n.settled() >= 1))?;
    run.net.net.stop(3);
    let (id, _) = accept(&mut run, 0, ProposalAction::Remove, 3, 0, &[1, 2])?;
    run.until(80, |n| Ok(n.epoch()? == 2))?;
    ensure!(run.net.status(id)? == ProposalStatus::Applied);
    let key = run.net.key(0)?.context("key")?;
    // Three players: threshold 3 - 0 = 3.
    ensure!(key.signers.len() == 3 && key.shares.threshold as usize == threshold(3));
    let a3 = run.net.net.addr(3);
    ensure!(
        !key.signers.iter().any(|s| s.as_slice() == a3.as_ref()),
        "the removed node signs"
    );
    let comet = run.net.net.comet.as_ref().context("comet")?;
    ensure!(
        comet.members().len() == 3,
        "CometBFT's set {:?}",
        comet.members()
    );
    members_sign(&run.net)?;
    let before = run.net.settled();
    run.until(60, |n| Ok(n.settled() > before))?;
    let hub = run.net.net.hub.as_ref().context("hub")?;
    ensure!(
        hub.pinned_group.as_deref() != Some(g1.as_slice()),
        "hub did not rotate"
    );
    // Back: it replays every block to the same hashes, follows without a
    // vote, and holds no share of the new key.
    run.net.net.restart(3)?;
    run.block(Vec::new())?;
    let n3 = &run.net.net.nodes[3];
    ensure!(!n3.member, "the removed node votes");
    ensure!(
        !n3.epoch_shares.iter().any(|(e, _)| *e == 2),
        "the removed node holds a share of epoch 2"
    );
    let addr = run.net.net.addr(3);
    ensure!(dst::validator(n3.app.committed_state(), addr.as_ref())?.is_none());
    let heads = run.net.net.heads();
    ensure!(heads.iter().all(|h| h == &heads[0]), "{heads:?}");
    Ok(())
}

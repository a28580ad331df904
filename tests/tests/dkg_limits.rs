//! One validator message of each kind per sender, and one allowance change
//! per user, per block (issue 26): through the driver's PrepareProposal a
//! second one waits for a later block; a block that carries two anyway is
//! refused by every honest ProcessProposal. The oracle is counting: which
//! of the sent transactions each block holds.

use anyhow::{ensure, Result};
use tally_settlement::dkg::types::ProposalAction;
use tally_settlement::proto::{validator_msg::Sum, ProposalApproval, ValidatorMsg};
use tally_settlement::Code;
use tally_tests::dkgnet::{DkgNet, CHAIN};

fn approval(net: &DkgNet, from: usize, id: u64) -> Result<Vec<u8>> {
    let key = net.net.nodes[from]
        .consensus
        .clone()
        .ok_or_else(|| anyhow::anyhow!("keyed"))?;
    Ok(tally_settlement::dkg::sign_validator_msg(
        &key,
        &ValidatorMsg {
            chain_id: CHAIN.into(),
            sum: Some(Sum::Approve(ProposalApproval { proposal: id })),
        },
    ))
}

#[test]
fn a_second_message_of_one_kind_waits_for_the_next_block() -> Result<()> {
    let mut net = DkgNet::new(4, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    let a = net.net.add_node()?;
    let b = net.net.add_node()?;
    let (code, pa) = net.propose(0, ProposalAction::Add, a, 10)?;
    ensure!(code == Code::Ok, "{code:?}");
    let (code, pb) = net.propose(0, ProposalAction::Add, b, 10)?;
    ensure!(code == Code::Ok, "{code:?}");
    // Node 1 approves both in one go: two approvals, one sender, one kind.
    let (t1, t2) = (approval(&net, 1, pa)?, approval(&net, 1, pb)?);
    let o = net.net.block(vec![t1.clone(), t2.clone()], 1)?;
    let has = |txs: &[bytes::Bytes], t: &[u8]| txs.iter().any(|x| x.as_ref() == t);
    ensure!(
        has(&o.block.txs, &t1) && !has(&o.block.txs, &t2),
        "both approvals in one block"
    );
    // The second is offered again and lands in the next block.
    let o = net.net.block(vec![t2.clone()], 1)?;
    ensure!(has(&o.block.txs, &t2), "the second approval never landed");
    // Different kinds of one sender share a block.
    Ok(())
}

#[test]
fn process_proposal_refuses_two_of_one_scope() -> Result<()> {
    let mut net = DkgNet::new(4, 3)?;
    net.until(16, |s| Ok(s.epoch()? == 1))?;
    let a = net.net.add_node()?;
    let (code, pa) = net.propose(0, ProposalAction::Add, a, 10)?;
    ensure!(code == Code::Ok, "{code:?}");
    let t1 = approval(&net, 1, pa)?;
    let t2 = approval(&net, 1, pa + 1)?;
    let kv = tally_store::Pending::open(net.net.nodes[0].app.committed_state().clone())?;
    let block = tally_settlement::Block {
        height: net.net.height as u64 + 1,
        time: net.net.now as u64,
    };
    let mut sim = kv;
    let e = tally_settlement::verify_system(
        &mut sim,
        &tally_settlement::KeyCache::new(),
        &block,
        &[t1.as_slice(), t2.as_slice()],
    )
    .expect_err("two approvals of one sender in one block");
    ensure!(e.to_string().contains("one block"), "{e}");
    let mut sim = tally_store::Pending::open(net.net.nodes[0].app.committed_state().clone())?;
    tally_settlement::verify_system(
        &mut sim,
        &tally_settlement::KeyCache::new(),
        &block,
        &[t1.as_slice(), approval(&net, 2, pa)?.as_slice()],
    )?;
    Ok(())
}

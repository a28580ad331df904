//! A re-key that fails its third round gives up (ADR 0015: "a reshare that
//! fails three rounds refuses its proposal"), on a hand-built state: the
//! proposal is refused with its reason, and the block says so with the
//! same `validator_proposal` event (id, status 4 = refused, reason) every
//! other refusal emits, beside the round's `dkg_failed`. Earlier rounds
//! run again instead, with no proposal event.

use std::sync::Arc;

use tally_settlement::dkg::types::{CeremonyKind, ProposalAction, ProposalStatus};
use tally_settlement::dkg::{self, state as st};
use tally_settlement::proto::{Ceremony, CeremonyDealer, CeremonyPlayer, Proposal};
use tally_settlement::{init_chain, Block, Genesis};
use tally_store::{MemBackend, Pending};

/// A state with an accepted addition (proposal 1) whose re-key is in
/// `attempt` (0-based) and ends at height 20, with nothing dealt.
fn rekey_in_attempt(attempt: u32) -> Pending {
    let mut kv = Pending::open(Arc::new(MemBackend::new())).unwrap();
    init_chain(&mut kv, "c", &Genesis::default()).unwrap();
    st::put_proposal(
        &mut kv,
        &Proposal {
            id: 1,
            action: ProposalAction::Add.into(),
            pubkey: vec![7; 32],
            power: 10,
            status: ProposalStatus::Accepted.into(),
            ..Proposal::default()
        },
    );
    let players: Vec<CeremonyPlayer> = (1..=4u8)
        .map(|i| CeremonyPlayer {
            address: vec![i; 20],
            pubkey: vec![i; 32],
            power: 10,
        })
        .collect();
    st::put_ceremony(
        &mut kv,
        Some(&Ceremony {
            round: 5 + u64::from(attempt),
            kind: CeremonyKind::Rekey.into(),
            start_height: 8,
            keys_end: 11,
            deal_end: 14,
            ack_end: 17,
            end: 20,
            dealers: players
                .iter()
                .map(|p| CeremonyDealer {
                    address: p.address.clone(),
                })
                .collect(),
            players,
            threshold: 3,
            proposal: 1,
            epoch: 2,
            attempt,
            ..Ceremony::default()
        }),
    );
    kv
}

fn kinds_and_attrs(kv: &mut Pending) -> Vec<(String, Vec<(String, String)>)> {
    dkg::begin_block(
        kv,
        &Block {
            height: 20,
            time: 100,
        },
    )
    .unwrap()
    .into_iter()
    .map(|e| {
        (
            e.kind.to_string(),
            e.attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    })
    .collect()
}

#[test]
fn the_third_failed_round_refuses_the_proposal_with_an_event() {
    let mut kv = rekey_in_attempt(2);
    let events = kinds_and_attrs(&mut kv);
    let s = |x: &str| x.to_string();
    assert_eq!(
        events,
        vec![
            (
                s("dkg_failed"),
                vec![
                    (s("round"), s("7")),
                    (s("qualified"), s("0")),
                    (s("needed"), s("3"))
                ]
            ),
            (
                s("validator_proposal"),
                vec![
                    (s("id"), s("1")),
                    (s("status"), s("4")),
                    (s("reason"), s("its re-key failed 3 times")),
                ]
            ),
        ]
    );
    let p = st::proposal(&kv, 1).unwrap().unwrap();
    assert_eq!(st::proposal_status(&p).unwrap(), ProposalStatus::Refused);
    assert!(st::ceremony(&kv).unwrap().is_none());
    assert!(st::open_proposals(&kv).unwrap().is_empty());
}

#[test]
fn an_earlier_failed_round_runs_again_without_a_proposal_event() {
    let mut kv = rekey_in_attempt(1);
    let events = kinds_and_attrs(&mut kv);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "dkg_failed");
    let c = st::ceremony(&kv).unwrap().unwrap();
    // Default phases of 8 blocks: four of them from 20.
    assert_eq!((c.attempt, c.start_height, c.end), (2, 20, 52));
    let p = st::proposal(&kv, 1).unwrap().unwrap();
    assert_eq!(st::proposal_status(&p).unwrap(), ProposalStatus::Accepted);
}

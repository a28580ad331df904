//! Conversions between the state machine's types and CometBFT's protobuf
//! types: block headers to [`Block`], events, codespaces.

use tally_settlement::{self as settlement, Block, Code};
use tendermint_proto::google::protobuf::Timestamp;
use tendermint_proto::v0_38::abci::{Event, EventAttribute};

use crate::CODESPACE;

/// The block at `height` with header time `time` (whole seconds; a
/// missing or negative time is 0).
pub(crate) fn block(height: i64, time: Option<&Timestamp>) -> Block {
    Block {
        height: height.max(0) as u64,
        time: time.map(|t| t.seconds.max(0) as u64).unwrap_or(0),
    }
}

/// The state machine's events as ABCI events, every attribute indexed.
pub(crate) fn events(events: Vec<settlement::Event>) -> Vec<Event> {
    events
        .into_iter()
        .map(|e| Event {
            r#type: e.kind,
            attributes: e
                .attrs
                .into_iter()
                .map(|(key, value)| EventAttribute {
                    key,
                    value,
                    index: true,
                })
                .collect(),
        })
        .collect()
}

/// The codespace of a result: empty for success, [`CODESPACE`] otherwise.
pub(crate) fn codespace(code: Code) -> String {
    if code == Code::Ok {
        String::new()
    } else {
        CODESPACE.to_string()
    }
}

/// The state machine's validator updates as CometBFT's (ed25519 keys;
/// power 0 removes). Powers were capped when proposed, so they fit i64.
pub(crate) fn validator_updates(
    updates: &[settlement::proto::ValidatorRecord],
) -> Vec<tendermint_proto::v0_38::abci::ValidatorUpdate> {
    use tendermint_proto::v0_38::crypto::{public_key::Sum, PublicKey};
    updates
        .iter()
        .map(|u| tendermint_proto::v0_38::abci::ValidatorUpdate {
            pub_key: Some(PublicKey {
                sum: Some(Sum::Ed25519(u.pubkey.clone())),
            }),
            power: i64::try_from(u.power).unwrap_or(i64::MAX),
        })
        .collect()
}

/// The consensus-parameter update that switches headers from the next
/// height on to app version `version` (every other parameter unchanged).
pub(crate) fn app_version_update(version: u64) -> tendermint_proto::v0_38::types::ConsensusParams {
    tendermint_proto::v0_38::types::ConsensusParams {
        version: Some(tendermint_proto::v0_38::types::VersionParams { app: version }),
        ..Default::default()
    }
}

//! [`LAYOUT`]: every key prefix of the state in one table (the docs'
//! state-layout tables are checked against it). Part of [`super`].

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::dkg::keys::{
    ACK, ACTIVE_KEY, CEREMONY, CEREMONY_KEY, CEREMONY_ROUND, DEALING, LAST_CEREMONY, LAST_ROTATION,
    NEXT_KEY, NEXT_PROPOSAL, PROPOSAL, PROPOSAL_OPEN, REVEAL, ROTATION, VALIDATOR,
    VALIDATOR_UPDATES,
};

/// Every prefix (or single key) of the state and what lives there: the
/// layout in one table, in the order the docs list it.
pub const LAYOUT: &[(&[u8], &str)] = &[
    (CHAIN_ID, "chain id"),
    (PARAMS, "chain parameters (JSON)"),
    (CUR_WINDOW, "window of the last block"),
    (LAST_TIME, "time of the last block"),
    (NEXT_CALL_ID, "id of the next hub call"),
    (GATEWAY, "registered gateways"),
    (BALANCE, "balances"),
    (REPORT_ID, "accepted report ids"),
    (REPORT_EXPIRY, "report ids by expiry"),
    (
        REPORT_BUCKET,
        "accepted report ids by expiry bucket (app version 2)",
    ),
    (
        REPORT_SIDE,
        "accepted report ids by expiry bucket, side state (app version 6)",
    ),
    (
        REPORT_DIGEST,
        "digest of the side report ids a block filed per bucket (app version 6)",
    ),
    (ROUTE, "route records"),
    (BY_PROVIDER, "route records by provider"),
    (BY_USER, "route records by user"),
    (WINDOW, "window totals"),
    (PROVIDER_WINDOW, "a provider's totals per window"),
    (USER_WINDOW, "a user's totals per window"),
    (OWED, "credits owed, not yet hub calls"),
    (CLOSING, "closed windows still becoming hub calls"),
    (GATEWAY_NAME, "gateway keys by name"),
    (USER_KEY, "user keys"),
    (USER_SEQ, "last allowance sequence per user"),
    (ALLOWANCE, "allowances (user to gateway)"),
    (ALLOWANCE_SPENT, "allowance use in the current window"),
    (ACTIVE_KEY, "threshold key"),
    (HUB_CALL, "escrowed hub calls"),
    (HUB_PENDING, "hub calls not yet in a batch"),
    (BATCH, "batches"),
    (
        SETTLED_RETAIN,
        "settled batches whose calls are kept, by prune window",
    ),
    (SYNC, "sync state per hub chain"),
    (PSIG, "partial signatures"),
    (PMSG, "messages being signed"),
    (PEXP, "partial expiry"),
    (HUB_CURSOR, "next hub height per hub chain"),
    (DEPOSIT_SEQ, "next deposit sequence per hub chain"),
    (
        HUB_HELD,
        "signed hub blocks ahead of the deposit cursor (app version 5)",
    ),
    (LAST_HEIGHT, "height of the last block"),
    (APP_VERSION, "app version the state runs under"),
    (V1_IDS_LEFT, "version-1 report ids still being migrated"),
    (
        TREE_IDS_UNTIL,
        "last bucket that may hold version-5 report ids",
    ),
    (
        SLA_KEPT_FROM,
        "first window whose SLA records are kept (app version 7)",
    ),
    (
        SLA_PRUNE,
        "the pass pruning SLA records of older windows (app version 7)",
    ),
    (UPGRADE_PLAN, "pending upgrade plan"),
    (UPGRADE_DONE, "upgrade plans carried out"),
    (PARAMS_SINCE, "first window the parameters in force govern"),
    (
        PARAMS_AT,
        "earlier parameters kept for open or converting windows",
    ),
    (PARAMS_NEXT, "scheduled parameter changes by first window"),
    (WITHDRAWAL, "users' withdrawals by call id"),
    (SLO_POLICY, "service-level objectives in force, by provider"),
    (SLO_NEXT, "scheduled objective changes by first window"),
    (SLO_VERDICT, "objective verdicts by provider and window"),
    (REPUTATION, "providers' reputations"),
    (LATENCY, "latency and TTFT histograms by route and window"),
    (
        PROVIDER_LATENCY,
        "latency and TTFT histograms by provider and window",
    ),
    (
        VALIDATOR,
        "validators (consensus key, power, encryption key)",
    ),
    (CEREMONY, "the running DKG or re-key ceremony"),
    (LAST_CEREMONY, "the last ceremony that made a key"),
    (CEREMONY_KEY, "players' encryption keys by round and player"),
    (DEALING, "dealings by round and dealer"),
    (ACK, "acks by round, dealer and player"),
    (REVEAL, "revealed shares by round, dealer and player"),
    (CEREMONY_ROUND, "last ceremony round number"),
    (
        NEXT_KEY,
        "a new key waiting for its rotation signature and activation height",
    ),
    (
        ROTATION,
        "key rotations for the hub, by nonce (the history of keys)",
    ),
    (LAST_ROTATION, "nonce of the last key rotation"),
    (VALIDATOR_UPDATES, "validator updates of the current block"),
    (PROPOSAL, "validator-set proposals"),
    (PROPOSAL_OPEN, "open and accepted proposals"),
    (NEXT_PROPOSAL, "id of the next proposal"),
];

//! The user-transaction pipeline: the one dispatcher for every transaction
//! a user, a gateway or a validator signs and sends through the mempool
//! (usage reports, allowance changes, validator messages, user messages,
//! and every kind added later). System transactions (the proposer's) go elsewhere
//! ([`crate::system`]).
//!
//! A transaction's bytes are decoded once, by [`crate::machine`]
//! ([`crate::tx::decode_tx`]), and the decoded [`Tx`] comes here with its
//! bytes. Every kind then takes the same path:
//!
//! 1. size: at most `max_tx_bytes` ([`check_size`], code 14; the caller
//!    runs it first, before the bytes are decoded for CheckTx);
//! 2. the envelope decoded (code 1) and in canonical encoding: the bytes
//!    are exactly what re-encoding the decoded [`Tx`] gives (code 19);
//! 3. the signed envelope opened by [`crate::envelope::open`]: body,
//!    chain id, signer, signature, with one table of codes for every kind
//!    and the node's verified-signature cache;
//! 4. the kind's own checks, reading state only, into a plan
//!    ([`UserPlan`]): nothing is written unless every check passed;
//! 5. [`UserPlan::apply`] writes (FinalizeBlock only; CheckTx answers with
//!    [`UserPlan::describe`]).
//!
//! **To add a signed transaction kind:**
//! 1. the wire types: a field of `Tx.sum` and the signed envelope and body
//!    messages in `proto/tally/v1/tx.proto` and `crate::proto` (hand
//!    derived, `tools/proto-check` compares them);
//! 2. its module (beside `report`, `allowance`): `impl Envelope` for the
//!    envelope (domain, chain id, signer; a new NUL-terminated domain),
//!    then `plan_*` from an [`Opened`](crate::envelope::Opened) to a plan
//!    that only reads, and `apply` on the plan that only writes;
//! 3. here: a [`UserPlan`] variant and one arm in [`plan`], `describe`
//!    and `apply`; in `abci/src/proposal.rs`, the kind among the user
//!    transactions PrepareProposal keeps;
//! 4. its result codes, if it needs new ones, at the end of
//!    [`Code`] (the numbers are public: README "Result codes");
//! 5. tests of every refusal, and the golden run (`tests/tests/golden.rs`)
//!    if it changes what blocks write.

use prost::Message;
use tally_store::{Kv, KvRead};

use crate::allowance::{plan_allowance, AllowancePlan};
use crate::codes::Code;
use crate::dkg::tx::{plan_validator_tx, ValidatorPlan};
use crate::envelope::{open, VerifiedSignatures};
use crate::error::{reject, ExecError, Rejection};
use crate::genesis::Params;
use crate::proto::{tx, Tx};
use crate::report::{plan_report, Plan};
use crate::types::TxResult;
use crate::user::{plan_user_msg, UserMsgPlan};

/// At most one transaction per block may have a given scope: a validator
/// message's is its sender and kind (dealing, ack, reveal, proposal,
/// approval), an allowance change's its user. `None` for every other
/// transaction, and for bodies that do not decode (refused anyway when
/// they run). PrepareProposal keeps the first of a scope, ProcessProposal
/// refuses a block with two, CheckTx refuses a second while the first
/// waits in the mempool (code 34): one leaked key or one validator cannot
/// fill blocks with these.
pub fn block_scope(t: &Tx) -> Option<Vec<u8>> {
    match t.sum.as_ref()? {
        tx::Sum::Validator(v) => {
            let m = crate::proto::ValidatorMsg::decode(v.body.as_slice()).ok()?;
            use crate::proto::validator_msg::Sum;
            let kind: u8 = match m.sum? {
                Sum::Dealing(_) => 1,
                Sum::Ack(_) => 2,
                Sum::Reveal(_) => 3,
                Sum::Propose(_) => 4,
                Sum::Approve(_) => 5,
                Sum::Key(_) => 6,
            };
            Some([b"validator/".as_slice(), &v.pubkey, &[kind]].concat())
        }
        tx::Sum::Allowance(a) => {
            let c = crate::proto::AllowanceChange::decode(a.body.as_slice()).ok()?;
            Some([b"allowance/".as_slice(), c.user.as_bytes()].concat())
        }
        // A user's messages share its allowance changes' scope: one
        // user-signed transaction per user and block (their sequences are
        // one counter).
        tx::Sum::User(u) => {
            let m = crate::proto::UserMsg::decode(u.body.as_slice()).ok()?;
            Some([b"allowance/".as_slice(), m.user.as_bytes()].concat())
        }
        _ => None,
    }
}

/// A checked user transaction, ready to write.
#[derive(Debug)]
pub enum UserPlan {
    /// A usage report.
    Report(Box<Plan>),
    /// A validator's DKG or governance message.
    Validator(Box<ValidatorPlan>),
    /// An allowance change.
    Allowance(AllowancePlan),
    /// A user's key change or withdrawal.
    User(UserMsgPlan),
}

impl UserPlan {
    /// Writes the transaction's changes and returns the accepted result.
    pub fn apply(self, kv: &mut impl Kv) -> Result<TxResult, ExecError> {
        match self {
            UserPlan::Report(p) => Ok(p.apply(kv)),
            UserPlan::Allowance(p) => Ok(p.apply(kv)),
            UserPlan::Validator(p) => p.apply(kv),
            UserPlan::User(p) => {
                let height = crate::dkg::state::last_height(kv)?;
                p.apply(kv, height)
            }
        }
    }

    /// What CheckTx answers for it.
    pub fn describe(&self) -> String {
        match self {
            UserPlan::Report(p) => format!("report {} passes checks", hex::encode(p.report_id())),
            UserPlan::Allowance(_) => "allowance change passes checks".into(),
            UserPlan::Validator(p) => format!("{} passes checks", p.describe()),
            UserPlan::User(p) => format!("{} passes checks", p.describe()),
        }
    }

    /// The replay scope (gateway key and report id) of a report, and its
    /// expiry.
    pub fn report_scope(&self) -> Option<(&[u8], u64)> {
        match self {
            UserPlan::Report(p) => Some(p.scope()),
            UserPlan::Allowance(_) | UserPlan::Validator(_) | UserPlan::User(_) => None,
        }
    }
}

/// Refuses, by length alone, a transaction over `max_tx_bytes`.
pub fn check_size(bytes: &[u8], params: &Params) -> Result<(), Rejection> {
    if bytes.len() as u64 > params.max_tx_bytes {
        return Err(Rejection::new(
            Code::TxTooLarge,
            format!(
                "transaction is {} bytes, at most {} allowed",
                bytes.len(),
                params.max_tx_bytes
            ),
        ));
    }
    Ok(())
}

/// Plans the user transaction `bytes`, decoded once by the caller into
/// `decoded`, at block time `now` under `params`, with `sigs` the node's
/// verified signatures and validated G1 points. The caller has checked the
/// size ([`check_size`]). Reads only.
pub fn plan(
    kv: &impl KvRead,
    params: &Params,
    now: u64,
    bytes: &[u8],
    decoded: Result<Tx, Rejection>,
    sigs: &dyn VerifiedSignatures,
) -> Result<UserPlan, ExecError> {
    let tx = decoded?;
    if tx.encoded_len() != bytes.len() || tx.encode_to_vec() != bytes {
        return Err(reject(
            Code::NonCanonical,
            "transaction is not in canonical protobuf encoding (fields in order, no unknown or repeated fields)",
        ));
    }
    match tx.sum {
        Some(tx::Sum::Report(r)) => {
            let opened = open(kv, &r, sigs)?;
            plan_report(kv, params, now, opened).map(|p| UserPlan::Report(Box::new(p)))
        }
        Some(tx::Sum::Allowance(a)) => {
            let opened = open(kv, &a, sigs)?;
            plan_allowance(kv, now, opened).map(UserPlan::Allowance)
        }
        Some(tx::Sum::User(u)) => {
            let opened = open(kv, &u, sigs)?;
            plan_user_msg(kv, opened).map(UserPlan::User)
        }
        Some(tx::Sum::Validator(v)) => {
            let opened = crate::dkg::msg::open(kv, &v, sigs)?;
            plan_validator_tx(kv, &opened, sigs).map(|p| UserPlan::Validator(Box::new(p)))
        }
        Some(tx::Sum::SyncStart(_) | tx::Sum::Partials(_)) => Err(reject(
            Code::BadSystemTx,
            "a system transaction is not a user transaction",
        )),
        None => Err(reject(Code::MalformedTx, "transaction has no payload")),
    }
}

//! Governance proposals (ADR 0019, ADR 0020): the proposal actions that
//! change the chain rather than the validator set. They are opened and
//! approved on the validator-proposal path (more than 2/3 of the power,
//! [`crate::dkg::proposal`]), checked when opened and again when accepted,
//! and carried out by the transaction that accepts them: they never wait
//! for a ceremony.
//!
//! | action | payload | carried out by | from app version |
//! |---|---|---|---|
//! | 5 `upgrade`, 6 `cancel_upgrade` | `upgrade` | [`crate::upgrade`] | 1 |
//! | 7 `params` | `params` | [`params`]: scheduled for a future window | 3 |
//! | 8 `gateway` | `gateway` | [`gateway`]: at once | 3 |
//! | 9 `slo` | `slo` | [`crate::slo::policy`]: scheduled for a future window | 4 |

pub mod gateway;
pub mod params;

use tally_store::{Kv, KvRead};

use crate::dkg::types::{ProposalAction, ProposalStatus};
use crate::error::Fatal;
use crate::proto::Proposal;
use crate::state::chain::app_version;
use crate::types::Event;

pub use crate::types::{GROWTH_VERSION, SLO_VERSION};

/// The payloads a proposal carries, as the checks read them.
#[derive(Clone, Copy, Debug)]
pub struct Payload<'a> {
    /// The upgrade plan.
    pub upgrade: Option<&'a crate::proto::UpgradePlan>,
    /// The parameter change.
    pub params: Option<&'a crate::proto::ParamChange>,
    /// The gateway change.
    pub gateway: Option<&'a crate::proto::GatewayChange>,
    /// The objectives' change.
    pub slo: Option<&'a crate::proto::SloChange>,
}

impl<'a> Payload<'a> {
    /// The payloads of stored proposal `p`.
    pub fn of(p: &'a Proposal) -> Self {
        Self {
            upgrade: p.upgrade.as_ref(),
            params: p.params.as_ref(),
            gateway: p.gateway.as_ref(),
            slo: p.slo.as_ref(),
        }
    }

    /// The reason a proposal of `action` may not carry these payloads:
    /// each action carries its own and no other.
    pub fn misfit(&self, action: ProposalAction) -> Option<String> {
        let carried = [
            (
                self.upgrade.is_some(),
                "an upgrade plan",
                action.is_upgrade(),
            ),
            (
                self.params.is_some(),
                "a parameter change",
                action == ProposalAction::Params,
            ),
            (
                self.gateway.is_some(),
                "a gateway change",
                action == ProposalAction::Gateway,
            ),
            (
                self.slo.is_some(),
                "an objectives change",
                action == ProposalAction::Slo,
            ),
        ];
        carried
            .iter()
            .find(|(has, _, own)| *has && !*own)
            .map(|(_, what, _)| format!("a {} carries no {what}", action.name()))
    }
}

/// Whether governance proposal `action` with `payload` can be carried out
/// at `height`; the reason it cannot otherwise.
pub fn check(
    kv: &impl KvRead,
    height: u64,
    action: ProposalAction,
    payload: Payload<'_>,
) -> Result<Result<(), String>, Fatal> {
    if let Some(why) = payload.misfit(action) {
        return Ok(Err(why));
    }
    let version = app_version(kv)?;
    match action {
        ProposalAction::Params | ProposalAction::Gateway if version < GROWTH_VERSION => Ok(Err(
            format!(
                "a {} proposal needs app version {GROWTH_VERSION}; the chain runs version {version}",
                action.name()
            ),
        )),
        ProposalAction::Slo if version < SLO_VERSION => Ok(Err(format!(
            "an slo proposal needs app version {SLO_VERSION}; the chain runs version {version}"
        ))),
        ProposalAction::Params => params::check(kv, payload.params),
        ProposalAction::Slo => crate::slo::policy::check(kv, payload.slo),
        ProposalAction::Gateway => gateway::check(kv, payload.gateway),
        a if a.is_upgrade() => crate::upgrade::check(kv, height, a, payload.upgrade),
        a => Ok(Err(format!("a {} is not a governance action", a.name()))),
    }
}

/// Carries out accepted governance proposal `p` at `height` (nothing for
/// any other proposal, or one still open): `p` is applied, or refused with
/// the reason the check gives now. Returns the event of what it did.
pub fn enact(kv: &mut impl Kv, p: &mut Proposal, height: u64) -> Result<Option<Event>, Fatal> {
    let action =
        ProposalAction::try_from(p.action).map_err(|_| Fatal::Corrupt("proposal action"))?;
    let accepted = ProposalStatus::try_from(p.status) == Ok(ProposalStatus::Accepted);
    if !accepted || !action.is_governance() {
        return Ok(None);
    }
    if let Err(why) = check(kv, height, action, Payload::of(p))? {
        p.status = ProposalStatus::Refused.into();
        p.reason = why;
        return Ok(None);
    }
    p.status = ProposalStatus::Applied.into();
    p.applied_height = height;
    match action {
        ProposalAction::Params => params::schedule(kv, p).map(Some),
        ProposalAction::Slo => crate::slo::policy::schedule(kv, p).map(Some),
        ProposalAction::Gateway => {
            let c = p.gateway.clone().unwrap_or_default();
            gateway::enact(kv, p.id, &c).map(Some)
        }
        _ => crate::upgrade::enact(kv, p),
    }
}

//! The DKG's named numbers: proposal actions and statuses, ceremony kinds
//! and phases. State and the wire keep `u32` fields (the numbers below
//! must never change); the accessors and the code between them use these
//! enums, converted with `TryFrom<u32>` (an unknown number is an
//! [`UnknownValue`]) and shown by `name()` in queries and events. A leaf
//! of [`crate::dkg`].

use crate::error::UnknownValue;
use crate::proto::Ceremony;

/// Defines a `#[repr(u32)]` enum with `ALL`, `value()`, `name()`,
/// `From<Self> for u32` and `TryFrom<u32>`.
macro_rules! stored_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal => $label:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(u32)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The stored number.
            pub fn value(self) -> u32 {
                self as u32
            }

            /// The name queries and events show.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v.value()
            }
        }

        impl TryFrom<u32> for $name {
            type Error = UnknownValue;

            fn try_from(v: u32) -> Result<Self, Self::Error> {
                $name::ALL
                    .iter()
                    .copied()
                    .find(|x| x.value() == v)
                    .ok_or(UnknownValue { what: $what, value: v })
            }
        }
    };
}

stored_enum! {
    /// What a validator-set proposal changes (`Proposal.action`).
    ProposalAction, "proposal action" {
        /// Add a validator.
        Add = 1 => "add",
        /// Remove a validator.
        Remove = 2 => "remove",
        /// A fresh key for the same set, handed to the hub by a rotation
        /// the current key signs (a periodic re-key).
        Rekey = 3 => "rekey",
        /// A fresh key for the same set that activates without the current
        /// key's signature, for the day fewer than `t` of its signers
        /// remain: the hub takes it only from its governors (ADR 0018).
        Recover = 4 => "recover",
        /// Schedule a software upgrade plan (ADR 0019).
        Upgrade = 5 => "upgrade",
        /// Cancel the pending upgrade plan, up to its safety margin.
        CancelUpgrade = 6 => "cancel_upgrade",
        /// Change chain parameters from a future settlement window (ADR
        /// 0020).
        Params = 7 => "params",
        /// Add, rotate, suspend, resume or remove a gateway (ADR 0020).
        Gateway = 8 => "gateway",
        /// Set or remove providers' service-level objectives from a future
        /// settlement window (ADR 0021).
        Slo = 9 => "slo",
    }
}

impl ProposalAction {
    /// Whether the action names a validator (add, remove) rather than the
    /// whole set (rekey, recover) or none (the upgrade actions).
    pub fn has_target(self) -> bool {
        matches!(self, ProposalAction::Add | ProposalAction::Remove)
    }

    /// Whether the action concerns an upgrade plan rather than the
    /// validator set.
    pub fn is_upgrade(self) -> bool {
        matches!(
            self,
            ProposalAction::Upgrade | ProposalAction::CancelUpgrade
        )
    }

    /// Whether the action governs the chain rather than the validator set
    /// (an upgrade, a parameter or gateway change): it is carried out in
    /// the transaction that accepts it and never waits for a ceremony
    /// ([`crate::gov`]).
    pub fn is_governance(self) -> bool {
        self.is_upgrade()
            || matches!(
                self,
                ProposalAction::Params | ProposalAction::Gateway | ProposalAction::Slo
            )
    }
}

stored_enum! {
    /// Where a validator-set proposal is (`Proposal.status`).
    ProposalStatus, "proposal status" {
        /// Collecting approvals.
        Open = 1 => "open",
        /// Approved, waiting for (or in) its re-key and rotation.
        Accepted = 2 => "accepted",
        /// Its new key's rotation was signed (or, with no key, the change
        /// was made at once): the set changes two blocks later.
        Applied = 3 => "applied",
        /// Refused or expired (see its reason).
        Refused = 4 => "refused",
    }
}

impl ProposalStatus {
    /// Whether the proposal is still in the open index (open or accepted).
    pub fn is_pending(self) -> bool {
        matches!(self, ProposalStatus::Open | ProposalStatus::Accepted)
    }
}

stored_enum! {
    /// What a ceremony makes (`Ceremony.kind`).
    CeremonyKind, "ceremony kind" {
        /// The first key (no key yet).
        Fresh = 1 => "fresh",
        /// A new key with a fresh secret for the next validator set, handed
        /// to the hub by a rotation the outgoing key signs. (2 was a
        /// reshare of the same secret, made before issue 26; never again.)
        Rekey = 3 => "rekey",
    }
}

/// Where a ceremony is once a block is committed: what the next block may
/// still carry. Not stored: derived from the ceremony's heights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Players register their keys for this round.
    Keys,
    /// Dealings are taken.
    Dealings,
    /// Acks are taken.
    Acks,
    /// Reveals are taken.
    Reveals,
    /// The next block finalises the ceremony.
    Finalising,
}

impl Phase {
    /// The phase of `c` once block `h` is committed.
    pub fn at(c: &Ceremony, h: u64) -> Phase {
        if h < c.keys_end {
            Phase::Keys
        } else if h < c.deal_end {
            Phase::Dealings
        } else if h < c.ack_end {
            Phase::Acks
        } else if h < c.end {
            Phase::Reveals
        } else {
            Phase::Finalising
        }
    }

    /// The name `/dkg` shows.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Keys => "keys",
            Phase::Dealings => "dealings",
            Phase::Acks => "acks",
            Phase::Reveals => "reveals",
            Phase::Finalising => "finalising",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_numbers_and_names_are_the_documented_ones() {
        // The numbers are in state (ADR 0015); the names in /proposals and
        // /dkg (docs/ARCHITECTURE.md).
        let actions = [
            (1, "add"),
            (2, "remove"),
            (3, "rekey"),
            (4, "recover"),
            (5, "upgrade"),
            (6, "cancel_upgrade"),
            (7, "params"),
            (8, "gateway"),
            (9, "slo"),
        ];
        for (v, name) in actions {
            let a = ProposalAction::try_from(v).unwrap();
            assert_eq!((u32::from(a), a.name()), (v, name));
        }
        let statuses = [(1, "open"), (2, "accepted"), (3, "applied"), (4, "refused")];
        for (v, name) in statuses {
            let s = ProposalStatus::try_from(v).unwrap();
            assert_eq!((u32::from(s), s.name()), (v, name));
        }
        for (v, name) in [(1, "fresh"), (3, "rekey")] {
            let k = CeremonyKind::try_from(v).unwrap();
            assert_eq!((u32::from(k), k.name()), (v, name));
        }
        for v in [0, 10, u32::MAX] {
            assert_eq!(
                ProposalAction::try_from(v),
                Err(UnknownValue {
                    what: "proposal action",
                    value: v
                })
            );
        }
        assert!(ProposalStatus::try_from(0).is_err());
        assert!(ProposalStatus::try_from(5).is_err());
        assert!(CeremonyKind::try_from(0).is_err());
        assert!(
            CeremonyKind::try_from(2).is_err(),
            "reshares are no longer made"
        );
        assert_eq!(ProposalStatus::ALL.len(), 4);
    }

    #[test]
    fn phases_follow_the_ceremony_heights() {
        let c = Ceremony {
            keys_end: 5,
            deal_end: 10,
            ack_end: 20,
            end: 30,
            ..Ceremony::default()
        };
        for (h, p) in [
            (0, "keys"),
            (4, "keys"),
            (5, "dealings"),
            (9, "dealings"),
            (10, "acks"),
            (19, "acks"),
            (20, "reveals"),
            (29, "reveals"),
            (30, "finalising"),
        ] {
            assert_eq!(Phase::at(&c, h).name(), p, "height {h}");
        }
    }
}

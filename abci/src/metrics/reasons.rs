//! The `reason` label of `vote_extensions_rejected_total`: one value per
//! way VerifyVoteExtension refuses an extension ([`BadExtension`]).

use tally_settlement::sync::BadExtension;

/// Why VerifyVoteExtension refused an extension (the `reason` label), one
/// per [`BadExtension`] variant.
pub(super) const EXTENSION_REASONS: [&str; 7] = [
    "too_large",
    "undecodable",
    "too_many_partials",
    "not_a_signer",
    "foreign_index",
    "malformed",
    "state",
];

/// The [`EXTENSION_REASONS`] position of `why`.
pub(super) fn extension_reason(why: &BadExtension) -> usize {
    match why {
        BadExtension::TooLarge { .. } => 0,
        BadExtension::Undecodable => 1,
        BadExtension::TooManyPartials { .. } => 2,
        BadExtension::NotASigner => 3,
        BadExtension::ForeignIndex { .. } => 4,
        BadExtension::Malformed { .. } => 5,
        BadExtension::State(_) => 6,
    }
}

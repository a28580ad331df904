//! The validators' threshold key and validator set, made and changed on
//! chain (ADR 0015).
//!
//! **Key.** A Joint-Feldman DKG with encrypted shares and the ack-or-reveal
//! rule. A ceremony is a fixed window of blocks in four phases of
//! `dkg_phase_blocks` each:
//!
//! 0. *keys*: each player registers a BLS12-381 encryption key made for
//!    this round only, with a proof of possession (ADR 0018); its owner
//!    erases it once the round is over, so no later theft opens a dealing;
//! 1. *dealings*: each dealer posts a commitment to a random polynomial of
//!    degree `t - 1` (t points of G1) and, for each player, its share
//!    encrypted to that player's round key (empty for a player with none,
//!    which gets no share of this key);
//! 2. *acks*: each player decrypts its shares and acks every dealing whose
//!    share matches the commitment;
//! 3. *reveals*: each dealer publishes, in the clear, the share of every
//!    player that did not ack; the chain checks each against the
//!    commitment;
//!
//! then, at the start of block `end`, the chain finalises ([`ceremony`]):
//! the qualified dealings make the group polynomial's commitment, the
//! public share of every player and the key record, and each player
//! derives its secret share from the chain and its round key
//! ([`participant::derive_share`]). A failed round runs again as the next.
//!
//! **Set.** A current validator proposes adding or removing a validator,
//! a re-key of the same set (`rekey`), or a recovery (`recover`: a fresh
//! key that activates without the old key's signature, for the day fewer
//! than `t` of its signers remain; the hub takes it only from its
//! governors, ADR 0018); the proposal is accepted once approvers holding
//! more than 2/3 of the voting power signed approvals ([`proposal`]).
//! Every validator has the same power, and an accepted change is checked again
//! when it runs, with CometBFT's own rules for the update it makes
//! ([`rules`]). It then runs a *re-key* (ADR 0017): the next set deals a
//! key with a fresh secret, so no past committee holds a share of it. The
//! outgoing key signs a rotation naming the new key for the hub
//! ([`rotation`]); the block that combines that signature returns the
//! validator update (CometBFT applies it from `h + 2`) and the new key
//! becomes active at `h + 2` too; stored partials of the old key are
//! dropped then, since partials of different epochs never combine, and a
//! batch the old key signed but the hub has not settled is signed again.
//!
//! ## Files
//!
//! Each file imports only files above it in this table (no cycles):
//!
//! | file | owns |
//! |---|---|
//! | [`keys`] | every state key of the component (listed again in [`crate::keys::LAYOUT`]) |
//! | [`key`] | the key record [`key::KeyEpoch`], the parsed [`key::ThresholdKey`] and the caller-owned [`key::KeyCache`] |
//! | [`types`] | proposal actions and statuses, ceremony kinds and phases as enums |
//! | [`crypto`] | the arithmetic: polynomials, commitments, share encryption, proofs of possession |
//! | [`msg`] | validator messages on the wire: signing and opening |
//! | [`state`] | the typed accessors: the only code that reads or writes DKG state |
//! | [`rules`] | the validator-set rules, checked when a proposal opens and again when it runs (CometBFT's own check of updates included) |
//! | [`genesis`] | the genesis validator set and its encryption keys |
//! | [`rotation`] | key rotations: the outgoing key signs its successor for the hub; activation waits for that signature |
//! | [`ceremony`] | begin-block work: activate a waiting key, finalise or fail a ceremony, expire proposals, start the next ceremony |
//! | [`proposal`] | validator-set proposals: checked, accepted at more than 2/3 of the power |
//! | [`tx`] | validator transactions: planned against state, then applied |
//! | [`participant`] | what an honest validator sends, and how it derives its share |
//! | [`query`] | `/validators`, `/proposals`, `/dkg` |
//!
//! **Every DKG write goes through [`state`]**: no other file (in this
//! component or outside it) puts or deletes a key of [`keys`].

pub mod ceremony;
pub mod crypto;
pub mod genesis;
pub mod key;
pub mod keys;
pub mod msg;
pub mod participant;
pub mod proposal;
pub mod query;
pub mod rotation;
pub mod rules;
pub mod state;
pub mod tx;
pub mod types;

pub use ceremony::begin_block;
pub use genesis::init_validators;
pub use msg::{address_of, sign_validator_msg};
pub use participant::{derive_share, next_messages, Me};
pub use state::validator_updates;

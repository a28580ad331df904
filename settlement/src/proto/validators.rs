// Validator messages and records (ADR 0015): see `mod validators` in
// settlement/src/proto.rs.

/// A current or incoming validator's message, signed with its CometBFT
/// consensus key (ADR 0015).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SignedValidatorMsg {
    /// Encoded [`ValidatorMsg`], exactly the signed bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    /// ed25519 consensus public key (32 bytes).
    #[prost(bytes = "vec", tag = "2")]
    pub pubkey: Vec<u8>,
    /// ed25519 over `"tally/validator/v1" || 0x00 || body`.
    #[prost(bytes = "vec", tag = "3")]
    pub signature: Vec<u8>,
}

/// The body of a [`SignedValidatorMsg`].
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ValidatorMsg {
    /// Must equal the chain's id.
    #[prost(string, tag = "1")]
    pub chain_id: String,
    /// What the message does.
    #[prost(oneof = "validator_msg::Sum", tags = "2, 3, 4, 5, 6, 7")]
    pub sum: Option<validator_msg::Sum>,
}

/// The kinds of [`ValidatorMsg`].
pub mod validator_msg {
    /// The message's payload.
    #[derive(Clone, PartialEq, Eq, prost::Oneof)]
    pub enum Sum {
        /// A dealer's dealing.
        #[prost(message, tag = "2")]
        Dealing(super::Dealing),
        /// A player's ack of one dealing.
        #[prost(message, tag = "3")]
        Ack(super::DkgAck),
        /// A dealer's reveal of shares not acked.
        #[prost(message, tag = "4")]
        Reveal(super::DkgReveal),
        /// A validator-set change proposal.
        #[prost(message, tag = "5")]
        Propose(super::ValidatorProposal),
        /// An approval of a proposal.
        #[prost(message, tag = "6")]
        Approve(super::ProposalApproval),
        /// A player's encryption key for one ceremony round.
        #[prost(message, tag = "7")]
        Key(super::DkgKey),
    }
}

/// A player's encryption key for one ceremony round (ADR 0018): made
/// fresh for the round, erased by its owner once the round is over.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct DkgKey {
    /// The ceremony round.
    #[prost(uint64, tag = "1")]
    pub round: u64,
    /// 48-byte compressed G1 encryption key.
    #[prost(bytes = "vec", tag = "2")]
    pub enc_key: Vec<u8>,
    /// 96-byte proof of possession over the chain, the round and the
    /// player's address.
    #[prost(bytes = "vec", tag = "3")]
    pub pop: Vec<u8>,
}

/// A dealer's commitment and encrypted shares.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Dealing {
    /// The ceremony round.
    #[prost(uint64, tag = "1")]
    pub round: u64,
    /// `threshold` compressed G1 points (48 bytes each).
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub commitment: Vec<Vec<u8>>,
    /// One encrypted share per player, in the ceremony's player order.
    #[prost(message, repeated, tag = "3")]
    pub shares: Vec<EncryptedShare>,
}

/// One share, encrypted to a player's encryption key.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct EncryptedShare {
    /// 48-byte compressed G1 ephemeral key.
    #[prost(bytes = "vec", tag = "1")]
    pub ephemeral: Vec<u8>,
    /// 32-byte ciphertext.
    #[prost(bytes = "vec", tag = "2")]
    pub ciphertext: Vec<u8>,
}

/// A player's ack of dealings whose shares matched.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct DkgAck {
    /// The ceremony round.
    #[prost(uint64, tag = "1")]
    pub round: u64,
    /// 1-based positions of the dealers, ascending, none acked before.
    #[prost(uint32, repeated, tag = "2")]
    pub dealers: Vec<u32>,
}

/// A dealer's public reveal of shares.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct DkgReveal {
    /// The ceremony round.
    #[prost(uint64, tag = "1")]
    pub round: u64,
    /// The shares revealed.
    #[prost(message, repeated, tag = "2")]
    pub shares: Vec<RevealedShare>,
}

/// One revealed share.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RevealedShare {
    /// 1-based position of the player (its new share index).
    #[prost(uint32, tag = "1")]
    pub player: u32,
    /// 32-byte big-endian scalar.
    #[prost(bytes = "vec", tag = "2")]
    pub share: Vec<u8>,
}

/// A proposal to change the validator set.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ValidatorProposal {
    /// 1 add, 2 remove, 3 rekey, 4 recover (ADR 0018), 5 upgrade, 6
    /// cancel upgrade (ADR 0019), 7 params, 8 gateway (ADR 0020), 9 slo
    /// (ADR 0021).
    #[prost(uint32, tag = "1")]
    pub action: u32,
    /// Add, remove: the validator's ed25519 consensus key; rekey,
    /// recover: empty.
    #[prost(bytes = "vec", tag = "2")]
    pub pubkey: Vec<u8>,
    /// Add: the common power of every validator; else 0.
    #[prost(uint64, tag = "3")]
    pub power: u64,
    /// The last height the proposal may open at (at most
    /// `MAX_VALIDITY_BLOCKS` ahead): a signed proposal cannot be replayed
    /// later to fill the open slots.
    #[prost(uint64, tag = "6")]
    pub valid_until_height: u64,
    /// Upgrade: the plan; cancel upgrade: the plan's name only.
    #[prost(message, optional, tag = "7")]
    pub upgrade: Option<UpgradePlan>,
    /// Params: the change (ADR 0020).
    #[prost(message, optional, tag = "8")]
    pub params: Option<ParamChange>,
    /// Gateway: the change (ADR 0020).
    #[prost(message, optional, tag = "9")]
    pub gateway: Option<GatewayChange>,
    /// Slo: the objectives' change (ADR 0021).
    #[prost(message, optional, tag = "10")]
    pub slo: Option<SloChange>,
}

/// A change of service-level objectives (ADR 0021): in force from the
/// first block of settlement window `from_window`, so every window is
/// judged by the policies it opened with.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SloChange {
    /// The first window judged by it: after the current one, at most
    /// 100000 windows ahead.
    #[prost(uint64, tag = "1")]
    pub from_window: u64,
    /// 1 to 256 providers' new policies, each provider once.
    #[prost(message, repeated, tag = "2")]
    pub policies: Vec<SloPolicy>,
}

/// One provider's objectives (or their removal).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SloPolicy {
    /// The provider.
    #[prost(string, tag = "1")]
    pub provider: String,
    /// Fail-rate ceiling, parts per million of the judged calls
    /// (requests - cancel - client); at most 1000000.
    #[prost(uint32, tag = "2")]
    pub max_fail_ppm: u32,
    /// A window with fewer judged calls is not judged; at least 1.
    #[prost(uint64, tag = "3")]
    pub min_requests: u64,
    /// p95 latency ceiling in ms, a bucket bound; 0: none.
    #[prost(uint64, tag = "4")]
    pub p95_latency_ms: u64,
    /// p95 time-to-first-token ceiling in ms, a bucket bound; 0: none.
    #[prost(uint64, tag = "5")]
    pub p95_ttft_ms: u64,
    /// Share of a breached window's charges returned to its users, parts
    /// per million; at most 1000000.
    #[prost(uint32, tag = "6")]
    pub credit_ppm: u32,
    /// Removes the provider's policy (every other field zero).
    #[prost(bool, tag = "7")]
    pub remove: bool,
}

/// A change of chain parameters (ADR 0020): in force from the first block
/// of settlement window `from_window`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ParamChange {
    /// The first window it governs: after the current one, at most
    /// 100000 windows ahead.
    #[prost(uint64, tag = "1")]
    pub from_window: u64,
    /// The new values: 1 to 32, each parameter once.
    #[prost(message, repeated, tag = "2")]
    pub values: Vec<ParamValue>,
}

/// One parameter's new value.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ParamValue {
    /// A field of genesis `params`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its value (decimal for numbers).
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A change to the registered gateways (ADR 0020).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct GatewayChange {
    /// 1 add, 2 rotate, 3 suspend, 4 resume, 5 remove.
    #[prost(uint32, tag = "1")]
    pub op: u32,
    /// The gateway's name (add: a name never used).
    #[prost(string, tag = "2")]
    pub name: String,
    /// Add, rotate: the (new) ed25519 key, never used before; else empty.
    #[prost(bytes = "vec", tag = "3")]
    pub pubkey: Vec<u8>,
}

/// A software upgrade plan (ADR 0019): from block `height` on, the state
/// machine runs the rules of `app_version`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct UpgradePlan {
    /// A short unique name (`[a-z0-9._-]`, 1 to 64 bytes).
    #[prost(string, tag = "1")]
    pub name: String,
    /// The app version it switches to: the current one plus 1.
    #[prost(uint64, tag = "2")]
    pub app_version: u64,
    /// The first block run under the new version.
    #[prost(uint64, tag = "3")]
    pub height: u64,
    /// SHA-256 of the release binary that carries the version (32 bytes).
    #[prost(bytes = "vec", tag = "4")]
    pub binary_sha256: Vec<u8>,
    /// Free text for operators (at most 1024 bytes), e.g. release notes.
    #[prost(string, tag = "5")]
    pub info: String,
}

/// An approval of a proposal.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ProposalApproval {
    /// The proposal's id.
    #[prost(uint64, tag = "1")]
    pub proposal: u64,
}

/// A validator as the chain knows it (state).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ValidatorRecord {
    /// ed25519 consensus key.
    #[prost(bytes = "vec", tag = "1")]
    pub pubkey: Vec<u8>,
    /// Voting power.
    #[prost(uint64, tag = "2")]
    pub power: u64,
}

/// A DKG or resharing ceremony (state).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Ceremony {
    /// Round number, from 1; a failed round retries as the next.
    #[prost(uint64, tag = "1")]
    pub round: u64,
    /// 1 the first key, 3 a re-key of the next set (2, a reshare of the
    /// same secret, is no longer made).
    #[prost(uint32, tag = "2")]
    pub kind: u32,
    /// First height of the ceremony-key phase.
    #[prost(uint64, tag = "3")]
    pub start_height: u64,
    /// Dealings at heights from `keys_end` to below this.
    #[prost(uint64, tag = "4")]
    pub deal_end: u64,
    /// Acks at heights below this.
    #[prost(uint64, tag = "5")]
    pub ack_end: u64,
    /// Reveals below this; finalised at the start of this block.
    #[prost(uint64, tag = "6")]
    pub end: u64,
    /// Who deals.
    #[prost(message, repeated, tag = "7")]
    pub dealers: Vec<CeremonyDealer>,
    /// Who receives shares (the next validator set).
    #[prost(message, repeated, tag = "8")]
    pub players: Vec<CeremonyPlayer>,
    /// Threshold of the key being made.
    #[prost(uint32, tag = "9")]
    pub threshold: u32,
    /// Re-key: the accepted proposal it carries out (0: none).
    #[prost(uint64, tag = "11")]
    pub proposal: u64,
    /// Epoch of the key being made.
    #[prost(uint64, tag = "12")]
    pub epoch: u64,
    /// Set when finalised: the qualified dealers' positions, ascending.
    #[prost(uint32, repeated, tag = "13")]
    pub qualified: Vec<u32>,
    /// 0 for the ceremony's first round, then one more per retry.
    #[prost(uint32, tag = "14")]
    pub attempt: u32,
    /// Ceremony keys at heights from `start_height` to below this.
    #[prost(uint64, tag = "15")]
    pub keys_end: u64,
}

/// A ceremony's dealer.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct CeremonyDealer {
    /// Consensus address.
    #[prost(bytes = "vec", tag = "1")]
    pub address: Vec<u8>,
}

/// A ceremony's player.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct CeremonyPlayer {
    /// Consensus address.
    #[prost(bytes = "vec", tag = "1")]
    pub address: Vec<u8>,
    /// ed25519 consensus key.
    #[prost(bytes = "vec", tag = "2")]
    pub pubkey: Vec<u8>,
    /// Voting power in the next set.
    #[prost(uint64, tag = "3")]
    pub power: u64,
}

/// A validator-set proposal (state).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Proposal {
    /// Id, from 1.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// 1 add, 2 remove, 3 rekey, 4 recover.
    #[prost(uint32, tag = "2")]
    pub action: u32,
    /// The validator's consensus key (add, remove; else empty).
    #[prost(bytes = "vec", tag = "3")]
    pub pubkey: Vec<u8>,
    /// Power (add; else 0).
    #[prost(uint64, tag = "4")]
    pub power: u64,
    /// Proposer's consensus address.
    #[prost(bytes = "vec", tag = "6")]
    pub proposer: Vec<u8>,
    /// Height proposed at.
    #[prost(uint64, tag = "7")]
    pub height: u64,
    /// 1 open, 2 accepted, 3 applied, 4 refused.
    #[prost(uint32, tag = "8")]
    pub status: u32,
    /// Approvers' consensus addresses, in arrival order.
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub approvals: Vec<Vec<u8>>,
    /// Why it was refused.
    #[prost(string, tag = "10")]
    pub reason: String,
    /// Height its reshare finished (applied).
    #[prost(uint64, tag = "11")]
    pub applied_height: u64,
    /// Upgrade, cancel upgrade: the plan (a cancellation: its name).
    #[prost(message, optional, tag = "12")]
    pub upgrade: Option<UpgradePlan>,
    /// Params: the change.
    #[prost(message, optional, tag = "13")]
    pub params: Option<ParamChange>,
    /// Gateway: the change.
    #[prost(message, optional, tag = "14")]
    pub gateway: Option<GatewayChange>,
    /// Slo: the change.
    #[prost(message, optional, tag = "15")]
    pub slo: Option<SloChange>,
}

/// The key a finished re-key ceremony made, until it is active (state).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct NextKey {
    /// The key record, JSON as stored under `dkg`.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// Height it becomes the active key; 0 while the outgoing key has not
    /// signed its rotation yet.
    #[prost(uint64, tag = "2")]
    pub activate_height: u64,
    /// The proposal it applies.
    #[prost(uint64, tag = "3")]
    pub proposal: u64,
    /// The rotation (`rot/<nonce>`) that hands it to the hub.
    #[prost(uint64, tag = "4")]
    pub rotation: u64,
}

/// A key rotation: the outgoing key's signature handing the hub its
/// successor (state, `rot/<nonce>`; kept as the history of keys).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct KeyRotation {
    /// 1, 2, ...: the hub applies rotations in this order.
    #[prost(uint64, tag = "1")]
    pub nonce: u64,
    /// The hub it is for (`hub_chain`).
    #[prost(string, tag = "2")]
    pub hub: String,
    /// The new key's epoch.
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    /// The new compressed group key (48 bytes).
    #[prost(bytes = "vec", tag = "4")]
    pub group_key: Vec<u8>,
    /// The epoch of the key that signs it.
    #[prost(uint64, tag = "5")]
    pub from_epoch: u64,
    /// The outgoing key's group signature over the rotation digest (96
    /// bytes); empty until combined.
    #[prost(bytes = "vec", tag = "6")]
    pub signature: Vec<u8>,
    /// Height the re-key ceremony finished.
    #[prost(uint64, tag = "7")]
    pub made_height: u64,
    /// Height the signature was combined (0 before).
    #[prost(uint64, tag = "8")]
    pub signed_height: u64,
    /// Height the new key became active on this chain (0 before).
    #[prost(uint64, tag = "9")]
    pub active_height: u64,
    /// A recovery (ADR 0018): activated without the outgoing key's
    /// signature (`signature` stays empty); the hub takes it only from its
    /// governors.
    #[prost(bool, tag = "10")]
    pub governed: bool,
}

/// Validator updates for one block (state).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ValidatorUpdates {
    /// The block whose FinalizeBlock returns them.
    #[prost(uint64, tag = "1")]
    pub height: u64,
    /// Updates; power 0 removes.
    #[prost(message, repeated, tag = "2")]
    pub updates: Vec<ValidatorRecord>,
}

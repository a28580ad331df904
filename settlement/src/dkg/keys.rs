//! Keys of the DKG component (ADR 0015): the active threshold key, the
//! validator set, ceremonies and validator-set proposals. Only
//! [`crate::dkg::state`] reads and writes them; [`crate::keys::LAYOUT`]
//! lists them with every other prefix. A leaf: it imports nothing.

/// The concatenation of `parts`.
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// `dkg`: the active threshold key (a [`crate::dkg::key::KeyEpoch`] as
/// JSON): the dealer's genesis key, or the last key a ceremony made.
pub const ACTIVE_KEY: &[u8] = b"dkg";

/// `val/<address>`: a validator (consensus key, power).
pub const VALIDATOR: &[u8] = b"val/";
/// `cer/cur`: the ceremony running now.
pub const CEREMONY: &[u8] = b"cer/cur";
/// `cer/last`: the last ceremony that made a key (its data is kept so a
/// player can derive its share later).
pub const LAST_CEREMONY: &[u8] = b"cer/last";
/// `cer/k/<round><player>`: a player's encryption key for one round
/// (48 bytes, ADR 0018).
pub const CEREMONY_KEY: &[u8] = b"cer/k/";
/// `cer/d/<round><dealer>`: a dealing.
pub const DEALING: &[u8] = b"cer/d/";
/// `cer/a/<round><dealer><player>`: an ack.
pub const ACK: &[u8] = b"cer/a/";
/// `cer/r/<round><dealer><player>`: a revealed share.
pub const REVEAL: &[u8] = b"cer/r/";
/// `cer/round`: the last ceremony round number used.
pub const CEREMONY_ROUND: &[u8] = b"cer/round";
/// `cer/next`: the key a finished re-key made, until it activates.
pub const NEXT_KEY: &[u8] = b"cer/next";
/// `rot/<nonce>`: a key rotation for the hub (the history of keys).
pub const ROTATION: &[u8] = b"rot/";
/// `meta/last_rotation`: the nonce of the last rotation made.
pub const LAST_ROTATION: &[u8] = b"meta/last_rotation";
/// `cer/vupd`: the validator updates of the current block.
pub const VALIDATOR_UPDATES: &[u8] = b"cer/vupd";
/// `prop/<id>`: a validator-set proposal.
pub const PROPOSAL: &[u8] = b"prop/";
/// `propopen/<id>`: open and accepted proposals (an index).
pub const PROPOSAL_OPEN: &[u8] = b"propopen/";
/// `meta/next_proposal`: the id of the next proposal.
pub const NEXT_PROPOSAL: &[u8] = b"meta/next_proposal";

/// `val/<address>`.
pub fn validator(address: &[u8]) -> Vec<u8> {
    cat(&[VALIDATOR, address])
}

/// `cer/k/<round><player>`.
pub fn ceremony_key(round: u64, player: u32) -> Vec<u8> {
    cat(&[CEREMONY_KEY, &round.to_be_bytes(), &player.to_be_bytes()])
}

/// `cer/k/<round>`: every ceremony key of a round.
pub fn ceremony_key_round(round: u64) -> Vec<u8> {
    cat(&[CEREMONY_KEY, &round.to_be_bytes()])
}

/// `cer/d/<round><dealer>`.
pub fn dealing(round: u64, dealer: u32) -> Vec<u8> {
    cat(&[DEALING, &round.to_be_bytes(), &dealer.to_be_bytes()])
}

/// `cer/d/<round>`: every dealing of a round.
pub fn dealing_round(round: u64) -> Vec<u8> {
    cat(&[DEALING, &round.to_be_bytes()])
}

/// `cer/a/<round><dealer><player>`.
pub fn ack(round: u64, dealer: u32, player: u32) -> Vec<u8> {
    cat(&[
        ACK,
        &round.to_be_bytes(),
        &dealer.to_be_bytes(),
        &player.to_be_bytes(),
    ])
}

/// `cer/a/<round>`: every ack of a round.
pub fn ack_round(round: u64) -> Vec<u8> {
    cat(&[ACK, &round.to_be_bytes()])
}

/// `cer/r/<round><dealer><player>`.
pub fn reveal(round: u64, dealer: u32, player: u32) -> Vec<u8> {
    cat(&[
        REVEAL,
        &round.to_be_bytes(),
        &dealer.to_be_bytes(),
        &player.to_be_bytes(),
    ])
}

/// `cer/r/<round>`: every reveal of a round.
pub fn reveal_round(round: u64) -> Vec<u8> {
    cat(&[REVEAL, &round.to_be_bytes()])
}

/// `rot/<nonce>`.
pub fn rotation(nonce: u64) -> Vec<u8> {
    cat(&[ROTATION, &nonce.to_be_bytes()])
}

/// `prop/<id>`.
pub fn proposal(id: u64) -> Vec<u8> {
    cat(&[PROPOSAL, &id.to_be_bytes()])
}

/// `propopen/<id>`.
pub fn proposal_open(id: u64) -> Vec<u8> {
    cat(&[PROPOSAL_OPEN, &id.to_be_bytes()])
}

// The messages users sign besides allowance changes (ADR 0020): a key
// change and a withdrawal, in one signed envelope: see `mod users` in
// settlement/src/proto.rs.

/// A user's message with the signature of its current key.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SignedUserMsg {
    /// Encoded [`UserMsg`], exactly the signed bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    /// ed25519 by the user's current key over `tally/user/v1\0 || body`.
    #[prost(bytes = "vec", tag = "2")]
    pub signature: Vec<u8>,
}

/// What a user signs to change its key or withdraw (ADR 0020).
#[derive(Clone, PartialEq, prost::Message)]
pub struct UserMsg {
    /// The chain it is for.
    #[prost(string, tag = "1")]
    pub chain_id: String,
    /// The user.
    #[prost(string, tag = "2")]
    pub user: String,
    /// Above the user's last sequence (shared with allowance changes).
    #[prost(uint64, tag = "3")]
    pub sequence: u64,
    /// What it does.
    #[prost(oneof = "user_msg::Sum", tags = "4, 5")]
    pub sum: Option<user_msg::Sum>,
}

/// The kinds of [`UserMsg`].
pub mod user_msg {
    /// The action.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Sum {
        /// Replace the user's key.
        #[prost(message, tag = "4")]
        Key(super::UserKeyChange),
        /// Take unspent credits back to the hub.
        #[prost(message, tag = "5")]
        Withdraw(super::Withdrawal),
    }
}

/// A user's new key.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct UserKeyChange {
    /// The new ed25519 key (32 bytes).
    #[prost(bytes = "vec", tag = "1")]
    pub pubkey: Vec<u8>,
}

/// A withdrawal of unspent credits.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Withdrawal {
    /// Credits, at most the user's balance.
    #[prost(uint64, tag = "1")]
    pub amount: u64,
}

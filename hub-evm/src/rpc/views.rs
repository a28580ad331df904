//! The hub contract's views as typed reads ([`EthRpc::view`] of the
//! interface's functions), each at a chosen block.

use alloy_primitives::{Address, U256};

use super::{At, EthError, EthRpc};
use crate::abi::ITallyHub as H;

impl EthRpc {
    /// `lastNonce()`: the last settled batch nonce (0: none yet).
    pub fn last_nonce(&self, hub: Address, at: At) -> Result<u64, EthError> {
        self.view(hub, &H::lastNonceCall {}, at)
    }

    /// `settledAt(nonce)`: the block batch `nonce` settled in (0: not
    /// settled).
    pub fn settled_at(&self, hub: Address, nonce: u64, at: At) -> Result<u64, EthError> {
        self.view(hub, &H::settledAtCall { nonce }, at)
    }

    /// `lastRotation()`: the last applied rotation nonce.
    pub fn last_rotation(&self, hub: Address, at: At) -> Result<u64, EthError> {
        self.view(hub, &H::lastRotationCall {}, at)
    }

    /// `depositCount()`: deposits made up to and including `at` (the
    /// last one's `seq`).
    pub fn deposit_count(&self, hub: Address, at: At) -> Result<u64, EthError> {
        self.view(hub, &H::depositCountCall {}, at)
    }

    /// `escrow(user)`: credits `user` holds.
    pub fn escrow(&self, hub: Address, user: &str, at: At) -> Result<u64, EthError> {
        self.view(hub, &H::escrowCall { user: user.into() }, at)
    }

    /// `payout(provider)`: credits batches paid to `provider`.
    pub fn payout(&self, hub: Address, provider: &str, at: At) -> Result<u64, EthError> {
        self.view(
            hub,
            &H::payoutCall {
                provider: provider.into(),
            },
            at,
        )
    }

    /// `withdrawn(user)`: credits withdrawals returned to `user`.
    pub fn withdrawn(&self, hub: Address, user: &str, at: At) -> Result<u64, EthError> {
        self.view(hub, &H::withdrawnCall { user: user.into() }, at)
    }

    /// `withdrawable(account)`: wei `account` can take with `withdraw()`.
    pub fn withdrawable(&self, hub: Address, account: Address, at: At) -> Result<U256, EthError> {
        self.view(hub, &H::withdrawableCall { account }, at)
    }

    /// `groupKey()`: the current group key, 48 bytes compressed.
    pub fn group_key(&self, hub: Address, at: At) -> Result<Vec<u8>, EthError> {
        Ok(self.view(hub, &H::groupKeyCall {}, at)?.to_vec())
    }

    /// `hubName()`: `evm:<chain id>:0x<address>`, the name the digests use.
    pub fn hub_name(&self, hub: Address, at: At) -> Result<String, EthError> {
        self.view(hub, &H::hubNameCall {}, at)
    }

    /// `tallyChainId()`: the Tally chain id the signed messages name.
    pub fn tally_chain_id(&self, hub: Address, at: At) -> Result<String, EthError> {
        self.view(hub, &H::tallyChainIdCall {}, at)
    }

    /// `weiPerCredit()`.
    pub fn wei_per_credit(&self, hub: Address, at: At) -> Result<U256, EthError> {
        self.view(hub, &H::weiPerCreditCall {}, at)
    }

    /// `registrationFee()`: credits a key-binding deposit pays.
    pub fn registration_fee(&self, hub: Address, at: At) -> Result<u64, EthError> {
        self.view(hub, &H::registrationFeeCall {}, at)
    }

    /// `userKey(user)`: the key bound to `user` (empty if none).
    pub fn user_key(&self, hub: Address, user: &str, at: At) -> Result<Vec<u8>, EthError> {
        Ok(self
            .view(hub, &H::userKeyCall { user: user.into() }, at)?
            .to_vec())
    }
}

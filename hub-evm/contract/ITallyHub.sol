// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// One hub call of a Tally batch (docs/signing.md, section 3.1).
struct Call {
    /// Chain-unique call id; a batch lists them ascending.
    uint64 id;
    /// Who pays (a Tally identifier, 1 to 64 bytes of [A-Za-z0-9._:/-]).
    string user;
    /// Who is paid; empty for a withdrawal.
    string provider;
    /// Credits.
    uint64 amount;
    /// The settlement window the payment comes from.
    uint64 window;
    /// 0 pays `provider`, 1 returns `amount` to `user` (a withdrawal).
    uint32 kind;
}

/// The interface of Tally's EVM hub: what the relay, the operator tool
/// (`tally-evm`) and the tests call. The contract is `TallyHub.sol`; the
/// Rust bindings (`tally_hub_evm::abi`) are generated from this file.
///
/// Points are passed uncompressed in EIP-2537's layout (each Fp
/// left-padded to 64 bytes, an Fp2 element c0 first): a G1 point is 128
/// bytes, a G2 point 256. Compressed keys (48 bytes, the ZCash form Tally
/// signs) are what the digests cover.
interface ITallyHub {
    /// `nonce` is at or below the last settled nonce `last`: nothing is
    /// paid twice.
    error AlreadySettled(uint64 nonce, uint64 last);
    /// `nonce` is not the next one (`expected`).
    error NonceGap(uint64 nonce, uint64 expected);
    /// The group signature does not verify against the key the hub holds.
    error BadSignature();
    /// Too little gas left to run the signature check (`needed` before the
    /// pairing, `left` at that point): never a bad signature.
    error LowGas(uint256 needed, uint256 left);
    /// `user`'s escrow cannot cover its total `owed` in the batch:
    /// nothing of the batch is paid.
    error InsufficientEscrow(string user, uint64 owed, uint64 escrow);
    /// Calls empty, too many, not ascending, a bad identifier, a kind
    /// that is neither 0 nor 1 or does not fit its provider, or an amount
    /// of zero (`callId` is 0 when the batch as a whole is at fault).
    error BadBatch(uint64 callId, string reason);
    /// A deposit this hub refuses (the chain could not credit it).
    error BadDeposit(string reason);
    /// A group key that is not a valid point, or whose uncompressed form
    /// does not match its compressed form.
    error BadKey();
    /// Rotation `nonce` is at or below the last applied one.
    error RotationApplied(uint64 nonce, uint64 last);
    /// Rotation `nonce` is not the next one (`expected`).
    error RotationGap(uint64 nonce, uint64 expected);
    /// The caller is not one of the hub's governors.
    error NotGovernor(address caller);
    /// Nothing to withdraw for the caller.
    error NothingToWithdraw();
    /// Sending native currency to the caller failed.
    error TransferFailed();

    /// Deposit number `seq` (1, 2, ...; also the running count) credited
    /// `amount` credits to `user`; `pubkey` is the 32-byte ed25519 key it
    /// bound to `user` (empty if none), `fee` the credits kept for that.
    event Deposited(uint64 indexed seq, string user, uint64 amount, bytes pubkey, uint64 fee, address from);
    /// Batch `nonce` settled: `calls` calls, `paid` credits to providers,
    /// `withdrawn` credits back to users.
    event BatchSettled(uint64 indexed nonce, uint64 calls, uint64 paid, uint64 withdrawn);
    /// Rotation `nonce` made `groupKey` (compressed) the hub's key.
    event KeyRotated(uint64 indexed nonce, uint64 epoch, bytes groupKey, bool governed);
    /// A governor approved governed rotation `nonce` (`approvals` so far).
    event GovernorApproved(uint64 indexed nonce, address governor, uint256 approvals);
    /// `amountWei` left the contract to `to` (a user's withdrawal).
    event Withdrawn(address indexed to, uint256 amountWei);

    /// Pays batch `nonce` (the last settled + 1) in full or not at all.
    /// `signature` is the group signature (uncompressed G2, 256 bytes)
    /// over the batch's message (kind 1).
    function submitBatch(uint64 nonce, Call[] calldata calls, bytes calldata signature) external;

    /// Applies key rotation `nonce` (the last applied + 1): the current
    /// key's signature (kind 4) over the rotation digest of `groupKey`
    /// (48 bytes compressed); `groupKeyPoint` is the same key uncompressed
    /// (128 bytes).
    function rotateKey(
        uint64 nonce,
        uint64 epoch,
        bytes calldata groupKey,
        bytes calldata groupKeyPoint,
        bytes calldata signature
    ) external;

    /// A governor's approval of governed rotation `nonce` (a recovery, ADR
    /// 0018); the key is taken once `governorThreshold` distinct governors
    /// approved the same (nonce, epoch, key).
    function governKey(uint64 nonce, uint64 epoch, bytes calldata groupKey, bytes calldata groupKeyPoint)
        external;

    /// Escrows `msg.value / weiPerCredit` credits for `user` (`msg.value`
    /// a positive multiple of `weiPerCredit`). A 32-byte ed25519 `pubkey`
    /// binds it to `user` if this deposit first funds the user (it pays
    /// the registration fee); the sender's address becomes where the
    /// user's withdrawals go, on the deposit that first funds the user.
    function deposit(string calldata user, bytes calldata pubkey) external payable;

    /// Sends the caller everything withdrawals credited to its address.
    function withdraw() external;

    /// `evm:<chain id>:0x<contract address, lowercase hex>`: the hub name
    /// every digest names (Tally's `hub_chain` parameter must equal it).
    function hubName() external view returns (string memory);
    /// The Tally chain id the signed messages name.
    function tallyChainId() external view returns (string memory);
    function weiPerCredit() external view returns (uint256);
    function registrationFee() external view returns (uint64);
    /// The current group key, compressed (48 bytes).
    function groupKey() external view returns (bytes memory);
    function lastNonce() external view returns (uint64);
    /// The block at which `nonce` settled (0: not settled).
    function settledAt(uint64 nonce) external view returns (uint64);
    function lastRotation() external view returns (uint64);
    /// Deposits made so far (the last deposit's `seq`).
    function depositCount() external view returns (uint64);
    function escrow(string calldata user) external view returns (uint64);
    function payout(string calldata provider) external view returns (uint64);
    function withdrawn(string calldata user) external view returns (uint64);
    function userKey(string calldata user) external view returns (bytes memory);
    function userAddress(string calldata user) external view returns (address);
    function withdrawable(address account) external view returns (uint256);
    function fees() external view returns (uint64);
    function governorThreshold() external view returns (uint256);
    function isGovernor(address account) external view returns (bool);
}

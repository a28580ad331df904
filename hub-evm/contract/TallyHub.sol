// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ITallyHub, Call} from "./ITallyHub.sol";

/// Tally's hub on an Ethereum-compatible chain: the EVM twin of the
/// reference hub (`hub/src/machine.rs`, `hub/src/deposit.rs`,
/// `hub/src/keys.rs`).
///
/// Users deposit native currency as credits into escrow; Tally's batches,
/// signed by its validators' BLS group key, pay providers (kind 0) or
/// return credits to users (kind 1, a withdrawal) out of that escrow, once
/// per nonce, in full or not at all. The group key follows Tally's key
/// rotations (signed by the key held) or, after a recovery, the hub's
/// governors.
///
/// Every signature is checked here, by the EIP-2537 precompiles, exactly
/// as docs/signing.md describes: the message is
/// `"tally/v1" || u8(len(chain id)) || chain id || u8(kind) || digest`,
/// hashed to G2 by RFC 9380 (expand_message_xmd with SHA-256 and Tally's
/// DST, then MAP_FP2_TO_G2 twice and G2ADD), and the pairing check
/// `e(pk, H(m)) * e(-g1, sig) == 1` decides.
contract TallyHub is ITallyHub {
    // ------------------------------------------------------------------
    // Limits and tags
    // ------------------------------------------------------------------

    /// Most calls a batch may carry (Tally's `max_batch_calls` is 1..=1000).
    uint256 private constant MAX_CALLS = 1000;
    /// Longest identifier (Tally's MAX_PARTY_LEN).
    uint256 private constant MAX_IDENT = 64;
    /// Longest Tally chain id (CometBFT's limit).
    uint256 private constant MAX_CHAIN_ID = 50;
    /// Most governors a hub may list (as the reference hub).
    uint256 private constant MAX_GOVERNORS = 32;

    bytes16 private constant HEX_DIGITS = "0123456789abcdef";

    uint8 private constant KIND_BATCH = 1;
    uint8 private constant KIND_ROTATION = 4;

    bytes32 private constant TAG_BATCH_V1 = "tally/batch/v1"; // 14 bytes
    bytes32 private constant TAG_BATCH_V2 = "tally/batch/v2"; // 14 bytes
    bytes32 private constant TAG_ROTATION = "tally/key-rotation/v1"; // 21 bytes

    /// DST' of RFC 9380's expand_message_xmd: Tally's 52-byte DST
    /// `BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_TALLY_V1_` followed by
    /// its length byte (0x34), 53 bytes in two words.
    bytes32 private constant DST_PRIME_0 = 0x424c535f5349475f424c53313233383147325f584d443a5348412d3235365f53;
    bytes32 private constant DST_PRIME_1 = 0x5357555f524f5f504f505f54414c4c595f56315f340000000000000000000000;

    // ------------------------------------------------------------------
    // BLS12-381 constants (EIP-2537 layout: an Fp is 64 bytes, its top 16
    // zero; `_HI` is the word holding the top 16 bytes of the 48-byte
    // value, `_LO` the word holding the low 32)
    // ------------------------------------------------------------------

    /// The base field prime p.
    uint256 private constant P_HI = 0x1a0111ea397fe69a4b1ba7b6434bacd7;
    uint256 private constant P_LO = 0x64774b84f38512bf6730d2a0f6b0f6241eabfffeb153ffffb9feffffffffaaab;
    /// (p - 1) / 2: a compressed point's sign flag says y is above it.
    uint256 private constant HALF_P_HI = 0x0d0088f51cbff34d258dd3db21a5d66b;
    uint256 private constant HALF_P_LO = 0xb23ba5c279c2895fb39869507b587b120f55ffff58a9ffffdcff7fffffffd555;
    /// -g1: the G1 generator with y replaced by p - y.
    uint256 private constant NEG_G1_X_HI = 0x17f1d3a73197d7942695638c4fa9ac0f;
    uint256 private constant NEG_G1_X_LO = 0xc3688c4f9774b905a14e3a3f171bac586c55e83ff97a1aeffb3af00adb22c6bb;
    uint256 private constant NEG_G1_Y_HI = 0x114d1d6855d545a8aa7d76c8cf2e21f2;
    uint256 private constant NEG_G1_Y_LO = 0x67816aef1db507c96655b9d5caac42364e6f38ba0ecb751bad54dcd6b939c2ca;

    // ------------------------------------------------------------------
    // ed25519 (curve25519) constants for checking deposit keys
    // ------------------------------------------------------------------

    /// 2^255 - 19.
    uint256 private constant ED_P = 0x7fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffed;
    /// (ED_P - 1) / 2: Euler's criterion exponent.
    uint256 private constant ED_HALF = 0x3ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff6;
    /// The twisted Edwards curve's d = -121665 / 121666.
    uint256 private constant ED_D = 0x52036cee2b6ffe738cc740797779e89800700a4d4141d8ab75eb4dca135978a3;

    // ------------------------------------------------------------------
    // Gas (EIP-2537 prices; MODEXP at its Osaka price, the higher one)
    // ------------------------------------------------------------------

    /// PAIRING_CHECK of two pairs: 32,600 * 2 + 37,700. The pairing is the
    /// one precompile of the check whose input a submitter chooses (the
    /// signature), so it gets exactly its price: a malformed signature
    /// burns no more than a valid one costs.
    uint256 private constant PAIRING_GAS = 102_900;
    /// What the pairing call needs left before it: its price with the
    /// 63/64 rule's margin, and the call's own cost.
    uint256 private constant PAIRING_MIN_LEFT = 106_700;
    /// G1MSM of one point (12,000): the key check's subgroup test.
    uint256 private constant G1MSM_GAS = 12_000;
    /// Gas a key check needs left before it starts.
    uint256 private constant KEY_CHECK_GAS = 16_000;
    /// Gas a signature check needs left before it starts: the key's four
    /// storage reads, 9 SHA-256 and 4 MODEXP calls, 2 MAP_FP2_TO_G2
    /// (23,800 each), a G2ADD (600) and the pairing, with margin.
    uint256 private constant VERIFY_GAS = 180_000;
    /// The most one call of a batch takes: its checks, its digest bytes,
    /// the escrow write and, for a withdrawal, two new slots (what the user
    /// was returned and what its address may withdraw).
    uint256 private constant CALL_GAS = 60_000;
    /// What follows the signature check: settledAt, lastNonce, the event.
    uint256 private constant SETTLE_GAS = 40_000;

    // ------------------------------------------------------------------
    // Configuration (fixed at deployment)
    // ------------------------------------------------------------------

    uint256 private immutable _weiPerCredit;
    uint64 private immutable _registrationFee;
    uint256 private immutable _governorThreshold;

    /// `"tally/v1" || u8(len(chain id)) || chain id`, the start of every
    /// signed message (at most 59 bytes, in two words, zero past the end).
    bytes32 private immutable _msgPrefix0;
    bytes32 private immutable _msgPrefix1;
    uint256 private immutable _msgPrefixLen;

    /// `put_str(hubName)` as every digest writes it (at most 65 bytes, in
    /// three words, zero past the end).
    bytes32 private immutable _hubStr0;
    bytes32 private immutable _hubStr1;
    bytes32 private immutable _hubStr2;
    uint256 private immutable _hubStrLen;

    string private _tallyChainId;
    string private _hubName;

    // ------------------------------------------------------------------
    // State
    // ------------------------------------------------------------------

    /// What the hub knows of a user (one storage slot).
    struct User {
        /// Credits in escrow.
        uint64 escrow;
        /// Whether a deposit bound an ed25519 key (`_userKey`) to the user.
        bool hasKey;
        /// Where the user's withdrawals go: the sender of the deposit that
        /// first funded the user.
        address addr;
    }

    /// The group key held now: compressed (48 bytes) and its EIP-2537 G1
    /// form (x and y, 64 bytes each).
    bytes private _groupKey;
    bytes32[4] private _groupKeyPoint;

    uint64 private _lastNonce;
    uint64 private _lastRotation;
    uint64 private _depositCount;
    uint64 private _fees;

    mapping(uint64 => uint64) private _settledAt;
    mapping(string => User) private _users;
    mapping(string => uint64) private _payout;
    mapping(string => uint64) private _withdrawn;
    mapping(string => bytes32) private _userKey;
    mapping(address => uint256) private _withdrawable;
    mapping(address => bool) private _isGovernor;
    /// Governed rotations: approvals of (nonce, epoch, keccak(key)).
    mapping(bytes32 => uint256) private _approvals;
    mapping(bytes32 => mapping(address => bool)) private _approved;

    // ------------------------------------------------------------------
    // Deployment
    // ------------------------------------------------------------------

    /// `tallyChainId_`: the Tally chain's CometBFT chain id (1 to 50
    /// bytes). `groupKey_` (48 bytes compressed) and `groupKeyPoint_` (128
    /// bytes, EIP-2537 G1) are the same key, the one the chain holds at its
    /// rotation nonce `lastRotation_`. `weiPerCredit_` > 0. Governors:
    /// distinct non-zero addresses, at most 32, and a threshold that is a
    /// majority of them (0 exactly when there are none).
    constructor(
        string memory tallyChainId_,
        bytes memory groupKey_,
        bytes memory groupKeyPoint_,
        uint64 lastRotation_,
        uint256 weiPerCredit_,
        uint64 registrationFee_,
        address[] memory governors_,
        uint256 governorThreshold_
    ) {
        uint256 cl = bytes(tallyChainId_).length;
        require(cl >= 1 && cl <= MAX_CHAIN_ID, "TallyHub: the Tally chain id must be 1 to 50 bytes");
        require(weiPerCredit_ > 0, "TallyHub: weiPerCredit must be above 0");
        _checkKey(groupKey_, groupKeyPoint_);

        uint256 g = governors_.length;
        require(g <= MAX_GOVERNORS, "TallyHub: at most 32 governors");
        for (uint256 i = 0; i < g; ++i) {
            address a = governors_[i];
            require(a != address(0), "TallyHub: a governor is the zero address");
            require(!_isGovernor[a], "TallyHub: a governor is listed twice");
            _isGovernor[a] = true;
        }
        require(
            g == 0 ? governorThreshold_ == 0 : (governorThreshold_ <= g && 2 * governorThreshold_ > g),
            "TallyHub: governorThreshold must be a majority of the governors (0 without governors)"
        );

        string memory name = string.concat("evm:", _decimal(block.chainid), ":0x", _lowerHex(address(this)));
        require(bytes(name).length <= MAX_IDENT, "TallyHub: the hub name is longer than 64 bytes");

        bytes memory prefix = abi.encodePacked("tally/v1", uint8(cl), tallyChainId_);
        bytes memory hubStr = abi.encodePacked(uint8(bytes(name).length), name);
        _msgPrefix0 = _word(prefix, 0);
        _msgPrefix1 = _word(prefix, 1);
        _msgPrefixLen = prefix.length;
        _hubStr0 = _word(hubStr, 0);
        _hubStr1 = _word(hubStr, 1);
        _hubStr2 = _word(hubStr, 2);
        _hubStrLen = hubStr.length;

        _tallyChainId = tallyChainId_;
        _hubName = name;
        _weiPerCredit = weiPerCredit_;
        _registrationFee = registrationFee_;
        _governorThreshold = governorThreshold_;
        _storeKey(groupKey_, groupKeyPoint_);
        _lastRotation = lastRotation_;
    }

    // ------------------------------------------------------------------
    // Batches
    // ------------------------------------------------------------------

    /// @inheritdoc ITallyHub
    function submitBatch(uint64 nonce, Call[] calldata calls, bytes calldata signature) external {
        uint64 last = _lastNonce;
        if (nonce <= last) revert AlreadySettled(nonce, last);
        if (nonce != last + 1) revert NonceGap(nonce, last + 1);
        uint256 n = calls.length;
        if (n == 0) revert BadBatch(0, "a batch needs at least one call");
        if (n > MAX_CALLS) revert BadBatch(0, "a batch has at most 1000 calls");

        // One pass checks the calls, writes the digest's input and pays;
        // an escrow that falls short is reported after the signature
        // check (the transaction reverts either way).
        (bytes32 digest, uint256 sums, uint256 short) = _scan(nonce, calls, true);
        _verify(KIND_BATCH, digest, signature);
        if (short != 0) _overdraft(calls, (short >> 64) - 1, uint64(short));

        _settledAt[nonce] = uint64(block.number);
        _lastNonce = nonce;
        emit BatchSettled(nonce, uint64(n), _cap64(uint128(sums)), _cap64(sums >> 128));
    }

    /// One pass over `calls`: checks each (see BadBatch), builds the batch
    /// digest (docs/signing.md 3.1; version 2 exactly when a call is not a
    /// payment) and, if `pay`, pays each call from its user's escrow until
    /// one falls short. `sums`: credits paid to providers (low 128 bits)
    /// and returned to users (high 128 bits). `short`: 0, or the first call
    /// its user's escrow could not cover, as (index + 1) << 64 | escrow
    /// left.
    function _scan(uint64 nonce, Call[] calldata calls, bool pay)
        internal
        returns (bytes32 digest, uint256 sums, uint256 short)
    {
        uint256 n = calls.length;
        // The digest's input is written from the free memory pointer on,
        // and nothing allocates memory until it is hashed (a revert does,
        // but then the buffer no longer matters); temporary memory goes
        // past its end.
        bool v2 = _anyWithdrawal(calls);
        (uint256 start, uint256 p) = _batchHeader(v2, nonce, n);
        uint64 prev = 0;
        for (uint256 i = 0; i < n; ++i) {
            // Gas for one more call, the digest, the signature check and
            // what follows it: so a gas limit too small for a batch fails
            // as LowGas, not as a plain out-of-gas, up to the signature
            // check.
            uint256 need;
            assembly ("memory-safe") {
                need := add(add(add(CALL_GAS, VERIFY_GAS), add(SETTLE_GAS, 200)), mul(12, shr(5, sub(p, start))))
            }
            if (gasleft() < need) revert LowGas(need, gasleft());
            Call calldata c = calls[i];
            uint64 id;
            (p, id) = _writeCall(p, c, v2);
            if (i > 0 && id <= prev) revert BadBatch(id, "call ids must be strictly ascending");
            prev = id;
            if (pay && short == 0) {
                uint256 r = _payCall(c, p + 32);
                if (r >> 255 != 0) short = ((i + 1) << 64) | uint64(r);
                else sums += r;
            }
        }
        bool ok;
        assembly ("memory-safe") {
            ok := staticcall(gas(), 0x02, start, sub(p, start), 0x00, 0x20)
            ok := and(ok, eq(returndatasize(), 0x20))
            digest := mload(0x00)
        }
        // SHA-256 only fails by running out of gas.
        if (!ok) revert LowGas(VERIFY_GAS, gasleft());
    }

    /// Whether a call is not a payment (kind != 0), read straight from the
    /// calldata (each call's kind is the sixth word of its tuple; the
    /// checked read in _writeCall refuses a malformed encoding).
    function _anyWithdrawal(Call[] calldata calls) private pure returns (bool any) {
        assembly ("memory-safe") {
            let base := calls.offset
            for { let i := 0 } lt(i, calls.length) { i := add(i, 1) } {
                if calldataload(add(add(base, calldataload(add(base, shl(5, i)))), 160)) {
                    any := 1
                    break
                }
            }
        }
    }

    /// Takes call `c`'s amount from its user's escrow and pays it (kind 0
    /// to the provider, kind 1 back to the user); `scratch` is free memory.
    /// Returns the amount (kind 0) or the amount << 128 (kind 1), or, if
    /// the escrow cannot cover it, 1 << 255 | the escrow (nothing taken).
    function _payCall(Call calldata c, uint256 scratch) private returns (uint256) {
        uint64 amount = c.amount;
        uint256 slot = _nameSlot(c.user, _usersSlot(), scratch);
        User storage u;
        assembly ("memory-safe") {
            u.slot := slot
        }
        uint64 have = u.escrow;
        if (have < amount) return (1 << 255) | have;
        unchecked {
            u.escrow = have - amount;
        }
        if (c.kind == 0) {
            _addCapped(_nameSlot(c.provider, _payoutSlot(), scratch), amount);
            return amount;
        }
        _addCapped(_nameSlot(c.user, _withdrawnSlot(), scratch), amount);
        _withdrawable[u.addr] += uint256(amount) * _weiPerCredit;
        return uint256(amount) << 128;
    }

    /// `put_str(hubName)` in three words (zero past its end) and its
    /// length: what every digest names as the hub.
    function _hubStr() internal view virtual returns (bytes32, bytes32, bytes32, uint256) {
        return (_hubStr0, _hubStr1, _hubStr2, _hubStrLen);
    }

    /// Writes the batch digest's header (tag, hub, nonce, number of calls)
    /// at the free memory pointer: its start and end.
    function _batchHeader(bool v2, uint64 nonce, uint256 n) private view returns (uint256 start, uint256 p) {
        bytes32 tag = v2 ? TAG_BATCH_V2 : TAG_BATCH_V1;
        (bytes32 h0, bytes32 h1, bytes32 h2, uint256 hl) = _hubStr();
        assembly ("memory-safe") {
            start := mload(0x40)
            mstore(start, tag)
            p := add(start, 14)
            mstore(p, h0)
            mstore(add(p, 32), h1)
            mstore(add(p, 64), h2)
            p := add(p, hl)
            mstore(p, or(shl(192, nonce), shl(128, n)))
            p := add(p, 16)
        }
    }

    /// Checks call `c` (but for its id's order) and writes its part of the
    /// batch digest at `p` (the kind too in version 2): the end, and its id.
    function _writeCall(uint256 p, Call calldata c, bool v2) private pure returns (uint256, uint64 id) {
        id = c.id;
        string calldata user = c.user;
        string calldata provider = c.provider;
        uint32 kind = c.kind;
        if (!_isIdent(user)) revert BadBatch(id, "user is not an identifier of 1 to 64 bytes [A-Za-z0-9._:/-]");
        if (kind == 0) {
            if (!_isIdent(provider)) {
                revert BadBatch(id, "provider is not an identifier of 1 to 64 bytes [A-Za-z0-9._:/-]");
            }
        } else if (kind == 1) {
            if (bytes(provider).length != 0) revert BadBatch(id, "a withdrawal (kind 1) has no provider");
        } else {
            revert BadBatch(id, "kind must be 0 (payment) or 1 (withdrawal)");
        }
        uint256 tail = (uint256(c.amount) << 192) | (uint256(c.window) << 128);
        if (c.amount == 0) revert BadBatch(id, "amount must be above 0");
        assembly ("memory-safe") {
            mstore(p, shl(192, id))
            p := add(p, 8)
            mstore8(p, user.length)
            calldatacopy(add(p, 1), user.offset, user.length)
            p := add(p, add(1, user.length))
            mstore8(p, provider.length)
            calldatacopy(add(p, 1), provider.offset, provider.length)
            p := add(p, add(1, provider.length))
            mstore(p, tail)
            p := add(p, 16)
            if v2 {
                mstore(p, shl(224, kind))
                p := add(p, 4)
            }
        }
        return (p, id);
    }

    /// Call `i` takes more than what is left of its user's escrow (`left`):
    /// reverts with the user's total in the batch and the escrow it had.
    function _overdraft(Call[] calldata calls, uint256 i, uint64 left) private pure {
        string calldata user = calls[i].user;
        bytes32 h = keccak256(bytes(user));
        uint256 before = left;
        uint256 owed = 0;
        for (uint256 j = 0; j < calls.length; ++j) {
            if (keccak256(bytes(calls[j].user)) != h) continue;
            owed += calls[j].amount;
            if (j < i) before += calls[j].amount;
        }
        revert InsufficientEscrow(user, _cap64(owed), _cap64(before));
    }

    // ------------------------------------------------------------------
    // Key rotations
    // ------------------------------------------------------------------

    /// @inheritdoc ITallyHub
    function rotateKey(
        uint64 nonce,
        uint64 epoch,
        bytes calldata groupKey_,
        bytes calldata groupKeyPoint_,
        bytes calldata signature
    ) external {
        _checkRotationNonce(nonce);
        bytes memory key = groupKey_;
        bytes memory point = groupKeyPoint_;
        _checkKey(key, point);
        _verify(KIND_ROTATION, _rotationDigest(nonce, epoch, key), signature);
        _applyKey(nonce, epoch, key, point, false);
    }

    /// @inheritdoc ITallyHub
    function governKey(uint64 nonce, uint64 epoch, bytes calldata groupKey_, bytes calldata groupKeyPoint_)
        external
    {
        if (!_isGovernor[msg.sender]) revert NotGovernor(msg.sender);
        _checkRotationNonce(nonce);
        bytes memory key = groupKey_;
        bytes memory point = groupKeyPoint_;
        _checkKey(key, point);
        bytes32 id = keccak256(abi.encode(nonce, epoch, keccak256(key)));
        // A governor's approval counts once; a repeat changes nothing.
        if (_approved[id][msg.sender]) return;
        _approved[id][msg.sender] = true;
        uint256 count = _approvals[id] + 1;
        _approvals[id] = count;
        emit GovernorApproved(nonce, msg.sender, count);
        if (count >= _governorThreshold) _applyKey(nonce, epoch, key, point, true);
    }

    function _checkRotationNonce(uint64 nonce) private view {
        uint64 last = _lastRotation;
        if (nonce <= last) revert RotationApplied(nonce, last);
        if (nonce != last + 1) revert RotationGap(nonce, last + 1);
    }

    function _applyKey(uint64 nonce, uint64 epoch, bytes memory key, bytes memory point, bool governed) private {
        _storeKey(key, point);
        _lastRotation = nonce;
        emit KeyRotated(nonce, epoch, key, governed);
    }

    function _storeKey(bytes memory key, bytes memory point) private {
        _groupKey = key;
        for (uint256 i = 0; i < 4; ++i) {
            _groupKeyPoint[i] = _word(point, i);
        }
    }

    /// The key rotation digest (docs/signing.md 3.4).
    function _rotationDigest(uint64 nonce, uint64 epoch, bytes memory key) internal view returns (bytes32 digest) {
        (bytes32 h0, bytes32 h1, bytes32 h2, uint256 hl) = _hubStr();
        bool ok;
        assembly ("memory-safe") {
            let start := mload(0x40)
            mstore(start, TAG_ROTATION)
            let p := add(start, 21)
            mstore(p, h0)
            mstore(add(p, 32), h1)
            mstore(add(p, 64), h2)
            p := add(p, hl)
            mstore(p, or(or(shl(192, nonce), shl(128, epoch)), shl(64, 48)))
            p := add(p, 24)
            mcopy(p, add(key, 32), 48)
            p := add(p, 48)
            ok := staticcall(gas(), 0x02, start, sub(p, start), 0x00, 0x20)
            ok := and(ok, eq(returndatasize(), 0x20))
            digest := mload(0x00)
        }
        if (!ok) revert LowGas(VERIFY_GAS, gasleft());
    }

    /// Reverts BadKey unless `key` (48 bytes, compressed) and `point` (128
    /// bytes, EIP-2537) are the same G1 point, on the curve, in the
    /// prime-order subgroup and not the point at infinity.
    function _checkKey(bytes memory key, bytes memory point) private view {
        if (key.length != 48 || point.length != 128) revert BadKey();
        uint256 left = gasleft();
        if (left < KEY_CHECK_GAS) revert LowGas(KEY_CHECK_GAS, left);
        bool ok;
        assembly ("memory-safe") {
            let k0 := mload(add(key, 32))
            let k1 := mload(add(key, 64))
            let flags := byte(0, k0)
            // x from the compressed form, flags cleared, as two EIP-2537
            // words: 16 zero bytes and bytes 0..16, then bytes 16..48.
            let kx := and(k0, not(shl(248, 0xe0)))
            let xHi := shr(128, kx)
            let xLo := or(shl(128, kx), shr(128, k1))
            let w0 := mload(add(point, 32))
            let w1 := mload(add(point, 64))
            let w2 := mload(add(point, 96))
            let w3 := mload(add(point, 128))
            // y above (p - 1) / 2
            let big := or(gt(w2, HALF_P_HI), and(eq(w2, HALF_P_HI), gt(w3, HALF_P_LO)))
            ok := and(iszero(iszero(and(flags, 0x80))), iszero(and(flags, 0x40)))
            ok := and(ok, and(eq(w0, xHi), eq(w1, xLo)))
            ok := and(ok, iszero(shr(128, w2)))
            ok := and(ok, eq(big, iszero(iszero(and(flags, 0x20)))))
            ok := and(ok, iszero(iszero(or(or(w0, w1), or(w2, w3)))))
            if ok {
                // G1MSM by the scalar 1 refuses a point off the curve or
                // outside the subgroup, and gives the point back.
                let f := mload(0x40)
                mstore(f, w0)
                mstore(add(f, 32), w1)
                mstore(add(f, 64), w2)
                mstore(add(f, 96), w3)
                mstore(add(f, 128), 1)
                ok := staticcall(G1MSM_GAS, 0x0c, f, 160, add(f, 160), 128)
                ok := and(ok, eq(returndatasize(), 128))
                ok := and(ok, and(eq(mload(add(f, 160)), w0), eq(mload(add(f, 192)), w1)))
                ok := and(ok, and(eq(mload(add(f, 224)), w2), eq(mload(add(f, 256)), w3)))
            }
        }
        if (!ok) revert BadKey();
    }

    // ------------------------------------------------------------------
    // The BLS check
    // ------------------------------------------------------------------

    /// Reverts unless `signature` (EIP-2537 G2, 256 bytes) is the group
    /// key's signature of Tally's message of `kind` over `digest`:
    /// BadSignature for a wrong or malformed signature, LowGas when too
    /// little gas is left to tell.
    function _verify(uint8 kind, bytes32 digest, bytes calldata signature) internal view {
        if (signature.length != 256) revert BadSignature();
        uint256 left = gasleft();
        if (left < VERIFY_GAS) revert LowGas(VERIFY_GAS, left);

        (bytes32 m0, bytes32 m1, uint256 ml) = (_msgPrefix0, _msgPrefix1, _msgPrefixLen);

        // 0: valid; 1: the signature does not verify; 2: a precompile ran
        // out of gas (only the pairing can fail on its input).
        uint256 status;
        assembly ("memory-safe") {
            // Scratch from f on (none of it kept):
            //   f+0x020  b0 ^ b(i-1) || u8(i) || DST'   (86 bytes)
            //   f+0x0a0  expand_message_xmd output      (256 bytes)
            //   f+0x1a0  msg' for b0                    (at most 212 bytes)
            //   f+0x2a0  MODEXP input                   (225 bytes)
            //   f+0x3a0  u0 || u1                       (2 x 128 bytes)
            //   f+0x4a0  Q0 || Q1                       (2 x 256 bytes)
            //   f+0x6a0  pairing input: pk, H(m), -g1, sig (768 bytes)
            let f := mload(0x40)

            // msg' = Z_pad (64 zero bytes) || m || I2OSP(256, 2) || I2OSP(0, 1) || DST'
            mstore(add(f, 0x1a0), 0)
            mstore(add(f, 0x1c0), 0)
            let p := add(f, 0x1e0)
            mstore(p, m0)
            mstore(add(p, 32), m1)
            p := add(p, ml)
            mstore8(p, kind)
            mstore(add(p, 1), digest)
            p := add(p, 33)
            mstore(p, shl(232, 0x010000))
            p := add(p, 3)
            mstore(p, DST_PRIME_0)
            mstore(add(p, 32), DST_PRIME_1)
            p := add(p, 53)

            // b0 = H(msg'), b1 = H(b0 || 1 || DST'),
            // bi = H((b0 ^ b(i-1)) || i || DST'), uniform = b1 || .. || b8
            let ok := staticcall(gas(), 0x02, add(f, 0x1a0), sub(p, add(f, 0x1a0)), f, 32)
            let b0 := mload(f)
            mstore(add(f, 0x20), b0)
            mstore8(add(f, 0x40), 1)
            mstore(add(f, 0x41), DST_PRIME_0)
            mstore(add(f, 0x61), DST_PRIME_1)
            ok := and(ok, staticcall(gas(), 0x02, add(f, 0x20), 86, add(f, 0xa0), 32))
            for { let i := 2 } lt(i, 9) { i := add(i, 1) } {
                mstore(add(f, 0x20), xor(b0, mload(add(f, add(0xa0, mul(sub(i, 2), 32))))))
                mstore8(add(f, 0x40), i)
                ok := and(ok, staticcall(gas(), 0x02, add(f, 0x20), 86, add(f, add(0xa0, mul(sub(i, 1), 32))), 32))
            }

            // e0..e3: each 64-byte chunk mod p (MODEXP base^1 mod p with a
            // 64-byte modulus, so the result is already an EIP-2537 Fp).
            p := add(f, 0x2a0)
            mstore(p, 64)
            mstore(add(p, 32), 1)
            mstore(add(p, 64), 64)
            mstore8(add(p, 160), 1)
            mstore(add(p, 161), P_HI)
            mstore(add(p, 193), P_LO)
            for { let j := 0 } lt(j, 4) { j := add(j, 1) } {
                mstore(add(p, 96), mload(add(f, add(0xa0, mul(j, 64)))))
                mstore(add(p, 128), mload(add(f, add(0xc0, mul(j, 64)))))
                ok := and(ok, staticcall(gas(), 0x05, p, 225, add(f, add(0x3a0, mul(j, 64))), 64))
                ok := and(ok, eq(returndatasize(), 64))
            }

            // H(m) = MAP(u0) + MAP(u1), written into the pairing input.
            ok := and(ok, staticcall(gas(), 0x11, add(f, 0x3a0), 128, add(f, 0x4a0), 256))
            ok := and(ok, eq(returndatasize(), 256))
            ok := and(ok, staticcall(gas(), 0x11, add(f, 0x420), 128, add(f, 0x5a0), 256))
            ok := and(ok, eq(returndatasize(), 256))
            ok := and(ok, staticcall(gas(), 0x0d, add(f, 0x4a0), 512, add(f, 0x720), 256))
            ok := and(ok, eq(returndatasize(), 256))

            switch ok
            case 0 { status := 2 }
            default {
                p := add(f, 0x6a0)
                let ks := _groupKeyPoint.slot
                mstore(p, sload(ks))
                mstore(add(p, 32), sload(add(ks, 1)))
                mstore(add(p, 64), sload(add(ks, 2)))
                mstore(add(p, 96), sload(add(ks, 3)))
                mstore(add(p, 384), NEG_G1_X_HI)
                mstore(add(p, 416), NEG_G1_X_LO)
                mstore(add(p, 448), NEG_G1_Y_HI)
                mstore(add(p, 480), NEG_G1_Y_LO)
                calldatacopy(add(p, 512), signature.offset, 256)
                switch lt(gas(), PAIRING_MIN_LEFT)
                case 1 { status := 2 }
                default {
                    mstore(f, 0)
                    ok := staticcall(PAIRING_GAS, 0x0f, p, 768, f, 32)
                    ok := and(ok, eq(returndatasize(), 32))
                    status := iszero(and(ok, eq(mload(f), 1)))
                }
            }
        }
        if (status == 2) revert LowGas(VERIFY_GAS, gasleft());
        if (status == 1) revert BadSignature();
    }

    // ------------------------------------------------------------------
    // Deposits and withdrawals
    // ------------------------------------------------------------------

    /// @inheritdoc ITallyHub
    function deposit(string calldata user, bytes calldata pubkey) external payable {
        uint256 wpc = _weiPerCredit;
        if (msg.value == 0 || msg.value % wpc != 0) {
            revert BadDeposit("the value must be a positive multiple of weiPerCredit");
        }
        uint256 credits = msg.value / wpc;
        if (credits > type(uint64).max) revert BadDeposit("the credits do not fit 64 bits");
        if (!_isIdent(user)) revert BadDeposit("user is not an identifier of 1 to 64 bytes [A-Za-z0-9._:/-]");

        User storage u = _users[user];
        uint64 have = u.escrow;
        (uint64 credited, uint64 fee, bool bind) = _depositTerms(user, u, have, uint64(credits), pubkey);
        if (uint256(have) + credited > type(uint64).max) revert BadDeposit("escrow would overflow");

        u.escrow = have + credited;
        if (u.addr == address(0)) u.addr = msg.sender;
        if (bind) {
            u.hasKey = true;
            _userKey[user] = bytes32(pubkey);
            _fees = _cap64(uint256(_fees) + fee);
        }
        uint64 seq = _depositCount + 1;
        _depositCount = seq;
        emit Deposited(seq, user, credited, bind ? pubkey : bytes(""), fee, msg.sender);
    }

    /// What a deposit of `amount` credits with `pubkey` does for `user`
    /// (who has `have` in escrow): the credits it adds, the registration
    /// fee it pays and whether it binds the key (hub/src/deposit.rs).
    function _depositTerms(string calldata user, User storage u, uint64 have, uint64 amount, bytes calldata pubkey)
        private
        view
        returns (uint64 credited, uint64 fee, bool bind)
    {
        if (pubkey.length == 0) return (amount, 0, false);
        if (pubkey.length != 32) revert BadDeposit("a deposit's key is not 32 bytes");
        bytes32 key = bytes32(pubkey);
        if (!_isEd25519Point(key)) revert BadDeposit("a deposit's key is not an ed25519 point");
        if (u.hasKey) {
            if (_userKey[user] != key) {
                revert BadDeposit("the user is bound to another key: deposit without a key, or with that one");
            }
            return (amount, 0, false);
        }
        if (have > 0) {
            revert BadDeposit(
                "the user already holds credits: a key is bound only by the deposit that first funds a user"
            );
        }
        fee = _registrationFee;
        if (amount <= fee) revert BadDeposit("a deposit that binds a key must be above the registration fee");
        return (amount - fee, fee, true);
    }

    /// @inheritdoc ITallyHub
    function withdraw() external {
        uint256 amount = _withdrawable[msg.sender];
        if (amount == 0) revert NothingToWithdraw();
        _withdrawable[msg.sender] = 0;
        bool ok;
        assembly ("memory-safe") {
            ok := call(gas(), caller(), amount, 0, 0, 0, 0)
        }
        if (!ok) revert TransferFailed();
        emit Withdrawn(msg.sender, amount);
    }

    /// Whether `key` decompresses as ed25519-dalek's
    /// `VerifyingKey::from_bytes` does: y is the low 255 bits read little
    /// endian (not required below p), and the key is valid exactly when
    /// (y^2 - 1) / (d y^2 + 1) is a square or zero mod p. d y^2 + 1 is
    /// never zero (d is not a square), so that is whether
    /// (y^2 - 1)(d y^2 + 1) is, by Euler's criterion. The sign bit never
    /// makes a key invalid.
    function _isEd25519Point(bytes32 key) private view returns (bool) {
        uint256 v = uint256(key);
        // Byte-reverse: little endian to a number.
        v = ((v >> 8) & 0x00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff)
            | ((v & 0x00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff) << 8);
        v = ((v >> 16) & 0x0000ffff0000ffff0000ffff0000ffff0000ffff0000ffff0000ffff0000ffff)
            | ((v & 0x0000ffff0000ffff0000ffff0000ffff0000ffff0000ffff0000ffff0000ffff) << 16);
        v = ((v >> 32) & 0x00000000ffffffff00000000ffffffff00000000ffffffff00000000ffffffff)
            | ((v & 0x00000000ffffffff00000000ffffffff00000000ffffffff00000000ffffffff) << 32);
        v = ((v >> 64) & 0x0000000000000000ffffffffffffffff0000000000000000ffffffffffffffff)
            | ((v & 0x0000000000000000ffffffffffffffff0000000000000000ffffffffffffffff) << 64);
        v = (v >> 128) | (v << 128);
        uint256 y = (v & ((1 << 255) - 1)) % ED_P;
        uint256 yy = mulmod(y, y, ED_P);
        uint256 num = addmod(yy, ED_P - 1, ED_P);
        uint256 den = addmod(mulmod(ED_D, yy, ED_P), 1, ED_P);
        uint256 w = mulmod(num, den, ED_P);
        if (w == 0) return true;
        bool ok;
        uint256 r;
        assembly ("memory-safe") {
            let f := mload(0x40)
            mstore(f, 32)
            mstore(add(f, 32), 32)
            mstore(add(f, 64), 32)
            mstore(add(f, 96), w)
            mstore(add(f, 128), ED_HALF)
            mstore(add(f, 160), ED_P)
            ok := staticcall(gas(), 0x05, f, 192, 0x00, 32)
            ok := and(ok, eq(returndatasize(), 32))
            r := mload(0x00)
        }
        if (!ok) revert LowGas(0, gasleft());
        return r == 1;
    }

    // ------------------------------------------------------------------
    // Views
    // ------------------------------------------------------------------

    function hubName() external view returns (string memory) {
        return _hubName;
    }

    function tallyChainId() external view returns (string memory) {
        return _tallyChainId;
    }

    function weiPerCredit() external view returns (uint256) {
        return _weiPerCredit;
    }

    function registrationFee() external view returns (uint64) {
        return _registrationFee;
    }

    function groupKey() external view returns (bytes memory) {
        return _groupKey;
    }

    function lastNonce() external view returns (uint64) {
        return _lastNonce;
    }

    function settledAt(uint64 nonce) external view returns (uint64) {
        return _settledAt[nonce];
    }

    function lastRotation() external view returns (uint64) {
        return _lastRotation;
    }

    function depositCount() external view returns (uint64) {
        return _depositCount;
    }

    function escrow(string calldata user) external view returns (uint64) {
        return _users[user].escrow;
    }

    function payout(string calldata provider) external view returns (uint64) {
        return _payout[provider];
    }

    function withdrawn(string calldata user) external view returns (uint64) {
        return _withdrawn[user];
    }

    function userKey(string calldata user) external view returns (bytes memory) {
        if (!_users[user].hasKey) return "";
        return abi.encodePacked(_userKey[user]);
    }

    function userAddress(string calldata user) external view returns (address) {
        return _users[user].addr;
    }

    function withdrawable(address account) external view returns (uint256) {
        return _withdrawable[account];
    }

    function fees() external view returns (uint64) {
        return _fees;
    }

    function governorThreshold() external view returns (uint256) {
        return _governorThreshold;
    }

    function isGovernor(address account) external view returns (bool) {
        return _isGovernor[account];
    }

    // ------------------------------------------------------------------
    // Helpers
    // ------------------------------------------------------------------

    /// Whether `s` is a Tally identifier: 1 to 64 bytes of
    /// `[A-Za-z0-9._:/-]`. A word (32 bytes) at a time: for bytes below
    /// 0x80, adding 0x80 - lo to each sets its top bit exactly when it is
    /// at least lo, and adding 0x7f - hi leaves it clear exactly when it is
    /// at most hi, with no carry between bytes.
    function _isIdent(string calldata s) private pure returns (bool ok) {
        assembly ("memory-safe") {
            // Whether the first n (1..32) bytes of w are identifier bytes.
            function identWord(w, n) -> valid {
                let ones := 0x0101010101010101010101010101010101010101010101010101010101010101
                let tops := 0x8080808080808080808080808080808080808080808080808080808080808080
                if lt(n, 32) {
                    // The bytes past n read as 'a'.
                    let keep := not(shr(shl(3, n), not(0)))
                    w := or(and(w, keep), and(mul(ones, 0x61), not(keep)))
                }
                // 0x2d..0x3a (- . / 0-9 :), 0x41..0x5a (A-Z), 0x5f (_), 0x61..0x7a (a-z)
                let r := and(add(w, mul(ones, 0x53)), not(add(w, mul(ones, 0x45))))
                r := or(r, and(add(w, mul(ones, 0x3f)), not(add(w, mul(ones, 0x25)))))
                r := or(r, and(add(w, mul(ones, 0x21)), not(add(w, mul(ones, 0x20)))))
                r := or(r, and(add(w, mul(ones, 0x1f)), not(add(w, mul(ones, 0x05)))))
                valid := and(iszero(and(w, tops)), eq(and(r, tops), tops))
            }
            let len := s.length
            switch gt(len, 32)
            case 0 { ok := and(gt(len, 0), identWord(calldataload(s.offset), len)) }
            default {
                ok := and(lt(len, add(MAX_IDENT, 1)), identWord(calldataload(s.offset), 32))
                ok := and(ok, identWord(calldataload(add(s.offset, 32)), sub(len, 32)))
            }
        }
    }

    /// The storage slot Solidity gives `name` in the string-keyed mapping
    /// at slot `base`: keccak256(name || base), hashed at `scratch`.
    function _nameSlot(string calldata name, uint256 base, uint256 scratch) private pure returns (uint256 slot) {
        assembly ("memory-safe") {
            calldatacopy(scratch, name.offset, name.length)
            mstore(add(scratch, name.length), base)
            slot := keccak256(scratch, add(name.length, 32))
        }
    }

    function _usersSlot() private pure returns (uint256 base) {
        assembly ("memory-safe") {
            base := _users.slot
        }
    }

    function _payoutSlot() private pure returns (uint256 base) {
        assembly ("memory-safe") {
            base := _payout.slot
        }
    }

    function _withdrawnSlot() private pure returns (uint256 base) {
        assembly ("memory-safe") {
            base := _withdrawn.slot
        }
    }

    /// Adds `amount` to the uint64 at `slot` (a string-keyed uint64
    /// mapping's entry), stopping at 2^64 - 1 as the reference hub does.
    function _addCapped(uint256 slot, uint64 amount) private {
        assembly ("memory-safe") {
            let v := add(sload(slot), amount)
            if gt(v, 0xffffffffffffffff) { v := 0xffffffffffffffff }
            sstore(slot, v)
        }
    }

    function _cap64(uint256 v) private pure returns (uint64) {
        return v > type(uint64).max ? type(uint64).max : uint64(v);
    }

    /// Word `i` of `b`'s bytes, zero past its end.
    function _word(bytes memory b, uint256 i) private pure returns (bytes32 w) {
        uint256 off = i * 32;
        if (off >= b.length) return bytes32(0);
        assembly ("memory-safe") {
            w := mload(add(add(b, 32), off))
        }
        uint256 rest = b.length - off;
        if (rest < 32) w &= bytes32(~(type(uint256).max >> (rest * 8)));
    }

    function _decimal(uint256 v) private pure returns (string memory) {
        if (v == 0) return "0";
        uint256 digits = 0;
        for (uint256 t = v; t != 0; t /= 10) ++digits;
        bytes memory out = new bytes(digits);
        for (uint256 i = digits; i > 0; --i) {
            out[i - 1] = bytes1(uint8(48 + (v % 10)));
            v /= 10;
        }
        return string(out);
    }

    function _lowerHex(address a) private pure returns (string memory) {
        bytes memory out = new bytes(40);
        uint160 v = uint160(a);
        for (uint256 i = 40; i > 0; --i) {
            out[i - 1] = HEX_DIGITS[v & 15];
            v >>= 4;
        }
        return string(out);
    }
}

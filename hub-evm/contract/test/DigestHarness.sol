// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {TallyHub} from "../TallyHub.sol";
import {Call} from "../ITallyHub.sol";

/// Test only (never deployed for real): TallyHub's digest code with a hub
/// name the test chooses (docs/signing.md's worked example names "hub"),
/// and TallyHub's signature check alone, with the gas it used.
contract DigestHarness is TallyHub {
    bytes32 private immutable _t0;
    bytes32 private immutable _t1;
    bytes32 private immutable _t2;
    uint256 private immutable _tLen;

    constructor(string memory hub_, string memory chainId_, bytes memory key_, bytes memory point_)
        TallyHub(chainId_, key_, point_, 0, 1, 0, new address[](0), 0)
    {
        bytes memory s = abi.encodePacked(uint8(bytes(hub_).length), hub_);
        require(s.length <= 65, "hub name too long");
        bytes32[3] memory w;
        for (uint256 i = 0; i < s.length; ++i) {
            w[i / 32] |= bytes32(uint256(uint8(s[i])) << (8 * (31 - (i % 32))));
        }
        (_t0, _t1, _t2, _tLen) = (w[0], w[1], w[2], s.length);
    }

    function _hubStr() internal view override returns (bytes32, bytes32, bytes32, uint256) {
        return (_t0, _t1, _t2, _tLen);
    }

    /// The digest submitBatch checks (by eth_call; nothing is paid).
    function batchDigest(uint64 nonce, Call[] calldata calls) external returns (bytes32 digest) {
        (digest,,) = _scan(nonce, calls, false);
    }

    function rotationDigest(uint64 nonce, uint64 epoch, bytes calldata key) external view returns (bytes32) {
        return _rotationDigest(nonce, epoch, key);
    }

    /// Reverts as submitBatch's check would; else the gas the check used.
    function verifyGas(uint8 kind, bytes32 digest, bytes calldata signature) external view returns (uint256 used) {
        uint256 before = gasleft();
        _verify(kind, digest, signature);
        used = before - gasleft();
    }
}

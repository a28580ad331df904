#!/usr/bin/env python3
"""Verifies a Tally batch signature with py_ecc (the Ethereum reference BLS
library), using only docs/signing.md and the group key: the batch digest and
the signed message are rebuilt here from the batch's calls, independently of
the Rust code.

usage: verify_batch.py VECTOR.json   (exit 0: valid, 1: invalid)
VECTOR: {"chain_id", "group_key", "dst", "batch": {"chain", "nonce",
         "calls": [{"id","user","provider","amount","window"}], "signature"}}
"""
import hashlib
import json
import sys

from py_ecc.bls.g2_primitives import pubkey_to_G1, signature_to_G2, subgroup_check
from py_ecc.bls.hash_to_curve import hash_to_G2
from py_ecc.optimized_bls12_381 import G1, FQ12, final_exponentiate, neg, pairing


def put_str(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b)]) + b


def batch_digest(chain: str, nonce: int, calls) -> bytes:
    h = hashlib.sha256()
    h.update(b"tally/batch/v1")
    h.update(put_str(chain))
    h.update(nonce.to_bytes(8, "big"))
    h.update(len(calls).to_bytes(8, "big"))
    for c in sorted(calls, key=lambda c: c["id"]):
        h.update(c["id"].to_bytes(8, "big"))
        h.update(put_str(c["user"]))
        h.update(put_str(c["provider"]))
        h.update(c["amount"].to_bytes(8, "big"))
        h.update(c["window"].to_bytes(8, "big"))
    return h.digest()


def message(chain_id: str, kind: int, payload: bytes) -> bytes:
    return b"tally/v1" + put_str(chain_id) + bytes([kind]) + payload


def main() -> int:
    v = json.load(open(sys.argv[1]))
    b = v["batch"]
    digest = batch_digest(b["chain"], b["nonce"], b["calls"])
    msg = message(v["chain_id"], 1, digest)
    pk = pubkey_to_G1(bytes.fromhex(v["group_key"]))
    sig = signature_to_G2(bytes.fromhex(b["signature"]))
    if not subgroup_check(sig):
        print("signature not in G2 subgroup")
        return 1
    hm = hash_to_G2(msg, v["dst"].encode(), hashlib.sha256)
    # e(sig, g1) == e(H(m), pk)  <=>  e(sig, -g1) * e(H(m), pk) == 1
    acc = pairing(sig, neg(G1), final_exponentiate=False) * pairing(hm, pk, final_exponentiate=False)
    ok = final_exponentiate(acc) == FQ12.one()
    print("digest", digest.hex(), "valid" if ok else "INVALID")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

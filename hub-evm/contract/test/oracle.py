#!/usr/bin/env python3
"""Independent oracle for the TallyHub smoke test (test/smoke.js).

Reads one JSON request per line on stdin and answers one JSON line on
stdout. Everything here is built from docs/signing.md with py_ecc and
hashlib, not from the contract: digests (3.1, 3.4), the signed message
(section 2), BLS keys and signatures (py_ecc's G2ProofOfPossession with
Tally's DST, or the standard one), points written in EIP-2537's layout,
and ed25519 point decompression as ed25519-dalek's from_bytes does it.

Requests: {"op": ..., ...}; hex strings without 0x.
"""

import hashlib
import json
import sys

from py_ecc.bls import G2ProofOfPossession
from py_ecc.bls.g2_primitives import pubkey_to_G1, signature_to_G2
from py_ecc.fields import optimized_bls12_381_FQ as FQ
from py_ecc.optimized_bls12_381 import field_modulus as P, normalize, is_on_curve, b as CURVE_B, multiply, curve_order, is_inf

TALLY_DST = b"BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_TALLY_V1_"


class TallyBLS(G2ProofOfPossession):
    DST = TALLY_DST


def put_str(s):
    b = s.encode()
    assert len(b) < 256
    return bytes([len(b)]) + b


def u64(v):
    return int(v).to_bytes(8, "big")


def batch_digest(hub, nonce, calls):
    calls = sorted(calls, key=lambda c: int(c["id"]))
    v2 = any(int(c.get("kind", 0)) != 0 for c in calls)
    out = (b"tally/batch/v2" if v2 else b"tally/batch/v1") + put_str(hub) + u64(nonce) + u64(len(calls))
    for c in calls:
        out += u64(c["id"]) + put_str(c["user"]) + put_str(c["provider"]) + u64(c["amount"]) + u64(c["window"])
        if v2:
            out += int(c.get("kind", 0)).to_bytes(4, "big")
    return hashlib.sha256(out).digest()


def rotation_digest(hub, nonce, epoch, key):
    return hashlib.sha256(
        b"tally/key-rotation/v1" + put_str(hub) + u64(nonce) + u64(epoch) + u64(len(key)) + key
    ).digest()


def message(chain_id, kind, digest):
    cid = chain_id.encode()
    return b"tally/v1" + bytes([len(cid)]) + cid + bytes([kind]) + digest


def fp(v):
    return int(v).to_bytes(64, "big")


def g1_eip2537(pt):
    x, y = normalize(pt)
    return fp(x.n) + fp(y.n)


def g2_eip2537(pt):
    x, y = normalize(pt)
    # py_ecc's FQ2 coefficients are (c0, c1): real part first, as EIP-2537.
    return fp(x.coeffs[0]) + fp(x.coeffs[1]) + fp(y.coeffs[0]) + fp(y.coeffs[1])


def key(secret):
    sk = int(secret) % curve_order
    pk = TallyBLS.SkToPk(sk)
    return {"key": pk.hex(), "point": g1_eip2537(pubkey_to_G1(pk)).hex()}


def sign(secret, msg, standard=False):
    cls = G2ProofOfPossession if standard else TallyBLS
    sig = cls.Sign(int(secret) % curve_order, msg)
    assert standard or TallyBLS.Verify(TallyBLS.SkToPk(int(secret) % curve_order), msg, sig)
    return g2_eip2537(signature_to_G2(sig))


def off_subgroup_point():
    """A point on y^2 = x^3 + 4 that is not in the prime-order subgroup."""
    x = 1
    while True:
        rhs = (x * x * x + 4) % P
        y = pow(rhs, (P + 1) // 4, P)  # p = 3 mod 4
        if y * y % P == rhs:
            pt = (FQ(x), FQ(y), FQ(1))
            assert is_on_curve(pt, CURVE_B)
            if not is_inf(multiply(pt, curve_order)):
                big = y > (P - 1) // 2
                comp = bytearray(x.to_bytes(48, "big"))
                comp[0] |= 0x80 | (0x20 if big else 0)
                return {"key": bytes(comp).hex(), "point": (fp(x) + fp(y)).hex()}
        x += 1


# ed25519: decompression as curve25519-dalek's CompressedEdwardsY::decompress
# (y = low 255 bits little endian, not required canonical; x^2 = u/v).
ED_P = 2**255 - 19
ED_D = (-121665 * pow(121666, -1, ED_P)) % ED_P
SQRT_M1 = pow(2, (ED_P - 1) // 4, ED_P)


def ed25519_valid(b):
    if len(b) != 32:
        return False
    y = (int.from_bytes(b, "little") & ((1 << 255) - 1)) % ED_P
    u = (y * y - 1) % ED_P
    v = (ED_D * y * y + 1) % ED_P
    # RFC 8032 5.1.3 step 2's candidate root, then its two checks.
    x = (u * pow(v, 3, ED_P) * pow(u * pow(v, 7, ED_P), (ED_P - 5) // 8, ED_P)) % ED_P
    vx2 = (v * x * x) % ED_P
    if vx2 == u:
        return True
    if vx2 == (-u) % ED_P:
        return True  # x * sqrt(-1) is a root
    return False


def handle(req):
    op = req["op"]
    if op == "key":
        return key(req["secret"])
    if op == "batch_digest":
        return {"digest": batch_digest(req["hub"], req["nonce"], req["calls"]).hex()}
    if op == "rotation_digest":
        return {"digest": rotation_digest(req["hub"], req["nonce"], req["epoch"], bytes.fromhex(req["key"])).hex()}
    if op == "sign_batch":
        d = batch_digest(req["hub"], req["nonce"], req["calls"])
        m = message(req["chain_id"], 1, d)
        return {"digest": d.hex(), "sig": sign(req["secret"], m, req.get("standard", False)).hex()}
    if op == "sign_rotation":
        d = rotation_digest(req["hub"], req["nonce"], req["epoch"], bytes.fromhex(req["key"]))
        m = message(req["chain_id"], 4, d)
        return {"digest": d.hex(), "sig": sign(req["secret"], m).hex()}
    if op == "sign_digest":
        m = message(req["chain_id"], req["kind"], bytes.fromhex(req["digest"]))
        return {"sig": sign(req["secret"], m).hex()}
    if op == "off_subgroup":
        return off_subgroup_point()
    if op == "ed25519_valid":
        return {"valid": [ed25519_valid(bytes.fromhex(k)) for k in req["keys"]]}
    raise ValueError(f"unknown op {op}")


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            out = {"ok": handle(json.loads(line))}
        except Exception as e:  # reported to the caller, which fails
            out = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

//! EIP-2537 encoding of Tally's BLS points.
//!
//! Tally stores and signs with compressed points (`docs/signing.md`,
//! section 1): a public key is a 48-byte compressed G1 point, a signature
//! a 96-byte compressed G2 point whose `x` is written imaginary part first
//! (`x.c1 || x.c0`). EIP-2537's precompiles take uncompressed points with
//! every base-field element left-padded from 48 to 64 bytes:
//!
//! | point | EIP-2537 layout | bytes |
//! |---|---|---|
//! | G1 | `pad(x) \|\| pad(y)` | 128 |
//! | G2 | `pad(x.c0) \|\| pad(x.c1) \|\| pad(y.c0) \|\| pad(y.c1)` (real part first) | 256 |
//!
//! `pad(v)` is 16 zero bytes followed by the 48-byte big-endian `v`.
//! blst's uncompressed serialisation of a G2 point is `x.c1 || x.c0 ||
//! y.c1 || y.c0` (imaginary part first, like the compressed form), so each
//! Fp2 element has its halves swapped on the way.
//!
//! Every input is decompressed and checked before it is re-encoded: a
//! point not on the curve, outside the prime-order subgroup, or at
//! infinity is refused ([`PointError`]). The contract's precompiles would
//! refuse most of these too, but only after a transaction paid for it; a
//! typed error here says what is wrong before anything is sent.

use blst::min_pk::{PublicKey, Signature};
use blst::BLST_ERROR;

/// Bytes of a compressed G1 point (a Tally group key).
pub const G1_COMPRESSED: usize = 48;
/// Bytes of a compressed G2 point (a Tally signature).
pub const G2_COMPRESSED: usize = 96;
/// Bytes of an EIP-2537 G1 point.
pub const G1_EIP2537: usize = 128;
/// Bytes of an EIP-2537 G2 point.
pub const G2_EIP2537: usize = 256;

/// Bytes of a base-field element as blst writes it.
const FP: usize = 48;
/// Bytes of a base-field element in EIP-2537 (16 zero bytes, then the 48).
const FP_PADDED: usize = 64;

/// Which point an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointKind {
    /// A G1 point: a group key.
    G1,
    /// A G2 point: a signature.
    G2,
}

impl std::fmt::Display for PointKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PointKind::G1 => "G1 point (group key)",
            PointKind::G2 => "G2 point (signature)",
        })
    }
}

/// Why a compressed point was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PointError {
    /// Not the compressed length (48 for G1, 96 for G2).
    #[error("{kind}: {got} bytes, a compressed point has {want}")]
    Length {
        /// The point.
        kind: PointKind,
        /// Bytes given.
        got: usize,
        /// Bytes wanted.
        want: usize,
    },
    /// The flag bits or the coordinate are not a compressed encoding (the
    /// compression flag is clear, or `x` is not below the field prime).
    #[error("{kind}: not a compressed encoding")]
    Encoding {
        /// The point.
        kind: PointKind,
    },
    /// `x` is not the abscissa of a point on the curve.
    #[error("{kind}: not on the curve")]
    NotOnCurve {
        /// The point.
        kind: PointKind,
    },
    /// On the curve but outside the prime-order subgroup.
    #[error("{kind}: not in the prime-order subgroup")]
    NotInSubgroup {
        /// The point.
        kind: PointKind,
    },
    /// The point at infinity (never a valid key or signature).
    #[error("{kind}: the point at infinity")]
    Infinity {
        /// The point.
        kind: PointKind,
    },
}

fn refusal(kind: PointKind, e: BLST_ERROR) -> PointError {
    match e {
        BLST_ERROR::BLST_POINT_NOT_ON_CURVE => PointError::NotOnCurve { kind },
        BLST_ERROR::BLST_POINT_NOT_IN_GROUP => PointError::NotInSubgroup { kind },
        BLST_ERROR::BLST_PK_IS_INFINITY => PointError::Infinity { kind },
        _ => PointError::Encoding { kind },
    }
}

/// The checks before decompression: `want` bytes, and no infinity flag
/// (`0x40`). blst decodes the canonical infinity encoding successfully;
/// it is refused explicitly so the error says what it is.
fn precheck(kind: PointKind, compressed: &[u8], want: usize) -> Result<(), PointError> {
    if compressed.len() != want {
        return Err(PointError::Length {
            kind,
            got: compressed.len(),
            want,
        });
    }
    if compressed.first().is_some_and(|b| b & 0x40 != 0) {
        return Err(PointError::Infinity { kind });
    }
    Ok(())
}

/// Copies the 48-byte field element at `src[from..from + 48]` into the
/// 64-byte slot at `dst[to..to + 64]`, left-padded with zeros.
fn pad_into(dst: &mut [u8], to: usize, src: &[u8], from: usize) {
    dst[to..to + FP_PADDED - FP].fill(0);
    dst[to + FP_PADDED - FP..to + FP_PADDED].copy_from_slice(&src[from..from + FP]);
}

/// Checks a 48-byte compressed G1 point (a group key) and returns it in
/// EIP-2537's 128-byte form `pad(x) || pad(y)`.
pub fn g1_to_eip2537(compressed: &[u8]) -> Result<[u8; G1_EIP2537], PointError> {
    let kind = PointKind::G1;
    precheck(kind, compressed, G1_COMPRESSED)?;
    // key_validate: decompress, refuse infinity, check the subgroup.
    let pk = PublicKey::key_validate(compressed).map_err(|e| refusal(kind, e))?;
    let raw = pk.serialize(); // x || y, 48 bytes each
    let mut out = [0u8; G1_EIP2537];
    pad_into(&mut out, 0, &raw, 0);
    pad_into(&mut out, FP_PADDED, &raw, FP);
    Ok(out)
}

/// Checks a 96-byte compressed G2 point (a signature) and returns it in
/// EIP-2537's 256-byte form `pad(x.c0) || pad(x.c1) || pad(y.c0) ||
/// pad(y.c1)`.
pub fn g2_to_eip2537(compressed: &[u8]) -> Result<[u8; G2_EIP2537], PointError> {
    let kind = PointKind::G2;
    precheck(kind, compressed, G2_COMPRESSED)?;
    // sig_validate(.., true): decompress, refuse infinity, check the subgroup.
    let sig = Signature::sig_validate(compressed, true).map_err(|e| refusal(kind, e))?;
    let raw = sig.serialize(); // x.c1 || x.c0 || y.c1 || y.c0, 48 bytes each
    let mut out = [0u8; G2_EIP2537];
    // EIP-2537 wants each Fp2 element real part (c0) first.
    pad_into(&mut out, 0, &raw, FP); // x.c0
    pad_into(&mut out, FP_PADDED, &raw, 0); // x.c1
    pad_into(&mut out, 2 * FP_PADDED, &raw, 3 * FP); // y.c0
    pad_into(&mut out, 3 * FP_PADDED, &raw, 2 * FP); // y.c1
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tally_settlement::bls::SecretShare;

    // The oracle: py_ecc 0.x (Ethereum's reference BLS code, no blst
    // inside), run once as
    //
    //   sk  = int(sha256(b"tally-hub-evm points oracle")) mod r
    //   class TallyBLS(G2ProofOfPossession): DST = b"..._POP_TALLY_V1_"
    //   pk  = TallyBLS.SkToPk(sk); sig = TallyBLS.Sign(sk, MSG)
    //   x, y = normalize(pubkey_to_G1(pk)); X, Y = normalize(signature_to_G2(sig))
    //
    // printing pk and sig (compressed) and every affine coordinate as
    // 48-byte big-endian hex (`X.coeffs[0]` is c0, the real part).
    const SK: &str = "488bd7a27fb98a9355fcfc089dd23d66827391918eafcf7b2cc54e7f3766b80a";
    const MSG: &[u8] = b"tally-hub-evm points oracle message";
    const PK: &str = "a04ed6cd53d02e54d5d23d30239a65958c915deb5a508346c9e9cd923c86a8dea15966a635243ef1e59afb7d1dfbc380";
    const SIG: &str = "b2798685fa0d8da2419133d891f95be8ec4356107cbb9e39d40128f55390a4781993bad8e50d80db32a121545dc833c40062abf39404d21ba65aae1e3ee79fcb010c531e14b6bcad0a3a47cdbfe84eb51ec8d412fdab4ae63660e53584a7d06e";
    const PK_X: &str = "004ed6cd53d02e54d5d23d30239a65958c915deb5a508346c9e9cd923c86a8dea15966a635243ef1e59afb7d1dfbc380";
    const PK_Y: &str = "1316e3bc6c3b29b395d0ee4c69a0a2fa9eb19926842f069047c28ec447f753184cd0415443a63ed51926b93e7eed5c8a";
    const SIG_X_C0: &str = "0062abf39404d21ba65aae1e3ee79fcb010c531e14b6bcad0a3a47cdbfe84eb51ec8d412fdab4ae63660e53584a7d06e";
    const SIG_X_C1: &str = "12798685fa0d8da2419133d891f95be8ec4356107cbb9e39d40128f55390a4781993bad8e50d80db32a121545dc833c4";
    const SIG_Y_C0: &str = "055a6d327443c1c831694629c87029017d298c2e7456d97778221377ff4c1627f83d6b71d5375d54f9477c1ee57c72a1";
    const SIG_Y_C1: &str = "190cb55efa2eea6a34a09a9655ab56ab9207fb6db17323387504c111fa3ddc1a43317d88f49d98e7bd306385c106109e";

    fn padded(hex48: &str) -> String {
        format!("{}{hex48}", "00".repeat(16))
    }

    fn share() -> SecretShare {
        SecretShare::from_bytes(1, &hex::decode(SK).unwrap()).unwrap()
    }

    #[test]
    fn a_tally_signature_encodes_as_py_ecc_computes_it() {
        let s = share();
        let pk = s.public().compress();
        let sig = s.sign(MSG).sig_bytes();
        // Same key and signature on both sides (same DST, same message)...
        assert_eq!(hex::encode(pk), PK);
        assert_eq!(hex::encode(sig), SIG);
        // ...and the EIP-2537 forms carry py_ecc's affine coordinates,
        // real parts first, each padded to 64 bytes.
        let g1 = g1_to_eip2537(&pk).unwrap();
        assert_eq!(hex::encode(g1), padded(PK_X) + &padded(PK_Y));
        let g2 = g2_to_eip2537(&sig).unwrap();
        let want = [SIG_X_C0, SIG_X_C1, SIG_Y_C0, SIG_Y_C1]
            .map(padded)
            .concat();
        assert_eq!(hex::encode(g2), want);
    }

    #[test]
    fn wrong_lengths_are_refused() {
        let pk = share().public().compress();
        assert_eq!(
            g1_to_eip2537(&pk[..47]),
            Err(PointError::Length {
                kind: PointKind::G1,
                got: 47,
                want: 48
            })
        );
        assert!(matches!(
            g2_to_eip2537(&pk),
            Err(PointError::Length {
                got: 48,
                want: 96,
                ..
            })
        ));
        assert!(matches!(
            g1_to_eip2537(&[]),
            Err(PointError::Length { got: 0, .. })
        ));
    }

    #[test]
    fn infinity_is_refused() {
        let mut g1 = [0u8; 48];
        g1[0] = 0xc0;
        assert_eq!(
            g1_to_eip2537(&g1),
            Err(PointError::Infinity {
                kind: PointKind::G1
            })
        );
        let mut g2 = [0u8; 96];
        g2[0] = 0xc0;
        assert_eq!(
            g2_to_eip2537(&g2),
            Err(PointError::Infinity {
                kind: PointKind::G2
            })
        );
    }

    #[test]
    fn off_curve_and_uncompressed_encodings_are_refused() {
        // x = 1: y^2 = 1 + 4 = 5 is not a square mod p (Euler's criterion,
        // checked with py_ecc's field modulus), so no point has x = 1.
        let mut g1 = [0u8; 48];
        g1[0] = 0x80;
        g1[47] = 1;
        assert_eq!(
            g1_to_eip2537(&g1),
            Err(PointError::NotOnCurve {
                kind: PointKind::G1
            })
        );
        // The compression flag clear: an uncompressed point's first half.
        let mut pk = share().public().compress();
        pk[0] &= 0x7f;
        assert!(matches!(
            g1_to_eip2537(&pk),
            Err(PointError::Encoding { .. } | PointError::NotOnCurve { .. })
        ));
        // x not below p.
        let mut big = [0xffu8; 48];
        big[0] = 0x9f;
        assert!(g1_to_eip2537(&big).is_err());
    }

    /// Small abscissas on the curve (x = 4 for G1: 68 is a square mod p)
    /// are, but for a 2^-126-order chance, outside the prime-order
    /// subgroup: the first one found must be refused as such.
    #[test]
    fn points_outside_the_subgroup_are_refused() {
        let mut found = None;
        for x in 1u8..=255 {
            let mut g1 = [0u8; 48];
            g1[0] = 0x80;
            g1[47] = x;
            match g1_to_eip2537(&g1) {
                Err(PointError::NotInSubgroup { .. }) => {
                    found = Some(x);
                    break;
                }
                Err(PointError::NotOnCurve { .. }) => continue,
                other => panic!("x = {x}: {other:?}"),
            }
        }
        assert!(found.is_some(), "some small x is on the curve");
        let mut found2 = false;
        for x in 1u8..=255 {
            let mut g2 = [0u8; 96];
            g2[0] = 0x80;
            g2[95] = x;
            if let Err(PointError::NotInSubgroup { .. }) = g2_to_eip2537(&g2) {
                found2 = true;
                break;
            }
        }
        assert!(found2, "some small x.c0 is on the G2 curve");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// For any key and message: the 16 padding bytes of every slot are
        /// zero, and the slots hold blst's uncompressed coordinates with
        /// the halves of each Fp2 element swapped.
        #[test]
        fn layout_holds_for_any_key(seed in any::<[u8; 32]>(), msg in any::<Vec<u8>>()) {
            let mut sk = seed;
            sk[0] &= 0x3f; // below r
            prop_assume!(sk != [0; 32]);
            let s = SecretShare::from_bytes(1, &sk).unwrap();
            let g1 = g1_to_eip2537(&s.public().compress()).unwrap();
            let raw = s.public().serialize();
            prop_assert_eq!(&g1[16..64], &raw[..48]);
            prop_assert_eq!(&g1[80..128], &raw[48..]);
            let sig = s.sign(&msg);
            let g2 = g2_to_eip2537(&sig.sig_bytes()).unwrap();
            let raw = sig.sig.serialize();
            for (slot, from) in [(0, 48), (1, 0), (2, 144), (3, 96)] {
                prop_assert_eq!(&g2[slot * 64..slot * 64 + 16], &[0u8; 16][..]);
                prop_assert_eq!(&g2[slot * 64 + 16..slot * 64 + 64], &raw[from..from + 48]);
            }
        }
    }
}

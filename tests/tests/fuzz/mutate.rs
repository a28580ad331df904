//! Byte-level mutations of valid encodings, shared by the targets.

use proptest::prelude::*;

/// One change to an encoding.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// Flips bit `.1` of the byte at `.0` (modulo the length).
    Flip(usize, u8),
    /// Keeps the first `.0` bytes (modulo the length + 1).
    Truncate(usize),
    /// Inserts bytes at `.0` (modulo the length + 1).
    Insert(usize, Vec<u8>),
    /// Appends bytes (a second field: prost merges messages, appends to
    /// repeated fields, and the last scalar or oneof wins).
    Append(Vec<u8>),
    /// Appends the bytes to themselves (every field twice).
    Double,
}

/// Mutations, appending what `append` draws.
pub fn mutation(append: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(p, b)| Mutation::Flip(p, b)),
        2 => any::<usize>().prop_map(Mutation::Truncate),
        2 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..12))
            .prop_map(|(p, b)| Mutation::Insert(p, b)),
        1 => append.prop_map(Mutation::Append),
        1 => Just(Mutation::Double),
    ]
}

/// `b` after every mutation in `ms`, in order.
pub fn apply(mut b: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        match m {
            Mutation::Flip(p, bit) => {
                if !b.is_empty() {
                    let i = p % b.len();
                    b[i] ^= 1 << (bit % 8);
                }
            }
            Mutation::Truncate(n) => b.truncate(n % (b.len() + 1)),
            Mutation::Insert(p, bytes) => {
                let i = p % (b.len() + 1);
                b.splice(i..i, bytes.iter().copied());
            }
            Mutation::Append(extra) => b.extend_from_slice(extra),
            Mutation::Double => b.extend(b.clone()),
        }
    }
    b
}

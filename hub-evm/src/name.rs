//! The EVM hub's name and contract addresses.
//!
//! Every digest Tally signs for a hub names it (`put_str(hub_chain)`,
//! `docs/signing.md` section 3), so the name is a wire format. An EVM hub
//! is named by where its contract lives:
//!
//! ```text
//! evm:<chain id, decimal>:0x<contract address, 40 lowercase hex digits>
//! ```
//!
//! e.g. `evm:31337:0x5fbdb2315678afecb367f032d93f642f64180aa3`. The
//! contract's `hubName()` answers the same string, and Tally's
//! `hub_chain` parameter must equal it byte for byte. [`HubName`]'s parser
//! accepts only this canonical form (no leading zeros, no sign, no
//! upper-case or mixed-case hex), so a name that parses prints back as the
//! same bytes. The longest name (a 20-digit chain id) is 67 bytes, above
//! the 64 bytes Tally's identifiers allow; chain ids up to 17 digits fit,
//! which covers every public EVM chain.
//!
//! [`create_address`] is the address a plain `CREATE` by `deployer` at
//! account nonce `nonce` gives: the last 20 bytes of
//! `keccak256(rlp([deployer, nonce]))`.

use std::fmt;
use std::str::FromStr;

use alloy_primitives::{keccak256, Address};

/// The name's fixed prefix.
pub const PREFIX: &str = "evm:";

/// An EVM hub: the chain its contract is on and the contract's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HubName {
    /// The EVM chain id (`eth_chainId`).
    pub chain_id: u64,
    /// The hub contract.
    pub address: Address,
}

/// Why a string is not a hub name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not `evm:<chain id>:0x<address>`.
    #[error("{0:?} is not a hub name: want evm:<decimal chain id>:0x<40 lowercase hex digits>")]
    Shape(String),
    /// The chain id is not a canonical decimal `u64` (digits only, no
    /// leading zero, not zero, at most `u64::MAX`).
    #[error("hub name {name:?}: chain id {id:?} is not a decimal number from 1 to 2^64-1 without leading zeros")]
    ChainId {
        /// The name.
        name: String,
        /// Its chain id part.
        id: String,
    },
    /// The address is not `0x` and 40 lowercase hex digits.
    #[error("hub name {name:?}: address {address:?} is not 0x and 40 lowercase hex digits")]
    Address {
        /// The name.
        name: String,
        /// Its address part.
        address: String,
    },
}

impl HubName {
    /// The hub of contract `address` on chain `chain_id`.
    pub fn new(chain_id: u64, address: Address) -> Self {
        Self { chain_id, address }
    }
}

impl fmt::Display for HubName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}:0x{}",
            self.chain_id,
            hex::encode(self.address.as_slice())
        )
    }
}

impl FromStr for HubName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, NameError> {
        let shape = || NameError::Shape(s.to_string());
        let rest = s.strip_prefix(PREFIX).ok_or_else(shape)?;
        let (id, addr) = rest.split_once(':').ok_or_else(shape)?;
        let chain_id = parse_chain_id(id).ok_or_else(|| NameError::ChainId {
            name: s.to_string(),
            id: id.to_string(),
        })?;
        let address = parse_lower_address(addr).ok_or_else(|| NameError::Address {
            name: s.to_string(),
            address: addr.to_string(),
        })?;
        Ok(Self { chain_id, address })
    }
}

/// A canonical non-zero decimal `u64`.
fn parse_chain_id(id: &str) -> Option<u64> {
    if id.is_empty() || id.starts_with('0') || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok()
}

/// `0x` and exactly 40 lowercase hex digits.
fn parse_lower_address(a: &str) -> Option<Address> {
    let digits = a.strip_prefix("0x")?;
    if digits.len() != 40
        || !digits
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let bytes = hex::decode(digits).ok()?;
    Some(Address::from_slice(&bytes))
}

/// The address a `CREATE` by `deployer` at account nonce `nonce` makes:
/// `keccak256(rlp([deployer, nonce]))[12..]`.
///
/// The RLP is built here by hand: the 20-byte address is a string
/// (`0x94 || address`), the nonce its minimal big-endian bytes (`0x80`
/// for 0, the byte itself below `0x80`, else `0x80 + len || bytes`), and
/// the list prefix `0xc0 + payload length` (the payload is at most 30
/// bytes, so the short form always applies).
pub fn create_address(deployer: Address, nonce: u64) -> Address {
    let mut payload = Vec::with_capacity(30);
    payload.push(0x80 + 20);
    payload.extend_from_slice(deployer.as_slice());
    let be = nonce.to_be_bytes();
    let first = be.iter().position(|&b| b != 0).unwrap_or(be.len());
    let minimal = &be[first..];
    match minimal {
        [] => payload.push(0x80),
        [b] if *b < 0x80 => payload.push(*b),
        _ => {
            payload.push(0x80 + minimal.len() as u8);
            payload.extend_from_slice(minimal);
        }
    }
    let mut rlp = Vec::with_capacity(31);
    rlp.push(0xc0 + payload.len() as u8);
    rlp.extend_from_slice(&payload);
    Address::from_slice(&keccak256(&rlp)[12..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr(s: &str) -> Address {
        s.parse().unwrap()
    }

    #[test]
    fn anvils_first_deployment_address() {
        // anvil's first dev account deploying its first contract.
        let deployer = addr("0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266");
        assert_eq!(
            create_address(deployer, 0),
            addr("0x5FbDB2315678afecb367f032d93F642f64180aa3")
        );
        // The next two deployments, as anvil and hardhat print them.
        assert_eq!(
            create_address(deployer, 1),
            addr("0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512")
        );
        assert_eq!(
            create_address(deployer, 2),
            addr("0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
        );
    }

    #[test]
    fn names_print_and_parse() {
        let n = HubName::new(31337, addr("0x5FbDB2315678afecb367f032d93F642f64180aa3"));
        let s = n.to_string();
        assert_eq!(s, "evm:31337:0x5fbdb2315678afecb367f032d93f642f64180aa3");
        assert_eq!(s.parse::<HubName>(), Ok(n));
    }

    #[test]
    fn non_canonical_names_are_refused() {
        let a = "0x5fbdb2315678afecb367f032d93f642f64180aa3";
        for bad in [
            "".to_string(),
            "evm".into(),
            format!("evm:31337{a}"),
            format!("EVM:31337:{a}"),
            format!("hub:31337:{a}"),
        ] {
            assert_eq!(bad.parse::<HubName>(), Err(NameError::Shape(bad.clone())));
        }
        for id in [
            "",
            "0",
            "031337",
            "+1",
            "-1",
            "1 ",
            "18446744073709551616",
            "1e3",
        ] {
            let s = format!("evm:{id}:{a}");
            assert!(
                matches!(s.parse::<HubName>(), Err(NameError::ChainId { .. })),
                "{s}"
            );
        }
        for ad in [
            "5fbdb2315678afecb367f032d93f642f64180aa3",
            "0x5FbDB2315678afecb367f032d93F642f64180aa3",
            "0X5fbdb2315678afecb367f032d93f642f64180aa3",
            "0x5fbdb2315678afecb367f032d93f642f64180aa",
            "0x5fbdb2315678afecb367f032d93f642f64180aa30",
            "0x5fbdb2315678afecb367f032d93f642f64180aag",
            "0x5fbdb2315678afecb367f032d93f642f64180aa3:1",
        ] {
            let s = format!("evm:1:{ad}");
            assert!(
                matches!(s.parse::<HubName>(), Err(NameError::Address { .. })),
                "{s}"
            );
        }
    }

    proptest! {
        /// The hand-built RLP agrees with alloy's own `Address::create`
        /// at every nonce length (0, one byte below and above 0x80, ...).
        #[test]
        fn create_address_agrees_with_alloy(a in any::<[u8; 20]>(), nonce in any::<u64>(), shift in 0u32..64) {
            let deployer = Address::from(a);
            let n = nonce >> shift;
            prop_assert_eq!(create_address(deployer, n), deployer.create(n));
        }

        /// Every name prints to a string that parses back to it, and is
        /// the same string when printed again.
        #[test]
        fn names_roundtrip(id in 1u64.., a in any::<[u8; 20]>()) {
            let n = HubName::new(id, Address::from(a));
            let s = n.to_string();
            prop_assert_eq!(s.parse::<HubName>(), Ok(n));
            prop_assert_eq!(s.parse::<HubName>().unwrap().to_string(), s);
        }
    }
}

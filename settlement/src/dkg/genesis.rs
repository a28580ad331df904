//! The genesis validator set: CometBFT's validators, every one at the same
//! power. No encryption key is registered in advance: each ceremony's
//! players register keys made for that round (ADR 0018), so the first key
//! starts at the first block.

use tally_store::Kv;

use super::msg::address_of;
use super::rules::MAX_POWER;
use super::state::{put_validator, MAX_VALIDATORS};
use crate::genesis::GenesisError;
use crate::proto::ValidatorRecord;

/// Stores the genesis validators (CometBFT's ed25519 keys and powers).
pub fn init_validators(
    kv: &mut impl Kv,
    validators: &[([u8; 32], u64)],
) -> Result<(), GenesisError> {
    if validators.len() > MAX_VALIDATORS {
        return Err(GenesisError::Invalid(format!(
            "{} validators, at most {}",
            validators.len(),
            MAX_VALIDATORS
        )));
    }
    check_powers(validators)?;
    for (k, power) in validators {
        put_validator(
            kv,
            &address_of(k),
            &ValidatorRecord {
                pubkey: k.to_vec(),
                power: *power,
            },
        );
    }
    Ok(())
}

/// Every validator has the same power (ADR 0017), within the cap that keeps
/// a full set under CometBFT's total.
fn check_powers(validators: &[([u8; 32], u64)]) -> Result<(), GenesisError> {
    let bad = |m: String| GenesisError::Invalid(m);
    if let Some((_, p)) = validators.first() {
        if validators.iter().any(|(_, q)| q != p) {
            return Err(bad(
                "genesis validators have unequal powers: Tally keeps one common power (ADR 0017)"
                    .into(),
            ));
        }
        if *p == 0 || *p > MAX_POWER {
            return Err(bad(format!(
                "validator power must be 1..={MAX_POWER}, not {p}"
            )));
        }
    }
    Ok(())
}

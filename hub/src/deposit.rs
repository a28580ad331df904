//! Deposits and what leaves escrow for the depositor (ADR 0020).
//!
//! - `Deposit {user, amount}` adds `amount` to `escrow/<user>`.
//! - `Deposit {user, amount, pubkey}` also binds `pubkey` to `user`
//!   (`ukey/<user>`): only the deposit that first funds the user does
//!   (its escrow is 0 and no key is bound), and it pays the hub's
//!   `registration_fee` out of `amount` (kept under `meta/fees`; the
//!   deposit credits `amount - fee`), so a name costs something to take.
//!   The deposit record carries the key, and the settlement chain binds it
//!   as the user's key (it ignores the key for a user it already knows).
//!   A later keyed deposit with the same key is a plain top-up (no fee, no
//!   key in the record); with another key it is refused (code 7), as is a
//!   key that is not a 32-byte ed25519 point (the settlement chain's own
//!   check, so nothing the hub takes can stop its deposit cursor).
//! - Every deposit takes the next number from `meta/deposit_seq` and is
//!   recorded as `{seq, user, amount, height[, pubkey, fee]}` under
//!   `dep/<height><seq>`.
//! - A withdrawal (a batch call of kind 1, see [`crate::machine`]) moves
//!   credits from escrow to `withdrawn/<user>`: paid out to the user.

use serde_json::json;
use tally_hub_types::{Deposit, HubCode};
use tally_settlement::sync::deposits::check_deposit_key;
use tally_store::{Kv, KvRead, StoreError};

use crate::kv::{get_u64, HubResult, DEPOSIT, DEPOSIT_SEQ, ESCROW};

/// `ukey/<user>`: the key a keyed deposit bound to the user.
pub const USER_KEY: &[u8] = b"ukey/";
/// `withdrawn/<user>`: credits paid out to the user by withdrawals.
pub const WITHDRAWN: &[u8] = b"withdrawn/";
/// `meta/fees`: registration fees kept.
pub const FEES: &[u8] = b"meta/fees";

fn refuse(log: String) -> HubResult {
    HubResult {
        code: HubCode::BadDeposit,
        log,
        value: Vec::new(),
    }
}

/// Runs `d` at `height`; `fee` is the hub's registration fee.
pub fn deposit(
    kv: &mut impl Kv,
    height: u64,
    d: &Deposit,
    fee: u64,
) -> Result<HubResult, StoreError> {
    if d.amount == 0 || tally_settlement::ident::check_party("user", &d.user).is_err() {
        return Ok(refuse(
            "deposit needs a valid user and an amount > 0".into(),
        ));
    }
    let ek = [ESCROW, d.user.as_bytes()].concat();
    let escrow = get_u64(kv, &ek)?;
    let kk = [USER_KEY, d.user.as_bytes()].concat();
    let bound = kv.get(&kk)?;
    // (credited, the key to record and bind, the fee kept)
    let (credited, bind, kept) = if d.pubkey.is_empty() {
        (d.amount, None, 0)
    } else {
        let key = match check_deposit_key(&d.pubkey) {
            Ok(k) => k,
            Err(why) => return Ok(refuse(why)),
        };
        match bound {
            Some(b) if b.as_slice() == key.as_slice() => (d.amount, None, 0),
            Some(_) => {
                return Ok(refuse(format!(
                    "user {} is bound to another key: deposit without a key, or with that one",
                    d.user
                )))
            }
            None if escrow > 0 => {
                return Ok(refuse(format!(
                    "user {} already holds {escrow} credits: a key is bound only by the deposit that first funds a user",
                    d.user
                )))
            }
            None if d.amount <= fee => {
                return Ok(refuse(format!(
                    "a deposit that binds a key must be above the registration fee {fee}"
                )))
            }
            None => (d.amount - fee, Some(key), fee),
        }
    };
    let Some(bal) = escrow.checked_add(credited) else {
        return Ok(refuse("escrow would overflow".into()));
    };
    let seq = get_u64(kv, DEPOSIT_SEQ)? + 1;
    kv.put(ek, bal.to_be_bytes().to_vec());
    kv.put(DEPOSIT_SEQ.to_vec(), seq.to_be_bytes().to_vec());
    let mut ev = json!({"seq": seq, "user": d.user, "amount": credited, "height": height});
    if let Some(key) = bind {
        kv.put(kk, key.to_vec());
        let fees = get_u64(kv, FEES)?.saturating_add(kept);
        kv.put(FEES.to_vec(), fees.to_be_bytes().to_vec());
        ev["pubkey"] = json!(hex::encode(key));
        ev["fee"] = json!(kept);
    }
    kv.put(
        [DEPOSIT, &height.to_be_bytes(), &seq.to_be_bytes()].concat(),
        ev.to_string().into_bytes(),
    );
    Ok(HubResult {
        code: HubCode::Ok,
        log: format!("deposit {seq}: {credited} credits for {}", d.user),
        value: ev.to_string().into_bytes(),
    })
}

/// Credits paid out to `user` by withdrawals.
pub fn withdrawn(kv: &impl KvRead, user: &str) -> Result<u64, StoreError> {
    get_u64(kv, &[WITHDRAWN, user.as_bytes()].concat())
}

/// Adds `amount` to what withdrawals paid out to `user`.
pub fn add_withdrawn(kv: &mut impl Kv, user: &str, amount: u64) -> Result<(), StoreError> {
    let k = [WITHDRAWN, user.as_bytes()].concat();
    let v = get_u64(kv, &k)?.saturating_add(amount);
    kv.put(k, v.to_be_bytes().to_vec());
    Ok(())
}

/// The key bound to `user` (hex), if any.
pub fn bound_key(kv: &impl KvRead, user: &str) -> Result<Option<String>, StoreError> {
    Ok(kv
        .get(&[USER_KEY, user.as_bytes()].concat())?
        .map(hex::encode))
}

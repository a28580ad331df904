//! Gateways after genesis (ADR 0020): a `gateway` proposal adds, rotates
//! the key of, suspends, resumes or removes a gateway, carried out by the
//! transaction that accepts it.
//!
//! | op | needs | effect |
//! |---|---|---|
//! | 1 add | a name and a key never registered | the key reports under the name |
//! | 2 rotate | an active gateway, no earlier rotation still in grace, a key never registered | the new key reports under the same name and identity; the old one until `max_report_expiry_secs` after this block, then code 36 |
//! | 3 suspend | an active gateway | its keys' reports are refused (code 35) |
//! | 4 resume | a suspended gateway | they are accepted again |
//! | 5 remove | a gateway not removed | its keys' reports are refused for good (code 35); the name and keys are never registered again |
//!
//! What a gateway already reported stays: its records, its report ids
//! (a report a rotated gateway signs again with its new key is still a
//! duplicate: ids are remembered under the gateway's first key) and the
//! allowances users gave it by name.

use ed25519_dalek::VerifyingKey;
use tally_store::{Kv, KvRead};

use crate::error::Fatal;
use crate::ident::check_party;
use crate::proto::GatewayChange;
use crate::state::chain::{last_time, params};
use crate::state::gateway::{
    gateway_key, gateway_keys, put_gateway_key, put_gateway_keys, GatewayKey, GatewayKeys,
};
use crate::types::Event;

/// What a gateway change does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Register a new gateway.
    Add,
    /// Replace its key.
    Rotate,
    /// Refuse its reports until resumed.
    Suspend,
    /// Accept its reports again.
    Resume,
    /// Refuse its reports for good.
    Remove,
}

impl Op {
    /// The op numbered `v` (`GatewayChange.op`).
    pub fn from_value(v: u32) -> Option<Op> {
        Some(match v {
            1 => Op::Add,
            2 => Op::Rotate,
            3 => Op::Suspend,
            4 => Op::Resume,
            5 => Op::Remove,
            _ => return None,
        })
    }

    /// Its name in events, queries and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Op::Add => "add",
            Op::Rotate => "rotate",
            Op::Suspend => "suspend",
            Op::Resume => "resume",
            Op::Remove => "remove",
        }
    }

    fn takes_key(self) -> bool {
        matches!(self, Op::Add | Op::Rotate)
    }
}

/// What [`check`] found: the op, and the gateway's keys (none for an add).
struct Checked {
    op: Op,
    keys: Option<GatewayKeys>,
    current: Option<GatewayKey>,
    new_key: Option<[u8; 32]>,
}

/// Whether change `c` can be carried out now; the reason it cannot
/// otherwise. Checked when the proposal opens and when it is accepted.
pub fn check(kv: &impl KvRead, c: Option<&GatewayChange>) -> Result<Result<(), String>, Fatal> {
    Ok(checked(kv, c)?.map(|_| ()))
}

fn checked(kv: &impl KvRead, c: Option<&GatewayChange>) -> Result<Result<Checked, String>, Fatal> {
    let Some(c) = c else {
        return Ok(Err("a gateway proposal carries a change".into()));
    };
    let Some(op) = Op::from_value(c.op) else {
        return Ok(Err(format!("unknown gateway op {}", c.op)));
    };
    if let Err(e) = check_party("gateway name", &c.name) {
        return Ok(Err(e.to_string()));
    }
    let new_key = match (op.takes_key(), c.pubkey.as_slice()) {
        (false, []) => None,
        (false, _) => return Ok(Err(format!("a gateway {} carries no key", op.name()))),
        (true, k) => {
            let Ok(k) = <[u8; 32]>::try_from(k) else {
                return Ok(Err("the gateway key is not 32 bytes".into()));
            };
            if VerifyingKey::from_bytes(&k).is_err() {
                return Ok(Err("the gateway key is not an ed25519 point".into()));
            }
            if let Some(g) = gateway_key(kv, &k)? {
                return Ok(Err(format!(
                    "key {} is registered already (gateway {})",
                    hex::encode(k),
                    g.name
                )));
            }
            Some(k)
        }
    };
    let keys = gateway_keys(kv, &c.name)?;
    let current = match &keys {
        Some(k) => gateway_key(kv, &k.current)?,
        None => None,
    };
    let now = last_time(kv)?;
    let why = match (op, &current) {
        (Op::Add, Some(_)) => Some(format!("gateway {} exists already", c.name)),
        (Op::Add, None) => None,
        (_, None) => Some(format!("no gateway {}", c.name)),
        (_, Some(g)) if g.removed => Some(format!("gateway {} was removed", c.name)),
        (Op::Rotate | Op::Suspend, Some(g)) if g.suspended => {
            Some(format!("gateway {} is suspended", c.name))
        }
        (Op::Resume, Some(g)) if !g.suspended => {
            Some(format!("gateway {} is not suspended", c.name))
        }
        (Op::Rotate, Some(_)) => in_grace(kv, keys.as_ref(), now)?.map(|until| {
            format!(
                "gateway {}'s previous key is in its grace until {until}: rotate again after it",
                c.name
            )
        }),
        _ => None,
    };
    Ok(match why {
        Some(why) => Err(why),
        None => Ok(Checked {
            op,
            keys,
            current,
            new_key,
        }),
    })
}

/// When the key a rotation replaced stops being accepted, if that is
/// still ahead of `now`.
fn in_grace(kv: &impl KvRead, keys: Option<&GatewayKeys>, now: u64) -> Result<Option<u64>, Fatal> {
    let Some(prev) = keys.and_then(|k| k.previous) else {
        return Ok(None);
    };
    Ok(gateway_key(kv, &prev)?
        .and_then(|g| g.retired_until)
        .filter(|until| *until > now))
}

/// Carries out change `c` of accepted proposal `proposal` (its check
/// passed at this height); returns the `gateway_changed` event.
pub fn enact(kv: &mut impl Kv, proposal: u64, c: &GatewayChange) -> Result<Event, Fatal> {
    let Ok(Checked {
        op,
        keys,
        current,
        new_key,
    }) = checked(kv, Some(c))?
    else {
        return Err(Fatal::Corrupt("checked gateway change"));
    };
    let now = last_time(kv)?;
    let mut attrs = vec![
        ("proposal", proposal.to_string()),
        ("op", op.name().to_string()),
        ("name", c.name.clone()),
    ];
    match (op, keys, current, new_key) {
        (Op::Add, _, _, Some(k)) => {
            put_gateway_key(kv, &k, &GatewayKey::fresh(&c.name, &k));
            put_gateway_keys(
                kv,
                &c.name,
                &GatewayKeys {
                    current: k,
                    previous: None,
                },
            );
            attrs.push(("pubkey", hex::encode(k)));
        }
        (Op::Rotate, Some(keys), Some(old), Some(k)) => {
            let until = now.saturating_add(params(kv)?.max_report_expiry_secs);
            let fresh = GatewayKey {
                retired_until: None,
                ..old.clone()
            };
            put_gateway_key(kv, &k, &fresh);
            let retired = GatewayKey {
                retired_until: Some(until),
                ..old
            };
            put_gateway_key(kv, &keys.current, &retired);
            put_gateway_keys(
                kv,
                &c.name,
                &GatewayKeys {
                    current: k,
                    previous: Some(keys.current),
                },
            );
            attrs.push(("pubkey", hex::encode(k)));
            attrs.push(("old_key_until", until.to_string()));
        }
        (Op::Suspend | Op::Resume | Op::Remove, Some(keys), Some(_), None) => {
            for key in std::iter::once(keys.current).chain(keys.previous) {
                if let Some(mut g) = gateway_key(kv, &key)? {
                    match op {
                        Op::Suspend => g.suspended = true,
                        Op::Resume => g.suspended = false,
                        _ => g.removed = true,
                    }
                    put_gateway_key(kv, &key, &g);
                }
            }
        }
        _ => return Err(Fatal::Corrupt("checked gateway change")),
    }
    let mut ev = Event::new("gateway_changed", []);
    ev.attrs = attrs.into_iter().map(|(k, v)| (k.into(), v)).collect();
    Ok(ev)
}

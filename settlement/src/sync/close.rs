//! Window close, incrementally: a closed window's owed entries become
//! escrowed hub calls, at most `max_close_per_block` of them per block.
//!
//! Each `owed/<window>/<provider>\0<user>` entry becomes one call `{id,
//! user, provider, amount, window}` with the next id from
//! `meta/next_call_id`, pending for the hub chain named by `hub_chain`. The
//! credits already left the user's balance when the report was accepted,
//! so they are escrowed: nothing later on Tally can spend them. From app
//! version 4 an entry owed to a provider whose verdict for the window is a
//! breach (ADR 0021) first gives the user back the credit
//! ([`crate::slo::judge::credit_on`]); the call carries the rest, and an
//! entry credited in full makes no call.
//!
//! A window that closes joins the closing queue (`closing/<window>`, oldest
//! window first) unless the block converts all of it at once. Every block
//! converts owed entries from the front of the queue, in owed-key order,
//! giving each the next call id, and range-deletes the ones it converted;
//! the queue entry keeps the last entry converted as its cursor, so a
//! block's work is one bounded scan whatever was converted before. Call
//! ids are therefore the same as if each window were converted whole when
//! it closed, only spread over blocks. The block that closes a window
//! converts it at once, without touching the queue, when the queue is
//! empty and the window fits the budget. A block with an empty queue and
//! no window closing reads one key range and writes nothing.
//!
//! Each block that converts emits `hub_calls_made {window, calls,
//! first_id, last_id}` per window, and `window_converted {window,
//! hub_calls}` when a window's last entry is converted; `/windows` reports
//! a window `converting` until then.

use tally_store::{Kv, KvRead};

use crate::error::Fatal;
use crate::genesis::Params;
use crate::proto::HubCall;
use crate::slo::judge::{credit_on, put_verdict, verdict, Status, Verdict};
use crate::state::chain::{
    balance, clear_owed, clear_owed_through, delete_closing, oldest_closing, owed_page, params_at,
    put_balance, put_closing, Closing, Owed,
};
use crate::state::sync::{next_call_id, put_next_call_id, put_pending_call};
use crate::types::Event;

/// The start-of-block conversion: `closed` is the window this block closed,
/// if any (it is newer than every window in the queue). Converts at most
/// `p.max_close_per_block` owed entries, oldest closing window first, into
/// pending hub calls on the hub chain of each window's own parameters
/// ([`params_at`]). Emits `hub_calls_made {window,
/// calls, first_id, last_id}` per window it converted entries of, and
/// `window_converted {window, hub_calls}` when a window has none left.
pub fn convert_closed(
    kv: &mut impl Kv,
    closed: Option<u64>,
    p: &Params,
) -> Result<Vec<Event>, Fatal> {
    let mut events = Vec::new();
    let mut left = p.max_close_per_block as usize;
    let mut fresh = closed.map(Closing::new);
    loop {
        let (mut c, stored) = match oldest_closing(kv)? {
            Some(c) => (c, true),
            None => match fresh.take() {
                Some(c) => (c, false),
                None => break,
            },
        };
        if left == 0 {
            if !stored {
                fresh = Some(c);
            }
            break;
        }
        let last = c.last.as_ref().map(|(p, u)| (p.as_str(), u.as_str()));
        let rows = owed_page(kv, c.window, last, left.saturating_add(1))?;
        let done = rows.len() <= left;
        let made = rows.len().min(left);
        if made > 0 {
            events.extend(make_calls(kv, &mut c, rows.into_iter().take(made))?);
            left -= made;
        }
        if !done {
            if let Some((provider, user)) = &c.last {
                clear_owed_through(kv, c.window, provider, user);
            }
            put_closing(kv, &c);
            break;
        }
        // Entries were converted (a fully credited one makes no call).
        if c.last.is_some() {
            clear_owed(kv, c.window);
            events.push(Event::new(
                "window_converted",
                [
                    ("window", c.window.to_string()),
                    ("hub_calls", c.calls.to_string()),
                ],
            ));
        }
        if stored {
            delete_closing(kv, c.window);
        }
    }
    // The budget ran out before the window closed by this block was
    // reached: it waits in the queue if it owes anything.
    if let Some(c) = fresh {
        if !owed_page(kv, c.window, None, 1)?.is_empty() {
            put_closing(kv, &c);
        }
    }
    Ok(events)
}

/// Turns `rows` (owed entries of window `c`, in owed-key order) into
/// pending hub calls with consecutive ids, moving `c`'s cursor and count
/// past them; returns the `hub_calls_made` event and one `slo_credited`
/// event per provider whose breach credited users back. A breached
/// provider's entry becomes a call for what is left after the credit
/// ([`crate::slo::judge::credit_on`]), and none when nothing is left; the
/// credit goes back to the user's balance.
fn make_calls(
    kv: &mut impl Kv,
    c: &mut Closing,
    rows: impl ExactSizeIterator<Item = Owed>,
) -> Result<Vec<Event>, Fatal> {
    // The window's own parameters name its hub chain (ADR 0020).
    let hub = params_at(kv, c.window)?.hub_chain;
    let first = next_call_id(kv)?;
    let mut next = first;
    let mut credits = Credits::default();
    for o in rows {
        let credit = credits.credit(kv, c.window, &o)?;
        c.last = Some((o.provider.clone(), o.user.clone()));
        if credit > 0 {
            put_balance(kv, &o.user, balance(kv, &o.user)?.saturating_add(credit));
        }
        if credit == o.amount {
            continue;
        }
        let call = HubCall {
            id: next,
            provider: o.provider,
            user: o.user,
            amount: o.amount - credit,
            window: c.window,
            kind: 0,
        };
        put_pending_call(kv, &hub, &call);
        next = next.saturating_add(1);
    }
    let mut events = credits.finish(kv);
    put_next_call_id(kv, next);
    let made = next - first;
    c.calls = c.calls.saturating_add(made);
    if made > 0 {
        events.insert(
            0,
            Event::new(
                "hub_calls_made",
                [
                    ("window", c.window.to_string()),
                    ("calls", made.to_string()),
                    ("first_id", first.to_string()),
                    ("last_id", (next - 1).to_string()),
                ],
            ),
        );
    }
    Ok(events)
}

/// The verdicts met while converting one page, with what they credited.
#[derive(Default)]
struct Credits {
    /// The provider of the last entry, and its verdict if it breached.
    current: Option<(String, Option<Verdict>)>,
    /// Breached verdicts done with, credited.
    done: Vec<Verdict>,
}

impl Credits {
    /// The credit on entry `o` of `window`, counted in its verdict.
    fn credit(&mut self, kv: &impl KvRead, window: u64, o: &Owed) -> Result<u64, Fatal> {
        if self.current.as_ref().is_none_or(|(p, _)| *p != o.provider) {
            if let Some((_, Some(v))) = self.current.take() {
                self.done.push(v);
            }
            let v = verdict(kv, &o.provider, window)?
                .filter(|v| v.status == Status::Breached && v.policy.credit_ppm > 0);
            self.current = Some((o.provider.clone(), v));
        }
        let Some((_, Some(v))) = self.current.as_mut() else {
            return Ok(0);
        };
        let credit = credit_on(Some(v), o.amount);
        if credit > 0 {
            v.credited = v.credited.saturating_add(credit);
            v.credited_users += 1;
        }
        Ok(credit)
    }

    /// Stores the verdicts that credited anything; their events.
    fn finish(mut self, kv: &mut impl Kv) -> Vec<Event> {
        if let Some((_, Some(v))) = self.current.take() {
            self.done.push(v);
        }
        self.done
            .into_iter()
            .map(|v| {
                put_verdict(kv, &v);
                Event::new(
                    "slo_credited",
                    [
                        ("window", v.window.to_string()),
                        ("provider", v.provider.clone()),
                        ("credited", v.credited.to_string()),
                        ("users", v.credited_users.to_string()),
                    ],
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;

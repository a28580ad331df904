//! Table rendering for `tallyd query`: fixed-width columns for records,
//! windows, hub calls and gateways, and `key: value` lines for flat objects.

use std::io::{self, Write};

use serde_json::Value;
use tally_settlement::{RouteRecordView, WindowView};

/// Writes `more: --cursor C` when the page has a next cursor.
pub fn more(out: &mut impl Write, page: &Value) -> io::Result<()> {
    if let Some(c) = page["next_cursor"].as_str() {
        writeln!(out, "more: --cursor {c}")?;
    }
    Ok(())
}

/// Route records, one per line, or `(no records)`.
pub fn records(out: &mut impl Write, rs: &[RouteRecordView]) -> io::Result<()> {
    writeln!(
        out,
        "{:>10} {:<20} {:<12} {:<12} {:<16} {:<16} {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>8} {:>8}",
        "WINDOW", "START", "USER", "PROVIDER", "MODEL", "ROUTE", "REQ", "OK", "FAIL", "RATE", "AUTH", "TRANS", "UNKN", "CLIENT", "CANCEL", "UNITS", "AMOUNT"
    )?;
    for r in rs {
        writeln!(
            out,
            "{:>10} {:<20} {:<12} {:<12} {:<16} {:<16} {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>8} {:>8}",
            r.window, r.window_start, r.user, r.provider, r.model, r.route, r.requests, r.ok, r.fail_count,
            r.rate_limit, r.auth, r.transient, r.unknown, r.client, r.cancel, r.units, r.amount
        )?;
    }
    if rs.is_empty() {
        writeln!(out, "(no records)")?;
    }
    Ok(())
}

/// Settlement windows with their totals.
pub fn windows(out: &mut impl Write, ws: &[WindowView]) -> io::Result<()> {
    writeln!(
        out,
        "{:>10} {:<20} {:<6} {:>6} {:>8} {:>6} {:>6} {:>6} {:>10}",
        "WINDOW", "START", "CLOSED", "ROUTES", "REQ", "FAIL", "CANCEL", "CLIENT", "AMOUNT"
    )?;
    for w in ws {
        writeln!(
            out,
            "{:>10} {:<20} {:<6} {:>6} {:>8} {:>6} {:>6} {:>6} {:>10}",
            w.window,
            w.window_start,
            w.closed,
            w.routes,
            w.requests,
            w.fail_count,
            w.cancel,
            w.client,
            w.amount
        )?;
    }
    Ok(())
}

/// Registered gateways (`{"name", "pubkey"}` objects).
pub fn gateways(out: &mut impl Write, gws: &[Value]) -> io::Result<()> {
    writeln!(out, "{:<20} PUBKEY", "NAME")?;
    for g in gws {
        writeln!(
            out,
            "{:<20} {}",
            g["name"].as_str().unwrap_or(""),
            g["pubkey"].as_str().unwrap_or("")
        )?;
    }
    Ok(())
}

/// A user's allowances, one row per gateway.
pub fn allowances(out: &mut impl Write, rows: &[Value]) -> io::Result<()> {
    writeln!(
        out,
        "{:<20} {:>20} {:>20} {:>12} {:>8}",
        "GATEWAY", "MAX/WINDOW", "USED", "EXPIRES_AT", "EXPIRED"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<20} {:>20} {:>20} {:>12} {:>8}",
            r["gateway"].as_str().unwrap_or(""),
            r["max_per_window"].as_u64().unwrap_or(0),
            r["used"].as_u64().unwrap_or(0),
            r["expires_at"].as_u64().unwrap_or(0),
            r["expired"].as_bool().unwrap_or(false)
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no allowances)")?;
    }
    Ok(())
}

/// Hub calls; a settled call is marked, one past its retention shows only
/// its id.
pub fn calls(out: &mut impl Write, calls: &[Value]) -> io::Result<()> {
    writeln!(
        out,
        "{:>8} {:<16} {:<16} {:>12} {:>10}",
        "CALL", "USER", "PROVIDER", "AMOUNT", "WINDOW"
    )?;
    for c in calls {
        if c["pruned"] == true || c["user"].is_null() {
            writeln!(out, "{:>8} (settled, body pruned)", c["id"])?;
        } else {
            writeln!(
                out,
                "{:>8} {:<16} {:<16} {:>12} {:>10}{}",
                c["id"],
                c["user"].as_str().unwrap_or(""),
                c["provider"].as_str().unwrap_or(""),
                c["amount"],
                c["window"],
                if c["settled"] == true {
                    "  settled"
                } else {
                    ""
                }
            )?;
        }
    }
    Ok(())
}

/// An object as `key: value` lines (strings unquoted); anything else as
/// JSON on one line.
pub fn flat(out: &mut impl Write, v: &Value) -> io::Result<()> {
    if let Some(o) = v.as_object() {
        for (k, v) in o {
            match v {
                Value::String(s) => writeln!(out, "{k}: {s}")?,
                other => writeln!(out, "{k}: {other}")?,
            }
        }
    } else {
        writeln!(out, "{v}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(f: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> String {
        let mut out = Vec::new();
        f(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn flat_unquotes_strings_only_in_key_order() {
        let v = json!({"chain": "hub", "running": false, "nonce": null, "n": 3});
        assert_eq!(
            text(|o| flat(o, &v)),
            "chain: hub\nn: 3\nnonce: null\nrunning: false\n"
        );
        assert_eq!(text(|o| flat(o, &json!([1]))), "[1]\n");
    }

    #[test]
    fn calls_and_gateways_print_as_they_always_have() {
        let cs = [
            json!({"id": 1, "user": "alice", "provider": "acme", "amount": 10, "window": 5}),
            json!({"id": 2, "settled": true, "pruned": true}),
        ];
        // JSON numbers ignore the column width (serde_json's Display does
        // not pad); kept as is so the output stays what scripts have seen.
        assert_eq!(
            text(|o| calls(o, &cs)),
            "    CALL USER             PROVIDER               AMOUNT     WINDOW\n\
             1 alice            acme             10 5\n\
             2 (settled, body pruned)\n"
        );
        let gs = [json!({"name": "gw", "pubkey": "ab"})];
        assert_eq!(
            text(|o| gateways(o, &gs)),
            "NAME                 PUBKEY\ngw                   ab\n"
        );
    }

    #[test]
    fn empty_records_say_so_and_pages_offer_the_cursor() {
        let t = text(|o| records(o, &[]));
        assert!(t.starts_with("    WINDOW START"), "{t}");
        assert!(t.ends_with("(no records)\n"), "{t}");
        assert_eq!(
            text(|o| more(o, &json!({"next_cursor": "0a"}))),
            "more: --cursor 0a\n"
        );
        assert_eq!(text(|o| more(o, &json!({"next_cursor": null}))), "");
    }
}

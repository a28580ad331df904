//! `/windows`: every window any report landed in, with its totals, whether
//! it closed and whether its payments are still becoming hub calls;
//! windows whose SLA records were pruned are not listed, and `kept_from`
//! names the first listed (app version 7).

use serde_json::{json, Value};

use super::ask::{foreign_cursor, Ask, Page};
use crate::error::ExecError;
use crate::record::WindowView;
use crate::state::chain::{is_closing, params};
use crate::state::listing;
use crate::time::rfc3339;

/// `/windows` (paged).
pub fn windows(a: &Ask) -> Result<Value, ExecError> {
    let paging = a.paging()?;
    let secs = params(&a.kv)?.settlement_window_secs;
    let page = listing::windows(&a.kv, paging.cursor.as_deref(), paging.limit)?
        .ok_or_else(foreign_cursor)?;
    let mut windows = Vec::with_capacity(page.items.len());
    for (w, info) in page.items {
        let start = w.saturating_mul(secs);
        windows.push(WindowView {
            window: w,
            window_start: rfc3339(start),
            window_end: rfc3339(start.saturating_add(secs)),
            closed: info.closed,
            converting: info.closed && is_closing(&a.kv, w)?,
            routes: info.routes,
            requests: info.totals.requests,
            fail_count: info.totals.fail_count(),
            cancel: info.totals.cancel,
            client: info.totals.client,
            units: info.totals.units,
            amount: info.totals.amount,
        });
    }
    // From app version 7 (ADR 0026): the first window still listed, once
    // older windows' records were pruned.
    let mut items = json!({ "windows": windows });
    let kept = crate::state::prune::kept_from(&a.kv)?;
    if kept > 0 {
        items["kept_from"] = json!(kept);
    }
    Ok(json!(Page {
        items,
        next_cursor: page.next.map(hex::encode),
    }))
}

//! The SLA route-record queries: one route over all windows or in one
//! window, and a provider's or user's records (`/sla/...`). A window whose
//! records were pruned answers code 28; listings start at the first kept
//! window (app version 7, ADR 0026).

use serde_json::{json, Value};

use super::ask::{bad, foreign_cursor, parse_window, state_fault, Ask, Page};
use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::ident;
use crate::record::{RouteId, RouteRecordView};
use crate::state::chain::{params, route};
use crate::state::listing::{party_routes, route_windows, Party};
use crate::state::prune::check_kept;

/// The route of `/sla/route/{user}/{provider}/{model}/{route}...`, its
/// identifiers checked.
fn route_id(a: &Ask) -> Result<RouteId, ExecError> {
    let (user, provider) = (a.arg("user")?, a.arg("provider")?);
    let (model, route) = (a.arg("model")?, a.arg("route")?);
    ident::check_party("user", user).map_err(|e| bad(e.log))?;
    ident::check_party("provider", provider).map_err(|e| bad(e.log))?;
    ident::check_name("model", model).map_err(|e| bad(e.log))?;
    ident::check_name("route", route).map_err(|e| bad(e.log))?;
    Ok(RouteId {
        user: user.to_string(),
        provider: provider.to_string(),
        model: model.to_string(),
        route: route.to_string(),
    })
}

/// `/sla/route/{user}/{provider}/{model}/{route}`: every window's record.
pub fn route_all(a: &Ask) -> Result<Value, ExecError> {
    let id = route_id(a)?;
    let secs = params(&a.kv)?.settlement_window_secs;
    let paging = a.paging()?;
    let page = route_windows(&a.kv, &id, paging.cursor.as_deref(), paging.limit)?
        .ok_or_else(foreign_cursor)?;
    let records: Vec<_> = page
        .items
        .iter()
        .map(|(w, c)| RouteRecordView::new(&id, *w, secs, c))
        .collect();
    Ok(json!(Page {
        items: json!({ "records": records }),
        next_cursor: page.next.map(hex::encode),
    }))
}

/// `/sla/route/{user}/{provider}/{model}/{route}/{window}`: one record.
pub fn route_window(a: &Ask) -> Result<Value, ExecError> {
    let id = route_id(a)?;
    let secs = params(&a.kv)?.settlement_window_secs;
    a.no_params()?;
    let w = parse_window(a.arg("window")?)?;
    check_kept(&a.kv, w)?;
    let c = route(&a.kv, &id, w).map_err(state_fault)?.ok_or_else(|| {
        reject(
            Code::NotFound,
            format!("no record for that route in window {w}"),
        )
    })?;
    Ok(json!(RouteRecordView::new(&id, w, secs, &c)))
}

fn party(a: &Ask, whose: Party, name: &str) -> Result<Value, ExecError> {
    let party = a.arg(name)?;
    ident::check_party(name, party).map_err(|e| bad(e.log))?;
    let window = a.opt("window").map(parse_window).transpose()?;
    if let Some(w) = window {
        check_kept(&a.kv, w)?;
    }
    let paging = a.paging()?;
    let secs = params(&a.kv)?.settlement_window_secs;
    let cursor = paging.cursor.as_deref();
    let page = party_routes(&a.kv, whose, party, window, cursor, paging.limit)?
        .ok_or_else(foreign_cursor)?;
    let records: Vec<_> = page
        .items
        .iter()
        .map(|(id, w, c)| RouteRecordView::new(id, *w, secs, c))
        .collect();
    Ok(json!(Page {
        items: json!({ "records": records }),
        next_cursor: page.next.map(hex::encode),
    }))
}

/// `/sla/provider/{provider}[/{window}]`.
pub fn provider(a: &Ask) -> Result<Value, ExecError> {
    party(a, Party::Provider, "provider")
}

/// `/sla/user/{user}[/{window}]`.
pub fn user(a: &Ask) -> Result<Value, ExecError> {
    party(a, Party::User, "user")
}

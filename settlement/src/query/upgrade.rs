//! The upgrade queries: `/upgrade` (the app version and the pending plan)
//! and `/upgrade/applied/{name}` (a plan carried out), over
//! [`crate::upgrade`].

use serde_json::{json, Value};

use super::ask::Ask;
use crate::codes::Code;
use crate::error::{reject, ExecError};
use crate::state::chain::app_version;
use crate::upgrade::{applied_plan, pending_plan, plan_json};

/// `/upgrade`: `{"app_version", "pending"}`, `pending` null without a plan.
pub fn upgrade(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let pending = pending_plan(&a.kv)?.as_ref().map(plan_json);
    Ok(json!({ "app_version": app_version(&a.kv)?, "pending": pending }))
}

/// `/upgrade/applied/{name}`: the plan carried out under `name`, its
/// `height` the first block run under its version.
pub fn applied(a: &Ask) -> Result<Value, ExecError> {
    a.no_params()?;
    let name = a.arg("name")?;
    match applied_plan(&a.kv, name)? {
        Some(p) => Ok(plan_json(&p)),
        None => Err(reject(
            Code::NotFound,
            format!("no upgrade {name:?} was carried out"),
        )),
    }
}

//! E2B's filesystem-only pause (`pause(mode="filesystem")`, `keep_memory=False`, the pause
//! body's `memory: false`; `autoPauseMemory: false` for a timeout's auto-pause) on Brig's
//! `pause_files_only`: every process of the sandbox ends and its memory is given back, its
//! files stay. Its resume is a cold boot, as E2B's: the sandbox runs again with nothing
//! running, and the gateway starts its template's start command again (waiting for the ready
//! command), as at create. Such a sandbox is not resumed by traffic (E2B refuses
//! `autoResume` with it): an envd request to it answers "not running" until it is resumed.

use std::time::Duration;

use brig_sdk::{Sandbox, SandboxInfo};
use serde::Deserialize;

use crate::api::{label, start_template, ApiError, TEMPLATE_LABEL};
use crate::Gateway;

/// The label of a sandbox whose timeout pauses it keeping its files only.
pub(crate) const AUTOPAUSE_FILES_LABEL: &str = "e2b.autopause-files";

/// `POST /sandboxes/{id}/pause`'s body (every field optional).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct PauseBody {
    /// `false`: keep the files only.
    pub memory: Option<bool>,
    /// Accepted: Brig's pause never depends on an agent in the sandbox answering.
    #[allow(dead_code)]
    pub require_healthy_guest: Option<bool>,
}

/// Whether `info`'s sandbox pauses keeping its files only when its timeout passes.
pub(crate) fn on_timeout(info: &SandboxInfo) -> bool {
    label(info, AUTOPAUSE_FILES_LABEL).is_some()
}

/// Pauses `sb`: in full, or keeping its files only.
pub(crate) async fn pause(sb: &Sandbox, body: &PauseBody) -> Result<(), ApiError> {
    let paused = match body.memory {
        Some(false) => sb.pause_files_only().await,
        _ => sb.pause().await,
    };
    paused.map_err(ApiError::from_brig)
}

/// After `sb` resumed from `info` (its state before): a sandbox paused keeping its files only
/// starts its template's start command again and answers once the ready command passes.
pub(crate) async fn after_resume(
    gw: &Gateway,
    sb: &Sandbox,
    info: &SandboxInfo,
    timeout: Duration,
) -> Result<(), ApiError> {
    if !info.paused_files_only {
        return Ok(());
    }
    let Some(template) = label(info, TEMPLATE_LABEL) else { return Ok(()) };
    let found = if crate::code_interpreter::is_code_interpreter(template) {
        let admin = gw.admin().await.map_err(|e| {
            ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        })?;
        Some(crate::code_interpreter::ensure(gw, &admin).await?)
    } else {
        gw.inner.templates.resolve(template)
    };
    match found {
        Some(t) => start_template(sb, &t.build, timeout).await,
        None => Ok(()),
    }
}

//! E2B's auto-resume (`lifecycle={"on_timeout": "pause", "auto_resume": True}`, the create
//! body's `autoResume: {enabled: true}`): a request to a sandbox its timeout paused (envd,
//! files, or a port of its own) resumes it first, with its timeout from then on, as E2B's
//! proxy does. Without it such a request answers "not running".

use std::time::Duration;

use brig_sdk::{Sandbox, SandboxInfo, SandboxState};

use crate::Gateway;

/// The label a sandbox made with auto-resume carries.
pub(crate) const AUTORESUME_LABEL: &str = "e2b.autoresume";

/// Whether `info`'s sandbox resumes on a request.
pub(crate) fn wanted(info: &SandboxInfo) -> bool {
    info.labels.iter().any(|(k, v)| k == AUTORESUME_LABEL && v == "true")
}

/// Resumes `sb` (paused, made with auto-resume) and starts its timeout again. Another
/// request that resumed it first is as good.
pub(crate) async fn resume(
    gw: &Gateway,
    sb: &Sandbox,
    info: &SandboxInfo,
) -> Result<(), brig_sdk::Error> {
    if let Err(e) = sb.resume().await {
        match sb.status().await {
            Ok(now) if now.state == SandboxState::Running => {}
            _ => return Err(e),
        }
    }
    tracing::debug!(sandbox = %sb.id(), "auto-resumed on a request");
    // Its E2B timeout is its idle TTL (auto-pause sandboxes pause when it passes).
    let timeout = Duration::from_millis(info.idle_ttl_ms.max(1000));
    let unavailable = |e: crate::api::ApiError| brig_sdk::Error::Server {
        code: brig_sdk::ErrorCode::Unavailable,
        message: e.message().to_string(),
    };
    // Paused keeping its files only: a cold boot, its template's start command again.
    crate::files_only_pause::after_resume(gw, sb, info, timeout).await.map_err(unavailable)?;
    crate::api::apply_timeout(gw, sb, info, timeout).await.map_err(unavailable)?;
    gw.inner.running.mark(sb.id());
    Ok(())
}

/// For a request to `sandbox`'s own port: resumes it if it is paused and asked for that.
pub(crate) async fn before_port_request(gw: &Gateway, sb: &Sandbox) {
    if gw.inner.running.fresh(sb.id()) {
        return;
    }
    match sb.status().await {
        Ok(info) if info.state == SandboxState::Paused && wanted(&info) => {
            if let Err(e) = resume(gw, sb, &info).await {
                tracing::info!(sandbox = %sb.id(), error = %e, "auto-resume failed");
            }
        }
        Ok(info) if info.state == SandboxState::Running => gw.inner.running.mark(sb.id()),
        _ => {}
    }
}

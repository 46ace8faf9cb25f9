//! E2B's lifecycle events: `GET /events/sandboxes[/{id}]` (a sandbox's events, or every one
//! the caller's project sees, newest first unless `orderAsc`, `offset`/`limit`/`types`), made
//! from the node's lifecycle journal (`brig_sdk::Client::events`), and the event records the
//! webhooks deliver (`crate::webhooks`).
//!
//! Brig's events map to E2B's: `created` → `sandbox.lifecycle.created`, `paused`, `resumed`,
//! `checkpointed`, and `destroyed`/`expired` → `sandbox.lifecycle.killed` (with the reason and
//! the run's execution); the rest (`forked` on the parent, `qos`, …) are Brig's own.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use brig_sdk::LifecycleEvent;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::{caller, rfc3339, ApiError, ApiResult, TEMPLATE_LABEL};
use crate::Gateway;

/// Events one list answers at most (E2B's cap).
pub const MAX_LIMIT: u32 = 100;

/// E2B's name of a Brig lifecycle event, and its legacy label; `None` for Brig's own.
pub(crate) fn e2b_type(event: &str) -> Option<(&'static str, &'static str)> {
    Some(match event {
        "created" => ("sandbox.lifecycle.created", "create"),
        "paused" => ("sandbox.lifecycle.paused", "pause"),
        "resumed" => ("sandbox.lifecycle.resumed", "resume"),
        "checkpointed" => ("sandbox.lifecycle.checkpointed", "checkpoint"),
        "destroyed" | "expired" => ("sandbox.lifecycle.killed", "kill"),
        _ => return None,
    })
}

/// A UUID-shaped id derived from `text` (E2B's ids are UUIDs; Brig's are its own).
pub(crate) fn uuid_of(text: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let h = hex::encode(&d.as_ref()[..16]);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// The team id of a project (admins' sandboxes: the nil UUID).
pub(crate) fn team_id(project: Option<&str>) -> String {
    match project {
        Some(p) => uuid_of(&format!("project/{p}")),
        None => "00000000-0000-0000-0000-000000000000".to_string(),
    }
}

/// A Brig lifecycle event as E2B's `SandboxEvent` (v2), or `None` for Brig's own events.
pub(crate) fn event_json(gw: &Gateway, node: &str, e: &LifecycleEvent) -> Option<Value> {
    let (kind, label) = e2b_type(&e.event)?;
    let cfg = gw.config();
    let label_of = |key: &str| e.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let metadata: Map<String, Value> = e
        .labels
        .iter()
        .filter(|(k, _)| !k.starts_with("e2b.") && !k.starts_with("brig."))
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let mut data = Map::new();
    data.insert("sandbox_metadata".into(), Value::Object(metadata));
    if matches!(label, "kill" | "pause") {
        let started = e.started_unix_ms;
        data.insert(
            "execution".into(),
            json!({
                "started_at": rfc3339(started),
                "vcpu_count": cfg.cpu_millis.div_ceil(1000).max(1),
                "memory_mb": cfg.memory_mib,
                "execution_time": e.unix_ms.saturating_sub(started),
            }),
        );
    }
    if label == "kill" {
        let reason = if e.event == "expired" { "timeout" } else { "killed" };
        data.insert("kill_reason".into(), reason.into());
    }
    let template = label_of(TEMPLATE_LABEL).unwrap_or("base");
    Some(json!({
        "id": uuid_of(&format!("{node}/{}", e.seq)),
        "version": "v2",
        "type": kind,
        "eventCategory": "lifecycle",
        "eventLabel": label,
        "eventData": Value::Object(data),
        "sandboxId": e.sandbox,
        "sandboxExecutionId": uuid_of(&format!("execution/{}", e.sandbox)),
        "sandboxTemplateId": template,
        "sandboxBuildId": uuid_of(&format!("build/{template}")),
        "sandboxTeamId": team_id(e.project.as_deref()),
        "timestamp": rfc3339(e.unix_ms),
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EventsQuery {
    offset: Option<u32>,
    limit: Option<u32>,
    order_asc: Option<bool>,
}

/// `types` repeats (`?types=a&types=b`): read from the raw query.
fn types_of(raw: Option<&str>) -> Vec<String> {
    let Some(raw) = raw else { return Vec::new() };
    url_pairs(raw).filter(|(k, _)| k == "types").map(|(_, v)| v).collect()
}

fn url_pairs(raw: &str) -> impl Iterator<Item = (String, String)> + '_ {
    raw.split('&').filter_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        Some((decode(k), decode(v)))
    })
}

async fn list_events(
    gw: &Gateway,
    headers: &HeaderMap,
    sandbox: Option<&str>,
    q: EventsQuery,
    raw: Option<&str>,
) -> ApiResult {
    let limit = q.limit.unwrap_or(10);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad(format!("limit {limit} is outside 1..={MAX_LIMIT}")));
    }
    let offset = q.offset.unwrap_or(0);
    let asked = types_of(raw);
    // E2B's types as the node's event names (killed is either end).
    let mut events: Vec<String> = Vec::new();
    for name in ["created", "paused", "resumed", "checkpointed", "destroyed", "expired"] {
        let e2b = e2b_type(name).map(|(t, _)| t).unwrap_or_default();
        if asked.is_empty() || asked.iter().any(|a| a == e2b) {
            events.push(name.to_string());
        }
    }
    if events.is_empty() {
        return Ok(Json(Vec::<Value>::new()).into_response());
    }
    let newest_first = !q.order_asc.unwrap_or(false);
    let req = brig_sdk::EventsRequest {
        sandbox: sandbox.map(str::to_string),
        limit: offset.saturating_add(limit),
        events,
        newest_first,
        ..Default::default()
    };
    let client = caller(gw, headers).await?;
    let node = client.server_version().await;
    let mut found = client.events(req).await.map_err(ApiError::from_brig)?;
    if newest_first {
        found.reverse();
    }
    let page: Vec<Value> = found
        .iter()
        .filter_map(|e| event_json(gw, &node, e))
        .skip(offset as usize)
        .take(limit as usize)
        .collect();
    Ok(Json(page).into_response())
}

/// `GET /events/sandboxes`: every event the caller's project sees.
pub async fn all(
    State(gw): State<Gateway>,
    Query(q): Query<EventsQuery>,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    headers: HeaderMap,
) -> ApiResult {
    list_events(&gw, &headers, None, q, raw.as_deref()).await
}

/// `GET /events/sandboxes/{id}`: one sandbox's events (404 for a sandbox never seen).
pub async fn of_sandbox(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    headers: HeaderMap,
) -> ApiResult {
    if !id.starts_with("sb-") || id.len() > 64 {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found")));
    }
    list_events(&gw, &headers, Some(&id), q, raw.as_deref()).await
}

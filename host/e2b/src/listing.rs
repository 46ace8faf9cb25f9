//! Listing sandboxes as E2B's API does (`GET /sandboxes`, `GET /v2/sandboxes`): filters by
//! metadata (E2B's SDK encodes it three times over), state, template and start time; either
//! order by start; pages with `x-next-token`, and `x-total-running`.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::IntoResponse;
use axum::Json;
use brig_sdk::{SandboxInfo, SandboxState};
use serde::Deserialize;
use serde_json::Value;

use crate::api::{caller, label, listed, ApiError, ApiResult, TEMPLATE_LABEL};
use crate::Gateway;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    /// A template id or name: only sandboxes made from it.
    template: Option<String>,
    /// RFC 3339: only sandboxes started at or after it.
    #[serde(rename = "startedAfter")]
    started_after: Option<String>,
    /// `asc` or `desc` (default) by start time.
    order: Option<String>,
}

/// The pairs of a `metadata` filter. E2B's SDK quotes each key and value, form-encodes the
/// pairs and sends that as one query value: after the query's own decoding the text is
/// decoded once more as a whole, then split into pairs, each decoded again (as E2B's API).
fn metadata_filter(text: &str) -> Result<Vec<(String, String)>, ApiError> {
    let spaced = text.replace('+', " ");
    let whole = percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .map_err(|e| ApiError::bad(format!("Error parsing metadata: {e}")))?;
    serde_urlencoded::from_str(&whole)
        .map_err(|e| ApiError::bad(format!("Error parsing metadata: {e}")))
}

async fn listing(
    gw: &Gateway,
    headers: &HeaderMap,
    q: &ListQuery,
) -> Result<Vec<SandboxInfo>, ApiError> {
    let client = caller(gw, headers).await?;
    let selector: Vec<(String, String)> = match q.metadata.as_deref() {
        Some(text) if !text.is_empty() => metadata_filter(text)?,
        _ => Vec::new(),
    };
    let newest_first = match q.order.as_deref() {
        None | Some("" | "desc") => true,
        Some("asc") => false,
        Some(other) => return Err(ApiError::bad(format!("invalid order {other:?}: asc or desc"))),
    };
    let after_ms = match q.started_after.as_deref().filter(|t| !t.is_empty()) {
        Some(text) => {
            let at = chrono::DateTime::parse_from_rfc3339(text)
                .map_err(|e| ApiError::bad(format!("startedAfter {text:?}: {e}")))?;
            u64::try_from(at.timestamp_millis()).unwrap_or(0)
        }
        None => 0,
    };
    // A template by id or name: the sandbox's own label, or the template both name.
    let template = q.template.as_deref().filter(|t| !t.is_empty());
    let same_template = |info: &SandboxInfo| match (template, label(info, TEMPLATE_LABEL)) {
        (None, _) => true,
        (Some(asked), Some(made)) => {
            asked == made
                || gw.inner.templates.id_of(crate::templates::split_tag(asked).0).is_some_and(
                    |id| gw.inner.templates.id_of(crate::templates::split_tag(made).0) == Some(id),
                )
        }
        (Some(_), None) => false,
    };
    let pairs: Vec<(&str, &str)> = selector.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let states: Vec<&str> = q.state.as_deref().map_or_else(Vec::new, |s| s.split(',').collect());
    let mut found: Vec<SandboxInfo> = client
        .list(&pairs)
        .await
        .map_err(ApiError::from_brig)?
        .into_iter()
        .filter(|i| matches!(i.state, SandboxState::Running | SandboxState::Paused))
        .filter(|i| {
            let state = if i.state == SandboxState::Paused { "paused" } else { "running" };
            states.is_empty() || states.contains(&state)
        })
        .filter(|i| i.created_unix_ms >= after_ms && same_template(i))
        .collect();
    found.sort_by(|a, b| (a.created_unix_ms, &a.id).cmp(&(b.created_unix_ms, &b.id)));
    if newest_first {
        found.reverse();
    }
    Ok(found)
}

pub(crate) async fn list_v1(
    State(gw): State<Gateway>,
    Query(q): Query<ListQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let found = listing(&gw, &headers, &q).await?;
    Ok(Json(found.iter().map(|i| listed(&gw, i)).collect::<Vec<_>>()).into_response())
}

/// `GET /v2/sandboxes`: newest first (or `order=asc`), `limit` per page, the next page's
/// token in `x-next-token` (an offset into the same ordering), and `x-total-running` (the
/// running matches of every page) when running sandboxes were asked for.
pub(crate) async fn list_v2(
    State(gw): State<Gateway>,
    Query(q): Query<ListQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let found = listing(&gw, &headers, &q).await?;
    let start: usize = match q.next_token.as_deref() {
        Some(t) if !t.is_empty() => t.parse().map_err(|_| ApiError::bad("bad nextToken"))?,
        _ => 0,
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let page: Vec<Value> = found.iter().skip(start).take(limit).map(|i| listed(&gw, i)).collect();
    let mut response = Json(page).into_response();
    let wants_running = q.state.as_deref().is_none_or(|s| s.is_empty() || s.contains("running"));
    if wants_running {
        let running = found.iter().filter(|i| i.state == SandboxState::Running).count();
        response.headers_mut().insert("x-total-running", HeaderValue::from(running));
    }
    if start + limit < found.len() {
        if let Ok(v) = HeaderValue::from_str(&(start + limit).to_string()) {
            response.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(response)
}

//! The rest of E2B's control API: fork, snapshots (Brig checkpoints), network rules (Brig
//! egress rules), metrics and logs (Brig usage and audit trail).

use std::net::Ipv4Addr;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use brig_sdk::{AuditKind, ErrorCode};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{parse, rfc3339, unix_ms, visible, ApiError};
use crate::Gateway;

type ApiResult = Result<axum::response::Response, ApiError>;

/// E2B's network settings (`allowOut`/`denyOut` take IPv4 addresses and CIDR networks).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Network {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[allow(dead_code)]
    allow_public_traffic: Option<bool>,
}

fn cidr(text: &str) -> Result<(u32, u8), ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("network rule {text:?}: only IPv4 addresses and CIDR networks are served"),
        )
    };
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, p.parse::<u8>().map_err(|_| bad())?),
        None => (text, 32),
    };
    let addr: Ipv4Addr = addr.trim().parse().map_err(|_| bad())?;
    if prefix > 32 {
        return Err(bad());
    }
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
    Ok((u32::from(addr) & mask, prefix))
}

/// The networks of the whole IPv4 space left after taking `deny` out, fewest first.
fn complement(deny: &[(u32, u8)]) -> Vec<(u32, u8)> {
    let mut out = Vec::new();
    let mut stack = vec![(0u32, 0u8)];
    while let Some((net, prefix)) = stack.pop() {
        let covers = |(d, p): &(u32, u8)| {
            *p <= prefix && {
                let mask = if *p == 0 { 0 } else { u32::MAX << (32 - u32::from(*p)) };
                net & mask == *d
            }
        };
        let inside = |(d, p): &(u32, u8)| {
            *p > prefix && {
                let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
                d & mask == net
            }
        };
        if deny.iter().any(covers) {
            continue;
        }
        if !deny.iter().any(inside) {
            out.push((net, prefix));
            continue;
        }
        let half = 1u32 << (31 - u32::from(prefix));
        stack.push((net | half, prefix + 1));
        stack.push((net, prefix + 1));
    }
    out
}

/// Brig egress rules for E2B network settings: `None` leaves the sandbox on loopback only
/// (`allow_internet_access: false` with nothing allowed), otherwise the allowed networks
/// (everything but `denyOut`, unless `allowOut` names what is allowed).
pub fn egress_rules(
    network: Option<&Network>,
    internet: Option<bool>,
) -> Result<Option<Vec<String>>, ApiError> {
    let internet = internet.or(network.and_then(|n| n.allow_internet_access)).unwrap_or(true);
    let allow: Vec<(u32, u8)> = network
        .and_then(|n| n.allow_out.as_ref())
        .map(|a| a.iter().map(|t| cidr(t)).collect::<Result<_, _>>())
        .transpose()?
        .unwrap_or_default();
    let deny: Vec<(u32, u8)> = network
        .and_then(|n| n.deny_out.as_ref())
        .map(|d| d.iter().map(|t| cidr(t)).collect::<Result<_, _>>())
        .transpose()?
        .unwrap_or_default();
    let networks = if !allow.is_empty() {
        allow
    } else if !internet {
        return Ok(None);
    } else {
        complement(&deny)
    };
    Ok(Some(networks.into_iter().map(|(n, p)| format!("{}/{p}", Ipv4Addr::from(n))).collect()))
}

/// `PUT /sandboxes/{id}/network`: replaces the sandbox's rules.
pub async fn network(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: Network = parse(&body)?;
    let (sb, _) = visible(&gw, &headers, &id).await?;
    let rules = egress_rules(Some(&req), None)?.unwrap_or_default();
    sb.set_egress(rules).await.map_err(ApiError::from_brig)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ForkBody {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork`: `count` children (1..=20) that start from the sandbox's files.
pub async fn fork(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: ForkBody = parse(&body)?;
    let count = req.count.unwrap_or(1);
    if !(1..=20).contains(&count) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "count must be 1 to 20"));
    }
    let (sb, info) = visible(&gw, &headers, &id).await?;
    let children = sb.fork(count).await.map_err(ApiError::from_brig)?;
    let template = info
        .labels
        .iter()
        .find(|(k, _)| k == "e2b.template")
        .map_or("base", |(_, v)| v.as_str())
        .to_string();
    let mut out = Vec::new();
    for child in children {
        let item = match crate::api::child_timeout(&gw, &child, req.timeout).await {
            Ok(()) => json!({ "sandbox": crate::api::sandbox_json(&gw, child.id(), &template) }),
            Err(e) => json!({ "error": e.body() }),
        };
        out.push(item);
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SnapshotBody {
    name: Option<String>,
}

fn layer_name(text: &str) -> String {
    let cleaned: String = text
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' })
        .collect();
    format!("snapshots/{}", cleaned.trim_start_matches('.'))
}

/// `POST /sandboxes/{id}/snapshots`: a Brig checkpoint of its files, usable as a template id.
pub async fn snapshot(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: SnapshotBody = parse(&body)?;
    let (sb, _) = visible(&gw, &headers, &id).await?;
    let name = layer_name(req.name.as_deref().unwrap_or(&id));
    let layer = sb.checkpoint(&name, None, &[]).await.map_err(ApiError::from_brig)?;
    let snapshot_id = snapshot_id(&layer).ok_or_else(|| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the checkpoint names no base image")
    })?;
    Ok((StatusCode::CREATED, Json(json!({ "snapshotID": snapshot_id, "names": [layer.name] })))
        .into_response())
}

/// A snapshot's id: the image it boots, its base stack and then the checkpoint layer (a
/// checkpoint holds only what changed), from the layer's `checkpoint of ID on IMAGE` source.
fn snapshot_id(layer: &brig_sdk::LayerInfo) -> Option<String> {
    let (_, base) = layer.source.split_once(" on ")?;
    Some(format!("{base}+{}@{}", layer.name, layer.version))
}

/// `GET /snapshots`: the checkpoints made through this API.
pub async fn list_snapshots(State(gw): State<Gateway>, headers: HeaderMap) -> ApiResult {
    let client = crate::api::caller(&gw, &headers).await?;
    let layers = client.images().await.map_err(ApiError::from_brig)?;
    let out: Vec<Value> = layers
        .iter()
        .filter(|l| l.name.starts_with("snapshots/"))
        .filter_map(|l| Some(json!({ "snapshotID": snapshot_id(l)?, "names": [l.name] })))
        .collect();
    Ok(Json(out).into_response())
}

/// `DELETE /templates/{id}`: removes a snapshot made through this API.
pub async fn delete_snapshot(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    // The checkpoint layer is the stack's last part.
    let layer = id.rsplit('+').next().unwrap_or("");
    if !layer.starts_with("snapshots/") {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no snapshot {id}")));
    }
    let client = crate::api::caller(&gw, &headers).await?;
    client.remove_image(layer).await.map_err(ApiError::from_brig)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /sandboxes/{id}/metrics`: one sample of what the sandbox uses now.
pub async fn metrics(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let (_, info) = visible(&gw, &headers, &id).await?;
    let cfg = gw.config();
    let usage = info.usage.unwrap_or_default();
    let now = unix_ms();
    let alive_ns = now.saturating_sub(info.created_unix_ms).max(1) * 1_000_000;
    let cpus = cfg.cpu_millis.div_ceil(1000).max(1);
    let cpu_pct = usage.cpu_ns as f64 * 100.0 / (alive_ns as f64 * cpus as f64);
    let sample = json!({
        "timestamp": rfc3339(now),
        "timestampUnix": now / 1000,
        "cpuCount": cpus,
        "cpuUsedPct": (cpu_pct * 100.0).round() / 100.0,
        "memUsed": usage.memory_bytes,
        "memTotal": cfg.memory_mib << 20,
        "memCache": 0,
        "diskUsed": 0,
        "diskTotal": cfg.disk_mib << 20,
    });
    Ok(Json(vec![sample]).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LogsQuery {
    limit: Option<usize>,
}

/// `GET /sandboxes/{id}/logs`: the sandbox's audit trail as log lines.
pub async fn logs(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let (sb, _) = visible(&gw, &headers, &id).await?;
    let events = sb.audit(0).await.map_err(|e| match e.code() {
        Some(ErrorCode::NotFound) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        _ => ApiError::from_brig(e),
    })?;
    let limit = q.limit.unwrap_or(1000).min(10_000);
    let entries: Vec<Value> = events
        .iter()
        .rev()
        .take(limit)
        .rev()
        .map(|e| {
            let line = match &e.kind {
                AuditKind::ExecStart { argv, .. } => format!("exec {}", argv.join(" ")),
                other => format!("{other:?}"),
            };
            json!({ "timestamp": rfc3339(e.unix_ms), "line": line, "message": line,
                    "level": "info", "fields": {} })
        })
        .collect();
    let logs: Vec<Value> =
        entries.iter().map(|e| json!({ "timestamp": e["timestamp"], "line": e["line"] })).collect();
    Ok(Json(json!({ "logs": logs, "logEntries": entries })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denied_networks_leave_the_rest_of_the_space_allowed() {
        let rules = |deny: &[&str]| {
            let n = Network {
                deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            };
            egress_rules(Some(&n), None).expect("rules").expect("some")
        };
        assert_eq!(rules(&[]), vec!["0.0.0.0/0"]);
        let r = rules(&["10.0.0.0/8"]);
        assert_eq!(r.len(), 8);
        assert!(r.contains(&"11.0.0.0/8".to_string()) && r.contains(&"128.0.0.0/1".to_string()));
        assert!(!r.iter().any(|x| x.starts_with("10.")));
        let r = rules(&["10.1.2.3"]);
        assert_eq!(r.len(), 32, "{r:?}");
        assert!(rules(&["0.0.0.0/0"]).is_empty());
        assert!(egress_rules(None, Some(false)).expect("rules").is_none());
        let allow = Network { allow_out: Some(vec!["1.2.3.4".into()]), ..Default::default() };
        assert_eq!(egress_rules(Some(&allow), None).expect("r"), Some(vec!["1.2.3.4/32".into()]));
        let named = Network { allow_out: Some(vec!["example.com".into()]), ..Default::default() };
        assert!(egress_rules(Some(&named), None).is_err());
    }
}

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

use crate::api::{parse, rfc3339, visible, ApiError};
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
    allow_public_traffic: Option<bool>,
}

impl Network {
    /// Whether the sandbox's ports need its traffic access token (`allowPublicTraffic: false`).
    pub(crate) fn private_ports(&self) -> bool {
        self.allow_public_traffic == Some(false)
    }
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

/// The most `allowOut` and `denyOut` entries one request may name, together: the node serves
/// at most 4,096 egress rules per sandbox (`brig_core::egress::MAX_EGRESS_RULES`), and a
/// `denyOut` takes one more for the allow-all it is cut out of.
pub const MAX_NETWORK_ENTRIES: usize = 4095;

/// Brig egress rules for E2B network settings: `None` leaves the sandbox on loopback only
/// (`allow_internet_access: false` with nothing allowed), otherwise the allowed networks
/// (everything but `denyOut`, unless `allowOut` names what is allowed). Everything but
/// `denyOut` is one allow-all rule and one denial (`!net`) per entry: linear, and the node
/// keeps its own addresses, its sandboxes and link-local addresses out of reach whatever the
/// rules say. More than [`MAX_NETWORK_ENTRIES`] entries answer 400 before anything is parsed.
pub fn egress_rules(
    network: Option<&Network>,
    internet: Option<bool>,
) -> Result<Option<Vec<String>>, ApiError> {
    let internet = internet.or(network.and_then(|n| n.allow_internet_access)).unwrap_or(true);
    let (allow_out, deny_out) = network.map_or((&[][..], &[][..]), |n| {
        (n.allow_out.as_deref().unwrap_or(&[]), n.deny_out.as_deref().unwrap_or(&[]))
    });
    let entries = allow_out.len() + deny_out.len();
    if entries > MAX_NETWORK_ENTRIES {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "network: {entries} allowOut and denyOut entries; at most {MAX_NETWORK_ENTRIES} \
                 are served per sandbox (use CIDR networks to name more addresses)"
            ),
        ));
    }
    let text = |(n, p): (u32, u8)| format!("{}/{p}", Ipv4Addr::from(n));
    let allow: Vec<String> =
        allow_out.iter().map(|t| cidr(t).map(text)).collect::<Result<_, _>>()?;
    let deny: Vec<String> = deny_out.iter().map(|t| cidr(t).map(text)).collect::<Result<_, _>>()?;
    if !allow.is_empty() {
        Ok(Some(allow))
    } else if !internet {
        Ok(None)
    } else {
        let mut rules = Vec::with_capacity(deny.len() + 1);
        rules.push("0.0.0.0/0".to_string());
        rules.extend(deny.into_iter().map(|d| format!("!{d}")));
        Ok(Some(rules))
    }
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
            Ok(()) => {
                json!({ "sandbox": crate::api::sandbox_json(&gw, child.id(), &template, false) })
            }
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

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MetricsQuery {
    /// Unix seconds; default the sandbox's start.
    start: Option<u64>,
    /// Unix seconds; default now.
    end: Option<u64>,
}

/// `GET /sandboxes/{id}/metrics?start=&end=`: the sandbox's use over that range (Unix
/// seconds), a sample every 5 s while it ran (older times more sparsely) and one of now, each
/// with the CPU share it used since the sample before.
pub async fn metrics(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<MetricsQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let (sb, info) = visible(&gw, &headers, &id).await?;
    let cfg = gw.config();
    // No end means "up to now" as the node sees it: a `now` taken here would already be
    // behind the node's clock when it decides whether to add a sample of the present.
    let from = q.start.map_or(info.created_unix_ms, |s| s.saturating_mul(1000));
    let to = q.end.map_or(u64::MAX, |e| e.saturating_mul(1000).saturating_add(999));
    if from > to {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "start is after end"));
    }
    // The sample before the range too, for the first one's CPU share.
    let mut samples =
        sb.usage_history(info.created_unix_ms, to).await.map_err(ApiError::from_brig)?;
    samples.retain(|s| s.unix_ms <= to);
    let cpus = cfg.cpu_millis.div_ceil(1000).max(1);
    let mut before = brig_sdk::UsageSample { unix_ms: info.created_unix_ms, ..Default::default() };
    let mut out = Vec::new();
    for sample in samples {
        let elapsed_ns = sample.unix_ms.saturating_sub(before.unix_ms).max(1) * 1_000_000;
        let used_ns = sample.cpu_ns.saturating_sub(before.cpu_ns);
        let pct = used_ns as f64 * 100.0 / (elapsed_ns as f64 * cpus as f64);
        if sample.unix_ms >= from {
            out.push(json!({
                "timestamp": rfc3339(sample.unix_ms),
                "timestampUnix": sample.unix_ms / 1000,
                "cpuCount": cpus,
                "cpuUsedPct": (pct.min(100.0) * 100.0).round() / 100.0,
                "memUsed": sample.memory_bytes,
                "memTotal": cfg.memory_mib << 20,
                "memCache": 0,
                "diskUsed": 0,
                "diskTotal": cfg.disk_mib << 20,
            }));
        }
        before = sample;
    }
    Ok(Json(out).into_response())
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
        assert_eq!(rules(&["10.0.0.0/8"]), vec!["0.0.0.0/0", "!10.0.0.0/8"]);
        assert_eq!(rules(&["10.1.2.3"]), vec!["0.0.0.0/0", "!10.1.2.3/32"]);
        assert_eq!(rules(&["10.1.2.3/8"]), vec!["0.0.0.0/0", "!10.0.0.0/8"], "host bits cleared");
        assert_eq!(rules(&["0.0.0.0/0"]), vec!["0.0.0.0/0", "!0.0.0.0/0"]);
        assert!(egress_rules(None, Some(false)).expect("rules").is_none());
        let allow = Network { allow_out: Some(vec!["1.2.3.4".into()]), ..Default::default() };
        assert_eq!(egress_rules(Some(&allow), None).expect("r"), Some(vec!["1.2.3.4/32".into()]));
        let named = Network { allow_out: Some(vec!["example.com".into()]), ..Default::default() };
        assert!(egress_rules(Some(&named), None).is_err());
    }

    /// The rules are linear in the entries, and past the cap the answer is a 400 before any
    /// entry is read.
    #[test]
    fn long_deny_lists_are_linear_and_capped() {
        let list = |n: u32| -> Vec<String> {
            (0..n).map(|i| Ipv4Addr::from(0x0b00_0000 + i * 7).to_string()).collect()
        };
        let at_cap =
            Network { deny_out: Some(list(MAX_NETWORK_ENTRIES as u32)), ..Default::default() };
        // Milliseconds of work; the bound is one a loaded 2-core machine meets too.
        let started = std::time::Instant::now();
        let rules = egress_rules(Some(&at_cap), None).expect("at the cap").expect("some");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!(rules.len(), MAX_NETWORK_ENTRIES + 1);
        // Past the cap, entries none of which is an address: the answer names the count, so
        // the count was checked before any entry was parsed.
        let unparsed = vec!["not an address".to_string(); 100_000];
        let over = Network { deny_out: Some(unparsed), ..Default::default() };
        let err = egress_rules(Some(&over), None).expect_err("over the cap");
        let body = err.body().to_string();
        assert!(body.contains("at most 4095"), "{body}");
        assert_eq!(err.into_response().status(), StatusCode::BAD_REQUEST);
    }
}

//! E2B's volumes: the control API (`/volumes`: create, list, get, delete, with `X-API-Key`)
//! and the content API (`/volumecontent/{id}/…`: files with no sandbox, with the volume's own
//! token as `Authorization: Bearer`). A volume is a Brig volume on the node
//! (`brig_sdk::Volume`); its token is the gateway's HMAC of its id, so the content API needs
//! no API key and a token opens its one volume only.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, put};
use axum::{Json, Router};
use brig_sdk::{ErrorCode, FileKind, VolumeAttrs, VolumeEntry, VolumeInfo};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::api::{caller, parse, rfc3339, ApiError, ApiResult};
use crate::Gateway;

/// Bytes buffered between a request body (or a download) and the node.
const PIPE_BYTES: usize = 256 << 10;
/// Longest an upload's body may go without a byte.
const BODY_STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// The volume routes.
pub fn routes() -> Router<Gateway> {
    Router::new()
        .route("/volumes", get(list).post(create))
        .route("/volumes/{id}", get(get_one).delete(delete))
        .route("/volumecontent/{id}/dir", get(list_dir).post(make_dir))
        .route(
            "/volumecontent/{id}/file",
            put(write_file).get(read_file).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/volumecontent/{id}/path", get(stat).delete(remove).patch(set_attrs))
}

impl Gateway {
    /// Volume `id`'s content token.
    pub(crate) fn volume_token(&self, id: &str) -> String {
        self.envd_token(&format!("volume/{id}"))
    }
}

/// A sandbox's `volumeMounts` (by name, as E2B reports them).
pub(crate) async fn mounts_json(
    gw: &Gateway,
    headers: &HeaderMap,
    info: &brig_sdk::SandboxInfo,
) -> Value {
    if info.volumes.is_empty() {
        return json!([]);
    }
    let names = match caller(gw, headers).await {
        Ok(client) => client.volumes().await.unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let name = |id: &str| {
        names.iter().find(|v| v.id == id).map_or_else(|| id.to_string(), |v| v.name.clone())
    };
    Value::Array(
        info.volumes.iter().map(|m| json!({ "name": name(&m.volume), "path": m.path })).collect(),
    )
}

fn with_token(gw: &Gateway, info: &VolumeInfo) -> Value {
    json!({
        "volumeID": info.id,
        "name": info.name,
        "token": gw.volume_token(&info.id),
    })
}

fn not_found(e: brig_sdk::Error, what: &str) -> ApiError {
    match e.code() {
        Some(ErrorCode::NotFound) => ApiError::new(StatusCode::NOT_FOUND, format!("{what}: {e}")),
        _ => ApiError::from_brig(e),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NewVolume {
    name: String,
}

async fn create(State(gw): State<Gateway>, headers: HeaderMap, body: Bytes) -> ApiResult {
    let req: NewVolume = parse(&body)?;
    let client = caller(&gw, &headers).await?;
    let info = client.create_volume(&req.name, None).await.map_err(ApiError::from_brig)?;
    Ok((StatusCode::CREATED, Json(with_token(&gw, &info))).into_response())
}

async fn list(State(gw): State<Gateway>, headers: HeaderMap) -> ApiResult {
    let client = caller(&gw, &headers).await?;
    let volumes = client.volumes().await.map_err(ApiError::from_brig)?;
    let out: Vec<Value> =
        volumes.iter().map(|v| json!({ "volumeID": v.id, "name": v.name })).collect();
    Ok(Json(out).into_response())
}

async fn get_one(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let client = caller(&gw, &headers).await?;
    let info = client.volume_info(&id).await.map_err(|e| not_found(e, "volume"))?;
    Ok(Json(with_token(&gw, &info)).into_response())
}

async fn delete(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let client = caller(&gw, &headers).await?;
    client.delete_volume(&id).await.map_err(|e| not_found(e, "volume"))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The volume a content request is for, once its bearer token is checked.
async fn content(
    gw: &Gateway,
    headers: &HeaderMap,
    id: &str,
) -> Result<brig_sdk::Volume, ApiError> {
    let token = crate::gateway::header(headers, "authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "no bearer token"))?;
    if !gw.envd_token_ok(&format!("volume/{id}"), token) {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "not this volume's token"));
    }
    let admin = gw
        .admin()
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(admin.volume(id))
}

/// A volume entry as E2B's content API writes it.
fn entry_json(e: &VolumeEntry) -> Value {
    let kind = match e.kind {
        FileKind::File => "file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "symlink",
        FileKind::Other => "unknown",
    };
    let name = e.path.rsplit('/').next().unwrap_or_default();
    let mut out = json!({
        "name": if e.path == "/" { "/" } else { name },
        "type": kind,
        "path": e.path,
        "size": e.size,
        "mode": e.mode,
        "uid": e.uid,
        "gid": e.gid,
        "atime": rfc3339(e.atime_unix_ms),
        "mtime": rfc3339(e.mtime_unix_ms),
        "ctime": rfc3339(e.ctime_unix_ms),
    });
    if let (Some(target), Some(obj)) = (&e.target, out.as_object_mut()) {
        obj.insert("target".into(), target.clone().into());
    }
    out
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PathQuery {
    path: Option<String>,
    depth: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

impl PathQuery {
    fn path(&self) -> Result<&str, ApiError> {
        self.path.as_deref().ok_or_else(|| ApiError::bad("no path"))
    }

    fn attrs(&self) -> VolumeAttrs {
        VolumeAttrs { mode: self.mode, uid: self.uid, gid: self.gid }
    }
}

async fn list_dir(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let vol = content(&gw, &headers, &id).await?;
    let entries =
        vol.list(q.path()?, q.depth.unwrap_or(1)).await.map_err(|e| not_found(e, "path"))?;
    Ok(Json(entries.iter().map(entry_json).collect::<Vec<_>>()).into_response())
}

async fn make_dir(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let vol = content(&gw, &headers, &id).await?;
    let parents = q.force.unwrap_or(false);
    let entry = vol.mkdir(q.path()?, parents, q.attrs()).await.map_err(|e| not_found(e, "path"))?;
    Ok((StatusCode::CREATED, Json(entry_json(&entry))).into_response())
}

async fn stat(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let vol = content(&gw, &headers, &id).await?;
    let entry = vol.stat(q.path()?).await.map_err(|e| not_found(e, "path"))?;
    Ok(Json(entry_json(&entry)).into_response())
}

async fn remove(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let vol = content(&gw, &headers, &id).await?;
    vol.remove(q.path()?).await.map_err(|e| not_found(e, "path"))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Attrs {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

async fn set_attrs(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let vol = content(&gw, &headers, &id).await?;
    let a: Attrs = parse(&body)?;
    let attrs = VolumeAttrs { mode: a.mode, uid: a.uid, gid: a.gid };
    let entry = vol.set_attrs(q.path()?, attrs).await.map_err(|e| not_found(e, "path"))?;
    Ok(Json(entry_json(&entry)).into_response())
}

/// `PUT …/file?path=`: the body becomes the file (parents made with `force`).
async fn write_file(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let vol = content(&gw, &headers, &id).await?;
    let path = q.path()?.to_string();
    if !q.force.unwrap_or(false) {
        // Without `force` (as E2B's volume service): the parent must exist and the file not.
        let parent = match path.trim_end_matches('/').rfind('/') {
            Some(0) | None => "/".to_string(),
            Some(i) => path[..i].to_string(),
        };
        vol.stat(&parent).await.map_err(|e| not_found(e, "parent"))?;
        if vol.stat(&path).await.is_ok() {
            let why = format!("{path} exists (write with force to overwrite it)");
            return Err(ApiError::new(StatusCode::CONFLICT, why));
        }
    }
    let (reader, mut writer) = tokio::io::duplex(PIPE_BYTES);
    let pump = tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        loop {
            match tokio::time::timeout(BODY_STALL, stream.next()).await {
                Ok(Some(Ok(chunk))) => {
                    if writer.write_all(&chunk).await.is_err() {
                        return Ok(());
                    }
                }
                Ok(None) => return writer.shutdown().await.map_err(|e| e.to_string()),
                Ok(Some(Err(e))) => return Err(format!("request body: {e}")),
                Err(_) => return Err(format!("no byte of the body for {BODY_STALL:?}")),
            }
        }
    });
    let written = vol.upload(&path, reader, q.attrs()).await;
    match pump.await {
        Ok(Err(why)) => return Err(ApiError::bad(why)),
        Err(e) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Ok(Ok(())) => {}
    }
    let entry = written.map_err(|e| not_found(e, "path"))?;
    Ok((StatusCode::CREATED, Json(entry_json(&entry))).into_response())
}

/// `GET …/file?path=`: the file's bytes, streamed.
async fn read_file(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let vol = content(&gw, &headers, &id).await?;
    let path = q.path()?.to_string();
    let entry = vol.stat(&path).await.map_err(|e| not_found(e, "path"))?;
    if entry.kind == FileKind::Dir {
        return Err(ApiError::bad(format!("{path} is a directory")));
    }
    let (reader, writer) = tokio::io::duplex(PIPE_BYTES);
    let task = tokio::spawn(async move { vol.download(&path, writer).await });
    let reader = tokio::io::BufReader::with_capacity(PIPE_BYTES, reader);
    let body = futures::stream::unfold((reader, Some(task)), |(mut reader, task)| async move {
        let task = task?;
        match reader.fill_buf().await {
            Ok([]) => match task.await {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some((Err(std::io::Error::other(e.to_string())), (reader, None))),
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), (reader, None))),
            },
            Ok(buf) => {
                let bytes = Bytes::copy_from_slice(buf);
                reader.consume(bytes.len());
                Some((Ok(bytes), (reader, Some(task))))
            }
            Err(e) => Some((Err(e), (reader, None))),
        }
    });
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], Body::from_stream(body))
        .into_response())
}

//! E2B's control API (`spec/openapi.yml` of e2b-dev/E2B) on Brig sandboxes: a template id
//! names a Brig image (`[e2b] templates`, or the id itself as an image reference), metadata
//! is labels, E2B's timeout is the sandbox's lifetime from now (ending it destroys, or pauses
//! with `autoPause`), and every call runs with the caller's own access token (`X-API-Key`).
//! Errors are `{"code": HTTP status, "message": …}`, the shape the SDKs parse.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use brig_sdk::{
    Client, Cmd, ErrorCode, IdleAction, Lifetimes as BrigLifetimes, Sandbox, SandboxInfo,
    SandboxOptions, SandboxState,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::files_only_pause::AUTOPAUSE_FILES_LABEL;
use crate::gateway::header;
use crate::keys::KeyError;
use crate::{Gateway, ENVD_VERSION};

/// Labels the gateway keeps on a sandbox for itself (not shown as metadata).
pub(crate) const TEMPLATE_LABEL: &str = "e2b.template";
const AUTOPAUSE_LABEL: &str = "e2b.autopause";
const INTERNAL_PREFIX: &str = "e2b.";

/// A control API error, as the SDKs read it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }

    pub(crate) fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The JSON body this error answers with.
    pub(crate) fn body(&self) -> Value {
        json!({ "code": self.status.as_u16(), "message": self.message })
    }

    pub(crate) fn from_brig(e: brig_sdk::Error) -> ApiError {
        let status = match e.code() {
            Some(ErrorCode::NotFound | ErrorCode::Expired | ErrorCode::SandboxLost) => {
                StatusCode::NOT_FOUND
            }
            Some(ErrorCode::Unauthenticated) => StatusCode::UNAUTHORIZED,
            Some(ErrorCode::PermissionDenied) => StatusCode::FORBIDDEN,
            Some(ErrorCode::BadRequest | ErrorCode::TooLarge) => StatusCode::BAD_REQUEST,
            Some(ErrorCode::AlreadyExists | ErrorCode::Conflict) => StatusCode::CONFLICT,
            Some(ErrorCode::ResourceExhausted | ErrorCode::QuotaExceeded) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Some(ErrorCode::Unavailable) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = crate::envd::brig_message(&e);
        ApiError::new(status, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

pub(crate) type ApiResult = Result<Response, ApiError>;

/// The control API's routes.
pub fn routes() -> Router<Gateway> {
    Router::new()
        .route("/sandboxes", post(create).get(crate::listing::list_v1))
        .route("/v2/sandboxes", post(create).get(crate::listing::list_v2))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(connect))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/fork", post(crate::api_more::fork))
        .route("/sandboxes/{id}/snapshots", post(crate::api_more::snapshot))
        .route("/snapshots", get(crate::api_more::list_snapshots))
        .route("/templates", get(crate::templates::list))
        .route("/v3/templates", post(crate::templates::create))
        .route("/v2/templates", post(crate::templates::create))
        .route("/templates/{id}", get(crate::templates::get_one).delete(crate::templates::delete))
        .route("/templates/{id}/files/{hash}", get(crate::templates::files))
        .route(
            "/template-files/{hash}",
            put(crate::templates::upload).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/v2/templates/{id}/builds/{build}", post(crate::template_builds::start))
        .route("/templates/{id}/builds/{build}/status", get(crate::template_builds::status))
        .route("/templates/aliases/{alias}", get(crate::templates::alias))
        .route(
            "/templates/tags",
            post(crate::templates::assign_tags).delete(crate::templates::remove_tags),
        )
        .route("/templates/{id}/tags", get(crate::templates::tags))
        .route("/sandboxes/{id}/network", put(crate::api_more::network))
        .route("/sandboxes/{id}/metrics", get(crate::api_more::metrics))
        .route("/sandboxes/{id}/logs", get(crate::api_more::logs))
        .route("/v2/sandboxes/{id}/logs", get(crate::api_more::logs))
        .route("/events/sandboxes", get(crate::events::all))
        .route("/events/sandboxes/{id}", get(crate::events::of_sandbox))
        .route("/events/webhooks", get(crate::webhooks::list).post(crate::webhooks::create))
        .route(
            "/events/webhooks/{id}",
            get(crate::webhooks::get_one)
                .patch(crate::webhooks::update)
                .delete(crate::webhooks::delete),
        )
}

/// The caller's Brig client, from `X-API-Key`.
pub(crate) async fn caller(gw: &Gateway, headers: &HeaderMap) -> Result<Client, ApiError> {
    let key = header(headers, "x-api-key")
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "no X-API-Key"))?;
    gw.client_for_key(key).await.map_err(|e| {
        let status = match e {
            KeyError::Refused => StatusCode::UNAUTHORIZED,
            KeyError::Busy | KeyError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, e.to_string())
    })
}

/// The sandbox `id` as the caller sees it (404 when it is not theirs or not there).
pub(crate) async fn visible(
    gw: &Gateway,
    headers: &HeaderMap,
    id: &str,
) -> Result<(Sandbox, SandboxInfo), ApiError> {
    let client = caller(gw, headers).await?;
    // E2B's debug mode names its one sandbox `debug_sandbox_id` in API calls too.
    let sb = match gw.current_debug_sandbox().await {
        Some(real) if id == crate::envd::DEBUG_SANDBOX_ID => client.sandbox(&real),
        _ => client.sandbox(id),
    };
    match sb.status().await {
        Ok(info) if matches!(info.state, SandboxState::Running | SandboxState::Paused) => {
            Ok((sb, info))
        }
        Ok(_) => Err(ApiError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))),
        Err(e) if e.code() == Some(ErrorCode::BadRequest) => {
            Err(ApiError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found")))
        }
        Err(e) => Err(ApiError::from_brig(e)),
    }
}

pub(crate) fn parse<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("malformed body: {e}")))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    auto_pause: Option<bool>,
    /// `false`: the timeout's pause keeps the files only.
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    network: Option<crate::api_more::Network>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    /// Accepted and ignored: every sandbox gets an envd access token.
    #[allow(dead_code)]
    secure: Option<bool>,
    volume_mounts: Option<Vec<VolumeMountReq>>,
}

/// A volume mounted at create, by name (`volumeMounts`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct VolumeMountReq {
    name: String,
    path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AutoResume {
    enabled: bool,
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// RFC 3339 (UTC, milliseconds) for a Unix time in milliseconds.
pub(crate) fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil-from-days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Which image a create asks for: the metadata key's value (when configured), the template's
/// mapping, or the template id itself as a Brig image reference.
fn image_for(gw: &Gateway, template: &str, metadata: &BTreeMap<String, String>) -> String {
    let cfg = gw.config();
    if let Some(image) = cfg.image_metadata_key.as_ref().and_then(|k| metadata.get(k)) {
        return image.clone();
    }
    cfg.templates.get(template).cloned().unwrap_or_else(|| template.to_string())
}

/// Makes E2B's default user (`user`, home `/home/user`) if the image lacks it; prints
/// `present` when the image already has it.
const ENSURE_USER: &str = "if id -u user >/dev/null 2>&1; then echo present; else \
    useradd -m -s /bin/bash user >/dev/null 2>&1 || adduser -D -s /bin/sh user >/dev/null 2>&1 \
    || { echo 'user:x:1000:1000::/home/user:/bin/sh' >> /etc/passwd && \
    echo 'user:x:1000:' >> /etc/group && mkdir -p /home/user && chown 1000:1000 /home/user; }; fi";

/// Gives a new sandbox E2B's default user unless its image is known to have it (images that
/// lack it get it in each sandbox, one command at create).
pub(crate) async fn ensure_user(
    gw: &Gateway,
    image: &str,
    sb: &brig_sdk::Sandbox,
) -> Result<(), brig_sdk::Error> {
    if gw.inner.images_with_user.lock().contains(image) {
        return Ok(());
    }
    let out =
        sb.exec_with(Cmd::new(["sh", "-c", ENSURE_USER]).timeout(Duration::from_secs(30))).await?;
    if out.stdout_text() == "present\n" {
        gw.inner.images_with_user.lock().insert(image.to_string());
    }
    Ok(())
}

async fn create(State(gw): State<Gateway>, headers: HeaderMap, body: Bytes) -> ApiResult {
    let client = caller(&gw, &headers).await?;
    let req: NewSandbox = parse(&body)?;
    let template = req.template_id.clone().unwrap_or_else(|| "base".to_string());
    let metadata = req.metadata.clone().unwrap_or_default();
    if metadata.keys().any(|k| k.starts_with(INTERNAL_PREFIX)) {
        return Err(ApiError::bad(format!(
            "metadata keys starting {INTERNAL_PREFIX:?} are reserved"
        )));
    }
    let auto_pause = req.auto_pause.unwrap_or(false);
    let auto_resume = req.auto_resume.as_ref().is_some_and(|a| a.enabled);
    if auto_resume && !auto_pause {
        return Err(ApiError::bad("autoResume needs autoPause: only a paused sandbox resumes"));
    }
    let pause_files_only = auto_pause && req.auto_pause_memory == Some(false);
    if pause_files_only && auto_resume {
        return Err(ApiError::bad(
            "autoPauseMemory false (a filesystem-only auto-pause) cannot be combined with \
             autoResume: such a sandbox is resumed explicitly",
        ));
    }
    let mut own_labels = vec![(TEMPLATE_LABEL, template.as_str())];
    if auto_pause {
        own_labels.push((AUTOPAUSE_LABEL, "true"));
    }
    if pause_files_only {
        own_labels.push((AUTOPAUSE_FILES_LABEL, "true"));
    }
    if auto_resume {
        own_labels.push((crate::auto_resume::AUTORESUME_LABEL, "true"));
    }
    crate::limits::check_metadata(&metadata, &own_labels)
        .map_err(|e| ApiError::bad(e.to_string()))?;
    if let Some(env) = &req.env_vars {
        crate::limits::check_sandbox_env(env).map_err(|e| ApiError::bad(e.to_string()))?;
    }
    let timeout = checked_timeout(&gw, req.timeout)?;
    let cfg = gw.config();
    // A template built through this API, by id or name (`name:tag`); else the configured
    // mapping or the id itself as an image.
    let built = match cfg.image_metadata_key.as_ref().and_then(|k| metadata.get(k)) {
        Some(_) => None,
        None if crate::code_interpreter::is_code_interpreter(&template) => {
            Some(crate::code_interpreter::ensure(&gw, &client).await?)
        }
        // A project's template is its own (an admin's, every project's): whose it is is
        // asked of brigd only then, so creates from shared templates pay nothing.
        None => match gw.inner.templates.resolve(&template) {
            Some(found) if found.project.is_some() => {
                let scope = crate::templates::Scope::of_client(&client).await?;
                Some(found).filter(|f| scope.sees(f.project.as_deref()))
            }
            found => found,
        },
    };
    let image = match &built {
        Some(t) => t.build.image.clone(),
        None => image_for(&gw, &template, &metadata),
    };
    let mut options = SandboxOptions::container(&image)
        .memory_mib(cfg.memory_mib)
        .cpu_millis(cfg.cpu_millis)
        .disk_mib(cfg.disk_mib)
        .label(TEMPLATE_LABEL, &template)
        .idle_ttl(timeout);
    if auto_resume {
        options = options.label(crate::auto_resume::AUTORESUME_LABEL, "true");
    }
    if pause_files_only {
        options = options
            .label(AUTOPAUSE_LABEL, "true")
            .label(AUTOPAUSE_FILES_LABEL, "true")
            .idle_action(IdleAction::PauseFilesOnly);
    } else if auto_pause {
        options = options.label(AUTOPAUSE_LABEL, "true").pause_when_idle();
    } else {
        options = options.max_lifetime(timeout);
    }
    for (k, v) in &metadata {
        options = options.label(k, v);
    }
    let facts = crate::facts::Facts {
        workdir: built.as_ref().and_then(|t| t.build.workdir.clone()),
        private: req.network.as_ref().is_some_and(crate::api_more::Network::private_ports),
    };
    for (k, v) in facts.labels() {
        options = options.label(k, &v);
    }
    for (k, v) in req.env_vars.iter().flatten() {
        options = options.env(k, v);
    }
    for m in req.volume_mounts.iter().flatten() {
        options = options.volume(&m.name, &m.path, false);
    }
    if let Some(rules) =
        crate::api_more::egress_rules(req.network.as_ref(), req.allow_internet_access)?
    {
        options = options.egress(rules);
    }
    let started = std::time::Instant::now();
    let sb = client.create(options).await.map_err(|e| match e.code() {
        Some(ErrorCode::BadRequest | ErrorCode::NotFound) => {
            ApiError::new(StatusCode::NOT_FOUND, format!("template {template:?}: {e}"))
        }
        _ => ApiError::from_brig(e),
    })?;
    if let Err(e) = ensure_user(&gw, &image, &sb).await {
        let _ = sb.destroy().await;
        return Err(ApiError::from_brig(e));
    }
    if let Some(t) = &built {
        if let Err(e) = start_template(&sb, &t.build, timeout).await {
            let _ = sb.destroy().await;
            return Err(e);
        }
    }
    if auto_pause {
        gw.inner.lifetimes.set(sb.id(), timeout);
    }
    let private = facts.private;
    gw.inner.facts.set(sb.id(), facts);
    gw.inner.running.mark(sb.id());
    tracing::debug!(sandbox = sb.id(), took = ?started.elapsed(), "E2B create");
    let body = sandbox_json(&gw, sb.id(), &template, private);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Longest a create waits for a template's ready command to pass.
const READY_WITHIN: Duration = Duration::from_secs(300);

/// Starts a template's start command (in the background, as E2B's `user`) and waits until
/// its ready command exits 0: the create answers then, or fails when it never does.
pub(crate) async fn start_template(
    sb: &brig_sdk::Sandbox,
    build: &crate::templates::BuildRecord,
    timeout: Duration,
) -> Result<(), ApiError> {
    if let Some(start) = &build.start_cmd {
        // The command runs on after its stream is dropped; its output is kept.
        let stream = sb.exec_stream(Cmd::shell(start).user("user")).await;
        drop(stream.map_err(ApiError::from_brig)?);
    }
    let Some(ready) = &build.ready_cmd else { return Ok(()) };
    let deadline = std::time::Instant::now() + READY_WITHIN.min(timeout);
    loop {
        let check = Cmd::shell(ready).user("user").timeout(Duration::from_secs(30));
        let out = sb.exec_with(check).await.map_err(ApiError::from_brig)?;
        if out.result.exit_code == Some(0) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "the template's ready command `{ready}` did not pass within {:?}",
                    READY_WITHIN.min(timeout)
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Makes the debug layout's sandbox (the `base` template, the default timeout) with `admin`.
pub(crate) async fn create_debug_sandbox(
    gw: &Gateway,
    admin: &Client,
) -> Result<String, crate::connect::ConnectError> {
    let cfg = gw.config();
    let image = image_for(gw, "base", &BTreeMap::new());
    let options = SandboxOptions::container(&image)
        .memory_mib(cfg.memory_mib)
        .cpu_millis(cfg.cpu_millis)
        .disk_mib(cfg.disk_mib)
        .label(TEMPLATE_LABEL, "base")
        .label("e2b.debug", "true")
        .idle_ttl(Duration::from_secs(cfg.default_timeout_s));
    let sb = admin.create(options).await.map_err(crate::envd::brig_error)?;
    ensure_user(gw, &image, &sb).await.map_err(crate::envd::brig_error)?;
    Ok(sb.id().to_string())
}

/// The `Sandbox` answer of create and connect.
pub(crate) fn sandbox_json(gw: &Gateway, id: &str, template: &str, private: bool) -> Value {
    json!({
        "templateID": template,
        "sandboxID": id,
        "clientID": "brig",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": gw.envd_token(id),
        "trafficAccessToken": if private { json!(gw.traffic_token(id)) } else { Value::Null },
        "domain": Value::Null,
    })
}

fn checked_timeout(gw: &Gateway, asked: Option<u64>) -> Result<Duration, ApiError> {
    let cfg = gw.config();
    let secs = asked.unwrap_or(cfg.default_timeout_s);
    if secs == 0 || secs > cfg.max_timeout_s {
        return Err(ApiError::bad(format!(
            "timeout {secs} s is outside 1..={} s",
            cfg.max_timeout_s
        )));
    }
    Ok(Duration::from_secs(secs))
}

pub(crate) fn label<'a>(info: &'a SandboxInfo, key: &str) -> Option<&'a str> {
    info.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn metadata(info: &SandboxInfo) -> BTreeMap<&str, &str> {
    info.labels
        .iter()
        .filter(|(k, _)| !k.starts_with(INTERNAL_PREFIX))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// When the sandbox's E2B timeout ends, in Unix milliseconds.
fn end_ms(gw: &Gateway, info: &SandboxInfo) -> u64 {
    if let Some(at) = gw.inner.lifetimes.deadline(&info.id) {
        return at;
    }
    match info.max_lifetime_ms {
        Some(lifetime) => info.created_unix_ms + lifetime,
        None => info.last_used_unix_ms + info.idle_ttl_ms,
    }
}

/// The listed form (and, with more fields, the detailed one) of a sandbox.
pub(crate) fn listed(gw: &Gateway, info: &SandboxInfo) -> Value {
    let cfg = gw.config();
    let state = if info.state == SandboxState::Paused { "paused" } else { "running" };
    json!({
        "templateID": label(info, TEMPLATE_LABEL).or(info.image.as_deref()).unwrap_or("base"),
        "sandboxID": info.id,
        "clientID": "brig",
        "startedAt": rfc3339(info.created_unix_ms),
        "endAt": rfc3339(end_ms(gw, info)),
        "cpuCount": cfg.cpu_millis.div_ceil(1000).max(1),
        "memoryMB": cfg.memory_mib,
        "diskSizeMB": cfg.disk_mib,
        "state": state,
        "envdVersion": ENVD_VERSION,
        "metadata": metadata(info),
    })
}

async fn get_one(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let (_, info) = visible(&gw, &headers, &id).await?;
    let mut detail = listed(&gw, &info);
    let auto_pause = label(&info, AUTOPAUSE_LABEL).is_some();
    let mounts = crate::volumes::mounts_json(&gw, &headers, &info).await;
    if let Some(obj) = detail.as_object_mut() {
        obj.insert("volumeMounts".into(), mounts);
        obj.insert("envdAccessToken".into(), gw.envd_token(&id).into());
        obj.insert("domain".into(), Value::Null);
        obj.insert("allowInternetAccess".into(), info.egress.is_some().into());
        obj.insert(
            "lifecycle".into(),
            json!({
                "autoResume": crate::auto_resume::wanted(&info),
                "onTimeout": if auto_pause { "pause" } else { "kill" },
            }),
        );
    }
    Ok(Json(detail).into_response())
}

async fn kill(State(gw): State<Gateway>, Path(id): Path<String>, headers: HeaderMap) -> ApiResult {
    let (sb, _) = visible(&gw, &headers, &id).await?;
    gw.inner.running.forget(&id);
    gw.inner.watchers.forget(sb.id());
    sb.destroy().await.map_err(ApiError::from_brig)?;
    gw.inner.lifetimes.forget(&id);
    gw.inner.facts.forget(&id);
    gw.inner.owner_names.forget(&id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn pause(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: crate::files_only_pause::PauseBody = parse(&body)?;
    let (sb, info) = visible(&gw, &headers, &id).await?;
    if info.state == SandboxState::Paused {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("sandbox {id} is already paused")));
    }
    gw.inner.running.forget(&id);
    // A watcher's next look would resume it.
    gw.inner.watchers.forget(sb.id());
    crate::files_only_pause::pause(&sb, &req).await?;
    gw.inner.lifetimes.forget(&id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct TimeoutBody {
    timeout: Option<u64>,
    auto_pause: Option<bool>,
    duration: Option<u64>,
}

/// `connect` and `resume`: a paused sandbox runs again (201) with its timeout from now; a
/// running one answers as it is (200), its timeout lengthened to the one given if that ends
/// later, never shortened (as E2B's `connect` does).
async fn connect(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: TimeoutBody = parse(&body)?;
    let (sb, info) = visible(&gw, &headers, &id).await?;
    let resumed = info.state == SandboxState::Paused;
    if resumed {
        sb.resume().await.map_err(ApiError::from_brig)?;
    }
    let timeout = checked_timeout(&gw, req.timeout)?;
    if resumed {
        crate::files_only_pause::after_resume(&gw, &sb, &info, timeout).await?;
    }
    let left = Duration::from_millis(end_ms(&gw, &info).saturating_sub(unix_ms()));
    if resumed || timeout > left {
        apply_timeout(&gw, &sb, &info, timeout).await?;
    }
    let template = label(&info, TEMPLATE_LABEL).unwrap_or("base").to_string();
    let status = if resumed { StatusCode::CREATED } else { StatusCode::OK };
    let private = crate::facts::Facts::from_labels(&info.labels).private;
    Ok((status, Json(sandbox_json(&gw, &id, &template, private))).into_response())
}

/// Sets the sandbox's E2B timeout to `timeout` from now.
pub(crate) async fn apply_timeout(
    gw: &Gateway,
    sb: &Sandbox,
    info: &SandboxInfo,
    timeout: Duration,
) -> Result<(), ApiError> {
    let auto_pause = label(info, AUTOPAUSE_LABEL).is_some();
    let lifetimes = if auto_pause {
        gw.inner.lifetimes.set(sb.id(), timeout);
        let action = match crate::files_only_pause::on_timeout(info) {
            true => IdleAction::PauseFilesOnly,
            false => IdleAction::Pause,
        };
        BrigLifetimes::new().idle_ttl(timeout).idle_action(action)
    } else {
        let alive = Duration::from_millis(unix_ms().saturating_sub(info.created_unix_ms));
        BrigLifetimes::new().idle_ttl(timeout).max_lifetime(Some(alive + timeout))
    };
    sb.set_lifetimes(lifetimes).await.map_err(ApiError::from_brig)?;
    Ok(())
}

/// A fork child's timeout: `timeout` seconds (or the default) from now.
pub(crate) async fn child_timeout(
    gw: &Gateway,
    child: &Sandbox,
    timeout: Option<u64>,
) -> Result<(), ApiError> {
    let info = child.status().await.map_err(ApiError::from_brig)?;
    apply_timeout(gw, child, &info, checked_timeout(gw, timeout)?).await
}

async fn set_timeout(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: TimeoutBody = parse(&body)?;
    let timeout = req.timeout.ok_or_else(|| ApiError::bad("no timeout"))?;
    let (sb, info) = visible(&gw, &headers, &id).await?;
    apply_timeout(&gw, &sb, &info, checked_timeout(&gw, Some(timeout))?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `refreshes`: keeps the sandbox alive at least `duration` seconds more.
async fn refresh(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let req: TimeoutBody = parse(&body)?;
    let (sb, info) = visible(&gw, &headers, &id).await?;
    let asked = Duration::from_secs(req.duration.unwrap_or(gw.config().default_timeout_s));
    let left = Duration::from_millis(end_ms(&gw, &info).saturating_sub(unix_ms()));
    if asked > left {
        apply_timeout(&gw, &sb, &info, checked_timeout(&gw, Some(asked.as_secs()))?).await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Pause-on-timeout deadlines the gateway enforces itself (Brig's idle TTL, set to the same
/// timeout, pauses them too if the gateway is restarted and forgets).
#[derive(Default)]
pub struct Lifetimes {
    pause_at: parking_lot::Mutex<HashMap<String, u64>>,
}

impl Lifetimes {
    fn set(&self, id: &str, timeout: Duration) {
        let at = unix_ms() + timeout.as_millis() as u64;
        self.pause_at.lock().insert(id.to_string(), at);
    }

    fn forget(&self, id: &str) {
        self.pause_at.lock().remove(id);
    }

    fn deadline(&self, id: &str) -> Option<u64> {
        self.pause_at.lock().get(id).copied()
    }

    fn due(&self) -> Vec<String> {
        let now = unix_ms();
        let mut map = self.pause_at.lock();
        let due: Vec<String> =
            map.iter().filter(|(_, at)| **at <= now).map(|(id, _)| id.clone()).collect();
        for id in &due {
            map.remove(id);
        }
        due
    }
}

impl Gateway {
    /// Pauses sandboxes whose pause-on-timeout deadline passed, once a second.
    pub(crate) fn spawn_lifetime_keeper(&self) {
        let gw = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let due = gw.inner.lifetimes.due();
                if due.is_empty() {
                    continue;
                }
                let Ok(admin) = gw.admin().await else { continue };
                for id in due {
                    gw.inner.running.forget(&id);
                    gw.inner.watchers.forget(&id);
                    let sb = admin.sandbox(&id);
                    // Made with `autoPauseMemory: false`: the pause keeps its files only.
                    let files_only = matches!(sb.status().await,
                        Ok(info) if crate::files_only_pause::on_timeout(&info));
                    let paused =
                        if files_only { sb.pause_files_only().await } else { sb.pause().await };
                    if let Err(e) = paused {
                        tracing::warn!(sandbox = %id, error = %e, "pause at E2B timeout failed");
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}

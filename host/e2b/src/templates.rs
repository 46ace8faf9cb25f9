//! E2B's template API, the names half: templates and their names, tags and builds, kept in
//! the gateway's state directory (`e2b-templates.json`); the files a build's COPY steps read
//! (`GET /templates/{id}/files/{hash}` and the upload it points to); aliases, tags, list,
//! get, delete. A template's builds are Brig environments (`env:e2b/<id>/<build>`), built
//! by `crate::template_builds`; a create names a template by id or name (`name:tag`).
//!
//! Templates belong to the project whose token made them ([`Scope`]): a project sees and
//! changes its own, and starts from those an admin token made; a name another project's
//! template holds, or a built-in template's, is refused (409).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use brig_sdk::Client;

use crate::api::{caller, rfc3339, unix_ms, ApiError};
use crate::gateway::header;
use crate::Gateway;

type ApiResult = Result<Response, ApiError>;

/// The tag a build gets when none is named, and a name without `:tag` means.
pub(crate) const DEFAULT_TAG: &str = "default";
/// Most templates one gateway keeps (a new one past it is refused).
const MAX_TEMPLATES: usize = 10_000;
/// Largest file archive one COPY step may upload.
const MAX_UPLOAD_BYTES: usize = 1 << 30;

/// One template: its names, and its tags each naming a build.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Template {
    pub names: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub builds: BTreeMap<String, BuildRecord>,
    pub created_ms: u64,
    pub cpu_count: Option<u64>,
    pub memory_mb: Option<u64>,
    /// The project whose token made it; `None` when an admin token did (every project may
    /// start from it).
    #[serde(default)]
    pub project: Option<String>,
}

/// Whose templates a caller sees and may change.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scope {
    /// The caller's project; `None` for an admin token (everything).
    project: Option<String>,
}

impl Scope {
    /// The caller of `headers` (401 without a valid key), and its scope (asked of brigd).
    pub(crate) async fn of(gw: &Gateway, headers: &HeaderMap) -> Result<(Client, Scope), ApiError> {
        let client = caller(gw, headers).await?;
        let scope = Scope::of_client(&client).await?;
        Ok((client, scope))
    }

    pub(crate) async fn of_client(client: &Client) -> Result<Scope, ApiError> {
        let who = client
            .whoami()
            .await
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("brigd: {e}")))?;
        Ok(Scope { project: who.project })
    }

    /// Whether templates of `project` are this caller's to change (its own project or a
    /// sub-project of it).
    pub(crate) fn owns(&self, project: Option<&str>) -> bool {
        match (&self.project, project) {
            (None, _) => true,
            (Some(me), Some(p)) => {
                p == me || p.strip_prefix(me.as_str()).is_some_and(|r| r.starts_with('/'))
            }
            (Some(_), None) => false,
        }
    }

    /// Whether templates of `project` are this caller's to start from: its own and an
    /// admin's.
    pub(crate) fn sees(&self, project: Option<&str>) -> bool {
        project.is_none() || self.owns(project)
    }
}

/// A finished build of a template.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct BuildRecord {
    /// What sandboxes of it start from (`env:e2b/<id>/<build>`).
    pub image: String,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// Where its commands start when they name no directory (its last WORKDIR).
    #[serde(default)]
    pub workdir: Option<String>,
    pub finished_ms: u64,
}

/// What a create from a template runs on.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub build: BuildRecord,
    /// The template's project (who may start from it).
    pub project: Option<String>,
}

/// The gateway's templates, by id, saved whole on each change.
pub(crate) struct Templates {
    path: PathBuf,
    pub(crate) files: PathBuf,
    by_id: parking_lot::Mutex<BTreeMap<String, Template>>,
}

impl Templates {
    pub(crate) fn open(state_dir: &Path) -> Templates {
        let path = state_dir.join("e2b-templates.json");
        let by_id = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let files = state_dir.join("e2b-template-files");
        Templates { path, files, by_id: parking_lot::Mutex::new(by_id) }
    }

    fn save(&self, all: &BTreeMap<String, Template>) {
        let bytes = serde_json::to_vec_pretty(all).unwrap_or_default();
        let tmp = self.path.with_extension("json.tmp");
        if let Err(e) = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &self.path))
        {
            tracing::warn!(error = %e, path = %self.path.display(), "cannot save the E2B templates");
        }
    }

    /// Changes the templates and saves them.
    pub(crate) fn change<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Template>) -> T) -> T {
        let mut all = self.by_id.lock();
        let out = f(&mut all);
        self.save(&all);
        out
    }

    pub(crate) fn get(&self, id: &str) -> Option<Template> {
        self.by_id.lock().get(id).cloned()
    }

    /// The template `reference` names (`id`, `name` or either with `:tag`) and its build.
    pub(crate) fn resolve(&self, reference: &str) -> Option<Resolved> {
        let (name, tag) = split_tag(reference);
        let all = self.by_id.lock();
        let (_, template) =
            all.iter().find(|(id, t)| *id == name || t.names.iter().any(|n| n == name))?;
        let build = template.tags.get(tag).and_then(|b| template.builds.get(b))?;
        Some(Resolved { build: build.clone(), project: template.project.clone() })
    }

    /// The id of the template `name` names (by id or name), whoever's it is.
    pub(crate) fn id_of(&self, name: &str) -> Option<String> {
        let all = self.by_id.lock();
        all.iter()
            .find(|(id, t)| *id == name || t.names.iter().any(|n| n == name))
            .map(|(id, _)| id.clone())
    }

    /// The id of the template `name` names, if `scope` sees it.
    pub(crate) fn seen_id(&self, name: &str, scope: &Scope) -> Option<String> {
        let id = self.id_of(name)?;
        self.get(&id).filter(|t| scope.sees(t.project.as_deref())).map(|_| id)
    }

    /// The id of the template `name` names, if `scope` may change it: 404 when it does not
    /// see it, 403 when it only starts from it.
    fn owned_id(&self, name: &str, scope: &Scope) -> Result<String, ApiError> {
        let id = self.seen_id(name, scope).ok_or_else(|| not_found(name))?;
        match self.get(&id) {
            Some(t) if scope.owns(t.project.as_deref()) => Ok(id),
            _ => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("template {name:?} is shared by an admin: a project cannot change it"),
            )),
        }
    }
}

/// `name:tag` → (`name`, `tag`), the tag [`DEFAULT_TAG`] when none is given.
pub(crate) fn split_tag(reference: &str) -> (&str, &str) {
    match reference.rsplit_once(':') {
        Some((name, tag)) if !tag.is_empty() && !tag.contains('/') => (name, tag),
        _ => (reference, DEFAULT_TAG),
    }
}

/// A template name or tag: what an environment name may hold.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// A new random id (20 lowercase letters and digits, as E2B's).
pub(crate) fn new_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 20];
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    bytes.iter().map(|b| alphabet[usize::from(*b) % alphabet.len()] as char).collect()
}

/// A new build id: a UUID (version 4), as E2B's SDK parses it.
pub(crate) fn new_build_id() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct NewTemplate {
    name: Option<String>,
    alias: Option<String>,
    tags: Option<Vec<String>>,
    cpu_count: Option<u64>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u64>,
}

/// `POST /v3/templates` (and `/v2/templates`): a template (new, or the one its name names)
/// and a build of it, waiting for its steps.
pub(crate) async fn create(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let req: NewTemplate = crate::api::parse(&body)?;
    let asked = req.name.or(req.alias);
    let (name, tag) = match asked.as_deref() {
        Some(n) => {
            let (name, tag) = split_tag(n);
            (Some(name.to_string()), tag.to_string())
        }
        None => (None, DEFAULT_TAG.to_string()),
    };
    let mut tags = vec![tag];
    tags.extend(req.tags.unwrap_or_default());
    tags.dedup();
    for t in name.iter().chain(&tags) {
        if !valid_name(t) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("{t:?}: names and tags are lowercase letters, digits, '.', '_' and '-'"),
            ));
        }
    }
    if let Some(n) = &name {
        clash(&gw, n, &scope)?;
    }
    let id = name.as_deref().and_then(|n| gw.inner.templates.id_of(n)).unwrap_or_else(|| {
        name.clone().filter(|n| gw.inner.templates.get(n).is_none()).unwrap_or_else(new_id)
    });
    let build_id = new_build_id();
    if gw.inner.templates.get(&id).is_none()
        && gw.inner.templates.by_id.lock().len() >= MAX_TEMPLATES
    {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("this gateway keeps at most {MAX_TEMPLATES} templates: delete one first"),
        ));
    }
    let names = gw.inner.templates.change(|all| {
        let t = all.entry(id.clone()).or_insert_with(|| Template {
            created_ms: unix_ms(),
            project: scope.project.clone(),
            ..Default::default()
        });
        if let Some(n) = &name {
            if !t.names.contains(n) {
                t.names.push(n.clone());
            }
        }
        t.cpu_count = req.cpu_count.or(t.cpu_count);
        t.memory_mb = req.memory_mb.or(t.memory_mb);
        t.names.clone()
    });
    gw.inner.template_builds.waiting(&build_id, &id, tags.clone());
    let body = json!({
        "templateID": id, "buildID": build_id, "public": false,
        "names": names, "tags": tags, "aliases": names,
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// Refuses a name that is not `scope`'s to build under (409): a built-in template's (the
/// gateway's configured templates and the code interpreter), or one another project's
/// template (or an admin's) holds.
fn clash(gw: &Gateway, name: &str, scope: &Scope) -> Result<(), ApiError> {
    let conflict = |why: &str| {
        Err(ApiError::new(StatusCode::CONFLICT, format!("the template name {name:?} {why}")))
    };
    if gw.config().templates.contains_key(name)
        || crate::code_interpreter::is_code_interpreter(name)
    {
        return conflict("is a built-in template's");
    }
    let held = gw.inner.templates.id_of(name).and_then(|id| gw.inner.templates.get(&id));
    match held {
        Some(t) if !scope.owns(t.project.as_deref()) => conflict("is taken by another project"),
        _ => Ok(()),
    }
}

/// `GET /templates/{id}/files/{hash}`: whether the files of a COPY step are here, and where
/// to upload them if not (a URL of this gateway, signed: the SDK sends no key with it).
pub(crate) async fn files(
    State(gw): State<Gateway>,
    UrlPath((id, hash)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> ApiResult {
    caller(&gw, &headers).await?;
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("{hash:?} is no sha256")));
    }
    let hash = hash.to_ascii_lowercase();
    let present = gw.inner.templates.files.join(&hash).is_file();
    let host = header(&headers, "host").unwrap_or("127.0.0.1");
    let token = gw.envd_token(&format!("template-files/{hash}"));
    let url = format!("http://{host}/template-files/{hash}?token={token}");
    tracing::debug!(template = %id, %hash, present, "template files asked for");
    Ok((StatusCode::CREATED, Json(json!({ "present": present, "url": url }))).into_response())
}

#[derive(Deserialize)]
pub(crate) struct UploadQuery {
    token: String,
}

/// `PUT /template-files/{hash}?token=`: the archive of a COPY step's files.
pub(crate) async fn upload(
    State(gw): State<Gateway>,
    UrlPath(hash): UrlPath<String>,
    Query(query): Query<UploadQuery>,
    body: axum::body::Body,
) -> ApiResult {
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;
    let valid = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    if !valid || !gw.envd_token_ok(&format!("template-files/{hash}"), &query.token) {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "a wrong upload token"));
    }
    let failed =
        |e: std::io::Error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let dir = gw.inner.templates.files.clone();
    tokio::fs::create_dir_all(&dir).await.map_err(failed)?;
    // Streamed to a file of its own (two uploads of one hash do not meet), within the cap.
    let part = dir.join(format!("{hash}.{}.part", new_id()));
    let mut out = tokio::fs::File::create(&part).await.map_err(failed)?;
    let (mut stream, mut bytes) = (body.into_data_stream(), 0usize);
    let copied = async {
        while let Some(piece) = stream.next().await {
            let piece = piece.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
            bytes += piece.len();
            if bytes > MAX_UPLOAD_BYTES {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the archive is too large",
                ));
            }
            out.write_all(&piece).await.map_err(failed)?;
        }
        out.flush().await.map_err(failed)?;
        tokio::fs::rename(&part, dir.join(&hash)).await.map_err(failed)
    }
    .await;
    if copied.is_err() {
        let _ = tokio::fs::remove_file(&part).await;
    }
    copied.map(|()| StatusCode::OK.into_response())
}

/// `GET /templates/aliases/{alias}`: the template a name names.
pub(crate) async fn alias(
    State(gw): State<Gateway>,
    UrlPath(alias): UrlPath<String>,
    headers: HeaderMap,
) -> ApiResult {
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let (name, _) = split_tag(&alias);
    match gw.inner.templates.seen_id(name, &scope) {
        Some(id) => Ok(Json(json!({ "templateID": id, "public": false })).into_response()),
        None => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no template {alias:?}"))),
    }
}

fn template_json(id: &str, t: &Template) -> Value {
    let last = t.builds.values().map(|b| b.finished_ms).max().unwrap_or(t.created_ms);
    let build_id = t.tags.get(DEFAULT_TAG).cloned().unwrap_or_default();
    json!({
        "templateID": id,
        "buildID": build_id,
        "cpuCount": t.cpu_count.unwrap_or(2),
        "memoryMB": t.memory_mb.unwrap_or(1024),
        "diskSizeMB": 1024,
        "public": false,
        "aliases": t.names,
        "names": t.names,
        "createdAt": rfc3339(t.created_ms),
        "updatedAt": rfc3339(last),
        "createdBy": Value::Null,
        "lastSpawnedAt": Value::Null,
        "spawnCount": 0,
        "buildCount": t.builds.len(),
        "envdVersion": crate::ENVD_VERSION,
        "buildStatus": if t.builds.is_empty() { "building" } else { "ready" },
    })
}

/// `GET /templates`: every template.
pub(crate) async fn list(State(gw): State<Gateway>, headers: HeaderMap) -> ApiResult {
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let all = gw.inner.templates.by_id.lock().clone();
    let out: Vec<Value> = all
        .iter()
        .filter(|(_, t)| scope.sees(t.project.as_deref()))
        .map(|(id, t)| template_json(id, t))
        .collect();
    Ok(Json(out).into_response())
}

/// `GET /templates/{id}`: one template, with its builds.
pub(crate) async fn get_one(
    State(gw): State<Gateway>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
) -> ApiResult {
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let id = gw.inner.templates.seen_id(&id, &scope).ok_or_else(|| not_found(&id))?;
    let t = gw.inner.templates.get(&id).ok_or_else(|| not_found(&id))?;
    let builds: Vec<Value> = t
        .builds
        .iter()
        .map(|(b, r)| json!({ "buildID": b, "status": "ready", "finishedAt": rfc3339(r.finished_ms) }))
        .collect();
    let mut v = template_json(&id, &t);
    v["builds"] = json!(builds);
    Ok(Json(v).into_response())
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no template {id:?}"))
}

/// `DELETE /templates/{id}`: a template (its builds' environments go too), or a snapshot.
pub(crate) async fn delete(
    State(gw): State<Gateway>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
) -> ApiResult {
    if gw.inner.templates.id_of(&id).is_none() {
        return crate::api_more::delete_snapshot(State(gw), UrlPath(id), headers).await;
    }
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let found = gw.inner.templates.owned_id(&id, &scope)?;
    gw.inner.templates.change(|all| all.remove(&found));
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TagsBody {
    target: Option<String>,
    name: Option<String>,
    tags: Vec<String>,
}

/// `POST /templates/tags`: tags `target`'s build (`name:tag`) with more tags.
pub(crate) async fn assign_tags(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let req: TagsBody = crate::api::parse(&body)?;
    let target = req.target.unwrap_or_default();
    let (name, tag) = split_tag(&target);
    let id = gw.inner.templates.owned_id(name, &scope)?;
    if let Some(bad) = req.tags.iter().find(|t| !valid_name(t)) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("bad tag {bad:?}")));
    }
    let build = gw.inner.templates.change(|all| {
        let t = all.get_mut(&id)?;
        let build = t.tags.get(tag)?.clone();
        for new in &req.tags {
            t.tags.insert(new.clone(), build.clone());
        }
        Some(build)
    });
    let build = build.ok_or_else(|| not_found(&target))?;
    Ok((StatusCode::CREATED, Json(json!({ "buildID": build, "tags": req.tags }))).into_response())
}

/// `DELETE /templates/tags`: removes tags of template `name`.
pub(crate) async fn remove_tags(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let req: TagsBody = crate::api::parse(&body)?;
    let name = req.name.unwrap_or_default();
    let id = gw.inner.templates.owned_id(split_tag(&name).0, &scope)?;
    gw.inner.templates.change(|all| {
        if let Some(t) = all.get_mut(&id) {
            for tag in &req.tags {
                t.tags.remove(tag);
            }
        }
    });
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /templates/{id}/tags`.
pub(crate) async fn tags(
    State(gw): State<Gateway>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
) -> ApiResult {
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let id = gw.inner.templates.seen_id(&id, &scope).ok_or_else(|| not_found(&id))?;
    let t = gw.inner.templates.get(&id).ok_or_else(|| not_found(&id))?;
    let out: Vec<Value> = t
        .tags
        .iter()
        .map(|(tag, build)| {
            let at = t.builds.get(build).map_or(t.created_ms, |b| b.finished_ms);
            json!({ "tag": tag, "buildID": build, "createdAt": rfc3339(at) })
        })
        .collect();
    Ok(Json(out).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tags_and_ids() {
        assert_eq!(split_tag("app:v1"), ("app", "v1"));
        assert_eq!(split_tag("app"), ("app", DEFAULT_TAG));
        assert!(valid_name("my-app_2.0") && !valid_name("App") && !valid_name("a/b"));
        assert_eq!(new_id().len(), 20);
        let build = new_build_id();
        assert_eq!((build.len(), &build[14..15]), (36, "4"));
    }

    #[test]
    fn a_project_owns_its_own_and_sub_projects_templates_and_sees_an_admins() {
        let admin = Scope::default();
        let team = Scope { project: Some("team".into()) };
        assert!(admin.owns(Some("team")) && admin.owns(None));
        assert!(team.owns(Some("team")) && team.owns(Some("team/a")));
        assert!(!team.owns(Some("teams")) && !team.owns(Some("other")) && !team.owns(None));
        assert!(team.sees(None) && !team.sees(Some("other")));
    }
}

//! E2B's template builds: `POST /v2/templates/{id}/builds/{buildID}` takes the steps the SDK
//! made (from `Template()` calls or a Dockerfile it parsed) and builds them with Brig's
//! builder (`Client::build_image`) in the background; `GET .../builds/{buildID}/status`
//! serves the build's state and its log entries from `logsOffset`. The files of COPY steps
//! are the archives uploaded for their hashes (`crate::templates::files`), unpacked together
//! as the build context.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use brig_sdk::{BuildCommand, BuildEvent, BuildEventKind, BuildOptions, BuildStep, Client};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{rfc3339, unix_ms, ApiError};
use crate::templates::{BuildRecord, Scope, Template};
use crate::Gateway;

type ApiResult = Result<Response, ApiError>;

/// Builds kept (their states and logs); the oldest finished ones go first.
const BUILDS_KEPT: usize = 256;
/// Log entries one build keeps; later ones are dropped (the last says so).
const LOG_ENTRIES: usize = 20_000;
/// Longest message of one log entry.
const ENTRY_BYTES: usize = 8 << 10;
/// Largest unpacked build context.
const MAX_CONTEXT_BYTES: u64 = 4 << 30;
/// Makes E2B's `user` in a template (as E2B's own base has it), before the steps.
const ENSURE_USER: &str = "id -u user >/dev/null 2>&1 || useradd -m -s /bin/bash user \
    >/dev/null 2>&1 || adduser -D -s /bin/sh user >/dev/null 2>&1 || { \
    echo 'user:x:1000:1000::/home/user:/bin/sh' >> /etc/passwd && \
    echo 'user:x:1000:' >> /etc/group && mkdir -p /home/user && chown 1000:1000 /home/user; }";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Building => "building",
            Status::Ready => "ready",
            Status::Error => "error",
        }
    }
}

struct LogEntry {
    at_ms: u64,
    level: &'static str,
    message: String,
    step: Option<String>,
}

struct Build {
    template_id: String,
    tags: Vec<String>,
    status: Status,
    entries: Vec<LogEntry>,
    reason: Option<(String, Option<String>)>,
    started_ms: u64,
}

impl Build {
    fn log(&mut self, level: &'static str, message: String, step: Option<String>) {
        if self.entries.len() >= LOG_ENTRIES {
            return;
        }
        let mut message = message;
        if message.len() > ENTRY_BYTES {
            let mut cut = ENTRY_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        if self.entries.len() + 1 == LOG_ENTRIES {
            message = "(the log of this build is cut here)".into();
        }
        self.entries.push(LogEntry { at_ms: unix_ms(), level, message, step });
    }
}

/// The gateway's builds, by build id.
#[derive(Default)]
pub(crate) struct TemplateBuilds {
    by_id: parking_lot::Mutex<HashMap<String, Arc<parking_lot::Mutex<Build>>>>,
}

impl TemplateBuilds {
    /// A build of template `template_id` waiting for its steps, to be tagged `tags`.
    pub(crate) fn waiting(&self, build_id: &str, template_id: &str, tags: Vec<String>) {
        let mut all = self.by_id.lock();
        if all.len() >= BUILDS_KEPT {
            let oldest = all
                .iter()
                .filter(|(_, b)| matches!(b.lock().status, Status::Ready | Status::Error))
                .min_by_key(|(_, b)| b.lock().started_ms)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                all.remove(&oldest);
            }
        }
        let build = Build {
            template_id: template_id.into(),
            tags,
            status: Status::Waiting,
            entries: Vec::new(),
            reason: None,
            started_ms: unix_ms(),
        };
        all.insert(build_id.into(), Arc::new(parking_lot::Mutex::new(build)));
    }

    fn get(&self, build_id: &str) -> Option<Arc<parking_lot::Mutex<Build>>> {
        self.by_id.lock().get(build_id).cloned()
    }
}

/// The body of a build start (`TemplateBuildStartV2`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct BuildStart {
    from_image: Option<String>,
    from_template: Option<String>,
    force: bool,
    steps: Vec<E2bStep>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct E2bStep {
    #[serde(rename = "type")]
    kind: String,
    args: Vec<String>,
    files_hash: Option<String>,
    force: bool,
}

/// `POST /v2/templates/{id}/builds/{buildID}`: starts the build in the background.
pub(crate) async fn start(
    State(gw): State<Gateway>,
    UrlPath((id, build_id)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    let (client, scope) = Scope::of(&gw, &headers).await?;
    let req: BuildStart = crate::api::parse(&body)?;
    let yours = |t: Template| scope.owns(t.project.as_deref());
    let build = gw.inner.template_builds.get(&build_id).filter(|b| b.lock().template_id == id);
    let build = build.filter(|_| gw.inner.templates.get(&id).is_some_and(yours));
    let build = build.ok_or_else(|| {
        ApiError::new(StatusCode::NOT_FOUND, format!("no build {build_id} of template {id}"))
    })?;
    {
        let mut b = build.lock();
        if b.status != Status::Waiting {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("build {build_id} has started"),
            ));
        }
        b.status = Status::Building;
        b.log("info", "Build started".into(), None);
    }
    let (gw2, build2) = (gw.clone(), build.clone());
    tokio::spawn(async move {
        let outcome = run(&gw2, &client, &scope, &id, &build_id, req, &build2).await;
        let mut b = build2.lock();
        match outcome {
            Ok(()) => {
                b.log("info", "Build finished".into(), None);
                b.status = Status::Ready;
            }
            Err((message, step)) => {
                b.log("error", message.clone(), step.clone());
                b.reason = Some((message, step));
                b.status = Status::Error;
            }
        }
    });
    Ok((StatusCode::ACCEPTED, Json(json!({}))).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct StatusQuery {
    logs_offset: usize,
    limit: Option<usize>,
}

/// `GET /templates/{id}/builds/{buildID}/status`.
pub(crate) async fn status(
    State(gw): State<Gateway>,
    UrlPath((id, build_id)): UrlPath<(String, String)>,
    Query(query): Query<StatusQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let (_, scope) = Scope::of(&gw, &headers).await?;
    let seen = |t: Template| scope.sees(t.project.as_deref());
    let build = gw.inner.template_builds.get(&build_id).filter(|b| b.lock().template_id == id);
    let build = build.filter(|_| gw.inner.templates.get(&id).is_some_and(seen));
    let build = build.ok_or_else(|| {
        ApiError::new(StatusCode::NOT_FOUND, format!("no build {build_id} of template {id}"))
    })?;
    let b = build.lock();
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    let entries: Vec<Value> = b
        .entries
        .iter()
        .skip(query.logs_offset)
        .take(limit)
        .map(|e| {
            let mut v =
                json!({ "timestamp": rfc3339(e.at_ms), "level": e.level, "message": e.message });
            if let Some(step) = &e.step {
                v["step"] = json!(step);
            }
            v
        })
        .collect();
    let mut body = json!({
        "templateID": id, "buildID": build_id, "status": b.status.as_str(),
        "logs": [], "logEntries": entries,
    });
    if let (Some((message, step)), Status::Error) = (&b.reason, b.status) {
        body["reason"] = json!({ "message": message });
        if let Some(step) = step {
            body["reason"]["step"] = json!(step);
        }
    }
    Ok(Json(body).into_response())
}

/// A failure: its message, and the step it names (`base`, `1`…, `finalize`).
type Failure = (String, Option<String>);

/// Runs a build: the context, the steps, the Brig build, the template's new build.
async fn run(
    gw: &Gateway,
    client: &Client,
    scope: &Scope,
    id: &str,
    build_id: &str,
    req: BuildStart,
    build: &Arc<parking_lot::Mutex<Build>>,
) -> Result<(), Failure> {
    let context = tempdir_in(&gw.inner.templates.files).map_err(|e| (e, Some("base".into())))?;
    let hashes: Vec<String> = req.steps.iter().filter_map(|s| s.files_hash.clone()).collect();
    let files = gw.inner.templates.files.clone();
    let root = context.clone();
    tokio::task::spawn_blocking(move || unpack_archives(&files, &hashes, &root))
        .await
        .map_err(|e| (e.to_string(), None))?
        .map_err(|e| (e, Some("base".into())))?;
    let base = match (&req.from_template, &req.from_image) {
        (Some(t), _) => {
            match gw.inner.templates.resolve(t).filter(|r| scope.sees(r.project.as_deref())) {
                Some(r) => r.build.image,
                // A template of the gateway's configuration (`base`).
                None => gw
                    .config()
                    .templates
                    .get(t)
                    .cloned()
                    .ok_or_else(|| (format!("no template {t:?}"), Some("base".to_string())))?,
            }
        }
        (None, Some(image)) if image != "e2bdev/base" => image.clone(),
        _ => gw.config().templates.get("base").cloned().unwrap_or_else(|| "debian-12".into()),
    };
    let (steps, numbers) = translate(&base, &req.steps).map_err(|e| (e, None))?;
    let env = format!("e2b/{id}/{}", build_id.replace('-', ""));
    let mut options = BuildOptions::steps(&env, steps).context(&context);
    if req.force || req.steps.iter().any(|s| s.force) {
        options = options.no_cache();
    }
    let on_event = |event: &BuildEvent| {
        let step = numbers.get(event.step as usize).cloned().flatten();
        let mut b = build.lock();
        match &event.kind {
            BuildEventKind::Started { text, cached } => {
                let cached = if *cached { " (cached)" } else { "" };
                b.log("info", format!("[{}/{}] {text}{cached}", event.step, event.steps), step);
            }
            BuildEventKind::Log { text, .. } => {
                for line in text.lines().filter(|l| !l.is_empty()) {
                    b.log("info", line.to_string(), step.clone());
                }
            }
            BuildEventKind::Finished { millis } => {
                b.log("debug", format!("step {} done in {millis} ms", event.step), step);
            }
        }
    };
    let built = client.build_image(options, on_event).await;
    let _ = std::fs::remove_dir_all(&context);
    let built = built.map_err(|e| {
        let message = crate::envd::brig_message(&e);
        // "step N/M" names Brig's step; the SDK wants the template's.
        let step = message
            .split("step ")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| numbers.get(n).cloned().flatten());
        (message, step.or_else(|| Some("base".into())))
    })?;
    let tags = build.lock().tags.clone();
    let record = BuildRecord {
        image: format!("env:{}", built.name),
        start_cmd: req.start_cmd.filter(|c| !c.is_empty()),
        ready_cmd: req.ready_cmd.filter(|c| !c.is_empty()),
        workdir: built.working_dir.clone(),
        finished_ms: unix_ms(),
    };
    gw.inner.templates.change(|all| {
        if let Some(t) = all.get_mut(id) {
            t.builds.insert(build_id.to_string(), record);
            for tag in tags {
                t.tags.insert(tag, build_id.to_string());
            }
        }
    });
    Ok(())
}

fn tempdir_in(dir: &std::path::Path) -> Result<std::path::PathBuf, String> {
    let path = dir.join(format!("context-{}", crate::templates::new_id()));
    std::fs::create_dir_all(&path).map_err(|e| format!("build context: {e}"))?;
    Ok(path)
}

/// Unpacks the archives of `hashes` (gzip or plain tar) into `root`, each path kept inside it.
fn unpack_archives(
    files: &std::path::Path,
    hashes: &[String],
    root: &std::path::Path,
) -> Result<(), String> {
    let mut total = 0u64;
    for hash in hashes {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("bad files hash {hash:?}"));
        }
        let path = files.join(hash.to_ascii_lowercase());
        let bytes = std::fs::read(&path)
            .map_err(|_| format!("the files of hash {hash} were never uploaded"))?;
        let reader: Box<dyn std::io::Read> = if bytes.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::read::GzDecoder::new(&bytes[..]))
        } else {
            Box::new(&bytes[..])
        };
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().map_err(|e| format!("files {hash}: {e}"))? {
            let mut entry = entry.map_err(|e| format!("files {hash}: {e}"))?;
            total += entry.header().size().unwrap_or(0);
            if total > MAX_CONTEXT_BYTES {
                return Err(format!("the files are over {MAX_CONTEXT_BYTES} bytes"));
            }
            use tar::EntryType as T;
            if !matches!(
                entry.header().entry_type(),
                T::Regular | T::Directory | T::Symlink | T::Link
            ) {
                continue;
            }
            entry.set_preserve_permissions(true);
            let inside = entry.unpack_in(root).map_err(|e| format!("files {hash}: {e}"))?;
            if !inside {
                return Err(format!("files {hash}: a path leads out of the context"));
            }
        }
    }
    Ok(())
}

/// The template's steps as Brig's, after its base and E2B's user, with each Brig step's
/// template step number (`base` for the ones the gateway adds; by Brig step number, from 1).
#[allow(clippy::type_complexity)]
fn translate(
    base: &str,
    steps: &[E2bStep],
) -> Result<(Vec<BuildStep>, Vec<Option<String>>), String> {
    let mut out = vec![
        BuildStep::From(base.to_string()),
        BuildStep::RunAs { command: BuildCommand::Shell(ENSURE_USER.into()), user: "root".into() },
        BuildStep::User("user".into()),
        BuildStep::Workdir("/home/user".into()),
    ];
    // Index 0 is unused: Brig's steps count from 1.
    let mut numbers = vec![
        None,
        Some("base".to_string()),
        Some("base".into()),
        Some("base".into()),
        Some("base".into()),
    ];
    let mut user = "user".to_string();
    for (i, step) in steps.iter().enumerate() {
        let a = &step.args;
        let arg = |n: usize| a.get(n).cloned().unwrap_or_default();
        let bad = |why: &str| format!("step {} ({}): {why}", i + 1, step.kind);
        let translated = match step.kind.as_str() {
            "RUN" => match a.get(1).filter(|u| !u.is_empty()) {
                Some(as_user) => {
                    BuildStep::RunAs { command: BuildCommand::Shell(arg(0)), user: as_user.clone() }
                }
                None => BuildStep::Run(BuildCommand::Shell(arg(0))),
            },
            "COPY" => {
                let owner = match arg(2) {
                    o if !o.is_empty() => Some(o),
                    _ if user != "root" => Some(user.clone()),
                    _ => None,
                };
                let chmod = match arg(3) {
                    m if m.is_empty() => None,
                    m => Some(u32::from_str_radix(&m, 8).map_err(|_| bad("a mode in octal"))?),
                };
                if a.is_empty() || arg(1).is_empty() {
                    return Err(bad("COPY needs a source and a destination"));
                }
                BuildStep::Copy { sources: vec![arg(0)], dest: arg(1), chown: None, owner, chmod }
            }
            "ENV" => BuildStep::Env(
                a.chunks(2)
                    .map(|p| (p[0].clone(), p.get(1).cloned().unwrap_or_default()))
                    .collect(),
            ),
            "WORKDIR" => BuildStep::Workdir(arg(0)),
            "USER" => {
                user = arg(0);
                BuildStep::User(arg(0))
            }
            other => return Err(bad(&format!("unknown step type {other:?}"))),
        };
        out.push(translated);
        numbers.push(Some((i + 1).to_string()));
    }
    Ok((out, numbers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str]) -> E2bStep {
        E2bStep {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn template_steps_become_brig_steps() {
        let steps = [
            step("ENV", &["A", "1", "B", "two words"]),
            step("COPY", &["app", "/home/user/app", "", "0755"]),
            step("RUN", &["pip install x", "root"]),
            step("USER", &["root"]),
            step("COPY", &["x", "y", "", ""]),
        ];
        let (out, numbers) = translate("python:3", &steps).expect("translate");
        assert_eq!(out[0], BuildStep::From("python:3".into()));
        assert_eq!(
            out[4],
            BuildStep::Env(vec![("A".into(), "1".into()), ("B".into(), "two words".into())])
        );
        let BuildStep::Copy { owner, chmod, .. } = &out[5] else { panic!("{:?}", out[5]) };
        assert_eq!(
            (owner.as_deref(), *chmod),
            (Some("user"), Some(0o755)),
            "the current user owns copies"
        );
        assert!(matches!(&out[6], BuildStep::RunAs { user, .. } if user == "root"));
        let BuildStep::Copy { owner, .. } = &out[8] else { panic!("{:?}", out[8]) };
        assert_eq!(owner, &None, "root's copies: no chown");
        assert_eq!(numbers[5].as_deref(), Some("1"));
        assert_eq!(numbers[9].as_deref(), Some("5"));
        assert!(translate("b", &[step("FOO", &[])]).is_err());
    }
}

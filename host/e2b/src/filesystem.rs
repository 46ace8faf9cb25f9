//! envd's `filesystem.Filesystem` service on Brig's file API. Operations that must act as the
//! calling user (make a directory, move) run as that user in the sandbox, so ownership and
//! permission checks are the sandbox's own; watchers poll the tree and report differences.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use brig_sdk::{Cmd, FileKind, FileStat, Sandbox};
use tokio::sync::mpsc;

use crate::connect::{self, Code, Codec, ConnectError};
use crate::envd::{self, brig_error, EnvdUser};
use crate::pb::filesystem as pb;
use crate::Gateway;

/// Most entries a recursive listing returns.
const MAX_ENTRIES: usize = 100_000;
/// Deepest `ListDir` depth served.
const MAX_DEPTH: u32 = 32;
/// How often a watcher looks at its tree.
const WATCH_EVERY: Duration = Duration::from_millis(200);
/// Watchers of the sync SDK alive at once, and the events each keeps until read.
const MAX_WATCHERS: usize = 1024;
const MAX_QUEUED_EVENTS: usize = 10_000;

/// `POST /filesystem.Filesystem/{method}`.
pub async fn rpc(
    State(gw): State<Gateway>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if method == "WatchDir" {
        return watch_dir(&gw, &headers, body).await.unwrap_or_else(IntoResponse::into_response);
    }
    let codec = match Codec::unary(&headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    macro_rules! serve {
        ($req:ty, $f:expr) => {{
            let r = async {
                let req: $req = connect::unary_request(codec, body).await?;
                let sb = envd::sandbox(&gw, &headers).await?;
                let user = EnvdUser::from_headers(&headers)?;
                $f(&gw, sb, user, req).await
            };
            connect::unary_reply(codec, r.await)
        }};
    }
    match method.as_str() {
        "Stat" => serve!(pb::StatRequest, stat),
        "MakeDir" => serve!(pb::MakeDirRequest, make_dir),
        "Move" => serve!(pb::MoveRequest, move_entry),
        "ListDir" => serve!(pb::ListDirRequest, list_dir),
        "Remove" => serve!(pb::RemoveRequest, remove),
        "CreateWatcher" => serve!(pb::CreateWatcherRequest, create_watcher),
        "GetWatcherEvents" => serve!(pb::GetWatcherEventsRequest, watcher_events),
        "RemoveWatcher" => serve!(pb::RemoveWatcherRequest, remove_watcher),
        other => {
            ConnectError::new(Code::Unimplemented, format!("no method {other}")).into_response()
        }
    }
}

/// envd's entry for a Brig file stat.
pub fn entry_info(stat: &FileStat) -> pb::EntryInfo {
    let name = stat.path.rsplit('/').next().unwrap_or("").to_string();
    let file_type = match stat.kind {
        FileKind::File => pb::FileType::File,
        FileKind::Dir => pb::FileType::Directory,
        FileKind::Symlink => pb::FileType::Symlink,
        FileKind::Other => pb::FileType::Unspecified,
    };
    let modified = Duration::from_millis(stat.modified_unix_ms);
    pb::EntryInfo {
        name,
        r#type: file_type as i32,
        path: stat.path.clone(),
        size: i64::try_from(stat.size).unwrap_or(i64::MAX),
        mode: stat.mode & 0o7777,
        permissions: permissions(stat.kind, stat.mode),
        owner: String::new(),
        group: String::new(),
        modified_time: Some(pbjson_types::Timestamp {
            seconds: i64::try_from(modified.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(modified.subsec_nanos()).unwrap_or(0),
        }),
        symlink_target: None,
        metadata: Default::default(),
        is_symlink: stat.kind == FileKind::Symlink,
    }
}

/// `ls -l`'s permission string: `drwxr-xr-x`.
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// Brig reports paths as asked; envd's are absolute.
async fn stat_abs(sb: &Sandbox, path: &str) -> Result<pb::EntryInfo, ConnectError> {
    let mut stat = sb.stat(path).await.map_err(brig_error)?;
    stat.path = path.to_string();
    Ok(entry_info(&stat))
}

async fn stat(
    _: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::StatRequest,
) -> Result<pb::StatResponse, ConnectError> {
    Ok(pb::StatResponse { entry: Some(stat_abs(&sb, &user.resolve(&req.path)).await?) })
}

/// Runs `argv` as `user` in the sandbox; a failure becomes the error its message implies.
pub(crate) async fn run_as(
    sb: &Sandbox,
    user: &EnvdUser,
    argv: &[&str],
) -> Result<(), ConnectError> {
    let mut cmd = Cmd::new(argv).cwd("/").timeout(Duration::from_secs(60));
    if let Some(name) = user.brig_user() {
        cmd = cmd.user(&name);
    }
    let out = sb.exec_with(cmd).await.map_err(brig_error)?;
    if out.success() {
        return Ok(());
    }
    let message = out.stderr_text().trim().to_string();
    let code = if message.contains("No such file") {
        Code::NotFound
    } else if message.contains("Permission denied") {
        Code::PermissionDenied
    } else if message.contains("File exists") {
        Code::AlreadyExists
    } else {
        Code::InvalidArgument
    };
    Err(ConnectError::new(code, message))
}

async fn make_dir(
    _: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::MakeDirRequest,
) -> Result<pb::MakeDirResponse, ConnectError> {
    let path = user.resolve(&req.path);
    if sb.stat(&path).await.is_ok() {
        return Err(ConnectError::new(Code::AlreadyExists, format!("{path} already exists")));
    }
    run_as(&sb, &user, &["mkdir", "-p", "--", &path]).await?;
    Ok(pb::MakeDirResponse { entry: Some(stat_abs(&sb, &path).await?) })
}

async fn move_entry(
    _: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::MoveRequest,
) -> Result<pb::MoveResponse, ConnectError> {
    let (from, to) = (user.resolve(&req.source), user.resolve(&req.destination));
    run_as(&sb, &user, &["mv", "-T", "--", &from, &to]).await?;
    Ok(pb::MoveResponse { entry: Some(stat_abs(&sb, &to).await?) })
}

async fn remove(
    _: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::RemoveRequest,
) -> Result<pb::RemoveResponse, ConnectError> {
    sb.remove(&user.resolve(&req.path), true).await.map_err(brig_error)?;
    Ok(pb::RemoveResponse {})
}

/// Every entry under `root` down to `depth` levels (1: the directory's own entries).
async fn walk(sb: &Sandbox, root: &str, depth: u32) -> Result<Vec<FileStat>, ConnectError> {
    let mut out = Vec::new();
    let mut queue = VecDeque::from([(root.trim_end_matches('/').to_string(), 1u32)]);
    while let Some((dir, level)) = queue.pop_front() {
        let dir = if dir.is_empty() { "/".to_string() } else { dir };
        let entries = sb.list_dir(&dir).await.map_err(brig_error)?;
        for mut e in entries {
            let name = e.path.rsplit('/').next().unwrap_or("").to_string();
            e.path = if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") };
            if e.kind == FileKind::Dir && level < depth {
                queue.push_back((e.path.clone(), level + 1));
            }
            out.push(e);
            if out.len() >= MAX_ENTRIES {
                return Ok(out);
            }
        }
    }
    Ok(out)
}

async fn list_dir(
    _: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::ListDirRequest,
) -> Result<pb::ListDirResponse, ConnectError> {
    let path = user.resolve(&req.path);
    let depth = req.depth.clamp(1, MAX_DEPTH);
    let top = sb.stat(&path).await.map_err(brig_error)?;
    if top.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("{path} is not a directory")));
    }
    let entries = walk(&sb, &path, depth).await?;
    Ok(pb::ListDirResponse { entries: entries.iter().map(entry_info).collect() })
}

/// What a watcher remembers of a tree: each path's kind, size and modification time.
type Snapshot = BTreeMap<String, (FileKind, u64, u64)>;

async fn snapshot(sb: &Sandbox, root: &str, recursive: bool) -> Result<Snapshot, ConnectError> {
    let entries = walk(sb, root, if recursive { MAX_DEPTH } else { 1 }).await?;
    Ok(entries.into_iter().map(|e| (e.path, (e.kind, e.size, e.modified_unix_ms))).collect())
}

/// The events that turn `before` into `after`, named relative to `root`.
fn diff(root: &str, before: &Snapshot, after: &Snapshot) -> Vec<pb::FilesystemEvent> {
    let rel = |p: &str| p.strip_prefix(root).unwrap_or(p).trim_start_matches('/').to_string();
    let mut events = Vec::new();
    for (path, now) in after {
        let kind = match before.get(path) {
            None => pb::EventType::Create,
            Some(was) if was != now => pb::EventType::Write,
            Some(_) => continue,
        };
        events.push(pb::FilesystemEvent { name: rel(path), r#type: kind as i32, entry: None });
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        events.push(pb::FilesystemEvent {
            name: rel(path),
            r#type: pb::EventType::Remove as i32,
            entry: None,
        });
    }
    events
}

/// Watches `root` until `tx` closes, sending each round's events (after a first snapshot).
async fn watch_loop(
    sb: Sandbox,
    root: String,
    recursive: bool,
    tx: mpsc::Sender<Result<pb::FilesystemEvent, ConnectError>>,
) {
    let mut before = match snapshot(&sb, &root, recursive).await {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Err(e)).await;
            return;
        }
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(WATCH_EVERY) => {}
            _ = tx.closed() => return,
        }
        let after = match snapshot(&sb, &root, recursive).await {
            Ok(s) => s,
            // The directory went away or the sandbox stopped: the watch ends with why.
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        for event in diff(&root, &before, &after) {
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
        before = after;
    }
}

async fn watch_target(sb: &Sandbox, user: &EnvdUser, path: &str) -> Result<String, ConnectError> {
    let root = user.resolve(path);
    let stat = sb.stat(&root).await.map_err(brig_error)?;
    if stat.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("{root} is not a directory")));
    }
    Ok(root)
}

/// `WatchDir`: `start`, then events as the tree changes, keepalives while it does not.
async fn watch_dir(
    gw: &Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    use pb::watch_dir_response::{Event, KeepAlive, StartEvent};
    let codec = Codec::streaming(headers)?;
    let req: pb::WatchDirRequest = connect::single_stream_request(codec, body).await?;
    let sb = envd::sandbox(gw, headers).await?;
    let user = EnvdUser::from_headers(headers)?;
    let root = watch_target(&sb, &user, &req.path).await?;
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(watch_loop(sb, root, req.recursive, tx));
    let deadline = connect::deadline(headers).map(|d| tokio::time::Instant::now() + d);
    let first = futures::stream::iter([Ok(pb::WatchDirResponse {
        event: Some(Event::Start(StartEvent {})),
    })]);
    let rest = futures::stream::unfold((rx, deadline), |(mut rx, deadline)| async move {
        let next = async {
            match tokio::time::timeout(Duration::from_secs(50), rx.recv()).await {
                Ok(Some(Ok(e))) => Some(Ok(Event::Filesystem(e))),
                Ok(Some(Err(e))) => Some(Err(e)),
                Ok(None) => None,
                Err(_) => Some(Ok(Event::Keepalive(KeepAlive {}))),
            }
        };
        let item = match deadline {
            Some(at) => match tokio::time::timeout_at(at, next).await {
                Ok(item) => item?,
                // The client's deadline ends a watch normally.
                Err(_) => return None,
            },
            None => next.await?,
        };
        let ended = item.is_err();
        let message = item.map(|e| pb::WatchDirResponse { event: Some(e) });
        Some((message, (rx, if ended { Some(tokio::time::Instant::now()) } else { deadline })))
    });
    Ok(connect::stream_reply(codec, futures::StreamExt::chain(first, rest)))
}

/// The sync SDK's watchers: events collected between its polls.
#[derive(Default)]
pub struct Watchers {
    by_id: parking_lot::Mutex<HashMap<String, Arc<Watcher>>>,
}

struct Watcher {
    sandbox: String,
    events: parking_lot::Mutex<VecDeque<pb::FilesystemEvent>>,
    failed: parking_lot::Mutex<Option<ConnectError>>,
    /// Dropped with the watcher: its loop ends.
    _stop: mpsc::Sender<()>,
}

async fn create_watcher(
    gw: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::CreateWatcherRequest,
) -> Result<pb::CreateWatcherResponse, ConnectError> {
    if gw.inner.watchers.by_id.lock().len() >= MAX_WATCHERS {
        return Err(ConnectError::new(Code::ResourceExhausted, "too many watchers"));
    }
    let root = watch_target(&sb, &user, &req.path).await?;
    let (stop, mut stopped) = mpsc::channel::<()>(1);
    let watcher = Arc::new(Watcher {
        sandbox: sb.id().to_string(),
        events: Default::default(),
        failed: Default::default(),
        _stop: stop,
    });
    let id = format!("w-{}", hex::encode(rand_id()));
    let (tx, mut rx) = mpsc::channel(256);
    tokio::spawn(watch_loop(sb, root, req.recursive, tx));
    let weak = Arc::downgrade(&watcher);
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                item = rx.recv() => item,
                _ = stopped.recv() => None,
            };
            let (Some(item), Some(w)) = (item, weak.upgrade()) else { return };
            match item {
                Ok(event) => {
                    let mut q = w.events.lock();
                    if q.len() < MAX_QUEUED_EVENTS {
                        q.push_back(event);
                    }
                }
                Err(e) => {
                    *w.failed.lock() = Some(e);
                    return;
                }
            }
        }
    });
    gw.inner.watchers.by_id.lock().insert(id.clone(), watcher);
    Ok(pb::CreateWatcherResponse { watcher_id: id })
}

fn watcher(gw: &Gateway, sb: &Sandbox, id: &str) -> Result<Arc<Watcher>, ConnectError> {
    gw.inner
        .watchers
        .by_id
        .lock()
        .get(id)
        .filter(|w| w.sandbox == sb.id())
        .cloned()
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("no watcher {id}")))
}

async fn watcher_events(
    gw: &Gateway,
    sb: Sandbox,
    _: EnvdUser,
    req: pb::GetWatcherEventsRequest,
) -> Result<pb::GetWatcherEventsResponse, ConnectError> {
    let w = watcher(gw, &sb, &req.watcher_id)?;
    if let Some(e) = w.failed.lock().take() {
        gw.inner.watchers.by_id.lock().remove(&req.watcher_id);
        return Err(e);
    }
    let events = w.events.lock().drain(..).collect();
    Ok(pb::GetWatcherEventsResponse { events })
}

async fn remove_watcher(
    gw: &Gateway,
    sb: Sandbox,
    _: EnvdUser,
    req: pb::RemoveWatcherRequest,
) -> Result<pb::RemoveWatcherResponse, ConnectError> {
    watcher(gw, &sb, &req.watcher_id)?;
    gw.inner.watchers.by_id.lock().remove(&req.watcher_id);
    Ok(pb::RemoveWatcherResponse {})
}

fn rand_id() -> [u8; 8] {
    let mut id = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_differences_name_paths_relative_to_the_root() {
        let before: Snapshot = [
            ("/w/a".to_string(), (FileKind::File, 1, 10)),
            ("/w/b".to_string(), (FileKind::File, 1, 10)),
        ]
        .into();
        let after: Snapshot = [
            ("/w/a".to_string(), (FileKind::File, 2, 11)),
            ("/w/c/d".to_string(), (FileKind::File, 0, 12)),
        ]
        .into();
        let mut got: Vec<(String, i32)> =
            diff("/w", &before, &after).into_iter().map(|e| (e.name, e.r#type)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("a".into(), pb::EventType::Write as i32),
                ("b".into(), pb::EventType::Remove as i32),
                ("c/d".into(), pb::EventType::Create as i32),
            ]
        );
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
        let json = serde_json::to_value(entry_info(&FileStat {
            path: "/home/user/x.txt".into(),
            kind: FileKind::File,
            size: 12,
            mode: 0o100644,
            modified_unix_ms: 1_700_000_000_500,
        }))
        .expect("json");
        assert_eq!(json["name"], "x.txt");
        assert_eq!(json["type"], "FILE_TYPE_FILE");
        assert_eq!(json["size"], "12");
        assert_eq!(json["mode"], 0o644);
        assert!(json["modifiedTime"].as_str().is_some_and(|t| t.starts_with("2023-11-14T")));
    }
}

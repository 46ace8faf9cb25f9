//! envd's `filesystem.Filesystem` service on Brig's file API. Operations that must act as the
//! calling user (make a directory, move) run as that user in the sandbox, so ownership and
//! permission checks are the sandbox's own; watchers are in [`crate::watch`].

use std::collections::VecDeque;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use brig_sdk::{Cmd, FileKind, FileStat, Sandbox};

use crate::connect::{self, Code, Codec, ConnectError};
use crate::envd::{self, brig_error, EnvdUser};
use crate::owners::Names;
use crate::pb::filesystem as pb;
use crate::Gateway;

/// Most entries a recursive listing returns.
const MAX_ENTRIES: usize = 100_000;
/// Deepest `ListDir` depth served (and watched).
pub(crate) const MAX_DEPTH: u32 = 32;

/// `POST /filesystem.Filesystem/{method}`.
pub async fn rpc(
    State(gw): State<Gateway>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if method == "WatchDir" {
        return crate::watch::watch_dir(&gw, &headers, body)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    let codec = match Codec::unary(&headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    macro_rules! serve {
        ($req:ty, $f:expr) => {{
            let r = async {
                // The token first: nobody else's body is read.
                let sb = envd::sandbox(&gw, &headers).await?;
                let req: $req = connect::unary_request(codec, body).await?;
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
        "CreateWatcher" => serve!(pb::CreateWatcherRequest, crate::watch::create_watcher),
        "GetWatcherEvents" => serve!(pb::GetWatcherEventsRequest, crate::watch::watcher_events),
        "RemoveWatcher" => serve!(pb::RemoveWatcherRequest, crate::watch::remove_watcher),
        other => {
            ConnectError::new(Code::Unimplemented, format!("no method {other}")).into_response()
        }
    }
}

/// envd's entry for a Brig file stat, its owner and group named by `names`.
pub(crate) fn entry_info(stat: &FileStat, names: &Names) -> pb::EntryInfo {
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
        owner: names.owner(stat.uid),
        group: names.group(stat.gid),
        modified_time: Some(pbjson_types::Timestamp {
            seconds: i64::try_from(modified.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(modified.subsec_nanos()).unwrap_or(0),
        }),
        symlink_target: None,
        metadata: stat.metadata.clone().into_iter().collect(),
        is_symlink: stat.kind == FileKind::Symlink,
    }
}

/// `ls -l`'s permission string: `drwxr-xr-x`.
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        // Go's `FileMode.String()`, which envd prints.
        FileKind::Symlink => 'L',
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
async fn stat_abs(gw: &Gateway, sb: &Sandbox, path: &str) -> Result<pb::EntryInfo, ConnectError> {
    let mut stat = sb.stat(path).await.map_err(brig_error)?;
    stat.path = path.to_string();
    let mut entry = entry_info(&stat, &*gw.inner.owner_names.of(sb).await);
    if stat.kind == FileKind::Symlink {
        follow_links(sb, std::slice::from_mut(&mut entry)).await?;
    }
    Ok(entry)
}

/// Most symlinks of one answer resolved (one command in the sandbox for all of them); past
/// it a link is reported as a link.
const MAX_LINKS_RESOLVED: usize = 1000;
/// Most bytes of link paths one such command takes.
const MAX_LINK_ARGUMENT_BYTES: usize = 64 << 10;

/// Turns the symlinks among `entries` into what envd reports for them: the type and mode of
/// what the link resolves to, `symlink_target` the fully resolved absolute path; a dangling
/// link has no type (E2B's SDK leaves it out of listings) and its own path as target. The
/// links are resolved inside the sandbox, as root, by one command.
async fn follow_links(sb: &Sandbox, entries: &mut [pb::EntryInfo]) -> Result<(), ConnectError> {
    // The paths go in one command's arguments: at most so many, and so many bytes, so that
    // a sandbox of long link names cannot make the command too large to run.
    let mut bytes = 0usize;
    let links: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.r#type == pb::FileType::Symlink as i32)
        .take_while(|(_, e)| {
            bytes += e.path.len() + 1;
            bytes <= MAX_LINK_ARGUMENT_BYTES
        })
        .map(|(i, _)| i)
        .take(MAX_LINKS_RESOLVED)
        .collect();
    if links.is_empty() {
        return Ok(());
    }
    const SCRIPT: &str =
        r#"for p; do t=$(readlink -f -- "$p") && [ -e "$t" ] && printf '%s\n' "$t" || echo; done"#;
    let mut argv = vec!["sh", "-c", SCRIPT, "sh"];
    argv.extend(links.iter().map(|&i| entries[i].path.as_str()));
    let out = sb
        .exec_with(Cmd::new(argv).cwd("/").timeout(Duration::from_secs(30)))
        .await
        .map_err(brig_error)?;
    let text = out.stdout_text();
    for (&i, target) in links.iter().zip(text.lines()) {
        let entry = &mut entries[i];
        if target.is_empty() {
            entry.r#type = pb::FileType::Unspecified as i32;
            entry.mode = 0;
            entry.symlink_target = Some(entry.path.clone());
            continue;
        }
        if let Ok(to) = sb.stat(target).await {
            entry.r#type = match to.kind {
                FileKind::File => pb::FileType::File,
                FileKind::Dir => pb::FileType::Directory,
                _ => pb::FileType::Unspecified,
            } as i32;
            entry.mode = to.mode & 0o777;
        }
        entry.symlink_target = Some(target.to_string());
    }
    Ok(())
}

async fn stat(
    gw: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::StatRequest,
) -> Result<pb::StatResponse, ConnectError> {
    Ok(pb::StatResponse { entry: Some(stat_abs(gw, &sb, &user.resolve(&req.path)).await?) })
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
    gw: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::MakeDirRequest,
) -> Result<pb::MakeDirResponse, ConnectError> {
    let path = user.resolve(&req.path);
    if sb.stat(&path).await.is_ok() {
        return Err(ConnectError::new(Code::AlreadyExists, format!("{path} already exists")));
    }
    run_as(&sb, &user, &["mkdir", "-p", "--", &path]).await?;
    Ok(pb::MakeDirResponse { entry: Some(stat_abs(gw, &sb, &path).await?) })
}

async fn move_entry(
    gw: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::MoveRequest,
) -> Result<pb::MoveResponse, ConnectError> {
    let (from, to) = (user.resolve(&req.source), user.resolve(&req.destination));
    run_as(&sb, &user, &["mv", "-T", "--", &from, &to]).await?;
    Ok(pb::MoveResponse { entry: Some(stat_abs(gw, &sb, &to).await?) })
}

async fn remove(
    _: &Gateway,
    sb: Sandbox,
    user: EnvdUser,
    req: pb::RemoveRequest,
) -> Result<pb::RemoveResponse, ConnectError> {
    // As envd's (`os.RemoveAll`): a path that is not there is removed already.
    match sb.remove(&user.resolve(&req.path), true).await {
        Err(e) if e.code() == Some(brig_sdk::ErrorCode::NotFound) => {}
        other => other.map_err(brig_error)?,
    }
    Ok(pb::RemoveResponse {})
}

/// Every entry under `root` down to `depth` levels (1: the directory's own entries), at most
/// `limit` of them; whether that was all of them.
pub(crate) async fn walk(
    sb: &Sandbox,
    root: &str,
    depth: u32,
    limit: usize,
) -> Result<(Vec<FileStat>, bool), ConnectError> {
    let mut out = Vec::new();
    let mut queue = VecDeque::from([(root.trim_end_matches('/').to_string(), 1u32)]);
    while let Some((dir, level)) = queue.pop_front() {
        let dir = if dir.is_empty() { "/".to_string() } else { dir };
        let entries = match sb.list_dir(&dir).await {
            Ok(entries) => entries,
            // A directory below the root that went away meanwhile (a process's in /proc, a
            // build's temporary one) is no longer part of the tree, and one the sandbox may
            // not read (the shim's in /proc) shows as its entry only, as `find` would.
            Err(e)
                if level > 1
                    && matches!(
                        e.code(),
                        Some(brig_sdk::ErrorCode::NotFound | brig_sdk::ErrorCode::PermissionDenied)
                    ) =>
            {
                continue
            }
            Err(e) => return Err(brig_error(e)),
        };
        for mut e in entries {
            let name = e.path.rsplit('/').next().unwrap_or("").to_string();
            e.path = if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") };
            if e.kind == FileKind::Dir && level < depth {
                queue.push_back((e.path.clone(), level + 1));
            }
            out.push(e);
            if out.len() >= limit {
                return Ok((out, false));
            }
        }
    }
    Ok((out, true))
}

async fn list_dir(
    gw: &Gateway,
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
    let (entries, _) = walk(&sb, &path, depth, MAX_ENTRIES).await?;
    let names = gw.inner.owner_names.of(&sb).await;
    let mut entries: Vec<pb::EntryInfo> = entries.iter().map(|e| entry_info(e, &names)).collect();
    follow_links(&sb, &mut entries).await?;
    // As envd's: a link that resolves to nothing has no type, and E2B's SDK leaves it out.
    Ok(pb::ListDirResponse { entries })
}

pub(crate) async fn watch_target(
    sb: &Sandbox,
    user: &EnvdUser,
    path: &str,
) -> Result<String, ConnectError> {
    let root = user.resolve(path);
    let stat = sb.stat(&root).await.map_err(brig_error)?;
    if stat.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("{root} is not a directory")));
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_as_envd_writes_them() {
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
        let json = serde_json::to_value(entry_info(
            &FileStat {
                path: "/home/user/x.txt".into(),
                kind: FileKind::File,
                size: 12,
                mode: 0o100644,
                modified_unix_ms: 1_700_000_000_500,
                uid: 1000,
                gid: 1000,
                metadata: [("owner".to_string(), "ann".to_string())].into(),
            },
            &Names::parse("user:x:1000:1000::/home/user:/bin/sh\n", ""),
        ))
        .expect("json");
        assert_eq!(json["name"], "x.txt");
        assert_eq!(json["type"], "FILE_TYPE_FILE");
        assert_eq!(json["size"], "12");
        assert_eq!(json["mode"], 0o644);
        assert_eq!(json["metadata"]["owner"], "ann");
        assert!(json["modifiedTime"].as_str().is_some_and(|t| t.starts_with("2023-11-14T")));
    }
}

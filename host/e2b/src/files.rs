//! envd's HTTP file transfer: `GET /files?path=` streams a file out, `POST /files` takes one or
//! many files as `multipart/form-data` (each part's filename is its destination) or one raw
//! `application/octet-stream` body (optionally `Content-Encoding: gzip`). Neither direction
//! holds a whole file in memory: bytes move in pieces between the HTTP body and a Brig upload or
//! download. A file written as a user other than root is written by that user in the sandbox
//! (parents made, ownership and permissions as the sandbox decides).

use std::io::Write as _;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use brig_core::files::{checked_metadata, FileMetadata};
use brig_sdk::{Cmd, ErrorCode, ExecStdin, ExecStream, FileKind, Sandbox};
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use crate::envd::{self, EnvdUser};
use crate::Gateway;

/// Bytes in flight between the HTTP body and Brig, per transfer.
const PIPE_BYTES: usize = 256 << 10;
/// Least a gzip body may inflate to, whatever the configured disk.
const MIN_INFLATE_CAP: u64 = 1 << 20;

#[derive(Debug, serde::Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    username: Option<String>,
}

/// An envd HTTP error: the status the SDK maps to its exceptions, and a message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct FileError {
    status: StatusCode,
    message: String,
}

impl FileError {
    fn new(status: StatusCode, message: impl Into<String>) -> FileError {
        FileError { status, message: message.into() }
    }

    fn bad(message: impl Into<String>) -> FileError {
        FileError::new(StatusCode::BAD_REQUEST, message)
    }

    fn from_brig(e: brig_sdk::Error) -> FileError {
        let status = match e.code() {
            Some(ErrorCode::NotFound) => StatusCode::NOT_FOUND,
            Some(ErrorCode::BadRequest) => StatusCode::BAD_REQUEST,
            Some(ErrorCode::PermissionDenied) => StatusCode::FORBIDDEN,
            Some(ErrorCode::TooLarge | ErrorCode::ResourceExhausted) => {
                StatusCode::INSUFFICIENT_STORAGE
            }
            Some(ErrorCode::QuotaExceeded) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = crate::envd::brig_message(&e);
        FileError::new(status, message)
    }

    /// A shell's complaint about a write, as the status it means.
    fn from_stderr(stderr: &str) -> FileError {
        let status = if stderr.contains("No space left") || stderr.contains("quota") {
            StatusCode::INSUFFICIENT_STORAGE
        } else if stderr.contains("Permission denied") {
            StatusCode::FORBIDDEN
        } else if stderr.contains("Is a directory") || stderr.contains("Not a directory") {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        FileError::new(status, stderr.trim())
    }
}

impl IntoResponse for FileError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, [(header::CONTENT_TYPE, "application/json")], body.to_string())
            .into_response()
    }
}

async fn target(
    gw: &Gateway,
    headers: &HeaderMap,
    username: Option<&str>,
) -> Result<(Sandbox, EnvdUser), Response> {
    let sb = envd::sandbox(gw, headers).await.map_err(IntoResponse::into_response)?;
    let user = EnvdUser::named(username).map_err(IntoResponse::into_response)?;
    Ok((sb, user))
}

/// `GET /files?path=P[&username=U]`: the file's bytes.
pub async fn download(
    State(gw): State<Gateway>,
    Query(q): Query<FileQuery>,
    headers: HeaderMap,
) -> Response {
    let (sb, user) = match target(&gw, &headers, q.username.as_deref()).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Some(path) = q.path.as_deref() else { return FileError::bad("no path").into_response() };
    let path = user.resolve(path);
    match sb.stat(&path).await {
        Ok(stat) if stat.kind == FileKind::Dir => {
            return FileError::bad(format!("{path} is a directory")).into_response()
        }
        Ok(_) => {}
        Err(e) => return FileError::from_brig(e).into_response(),
    }
    let (reader, writer) = tokio::io::duplex(PIPE_BYTES);
    let task: JoinHandle<Result<u64, brig_sdk::Error>> = {
        let (sb, path) = (sb.clone(), path.clone());
        tokio::spawn(async move { sb.download(&path, writer).await })
    };
    let mut reader = tokio::io::BufReader::with_capacity(PIPE_BYTES, reader);
    // The first bytes (or the end) decide the status: an error before any byte is an error
    // answer, after that the body breaks off (the client sees a short read).
    let first_empty = match reader.fill_buf().await {
        Ok(buf) => buf.is_empty(),
        Err(e) => {
            return FileError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    };
    if first_empty {
        return match task.await {
            Ok(Ok(_)) => ([(header::CONTENT_TYPE, "application/octet-stream")], Body::empty())
                .into_response(),
            Ok(Err(e)) => FileError::from_brig(e).into_response(),
            Err(e) => {
                FileError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
            }
        };
    }
    let body = futures::stream::unfold((reader, Some(task)), |(mut reader, task)| async move {
        let task = task?;
        let chunk = match reader.fill_buf().await {
            Ok([]) => None,
            Ok(buf) => Some(Bytes::copy_from_slice(buf)),
            Err(e) => return Some((Err(e), (reader, None))),
        };
        match chunk {
            Some(bytes) => {
                reader.consume(bytes.len());
                Some((Ok(bytes), (reader, Some(task))))
            }
            None => match task.await {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some((Err(std::io::Error::other(e.to_string())), (reader, None))),
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), (reader, None))),
            },
        }
    });
    ([(header::CONTENT_TYPE, "application/octet-stream")], Body::from_stream(body)).into_response()
}

/// Where one file's bytes go: Brig's file API (root), or `cat` run as the user.
enum Sink {
    Brig { pipe: tokio::io::DuplexStream, task: JoinHandle<Result<u64, brig_sdk::Error>> },
    AsUser { stdin: ExecStdin, stream: ExecStream },
}

/// Makes the parent directories, then takes stdin into the file (as whoever runs it).
const WRITE_SCRIPT: &str = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;

impl Sink {
    async fn open(sb: &Sandbox, user: &EnvdUser, path: &str) -> Result<Sink, FileError> {
        match user.brig_user() {
            None => {
                let (reader, pipe) = tokio::io::duplex(PIPE_BYTES);
                let (sb, path) = (sb.clone(), path.to_string());
                let task = tokio::spawn(async move { sb.upload(&path, reader).await });
                Ok(Sink::Brig { pipe, task })
            }
            Some(name) => {
                let cmd = Cmd::new(["sh", "-c", WRITE_SCRIPT, "sh", path])
                    .user(&name)
                    .cwd("/")
                    .timeout(std::time::Duration::from_secs(24 * 3600))
                    .stdin_stream();
                let mut stream = sb.exec_stream(cmd).await.map_err(FileError::from_brig)?;
                let stdin = stream
                    .take_stdin()
                    .ok_or_else(|| FileError::new(StatusCode::INTERNAL_SERVER_ERROR, "no stdin"))?;
                Ok(Sink::AsUser { stdin, stream })
            }
        }
    }

    /// Passes `bytes` on; when the other side stopped taking them, its ending says why.
    async fn write(mut self, bytes: Bytes) -> Result<Sink, FileError> {
        let broken = match &mut self {
            Sink::Brig { pipe, .. } => pipe.write_all(&bytes).await.is_err(),
            Sink::AsUser { stdin, .. } => stdin.write(bytes).await.is_err(),
        };
        if broken {
            return Err(match self.finish().await {
                Err(e) => e,
                Ok(()) => FileError::new(StatusCode::INTERNAL_SERVER_ERROR, "the write stopped"),
            });
        }
        Ok(self)
    }

    async fn finish(self) -> Result<(), FileError> {
        match self {
            Sink::Brig { mut pipe, task } => {
                let _ = pipe.shutdown().await;
                drop(pipe);
                match task.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(FileError::from_brig(e)),
                    Err(e) => Err(FileError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
                }
            }
            Sink::AsUser { mut stdin, stream } => {
                let _ = stdin.close();
                let out = stream.collect().await.map_err(FileError::from_brig)?;
                if out.success() {
                    Ok(())
                } else {
                    Err(FileError::from_stderr(&out.stderr_text()))
                }
            }
        }
    }
}

/// Input bytes inflated in one step: deflate makes at most ~1032 bytes of a byte, so one step
/// holds at most ~1 MiB of output before it is passed on.
const GUNZIP_STEP: usize = 1 << 10;

/// Undoes `Content-Encoding: gzip` as a stream: the body is inflated a small step at a time,
/// each step's output passed on before the next, and inflation stops once the output passes
/// `cap` bytes (a bomb ends as a 507, having written no more than the cap).
struct Gunzip {
    decoder: flate2::write::GzDecoder<Vec<u8>>,
    inflated: u64,
    cap: u64,
}

impl Gunzip {
    fn new(cap: u64) -> Gunzip {
        Gunzip { decoder: flate2::write::GzDecoder::new(Vec::new()), inflated: 0, cap }
    }

    /// Inflates `bytes` into `sink`, step by step.
    async fn feed(&mut self, bytes: &[u8], mut sink: Sink) -> Result<Sink, FileError> {
        for step in bytes.chunks(GUNZIP_STEP) {
            self.decoder.write_all(step).map_err(bad_gzip)?;
            sink = self.pass_on(sink).await?;
        }
        Ok(sink)
    }

    /// Checks the gzip trailer and passes on what is left.
    async fn end(mut self, sink: Sink) -> Result<Sink, FileError> {
        self.decoder.try_finish().map_err(bad_gzip)?;
        self.pass_on(sink).await
    }

    async fn pass_on(&mut self, sink: Sink) -> Result<Sink, FileError> {
        let out = std::mem::take(self.decoder.get_mut());
        if out.is_empty() {
            return Ok(sink);
        }
        self.inflated += out.len() as u64;
        if self.inflated > self.cap {
            return Err(FileError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                format!(
                    "the gzip body inflates past {} MiB, the sandbox's disk; nothing more was written",
                    self.cap >> 20
                ),
            ));
        }
        sink.write(Bytes::from(out)).await
    }
}

fn bad_gzip(e: std::io::Error) -> FileError {
    FileError::bad(format!("bad gzip body: {e}"))
}

/// What one written file answers.
fn written(path: &str, metadata: &FileMetadata) -> serde_json::Value {
    let name = path.rsplit('/').next().unwrap_or("");
    let mut info = serde_json::json!({ "name": name, "type": "file", "path": path });
    if !metadata.is_empty() {
        info["metadata"] = serde_json::json!(metadata);
    }
    info
}

/// Header names of an upload's file metadata (`X-Metadata-<key>: <value>`, as E2B's SDK sends
/// it), lowercase as they arrive.
const METADATA_HEADER: &str = "x-metadata-";

/// The file metadata an upload's headers ask for (keys lowercased; a key sent twice keeps its
/// first value), checked before a byte is written.
fn upload_metadata(headers: &HeaderMap) -> Result<FileMetadata, FileError> {
    let mut metadata = FileMetadata::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else { continue };
        let value = value
            .to_str()
            .map_err(|_| FileError::bad(format!("metadata {key:?}: not printable US-ASCII")))?;
        metadata.entry(key.to_string()).or_insert_with(|| value.to_string());
    }
    checked_metadata(&metadata).map_err(|e| FileError::bad(e.to_string()))
}

/// Makes `metadata` the metadata of every written file, as envd does: an upload replaces a
/// file's metadata, one with none clears it (after the bytes, as a user writing them could
/// not set another user's attributes). What the upload answers.
async fn keep_metadata(
    sb: &Sandbox,
    paths: Vec<String>,
    metadata: &FileMetadata,
) -> Result<Vec<serde_json::Value>, FileError> {
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        match sb.set_file_metadata(&path, metadata.clone()).await {
            Ok(_) => {}
            // A tier that keeps no metadata has none to clear.
            Err(e) if e.is_unsupported() && metadata.is_empty() => {}
            Err(e) => return Err(FileError::from_brig(e)),
        }
        out.push(written(&path, metadata));
    }
    Ok(out)
}

/// `POST /files`: one raw body to `path`, or every multipart `file` part to its filename.
pub async fn upload(
    State(gw): State<Gateway>,
    Query(q): Query<FileQuery>,
    request: Request,
) -> Response {
    let headers = request.headers().clone();
    let (sb, user) = match target(&gw, &headers, q.username.as_deref()).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (parts, body) = request.into_parts();
    let (body, pump) = BodyPump::start(body);
    let request = Request::from_parts(parts, body);
    let content_type = crate::gateway::header(&headers, "content-type").unwrap_or("");
    let result = match upload_metadata(&headers) {
        Err(e) => Err(e),
        Ok(metadata) => {
            let written = if content_type.starts_with("multipart/form-data") {
                match Multipart::from_request(request, &()).await {
                    Ok(multipart) => upload_parts(&sb, &user, q.path.as_deref(), multipart).await,
                    Err(e) => Err(FileError::bad(e.body_text())),
                }
            } else {
                // An inflated body larger than the sandbox's disk could not be written anyway.
                let cap = gw.config().disk_mib.saturating_mul(1 << 20).max(MIN_INFLATE_CAP);
                let body = request.into_body();
                upload_raw(&sb, &user, q.path.as_deref(), &headers, body, cap).await
            };
            match written {
                Ok(paths) => keep_metadata(&sb, paths, &metadata).await,
                Err(e) => Err(e),
            }
        }
    };
    // A sandbox killed (or paused) during the upload answers as gone, the SDK's "not running",
    // whatever the write itself said: a file written into a sandbox that ended is not there.
    let gone = sandbox_ended(&sb).await;
    match result {
        Ok(_) if gone => crate::connect::sandbox_gone(sb.id()),
        Ok(entries) => (StatusCode::OK, axum::Json(entries)).into_response(),
        Err(e) => {
            // The client may still be sending: answer once it has finished, or it may see its
            // connection reset instead of this error.
            pump.drain().await;
            if gone {
                return crate::connect::sandbox_gone(sb.id());
            }
            e.into_response()
        }
    }
}

/// Whether the sandbox is known to be no longer running (a failed status request that is
/// not "not found" says nothing).
async fn sandbox_ended(sb: &Sandbox) -> bool {
    match sb.status().await {
        Ok(info) => info.state != brig_sdk::SandboxState::Running,
        Err(e) => matches!(
            e.code(),
            Some(
                ErrorCode::NotFound
                    | ErrorCode::Expired
                    | ErrorCode::SandboxLost
                    | ErrorCode::BadRequest
            )
        ),
    }
}

/// How much of a failed upload's remaining body is read (and dropped) before answering, and
/// for how long; past either the connection is closed under the client.
const DRAIN_BYTES: u64 = 4 << 30;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(60);
/// Longest an upload's body may go without a byte before the upload fails.
const BODY_STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// Moves a request body through a small channel, so that a handler that stops reading can still
/// read the rest of it (and throw it away) before it answers.
struct BodyPump {
    task: JoinHandle<()>,
}

impl BodyPump {
    fn start(body: Body) -> (Body, BodyPump) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, axum::Error>>(8);
        let task = tokio::spawn(async move {
            let mut stream = body.into_data_stream();
            loop {
                let chunk = match tokio::time::timeout(BODY_STALL, stream.next()).await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break,
                    Err(_) => {
                        let stalled = std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no byte of the body for {BODY_STALL:?}"),
                        );
                        let _ = tx.send(Err(axum::Error::new(stalled))).await;
                        return;
                    }
                };
                if tx.send(chunk).await.is_err() {
                    break;
                }
            }
            // The handler has stopped reading; `drain` decides how long the rest is read.
            drop(tx);
            let mut dropped = 0u64;
            let read_rest = async {
                while let Some(Ok(chunk)) = stream.next().await {
                    dropped += chunk.len() as u64;
                    if dropped > DRAIN_BYTES {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, read_rest).await;
        });
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        });
        (Body::from_stream(body), BodyPump { task })
    }

    /// Waits until the rest of the body has been read (within the caps).
    async fn drain(self) {
        let _ = self.task.await;
    }
}

/// `inflate_cap`: most bytes a gzip body may inflate to.
async fn upload_raw(
    sb: &Sandbox,
    user: &EnvdUser,
    path: Option<&str>,
    headers: &HeaderMap,
    body: Body,
    inflate_cap: u64,
) -> Result<Vec<String>, FileError> {
    let path = user.resolve(path.ok_or_else(|| FileError::bad("no path"))?);
    let gzip = crate::gateway::header(headers, "content-encoding")
        .is_some_and(|e| e.eq_ignore_ascii_case("gzip"));
    let mut gunzip = gzip.then(|| Gunzip::new(inflate_cap));
    let mut sink = Sink::open(sb, user, &path).await?;
    let mut body = body.into_data_stream();
    while let Some(chunk) = body.next().await {
        // A broken request leaves the file as far as it got, as a failed copy would.
        let chunk = chunk.map_err(|e| FileError::bad(format!("request body: {e}")))?;
        sink = match gunzip.as_mut() {
            Some(g) => g.feed(&chunk, sink).await?,
            None if chunk.is_empty() => sink,
            None => sink.write(chunk).await?,
        };
    }
    if let Some(g) = gunzip {
        sink = g.end(sink).await?;
    }
    sink.finish().await?;
    Ok(vec![path])
}

async fn upload_parts(
    sb: &Sandbox,
    user: &EnvdUser,
    path: Option<&str>,
    mut multipart: Multipart,
) -> Result<Vec<String>, FileError> {
    let mut out = Vec::new();
    while let Some(mut field) =
        multipart.next_field().await.map_err(|e| FileError::bad(e.body_text()))?
    {
        let destination = match (path, field.file_name()) {
            (Some(p), _) if out.is_empty() => p.to_string(),
            (_, Some(name)) if !name.is_empty() => name.to_string(),
            _ => return Err(FileError::bad("a file part has no destination (filename)")),
        };
        let destination = user.resolve(&destination);
        let mut sink = Sink::open(sb, user, &destination).await?;
        while let Some(bytes) = field.chunk().await.map_err(|e| FileError::bad(e.body_text()))? {
            sink = sink.write(bytes).await?;
        }
        sink.finish().await?;
        out.push(destination);
    }
    if out.is_empty() {
        return Err(FileError::bad("no file in the request"));
    }
    Ok(out)
}

//! The file API of every tier: streamed upload and download, and the small operations. Neither
//! direction holds a whole file in memory: uploads are written chunk by chunk as they arrive,
//! downloads are read in [`CHUNK_BYTES`] pieces and sent as raw stream bytes after a
//! `FileData { size }` header.

use std::io::SeekFrom;

use std::io::{Read, Seek, Write};

use brig_core::files::checked_metadata;
use brig_core::sandbox::{FileAccess, Op, ReadSource, SandboxError, WriteOptions};
use brig_proto::{FileOp, FileReadRequest, FileWriteRequest, Reply, Request};
use brig_transport::Exchange;
use bytes::BytesMut;

use crate::convert;
use crate::serve::route::{stream, Conversation};
use crate::{Node, NodeError};

/// Download piece size.
pub const CHUNK_BYTES: usize = 256 << 10;
/// Largest file moved in or out of a guest (a microVM's, or a container-host VM's container)
/// in one request: it is held in memory on its way through the agent.
const MAX_GUEST_FILE: u64 = brig_vmtier::MAX_GUEST_FILE as u64;

impl Node {
    /// Most bytes of one file read from a guest (`max_guest_read_mib`).
    pub(crate) fn guest_read_limit(&self) -> usize {
        let mib = self.inner.config.max_guest_read_mib;
        usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }

    /// The whole upload of a file request for a guest, within [`MAX_GUEST_FILE`] and the
    /// node's upload limit.
    pub(crate) async fn guest_upload(&self, exchange: &mut Exchange) -> Result<Vec<u8>, NodeError> {
        let limit = MAX_GUEST_FILE.min(self.inner.config.max_upload_bytes);
        exchange
            .read_upload_to_end(usize::try_from(limit).unwrap_or(usize::MAX))
            .await
            .map_err(|_| NodeError::UploadTooLarge(limit))
    }
}

/// Sends the `offset`/`len` range of a file read from a guest: `FileData`, then the bytes.
pub(crate) async fn send_range(
    exchange: &mut Exchange,
    data: &[u8],
    offset: u64,
    len: Option<u64>,
) -> Result<(), NodeError> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
    let end = len
        .and_then(|len| usize::try_from(len).ok())
        .map_or(data.len(), |len| start.saturating_add(len).min(data.len()));
    exchange.reply(&Reply::FileData { size: (end - start) as u64 }).await?;
    exchange.send_raw(bytes::Bytes::copy_from_slice(&data[start..end])).await?;
    Ok(())
}

/// The sandbox, operation and path of a file request, for the audit trail.
pub(crate) fn audited_op(request: &Request) -> Option<(String, &'static str, String)> {
    let (sandbox, op, path) = match request {
        Request::File(FileOp::Write(r)) => (&r.sandbox, "write", &r.path),
        Request::File(FileOp::Read(r)) => (&r.sandbox, "read", &r.path),
        Request::File(FileOp::List { sandbox, path }) => (sandbox, "list", path),
        Request::File(FileOp::Stat { sandbox, path }) => (sandbox, "stat", path),
        Request::File(FileOp::Mkdir { sandbox, path, .. }) => (sandbox, "mkdir", path),
        Request::File(FileOp::Remove { sandbox, path, .. }) => (sandbox, "remove", path),
        Request::File(FileOp::SetMetadata { sandbox, path, .. }) => (sandbox, "set_metadata", path),
        Request::File(FileOp::Watch(w)) => (&w.sandbox, "watch", &w.path),
        _ => return None,
    };
    Some((sandbox.clone(), op, path.clone()))
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> NodeError + '_ {
    move |source| NodeError::Io { what: what.to_string(), source }
}

pub(crate) async fn write(
    node: &Node,
    req: FileWriteRequest,
    exchange: &mut Exchange,
) -> Result<Option<Reply>, NodeError> {
    let checked = node.live(&req.sandbox).await.and_then(|entry| {
        entry.require(Op::Files)?;
        if req.append {
            entry.require(Op::FileAppend)?;
        }
        Ok(entry)
    });
    let entry = match checked {
        Ok(entry) => entry,
        Err(e) => {
            exchange.refuse_upload();
            return Err(e);
        }
    };
    let options = WriteOptions { append: req.append, parents: req.parents, mode: req.mode };
    if entry.sandbox.capabilities().files == FileAccess::Guest {
        // Through the guest's agent: the whole file, bounded.
        let data = node.guest_upload(exchange).await?;
        let bytes = data.len() as u64;
        entry.sandbox.put(&req.path, options, data).await.map_err(|e| entry.fail(e))?;
        entry.touch();
        return Ok(Some(Reply::Written { bytes }));
    }
    let path = req.path.clone();
    let opened = node
        .tier_file_op(&entry, &req.path, move |s| async move { s.open_write(&path, options).await })
        .await;
    let (mut file, landed) = match opened {
        Ok(target) => (target.file, target.landed),
        Err(e) => {
            exchange.refuse_upload();
            return Err(e);
        }
    };
    let limit = node.inner.config.max_upload_bytes;
    let mut written: u64 = 0;
    while let Some(chunk) = exchange.read_upload().await? {
        written += chunk.len() as u64;
        if written > limit {
            exchange.refuse_upload();
            return Err(NodeError::UploadTooLarge(limit));
        }
        let wrote = node
            .file_work(&entry, &req.path, move || {
                let mut file = file;
                file.write_all(&chunk).map(|()| file)
            })
            .await?;
        file = match wrote {
            Ok(file) => file,
            Err(e) => {
                exchange.refuse_upload();
                // A writer in the sandbox that stopped taking bytes says why (its disk is
                // full, it was killed); that is the answer, not the broken pipe.
                if let Some(landed) = landed {
                    let after = node.inner.file_work.deadline();
                    if let Ok(Err(why)) = tokio::time::timeout(after, landed).await {
                        return Err(entry.fail(why));
                    }
                }
                return Err(entry.gone_error().unwrap_or_else(|| io(&req.path)(e)));
            }
        };
    }
    drop(file);
    // A tier whose writer runs in the sandbox says whether everything arrived (its disk may
    // have filled up after the last chunk left here).
    if let Some(landed) = landed {
        let after = node.inner.file_work.deadline();
        let landed = tokio::time::timeout(after, landed).await;
        let landed =
            landed.map_err(|_| NodeError::FileDeadline { what: req.path.clone(), after })?;
        if let Err(e) = landed {
            return Err(entry.gone_error().unwrap_or_else(|| entry.fail(e)));
        }
    }
    // A sandbox destroyed while the bytes went in kept them in a file nobody will read.
    if let Some(gone) = entry.gone_error() {
        return Err(gone);
    }
    entry.touch();
    Ok(Some(Reply::Written { bytes: written }))
}

pub(crate) async fn read(
    node: &Node,
    req: FileReadRequest,
    exchange: &mut Exchange,
) -> Result<Option<Reply>, NodeError> {
    let entry = node.live(&req.sandbox).await?;
    entry.require(Op::Files)?;
    let limit = node.guest_read_limit() as u64;
    let path = req.path.clone();
    let source = node
        .tier_file_op(&entry, &req.path, move |s| async move { s.read(&path, limit).await })
        .await?;
    let file = match source {
        ReadSource::Bytes(data) => {
            send_range(exchange, &data, req.offset, req.len).await?;
            entry.touch();
            return Ok(None);
        }
        ReadSource::File(file) => file,
    };
    // The size is announced before the bytes, so it is measured where they come from.
    let offset = req.offset;
    let sized = node
        .file_work(&entry, &req.path, move || {
            let mut file = file;
            let meta = file.metadata()?;
            if meta.is_dir() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::IsADirectory,
                    "is a directory",
                ));
            }
            if offset > 0 {
                file.seek(SeekFrom::Start(offset))?;
            }
            Ok((file, meta.len()))
        })
        .await?;
    let (mut file, len) = sized.map_err(io(&req.path))?;
    let available = len.saturating_sub(req.offset);
    let size = req.len.map_or(available, |len| len.min(available));
    exchange.reply(&Reply::FileData { size }).await?;
    let mut remaining = size;
    while remaining > 0 {
        let want = usize::try_from(remaining).unwrap_or(CHUNK_BYTES).min(CHUNK_BYTES);
        let piece = node
            .file_work(&entry, &req.path, move || {
                let mut buf = BytesMut::zeroed(want);
                let n = file.read(&mut buf)?;
                buf.truncate(n);
                Ok::<_, std::io::Error>((file, buf))
            })
            .await?;
        let (back, buf) = piece.map_err(io(&req.path))?;
        file = back;
        if buf.is_empty() {
            // The file shrank while we read it; the client sees fewer bytes than announced.
            tracing::debug!(path = %req.path, "file shrank during download");
            break;
        }
        remaining -= buf.len() as u64;
        exchange.send_raw(buf.freeze()).await?;
    }
    entry.touch();
    Ok(None)
}

/// The file family: every op, the streamed ones (read, write, watch) on `exchange`.
pub(crate) async fn request(
    node: &Node,
    op: FileOp,
    exchange: Conversation<'_>,
) -> Result<Option<Reply>, NodeError> {
    let kind = op.kind();
    let (sandbox, path, small) = match op {
        FileOp::Write(req) => return write(node, req, stream(exchange, kind)?).await,
        FileOp::Read(req) => return read(node, req, stream(exchange, kind)?).await,
        FileOp::Watch(req) => {
            return super::file_watch::watch(node, req, stream(exchange, kind)?).await
        }
        FileOp::List { sandbox, path } => (sandbox, path, SmallFileOp::List),
        FileOp::Stat { sandbox, path } => (sandbox, path, SmallFileOp::Stat),
        FileOp::Mkdir { sandbox, path, parents } => (sandbox, path, SmallFileOp::Mkdir { parents }),
        FileOp::Remove { sandbox, path, recursive } => {
            (sandbox, path, SmallFileOp::Remove { recursive })
        }
        FileOp::SetMetadata { sandbox, path, metadata } => {
            (sandbox, path, SmallFileOp::SetMetadata { metadata })
        }
    };
    small_op(node, &sandbox, path, kind, small).await.map(Some)
}

/// A file op that needs no stream, once its sandbox and path are taken out.
enum SmallFileOp {
    List,
    Stat,
    Mkdir { parents: bool },
    Remove { recursive: bool },
    SetMetadata { metadata: std::collections::BTreeMap<String, String> },
}

/// The small file operations, the same for every tier.
async fn small_op(
    node: &Node,
    sandbox: &str,
    path: String,
    kind: &'static str,
    op: SmallFileOp,
) -> Result<Reply, NodeError> {
    let entry = node.live(sandbox).await?;
    entry.require(Op::Files)?;
    if matches!(op, SmallFileOp::SetMetadata { .. }) {
        entry.require(Op::FileMetadata)?;
    }
    let reply = node
        .tier_file_op(&entry, kind, move |s| async move {
            match op {
                SmallFileOp::List => s.list(&path).await.map(|list| {
                    Reply::Entries(list.into_iter().map(convert::entry_to_wire).collect())
                }),
                SmallFileOp::Stat => {
                    s.stat(&path).await.map(|e| Reply::Stat(convert::entry_to_wire(e)))
                }
                SmallFileOp::Mkdir { parents } => {
                    s.mkdir(&path, parents).await.map(|()| Reply::Done)
                }
                SmallFileOp::Remove { recursive } => {
                    s.remove(&path, recursive).await.map(|()| Reply::Done)
                }
                SmallFileOp::SetMetadata { metadata } => match checked_metadata(&metadata) {
                    Ok(metadata) => s
                        .set_metadata(&path, metadata)
                        .await
                        .map(|e| Reply::Stat(convert::entry_to_wire(e))),
                    Err(e) => Err(SandboxError::BadRequest(e.to_string())),
                },
            }
        })
        .await?;
    entry.touch();
    Ok(reply)
}

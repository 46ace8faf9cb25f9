//! The file API of every tier: streamed upload and download, and the small operations. Neither
//! direction holds a whole file in memory: uploads are written chunk by chunk as they arrive,
//! downloads are read in [`CHUNK_BYTES`] pieces and sent as raw stream bytes after a
//! `FileData { size }` header.

use std::io::SeekFrom;

use brig_core::files::Entry;
use brig_fncall::Workspace;
use brig_proto::{FileReadRequest, FileWriteRequest, Reply, Request};
use brig_transport::Exchange;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::sandboxes::TierHandle;
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
        Request::FileWrite(r) => (&r.sandbox, "write", &r.path),
        Request::FileRead(r) => (&r.sandbox, "read", &r.path),
        Request::FileList { sandbox, path } => (sandbox, "list", path),
        Request::FileStat { sandbox, path } => (sandbox, "stat", path),
        Request::FileMkdir { sandbox, path, .. } => (sandbox, "mkdir", path),
        Request::FileRemove { sandbox, path, .. } => (sandbox, "remove", path),
        _ => return None,
    };
    Some((sandbox.clone(), op, path.clone()))
}

/// A sandbox's file tree: an fncall workspace or a container root.
pub(crate) enum FileRoot<'a> {
    Workspace(&'a Workspace),
    Container(brig_container::files::RootDir<'a>),
}

impl FileRoot<'_> {
    pub fn open_read(&self, path: &str) -> Result<std::fs::File, NodeError> {
        Ok(match self {
            FileRoot::Workspace(ws) => ws.open_read(path)?,
            FileRoot::Container(root) => root.open_read(path)?,
        })
    }

    pub fn open_write(
        &self,
        path: &str,
        append: bool,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<std::fs::File, NodeError> {
        Ok(match self {
            FileRoot::Workspace(ws) => ws.open_write(path, append, parents, mode)?,
            FileRoot::Container(root) => root.open_write(path, append, parents, mode)?,
        })
    }

    pub fn stat(&self, path: &str) -> Result<Entry, NodeError> {
        Ok(match self {
            FileRoot::Workspace(ws) => ws.stat(path)?,
            FileRoot::Container(root) => root.stat(path)?,
        })
    }

    pub fn list(&self, path: &str) -> Result<Vec<Entry>, NodeError> {
        Ok(match self {
            FileRoot::Workspace(ws) => ws.list(path)?,
            FileRoot::Container(root) => root.list(path)?,
        })
    }

    pub fn mkdir(&self, path: &str, parents: bool) -> Result<(), NodeError> {
        match self {
            FileRoot::Workspace(ws) => ws.mkdir(path, parents)?,
            FileRoot::Container(root) => root.mkdir(path, parents)?,
        }
        Ok(())
    }

    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), NodeError> {
        match self {
            FileRoot::Workspace(ws) => ws.remove_path(path, recursive)?,
            FileRoot::Container(root) => root.remove(path, recursive)?,
        }
        Ok(())
    }
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> NodeError + '_ {
    move |source| NodeError::Io { what: what.to_string(), source }
}

pub(crate) async fn write(
    node: &Node,
    req: FileWriteRequest,
    exchange: &mut Exchange,
) -> Result<Option<Reply>, NodeError> {
    if let Ok(entry) = node.live(&req.sandbox).await {
        match &entry.handle {
            TierHandle::Microvm(_) => return node.write_microvm_file(&entry, req, exchange).await,
            TierHandle::Hosted(_) => return node.write_hosted_file(&entry, req, exchange).await,
            TierHandle::Fncall(_) | TierHandle::Container(_) => {}
        }
    }
    let opened = node.live(&req.sandbox).await.and_then(|entry| {
        let file = entry.handle.file_root(&entry)?.open_write(
            &req.path,
            req.append,
            req.parents,
            req.mode,
        )?;
        Ok((entry, file))
    });
    let (entry, file) = match opened {
        Ok(pair) => pair,
        Err(e) => {
            exchange.refuse_upload();
            return Err(e);
        }
    };
    let mut file = tokio::fs::File::from_std(file);
    let limit = node.inner.config.max_upload_bytes;
    let mut written: u64 = 0;
    while let Some(chunk) = exchange.read_upload().await? {
        written += chunk.len() as u64;
        if written > limit {
            exchange.refuse_upload();
            return Err(NodeError::UploadTooLarge(limit));
        }
        file.write_all(&chunk).await.map_err(io(&req.path))?;
    }
    file.flush().await.map_err(io(&req.path))?;
    entry.touch();
    Ok(Some(Reply::Written { bytes: written }))
}

pub(crate) async fn read(
    node: &Node,
    req: FileReadRequest,
    exchange: &mut Exchange,
) -> Result<Option<Reply>, NodeError> {
    let entry = node.live(&req.sandbox).await?;
    match &entry.handle {
        TierHandle::Microvm(_) => return node.read_microvm_file(&entry, req, exchange).await,
        TierHandle::Hosted(_) => return node.read_hosted_file(&entry, req, exchange).await,
        TierHandle::Fncall(_) | TierHandle::Container(_) => {}
    }
    let file = entry.handle.file_root(&entry)?.open_read(&req.path)?;
    let mut file = tokio::fs::File::from_std(file);
    let meta = file.metadata().await.map_err(io(&req.path))?;
    if meta.is_dir() {
        return Err(NodeError::Io {
            what: req.path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::IsADirectory, "is a directory"),
        });
    }
    let available = meta.len().saturating_sub(req.offset);
    let size = req.len.map_or(available, |len| len.min(available));
    if req.offset > 0 {
        file.seek(SeekFrom::Start(req.offset)).await.map_err(io(&req.path))?;
    }
    exchange.reply(&Reply::FileData { size }).await?;
    let mut remaining = size;
    while remaining > 0 {
        let want = usize::try_from(remaining).unwrap_or(CHUNK_BYTES).min(CHUNK_BYTES);
        let mut buf = BytesMut::zeroed(want);
        let n = file.read(&mut buf).await.map_err(io(&req.path))?;
        if n == 0 {
            // The file shrank while we read it; the client sees fewer bytes than announced.
            tracing::debug!(path = %req.path, "file shrank during download");
            break;
        }
        buf.truncate(n);
        exchange.send_raw(buf.freeze()).await?;
        remaining -= n as u64;
    }
    entry.touch();
    Ok(None)
}

//! Streamed file transfer into and out of a sandbox workspace. Neither direction holds a whole
//! file in memory: uploads are written chunk by chunk as they arrive, downloads are read in
//! [`CHUNK_BYTES`] pieces and sent as raw stream bytes after a `FileData { size }` header.

use std::io::SeekFrom;

use brig_proto::{FileReadRequest, FileWriteRequest, Reply};
use brig_transport::Exchange;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::sandboxes::TierHandle;
use crate::{Node, NodeError};

/// Download piece size.
pub const CHUNK_BYTES: usize = 256 << 10;

fn io(what: &str) -> impl FnOnce(std::io::Error) -> NodeError + '_ {
    move |source| NodeError::Io { what: what.to_string(), source }
}

pub(crate) async fn write(
    node: &Node,
    req: FileWriteRequest,
    exchange: &mut Exchange,
) -> Result<Option<Reply>, NodeError> {
    let entry = match node.inner.sandboxes.get(&req.sandbox) {
        Ok(entry) => entry,
        Err(e) => {
            exchange.refuse_upload();
            return Err(e);
        }
    };
    entry.touch();
    let TierHandle::Fncall(ws) = &entry.handle;
    let file = match ws.open_write(&req.path, req.append, req.parents, req.mode) {
        Ok(file) => file,
        Err(e) => {
            exchange.refuse_upload();
            return Err(e.into());
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
    let entry = node.inner.sandboxes.get(&req.sandbox)?;
    entry.touch();
    let TierHandle::Fncall(ws) = &entry.handle;
    let file = ws.open_read(&req.path)?;
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

//! The node's side of file operations done with a container's rights
//! ([`crate::shim::file_op`]): each request gets a reply socket of its own, sent with the
//! request to the shim; the child the shim forks answers on it. Every answer is read with a
//! byte cap ([`MAX_REPLY_BYTES`], [`MAX_LISTING_BYTES`]) and a deadline ([`REPLY_DEADLINE`]).
//!
//! ```text
//! read    → FileOp(Read)   [reply]          ← Opened + the file     (the node streams it)
//! write   → FileOp(Write)  [reply, pipe r]  ← Ready … bytes into the pipe, closed … ← Written
//! list    → FileOp(List)   [reply, pipe w]  ← entries in the pipe, then Done
//! stat, mkdir, remove                       ← Entry / Done
//! any of them                               ← Failed(error)
//! ```

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use brig_core::files::{Entry, EntryKind, FileMetadata, WatchBatch, MAX_LIST_ENTRIES};
use brig_core::sandbox::{BoxFuture, SandboxError, UploadTarget};
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncReadExt;

use crate::files::FileError;
use crate::runtime::Container;
use crate::shim_conn::{async_socket, recv_message, ShimConnError};
use crate::shim_proto::{FileReply, FileRequest, ToShim, WireEntry, WireFileError, WireMetadata};

/// Largest answer of a file child.
pub const MAX_REPLY_BYTES: usize = 64 << 10;
/// Largest listing taken in ([`MAX_LIST_ENTRIES`] entries with names of ~600 bytes).
pub const MAX_LISTING_BYTES: u64 = 64 << 20;
/// How long the node waits for one answer (the first of a write, the end of the copy after
/// the node closed its pipe, a whole listing).
pub const REPLY_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ShimFileError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("file operation channel")]
    Channel(#[source] std::io::Error),
    #[error(transparent)]
    Shim(#[from] ShimConnError),
    #[error("the sandbox's file operation gave no answer within {0:?}")]
    Deadline(Duration),
    #[error("the sandbox's file operation ended without an answer (the sandbox stopped, or it ran out of memory or processes)")]
    NoAnswer,
    #[error("the sandbox's file operation answered {0:?}, which does not fit the request")]
    Unexpected(String),
    #[error("the directory's listing is larger than {0} bytes")]
    ListingTooLarge(u64),
    #[error("the directory's listing cannot be read: {0}")]
    BadListing(String),
}

impl From<ShimFileError> for SandboxError {
    fn from(e: ShimFileError) -> SandboxError {
        match e {
            ShimFileError::File(e) => e.into(),
            ShimFileError::Deadline(_) | ShimFileError::NoAnswer => {
                SandboxError::Unavailable(e.to_string())
            }
            ShimFileError::ListingTooLarge(_) => SandboxError::TooLarge(e.to_string()),
            ShimFileError::Shim(ShimConnError::Gone) => SandboxError::Lost(e.to_string()),
            other => SandboxError::Internal(other.to_string()),
        }
    }
}

pub(crate) fn wire_entry(e: Entry) -> (WireEntry, WireMetadata) {
    let kind = match e.kind {
        EntryKind::File => 0,
        EntryKind::Dir => 1,
        EntryKind::Symlink => 2,
        EntryKind::Other => 3,
    };
    let wire = WireEntry {
        path: e.path,
        kind,
        size: e.size,
        mode: e.mode,
        modified_unix_ms: e.modified_unix_ms,
        uid: e.uid,
        gid: e.gid,
    };
    (wire, e.metadata.into_iter().collect())
}

fn entry_of(w: WireEntry, metadata: WireMetadata) -> Entry {
    let kind = match w.kind {
        0 => EntryKind::File,
        1 => EntryKind::Dir,
        2 => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let (uid, gid) = (w.uid, w.gid);
    Entry {
        path: w.path,
        kind,
        size: w.size,
        mode: w.mode,
        modified_unix_ms: w.modified_unix_ms,
        uid,
        gid,
        metadata: metadata.into_iter().collect(),
    }
}

/// The entry of a stat-like answer.
fn answered_entry(reply: FileReply) -> Result<Entry, ShimFileError> {
    match reply {
        FileReply::EntryWithMetadata(e, metadata) => Ok(entry_of(e, metadata)),
        FileReply::Entry(e) => Ok(entry_of(e, WireMetadata::new())),
        other => Err(refused(other)),
    }
}

pub(crate) fn wire_error(e: &FileError) -> WireFileError {
    match e {
        FileError::Io { path, source } => match source.raw_os_error() {
            Some(errno) => WireFileError::Io { path: path.clone(), errno },
            None => WireFileError::Other { path: path.clone(), message: source.to_string() },
        },
        FileError::BadPath(p) => WireFileError::BadPath(p.clone()),
        FileError::NotRegular(p) => WireFileError::NotRegular(p.clone()),
        FileError::KernelFile { path, magic } => {
            WireFileError::KernelFile { path: path.clone(), magic: *magic }
        }
        FileError::TooManyDirs { path, max } => {
            WireFileError::TooManyDirs { path: path.clone(), max: *max as u64 }
        }
    }
}

fn error_of(w: WireFileError) -> FileError {
    match w {
        WireFileError::Io { path, errno } => {
            FileError::Io { path, source: std::io::Error::from_raw_os_error(errno) }
        }
        WireFileError::Other { path, message } => {
            FileError::Io { path, source: std::io::Error::other(message) }
        }
        WireFileError::BadPath(p) => FileError::BadPath(p),
        WireFileError::NotRegular(p) => FileError::NotRegular(p),
        WireFileError::KernelFile { path, magic } => FileError::KernelFile { path, magic },
        WireFileError::TooManyDirs { path, max } => {
            FileError::TooManyDirs { path, max: usize::try_from(max).unwrap_or(usize::MAX) }
        }
    }
}

/// Largest frame of changes taken from a watch child.
pub const MAX_WATCH_FRAME_BYTES: u32 = 8 << 20;

/// The node's end of a watch ([`Container::watch_dir`]); dropping it ends the watch (the
/// child sees its pipe closed and exits).
pub struct ContainerWatch {
    changes: tokio::net::unix::pipe::Receiver,
}

impl ContainerWatch {
    /// The next batch of changes, waiting for it; `None` once the watch ended.
    pub async fn next(&mut self) -> Result<Option<WatchBatch>, ShimFileError> {
        let mut len = [0u8; 4];
        match self.changes.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(ShimFileError::Channel(e)),
        }
        let len = u32::from_le_bytes(len);
        if len > MAX_WATCH_FRAME_BYTES {
            return Err(ShimFileError::ListingTooLarge(u64::from(MAX_WATCH_FRAME_BYTES)));
        }
        let mut body = vec![0u8; len as usize];
        tokio::time::timeout(REPLY_DEADLINE, self.changes.read_exact(&mut body))
            .await
            .map_err(|_| ShimFileError::Deadline(REPLY_DEADLINE))?
            .map_err(ShimFileError::Channel)?;
        let batch =
            postcard::from_bytes(&body).map_err(|e| ShimFileError::BadListing(e.to_string()))?;
        Ok(Some(batch))
    }
}

impl brig_core::sandbox::FileWatch for ContainerWatch {
    fn next(&mut self) -> BoxFuture<'_, Result<Option<WatchBatch>, SandboxError>> {
        Box::pin(async move { Ok(ContainerWatch::next(self).await?) })
    }
}

/// The node's end of one request's reply socket.
struct ReplySocket {
    fd: AsyncFd<OwnedFd>,
}

impl ReplySocket {
    fn new(fd: OwnedFd) -> Result<Self, ShimFileError> {
        Ok(ReplySocket { fd: async_socket(fd).map_err(ShimFileError::Channel)? })
    }

    /// The next answer and what is attached to it, within [`REPLY_DEADLINE`].
    async fn next(&self) -> Result<(FileReply, Vec<OwnedFd>), ShimFileError> {
        let received =
            tokio::time::timeout(REPLY_DEADLINE, recv_message(&self.fd, MAX_REPLY_BYTES))
                .await
                .map_err(|_| ShimFileError::Deadline(REPLY_DEADLINE))?;
        match received.map_err(ShimFileError::Channel)? {
            Some((bytes, fds)) => {
                let reply = postcard::from_bytes(&bytes)
                    .map_err(|e| ShimFileError::Unexpected(e.to_string()))?;
                Ok((reply, fds))
            }
            None => Err(ShimFileError::NoAnswer),
        }
    }

    /// The next answer, which must be `Done`.
    async fn done(&self) -> Result<(), ShimFileError> {
        match self.next().await?.0 {
            FileReply::Done => Ok(()),
            other => Err(refused(other)),
        }
    }
}

/// A failure the child reported, or an answer that does not fit.
fn refused(reply: FileReply) -> ShimFileError {
    match reply {
        FileReply::Failed(e) => ShimFileError::File(error_of(e)),
        other => ShimFileError::Unexpected(format!("{other:?}")),
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), ShimFileError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| ShimFileError::Channel(e.into()))
}

impl Container {
    /// Sends `request` with its reply socket and `pipe` (the child's end) to the shim.
    async fn file_request(
        &self,
        request: FileRequest,
        pipe: Option<OwnedFd>,
    ) -> Result<ReplySocket, ShimFileError> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (mine, theirs) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .map_err(|e| ShimFileError::Channel(e.into()))?;
        let mut fds: Vec<BorrowedFd<'_>> = vec![theirs.as_fd()];
        fds.extend(pipe.as_ref().map(|p| p.as_fd()));
        self.shim.send_with_fds(&ToShim::FileOp(request), &fds).await?;
        ReplySocket::new(mine)
    }

    /// A regular file of the container, opened for reading with its rights.
    pub async fn read_file(&self, path: &str) -> Result<std::fs::File, ShimFileError> {
        let reply = self.file_request(FileRequest::Read { path: path.into() }, None).await?;
        match reply.next().await? {
            (FileReply::Opened, mut fds) if fds.len() == 1 => {
                Ok(std::fs::File::from(fds.remove(0)))
            }
            (other, _) => Err(refused(other)),
        }
    }

    /// A file of the container opened for writing with its rights: the bytes written to the
    /// target's file are copied in by a process of the container, and `landed` says whether
    /// they all arrived.
    pub async fn write_file(
        &self,
        path: &str,
        append: bool,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<UploadTarget, ShimFileError> {
        let (read_end, write_end) = pipe()?;
        let request = FileRequest::Write { path: path.into(), append, parents, mode };
        let reply = self.file_request(request, Some(read_end)).await?;
        match reply.next().await?.0 {
            FileReply::Ready => {}
            other => return Err(refused(other)),
        }
        let landed: BoxFuture<'static, Result<u64, SandboxError>> = Box::pin(async move {
            match reply.next().await?.0 {
                FileReply::Written { bytes } => Ok(bytes),
                other => Err(refused(other).into()),
            }
        });
        Ok(UploadTarget { file: std::fs::File::from(write_end), landed: Some(landed) })
    }

    pub async fn stat_file(&self, path: &str) -> Result<Entry, ShimFileError> {
        let reply = self.file_request(FileRequest::Stat { path: path.into() }, None).await?;
        answered_entry(reply.next().await?.0)
    }

    /// Replaces a file's or directory's metadata with the container's rights; its entry after.
    pub async fn set_file_metadata(
        &self,
        path: &str,
        metadata: &FileMetadata,
    ) -> Result<Entry, ShimFileError> {
        let metadata = metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let request = FileRequest::SetMetadata { path: path.into(), metadata };
        let reply = self.file_request(request, None).await?;
        answered_entry(reply.next().await?.0)
    }

    /// A directory's entries, sorted by name (at most [`MAX_LIST_ENTRIES`]).
    pub async fn list_dir(&self, path: &str) -> Result<Vec<Entry>, ShimFileError> {
        let (read_end, write_end) = pipe()?;
        let reply = self.file_request(FileRequest::List { path: path.into() }, Some(write_end));
        let reply = reply.await?;
        let read = async {
            let mut listing = tokio::net::unix::pipe::Receiver::from_owned_fd(read_end)
                .map_err(ShimFileError::Channel)?
                .take(MAX_LISTING_BYTES + 1);
            let mut bytes = Vec::new();
            listing.read_to_end(&mut bytes).await.map_err(ShimFileError::Channel)?;
            Ok::<_, ShimFileError>(bytes)
        };
        let bytes = tokio::time::timeout(REPLY_DEADLINE, read)
            .await
            .map_err(|_| ShimFileError::Deadline(REPLY_DEADLINE))??;
        if bytes.len() as u64 > MAX_LISTING_BYTES {
            return Err(ShimFileError::ListingTooLarge(MAX_LISTING_BYTES));
        }
        reply.done().await?;
        let bad = |e: postcard::Error| ShimFileError::BadListing(e.to_string());
        let (wire, rest): (Vec<WireEntry>, _) = postcard::take_from_bytes(&bytes).map_err(bad)?;
        // A shim from before metadata sends the entries alone.
        let metadata: Vec<WireMetadata> =
            if rest.is_empty() { Vec::new() } else { postcard::from_bytes(rest).map_err(bad)? };
        let mut metadata = metadata.into_iter();
        Ok(wire
            .into_iter()
            .take(MAX_LIST_ENTRIES)
            .map(|e| entry_of(e, metadata.next().unwrap_or_default()))
            .collect())
    }

    /// Watches a directory with the container's rights ([`crate::shim::file_op`]'s watch
    /// child); the watch is in place when this returns.
    pub async fn watch_dir(
        &self,
        path: &str,
        recursive: bool,
    ) -> Result<ContainerWatch, ShimFileError> {
        let (read_end, write_end) = pipe()?;
        let request = FileRequest::Watch { path: path.into(), recursive };
        let reply = self.file_request(request, Some(write_end)).await?;
        match reply.next().await?.0 {
            FileReply::Ready => {}
            other => return Err(refused(other)),
        }
        let changes = tokio::net::unix::pipe::Receiver::from_owned_fd(read_end)
            .map_err(ShimFileError::Channel)?;
        Ok(ContainerWatch { changes })
    }

    pub async fn make_dir(&self, path: &str, parents: bool) -> Result<(), ShimFileError> {
        let request = FileRequest::Mkdir { path: path.into(), parents };
        self.file_request(request, None).await?.done().await
    }

    pub async fn remove_path(&self, path: &str, recursive: bool) -> Result<(), ShimFileError> {
        let request = FileRequest::Remove { path: path.into(), recursive };
        self.file_request(request, None).await?.done().await
    }
}

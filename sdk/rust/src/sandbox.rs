//! Handles to sandboxes: calls and files.

use std::path::Path;
use std::time::Duration;

use brig_proto::{
    CallRequest, CallResult, CreateRequest, FileReadRequest, FileStat, FileWriteRequest,
    IdleAction, Reply, Request, SandboxInfo, Tier,
};
use brig_proto::{FileOp, SandboxOp, ToolOp};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::{expect_done, unexpected};
use crate::{Client, Error};

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Upload piece size.
const UPLOAD_CHUNK: usize = 256 << 10;

/// What to create. Start from a tier constructor and add labels and a TTL.
#[derive(Debug, Clone, Default)]
pub struct SandboxOptions {
    request: CreateRequest,
}

impl SandboxOptions {
    /// A stateful fncall sandbox: a workspace for tool calls.
    pub fn fncall() -> Self {
        Self::tier(Tier::Fncall)
    }

    pub fn tier(tier: Tier) -> Self {
        SandboxOptions { request: CreateRequest { tier: Some(tier), ..Default::default() } }
    }

    /// Image or environment (container and VM tiers).
    pub fn image(mut self, image: &str) -> Self {
        self.request.image = Some(image.to_string());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.request.labels.push((key.to_string(), value.to_string()));
        self
    }

    /// A container sandbox from `image` (`base` or `base+workspace+toolkit`).
    pub fn container(image: &str) -> Self {
        Self::tier(Tier::Container).image(image)
    }

    /// Memory limit.
    pub fn memory_mib(mut self, mib: u64) -> Self {
        self.request.limits.memory_mib = Some(mib);
        self
    }

    /// CPU limit in thousandths of a core.
    pub fn cpu_millis(mut self, millis: u64) -> Self {
        self.request.limits.cpu_millis = Some(millis);
        self
    }

    /// Process limit.
    pub fn pids(mut self, pids: u64) -> Self {
        self.request.limits.pids = Some(pids);
        self
    }

    /// Writable-disk quota.
    pub fn disk_mib(mut self, mib: u64) -> Self {
        self.request.limits.disk_mib = Some(mib);
        self
    }

    /// An environment variable every command starts with.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.request.env.push((key.to_string(), value.to_string()));
        self
    }

    /// After this long without a request the sandbox is destroyed (or paused, with
    /// [`SandboxOptions::pause_when_idle`]).
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.request.idle_ttl_ms = Some(millis(ttl));
        self
    }

    /// Pause instead of destroy when the idle TTL passes; the next request resumes it.
    pub fn pause_when_idle(mut self) -> Self {
        self.request.idle_action = Some(IdleAction::Pause);
        self
    }

    /// What happens when the idle TTL passes: destroy (the default), pause, or pause keeping
    /// the files only ([`crate::Sandbox::pause_files_only`]).
    pub fn idle_action(mut self, action: IdleAction) -> Self {
        self.request.idle_action = Some(action);
        self
    }

    /// Destroy after being paused this long.
    pub fn paused_ttl(mut self, ttl: Duration) -> Self {
        self.request.paused_ttl_ms = Some(millis(ttl));
        self
    }

    /// Destroy this long after creation, whatever it is doing.
    pub fn max_lifetime(mut self, lifetime: Duration) -> Self {
        self.request.max_lifetime_ms = Some(millis(lifetime));
        self
    }

    pub(crate) fn request_mut(&mut self) -> &mut CreateRequest {
        &mut self.request
    }

    pub(crate) fn into_request(self) -> CreateRequest {
        self.request
    }
}

/// A sandbox on the server. Cheap to clone; holds no server resources by itself.
#[derive(Clone)]
pub struct Sandbox {
    client: Client,
    id: String,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("id", &self.id).finish()
    }
}

impl Sandbox {
    pub(crate) fn new(client: Client, id: String) -> Self {
        Sandbox { client, id }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Calls a `brig:tool` component with this sandbox's workspace at `/workspace`.
    pub async fn call(&self, tool: &str, input: &str) -> Result<CallResult, Error> {
        self.call_with(CallRequest::new(tool, input)).await
    }

    pub async fn call_with(&self, call: CallRequest) -> Result<CallResult, Error> {
        let request = Request::Tool(ToolOp::CallIn { sandbox: self.id.clone(), call });
        match self.client.request(&request).await? {
            Reply::Called(result) => Ok(result),
            other => Err(unexpected("call_in", &other)),
        }
    }

    pub async fn status(&self) -> Result<SandboxInfo, Error> {
        match self
            .client
            .request(&Request::Sandbox(SandboxOp::Status { sandbox: self.id.clone() }))
            .await?
        {
            Reply::Sandbox(info) => Ok(info),
            other => Err(unexpected("status", &other)),
        }
    }

    /// Its use over its life with `unix_ms` in `from..=to`, oldest first: a sample every few
    /// seconds while it ran (older times more sparsely), and one of now when `to` is not past.
    pub async fn usage_history(
        &self,
        from_unix_ms: u64,
        to_unix_ms: u64,
    ) -> Result<Vec<brig_proto::UsageSample>, Error> {
        let op = SandboxOp::UsageHistory { sandbox: self.id.clone(), from_unix_ms, to_unix_ms };
        match self.client.request(&Request::Sandbox(op)).await? {
            Reply::UsageHistory(samples) => Ok(samples),
            other => Err(unexpected("usage_history", &other)),
        }
    }

    pub async fn destroy(&self) -> Result<(), Error> {
        expect_done(
            "destroy",
            self.client
                .request(&Request::Sandbox(SandboxOp::Destroy { sandbox: self.id.clone() }))
                .await?,
        )
    }

    /// Writes `bytes` to `path` (parents created), replacing the file.
    pub async fn write_file(&self, path: &str, bytes: &[u8]) -> Result<u64, Error> {
        self.upload(path, bytes).await
    }

    /// Streams `reader` into `path` without holding it in memory (parents created).
    pub async fn upload(
        &self,
        path: &str,
        mut reader: impl AsyncRead + Unpin,
    ) -> Result<u64, Error> {
        let request = Request::File(FileOp::Write(FileWriteRequest {
            sandbox: self.id.clone(),
            path: path.to_string(),
            mode: None,
            append: false,
            parents: true,
        }));
        let mut exchange = self.client.open(&request).await?;
        loop {
            let mut buf = BytesMut::with_capacity(UPLOAD_CHUNK);
            let n = reader
                .read_buf(&mut buf)
                .await
                .map_err(|source| Error::LocalIo { path: path.to_string(), source })?;
            if n == 0 {
                break;
            }
            if let Err(e) = exchange.send_raw(buf.freeze()).await {
                // The server stopped reading (refused the upload): its reply says why.
                if let Ok(Reply::Error(wire)) = exchange.reply().await {
                    return Err(wire.into());
                }
                return Err(e.into());
            }
        }
        exchange.finish_upload()?;
        match exchange.reply().await? {
            Reply::Written { bytes } => Ok(bytes),
            Reply::Error(e) => Err(e.into()),
            other => Err(unexpected("file_write", &other)),
        }
    }

    /// Uploads a local file.
    pub async fn upload_file(&self, remote: &str, local: &Path) -> Result<u64, Error> {
        let file = tokio::fs::File::open(local)
            .await
            .map_err(|source| Error::LocalIo { path: local.display().to_string(), source })?;
        self.upload(remote, file).await
    }

    /// Reads a whole file into memory.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        self.download(path, &mut out).await?;
        Ok(out)
    }

    /// Reads at most `max_bytes` of a file from its start, into memory.
    pub async fn read_file_head(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        self.download_range(path, 0, Some(max_bytes), &mut out).await?;
        Ok(out)
    }

    /// Streams a file into `writer`; returns the bytes written.
    pub async fn download(
        &self,
        path: &str,
        writer: impl AsyncWrite + Unpin,
    ) -> Result<u64, Error> {
        self.download_range(path, 0, None, writer).await
    }

    /// Streams `len` bytes of a file (to its end when `None`) from `offset` into `writer`;
    /// returns the bytes written.
    pub async fn download_range(
        &self,
        path: &str,
        offset: u64,
        len: Option<u64>,
        mut writer: impl AsyncWrite + Unpin,
    ) -> Result<u64, Error> {
        let request = Request::File(FileOp::Read(FileReadRequest {
            sandbox: self.id.clone(),
            path: path.to_string(),
            offset,
            len,
        }));
        let mut exchange = self.client.open(&request).await?;
        exchange.finish_upload()?;
        let size = match exchange.reply().await? {
            Reply::FileData { size } => size,
            Reply::Error(e) => return Err(e.into()),
            other => return Err(unexpected("file_read", &other)),
        };
        let mut got = 0u64;
        while let Some(chunk) = exchange.read_raw().await? {
            got += chunk.len() as u64;
            writer
                .write_all(&chunk)
                .await
                .map_err(|source| Error::LocalIo { path: path.to_string(), source })?;
        }
        writer.flush().await.map_err(|source| Error::LocalIo { path: path.to_string(), source })?;
        if got != size {
            return Err(Error::ShortDownload { got, expected: size });
        }
        Ok(got)
    }

    /// Downloads to a local file.
    pub async fn download_file(&self, remote: &str, local: &Path) -> Result<u64, Error> {
        let file = tokio::fs::File::create(local)
            .await
            .map_err(|source| Error::LocalIo { path: local.display().to_string(), source })?;
        self.download(remote, file).await
    }

    pub async fn list_dir(&self, path: &str) -> Result<Vec<FileStat>, Error> {
        let request =
            Request::File(FileOp::List { sandbox: self.id.clone(), path: path.to_string() });
        match self.client.request(&request).await? {
            Reply::Entries(entries) => Ok(entries),
            other => Err(unexpected("file_list", &other)),
        }
    }

    pub async fn stat(&self, path: &str) -> Result<FileStat, Error> {
        let request =
            Request::File(FileOp::Stat { sandbox: self.id.clone(), path: path.to_string() });
        match self.client.request(&request).await? {
            Reply::Stat(stat) => Ok(stat),
            other => Err(unexpected("file_stat", &other)),
        }
    }

    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<(), Error> {
        let request = Request::File(FileOp::Mkdir {
            sandbox: self.id.clone(),
            path: path.to_string(),
            parents,
        });
        expect_done("file_mkdir", self.client.request(&request).await?)
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), Error> {
        let request = Request::File(FileOp::Remove {
            sandbox: self.id.clone(),
            path: path.to_string(),
            recursive,
        });
        expect_done("file_remove", self.client.request(&request).await?)
    }
}

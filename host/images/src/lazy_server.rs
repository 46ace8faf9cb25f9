//! The lazy blob file system in a process of its own (`brig-lazyfs`), so that it outlives brigd.
//!
//! ```text
//! brigd: LayerStore ── LazyServer ──▶ <run>/lazyfs.sock ──▶ brig-lazyfs: LazyFs  <run>/lazy
//!                                                                        └ ChunkCache ─▶ backend
//! ```
//!
//! A container's store-backed layer is an EROFS mount whose data device is a blob of this file
//! system, held open for as long as the layer is mounted. When the FUSE server lived in brigd,
//! a brigd crash aborted the FUSE connection and every read of a page not yet cached failed
//! with EIO inside running containers. Now brigd starts the server in a process group of its
//! own and records it in `<run>/lazyfs.pid` (pid and start time); a restarted brigd adopts it
//! when that pid still has that start time and the socket answers, and the blobs it serves
//! never went away. A clean exit of brigd with no container left stops it. A server that dies
//! is replaced at once by one that takes its mount over (see [`LazyServer`]), keeping the file
//! table (`<run>/lazyfs.files`: which inode is which layer's blob) it left behind.
//!
//! Messages are JSON, each behind a 4-byte little-endian length, at most [`MAX_FRAME_BYTES`];
//! brigd's calls have a deadline ([`CALL_DEADLINE`]).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::backend::{Backend, BackendSpec};
use crate::cache::ChunkCache;
use crate::device_keeper::DeviceKeeper;
use crate::fuse_takeover::copy_descriptor;
use crate::lazyfs::{ChunkEntry, LazyFs};
use crate::recorded_process::{write_record, PidRecord};

/// Largest message either side reads (a layer's chunk list: about 80 bytes a chunk).
pub const MAX_FRAME_BYTES: u32 = 64 << 20;
/// How long brigd waits for an answer.
pub const CALL_DEADLINE: Duration = Duration::from_secs(30);
/// How long a new server has to mount and answer.
const START_DEADLINE: Duration = Duration::from_secs(15);
/// How long a server whose socket refuses connections may take to finish dying (a killed process
/// closes its socket before it leaves the process table) before brigd ends it itself.
const DYING_GRACE: Duration = Duration::from_secs(2);
/// How long brigd waits for a server it killed to be gone.
const END_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum LazyServerError {
    #[error("lazy file system server I/O ({what})")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the lazy file system server did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the lazy file system server refused: {0}")]
    Refused(String),
    #[error("the lazy file system server did not start: {0}")]
    Start(String),
    #[error(transparent)]
    Cache(#[from] crate::cache::CacheError),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    #[error(transparent)]
    Mount(#[from] crate::lazyfs::MountError),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> LazyServerError {
    move |source| LazyServerError::Io { what, source }
}

/// What the server is started with (one JSON argument).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerConfig {
    pub mountpoint: PathBuf,
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub cache_max_bytes: u64,
    pub cache_memory_bytes: usize,
    pub backend: BackendSpec,
    /// Serve the mount whose server died instead of mounting: its `/dev/fuse` file is this
    /// descriptor of this process (brigd's copy).
    #[serde(default)]
    pub takeover: Option<DeviceRef>,
}

/// A process's descriptor, to be copied with `pidfd_getfd`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceRef {
    pub pid: i32,
    pub fd: i32,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum LazyRequest {
    /// Publish a layer's blob (idempotent).
    Add {
        name: String,
        chunks: Vec<ChunkEntry>,
    },
    /// Withdraw a layer's blob (mounts using it keep it).
    Remove {
        name: String,
    },
    Stats,
    /// Forget every cached chunk (the next reads are cold).
    ClearCache,
    /// Unmount and exit.
    Stop,
    /// Which descriptor is the mount's `/dev/fuse` file (brigd keeps a copy, so that a server
    /// that dies leaves the connection for the next one).
    Device,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum LazyReply {
    Added { path: PathBuf },
    Stats(LazyStats),
    Done,
    Device { fd: i32 },
    Failed { error: String },
}

/// The server's chunk cache counters.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LazyStats {
    pub fetched_bytes: u64,
    pub fetched_chunks: u64,
    pub corrupt_chunks: u64,
    pub cache_bytes: u64,
}

fn encode<T: Serialize>(message: &T) -> std::io::Result<Vec<u8>> {
    let body = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|n| *n <= MAX_FRAME_BYTES)
        .ok_or_else(|| std::io::Error::other("message too large"))?;
    let mut frame = len.to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    Ok(frame)
}

fn frame_len(header: [u8; 4]) -> std::io::Result<usize> {
    let len = u32::from_le_bytes(header);
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::other(format!("a {len}-byte message is over the cap")));
    }
    Ok(len as usize)
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> std::io::Result<T> {
    serde_json::from_slice(body).map_err(std::io::Error::other)
}

async fn read_message<T: DeserializeOwned>(
    stream: &mut UnixStream,
    body_deadline: Duration,
) -> std::io::Result<Option<T>> {
    let mut header = [0u8; 4];
    match stream.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; frame_len(header)?];
    tokio::time::timeout(body_deadline, stream.read_exact(&mut body))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    decode(&body).map(Some)
}

/// Runs the server until it is told to stop. Mounts first, then answers on the socket, so a
/// server that answers has its file system mounted.
pub async fn serve(config: ServerConfig) -> Result<(), LazyServerError> {
    let backend = Backend::open(&config.backend)?;
    let cache = Arc::new(ChunkCache::open(
        &config.cache_dir,
        config.cache_max_bytes,
        config.cache_memory_bytes,
        backend,
    )?);
    let table = config.socket.with_extension("files");
    let runtime = tokio::runtime::Handle::current();
    let fs = Arc::new(match config.takeover {
        Some(from) => {
            let device = copy_descriptor(from.pid, from.fd).map_err(io("copy the FUSE device"))?;
            let fs = LazyFs::take_over(device, &config.mountpoint, &table, cache.clone(), runtime)?;
            tracing::info!(from = from.pid, "took over the mount of a server that died");
            fs
        }
        None => LazyFs::mount(&config.mountpoint, &table, cache.clone(), runtime)?,
    });
    let _ = std::fs::remove_file(&config.socket);
    let listener = tokio::net::UnixListener::bind(&config.socket).map_err(io("bind the socket"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&config.socket, std::fs::Permissions::from_mode(0o600))
            .map_err(io("restrict the socket"))?;
    }
    tracing::info!(mountpoint = %config.mountpoint.display(), "lazy file system serving");
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let (fs, cache, stop) = (fs.clone(), cache.clone(), stop_tx.clone());
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &fs, &cache, &stop).await {
                        tracing::warn!(error = %e, "a connection to the lazy file system server failed");
                    }
                });
            }
            _ = stop_rx.changed() => break,
        }
    }
    tracing::info!("lazy file system server stopping");
    let _ = std::fs::remove_file(&config.socket);
    drop(fs);
    Ok(())
}

async fn answer(
    mut stream: UnixStream,
    fs: &LazyFs,
    cache: &ChunkCache,
    stop: &tokio::sync::watch::Sender<bool>,
) -> std::io::Result<()> {
    while let Some(request) = read_message::<LazyRequest>(&mut stream, CALL_DEADLINE).await? {
        let (reply, stopping) = match request {
            LazyRequest::Add { name, chunks } => match fs.add(&name, chunks) {
                Ok(path) => (LazyReply::Added { path }, false),
                Err(e) => (LazyReply::Failed { error: format!("keep the file table: {e}") }, false),
            },
            LazyRequest::Remove { name } => match fs.remove(&name) {
                Ok(()) => (LazyReply::Done, false),
                Err(e) => (LazyReply::Failed { error: format!("keep the file table: {e}") }, false),
            },
            LazyRequest::Device => (LazyReply::Device { fd: fs.device_fd() }, false),
            LazyRequest::Stats => (LazyReply::Stats(stats_of(cache)), false),
            LazyRequest::ClearCache => {
                cache.clear();
                (LazyReply::Done, false)
            }
            LazyRequest::Stop => (LazyReply::Done, true),
        };
        stream.write_all(&encode(&reply)?).await?;
        if stopping {
            let _ = stop.send(true);
            return Ok(());
        }
    }
    Ok(())
}

fn stats_of(cache: &ChunkCache) -> LazyStats {
    use std::sync::atomic::Ordering::Relaxed;
    LazyStats {
        fetched_bytes: cache.stats.fetched_bytes.load(Relaxed),
        fetched_chunks: cache.stats.fetched_chunks.load(Relaxed),
        corrupt_chunks: cache.stats.corrupt.load(Relaxed),
        cache_bytes: cache.disk_bytes(),
    }
}

/// brigd's side: the running server, started or adopted.
///
/// brigd keeps a copy of the server's `/dev/fuse` file, so a server that dies leaves its FUSE
/// connection up with the containers' reads queued on it. A watcher thread sees the death at
/// once (a pidfd) and starts a server that takes the mount over ([`crate::fuse_takeover`]):
/// the layers mounted from it read on. A device keeper (`crate::device_keeper`) holds another
/// copy past brigd, so a restarted brigd takes the mount over the same way when brigd and the
/// server died together. Without a copy (the server could not be asked for it, the keeper is
/// gone too, or the new one could not take over), the new server mounts afresh and reads of
/// pages not yet fetched fail with EIO in the containers that mounted a layer before.
pub struct LazyServer {
    inner: Arc<Inner>,
    conn: tokio::sync::Mutex<Option<UnixStream>>,
}

struct Inner {
    config: ServerConfig,
    binary: PathBuf,
    /// The serving process; replaced only with `replacing` held.
    serving: std::sync::Mutex<PidRecord>,
    /// brigd's copy of the mount's `/dev/fuse` file.
    device: std::sync::Mutex<Option<OwnedFd>>,
    /// The process that holds another copy, past brigd (`crate::device_keeper`).
    keeper: std::sync::Mutex<Option<DeviceKeeper>>,
    replacing: std::sync::Mutex<()>,
    /// Set when brigd stops the server: its end is not a death to repair.
    stopping: AtomicBool,
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Inner {
    fn serving(&self) -> PidRecord {
        *lock(&self.serving)
    }

    /// Asks the serving process which descriptor is its `/dev/fuse` file and keeps a copy.
    fn keep_device(&self) {
        let serving = self.serving();
        let copied = match call_blocking(&self.config.socket, &LazyRequest::Device, START_DEADLINE)
        {
            Ok(LazyReply::Device { fd }) => copy_descriptor(serving.pid, fd),
            Ok(other) => Err(std::io::Error::other(format!("unexpected reply {other:?}"))),
            Err(e) => Err(e),
        };
        match copied {
            Ok(device) => *lock(&self.device) = Some(device),
            Err(e) => tracing::warn!(
                pid = serving.pid,
                error = %e,
                "no copy of the lazy file system's FUSE device: if its server dies, the layers \
                 mounted from it lose the pages they have not read"
            ),
        }
    }

    /// Has a device keeper hold a copy of brigd's device, unless one runs.
    fn ensure_keeper(&self) {
        let mut keeper = lock(&self.keeper);
        // Checked under the lock `stop` ends the keeper under: none starts after it.
        if self.stopping.load(Ordering::Acquire) || keeper.as_ref().is_some_and(DeviceKeeper::alive)
        {
            return;
        }
        let device = lock(&self.device);
        let Some(device) = device.as_ref() else { return };
        let (record, log) = keeper_paths(&self.config);
        match DeviceKeeper::start(&self.binary, device, &record, &log) {
            Ok(started) => *keeper = Some(started),
            Err(e) => tracing::warn!(
                error = %e,
                "no device keeper for the lazy file system: if brigd and its server die \
                 together, the layers mounted from it lose the pages they have not read"
            ),
        }
    }

    /// Ends the device keeper: its connection is given up.
    fn end_keeper(&self) {
        if let Some(keeper) = lock(&self.keeper).take() {
            keeper.end();
        }
    }

    /// Starts a new server if the serving one is gone: one that takes the mount over when brigd
    /// holds its device, else one that mounts afresh.
    fn replace_if_dead(&self) -> Result<(), LazyServerError> {
        let _one_at_a_time = lock(&self.replacing);
        let dead = self.serving();
        if dead.alive() || self.stopping.load(Ordering::Acquire) {
            return Ok(());
        }
        // Taken out first: the guard of an `if let` scrutinee lives through its block.
        let held = lock(&self.device).take();
        if let Some(device) = held {
            match start_taking_over(&self.config, &self.binary, &device) {
                Ok(started) => {
                    tracing::warn!(
                        pid = dead.pid,
                        new = started.pid,
                        "the lazy file system server died; a new one took over its mount"
                    );
                    *lock(&self.serving) = started;
                    *lock(&self.device) = Some(device);
                    self.ensure_keeper();
                    return Ok(());
                }
                // The connection ends with the last copy of its device: reads of pages not
                // fetched fail instead of waiting, and the new server mounts over it.
                Err(e) => tracing::error!(
                    pid = dead.pid,
                    error = %e,
                    "the lazy file system server died and a new one could not take over its \
                     mount; mounting afresh"
                ),
            }
        } else {
            tracing::warn!(pid = dead.pid, "the lazy file system server died; starting a new one");
        }
        // The old connection ends with its keeper's copy: its queued reads fail at once.
        self.end_keeper();
        let started = start_recorded(&self.config, &self.binary)?;
        *lock(&self.serving) = started;
        self.keep_device();
        self.ensure_keeper();
        Ok(())
    }
}

/// Waits for the serving process to end (a pidfd, checked every second for brigd letting go)
/// and replaces it at once, so that reads queued on its mount wait as little as possible.
fn watch(inner: std::sync::Weak<Inner>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use rustix::process::{pidfd_open, Pid, PidfdFlags};
    loop {
        let Some(server) = inner.upgrade() else { return };
        if server.stopping.load(Ordering::Acquire) {
            return;
        }
        let serving = server.serving();
        drop(server);
        let pidfd =
            Pid::from_raw(serving.pid).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
        let ended = match &pidfd {
            Some(fd) => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                matches!(poll(&mut fds, PollTimeout::from(1000u16)), Ok(n) if n > 0)
            }
            // Gone already; or no pidfd to wait on (out of descriptors): looked at every second.
            None if serving.alive() => {
                std::thread::sleep(Duration::from_secs(1));
                false
            }
            None => true,
        };
        if !ended {
            // A keeper that died is replaced too (brigd still holds the device).
            if let Some(server) = inner.upgrade() {
                server.ensure_keeper();
            }
            continue;
        }
        let Some(server) = inner.upgrade() else { return };
        if let Err(e) = server.replace_if_dead() {
            tracing::error!(error = %e, "the lazy file system server could not be started again");
            drop(server);
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// One call over a blocking connection (start-up, before the async side exists).
fn call_blocking(
    socket: &Path,
    request: &LazyRequest,
    deadline: Duration,
) -> std::io::Result<LazyReply> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(deadline))?;
    stream.set_write_timeout(Some(deadline))?;
    stream.write_all(&encode(request)?)?;
    let mut header = [0u8; 4];
    stream.read_exact(&mut header)?;
    let mut body = vec![0u8; frame_len(header)?];
    stream.read_exact(&mut body)?;
    decode(&body)
}

impl LazyServer {
    /// Adopts the server an earlier brigd started for this run directory, or starts `binary`.
    pub fn start_or_adopt(
        config: &ServerConfig,
        binary: &Path,
    ) -> Result<LazyServer, LazyServerError> {
        let pid_path = config.socket.with_extension("pid");
        let recorded = std::fs::read(&pid_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<PidRecord>(&b).ok());
        let mut adopted = None;
        if let Some(record) = recorded.filter(PidRecord::alive) {
            if call_blocking(&config.socket, &LazyRequest::Stats, Duration::from_secs(5)).is_ok() {
                tracing::info!(pid = record.pid, "lazy file system server adopted");
                adopted = Some(record);
            } else {
                // Ours (same pid and start time) but not answering: it cannot serve anyone.
                tracing::warn!(
                    pid = record.pid,
                    "the lazy file system server does not answer; replacing it"
                );
                record.end();
            }
        }
        let mut keeper = DeviceKeeper::adopt(&keeper_paths(config).0);
        let serving = match adopted {
            Some(record) => record,
            None => match keeper.as_ref().and_then(|k| take_over_from(k, config, binary)) {
                Some(record) => record,
                None => {
                    // Its connection is not served again: ended, so its reads fail at once.
                    if let Some(keeper) = keeper.take() {
                        keeper.end();
                    }
                    start_recorded(config, binary)?
                }
            },
        };
        let inner = Arc::new(Inner {
            config: config.clone(),
            binary: binary.to_owned(),
            serving: std::sync::Mutex::new(serving),
            device: std::sync::Mutex::new(None),
            keeper: std::sync::Mutex::new(keeper),
            replacing: std::sync::Mutex::new(()),
            stopping: AtomicBool::new(false),
        });
        inner.keep_device();
        inner.ensure_keeper();
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("lazyfs-watch".into())
            .spawn(move || watch(weak))
            .map_err(io("start the server's watcher"))?;
        Ok(LazyServer { inner, conn: tokio::sync::Mutex::new(None) })
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.inner.serving().pid
    }

    /// Starts a new server if this one's process is gone.
    async fn replace_if_dead(&self) -> Result<(), LazyServerError> {
        if self.inner.serving().alive() {
            return Ok(());
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.replace_if_dead())
            .await
            .map_err(|e| LazyServerError::Start(e.to_string()))?
    }

    async fn call(&self, request: &LazyRequest) -> Result<LazyReply, LazyServerError> {
        let frame = encode(request).map_err(io("encode a request"))?;
        let mut conn = self.conn.lock().await;
        // A connection broken since the last call gets fresh tries; a failed one is dropped. Two:
        // a server killed a moment ago may still accept a connection and then reset it.
        for attempt in 0..3 {
            let mut stream = match conn.take() {
                Some(stream) => stream,
                None => self.connect().await?,
            };
            let exchange = async {
                stream.write_all(&frame).await?;
                read_message::<LazyReply>(&mut stream, CALL_DEADLINE).await
            };
            match tokio::time::timeout(CALL_DEADLINE, exchange).await {
                Ok(Ok(Some(reply))) => {
                    *conn = Some(stream);
                    return match reply {
                        LazyReply::Failed { error } => Err(LazyServerError::Refused(error)),
                        reply => Ok(reply),
                    };
                }
                Ok(Ok(None) | Err(_)) if attempt < 2 => {}
                Ok(Ok(None)) => {
                    return Err(LazyServerError::Refused("the connection closed".into()))
                }
                Ok(Err(e)) => return Err(io("call")(e)),
                Err(_) => return Err(LazyServerError::Timeout(CALL_DEADLINE)),
            }
        }
        Err(LazyServerError::Refused("no connection".into()))
    }

    /// A new connection, to a server started again first if this one's process is gone. A
    /// server killed a moment ago refuses before it is gone from the process table: brigd waits
    /// up to [`DYING_GRACE`] for it to go, then ends it (once) and starts a new one.
    async fn connect(&self) -> Result<UnixStream, LazyServerError> {
        let mut grace = Instant::now() + DYING_GRACE;
        let mut ended_one = false;
        loop {
            self.replace_if_dead().await?;
            let refused = match tokio::time::timeout(
                CALL_DEADLINE,
                UnixStream::connect(&self.inner.config.socket),
            )
            .await
            {
                Err(_) => return Err(LazyServerError::Timeout(CALL_DEADLINE)),
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(refused)) => refused,
            };
            if Instant::now() < grace {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            if ended_one {
                return Err(io("connect")(refused));
            }
            // Still there but refusing: it is ended. Gone meanwhile (it died during the
            // grace): the next turn's `replace_if_dead` starts another. Either once per call.
            let serving = self.inner.serving();
            if serving.alive() {
                tracing::warn!(
                    pid = serving.pid,
                    error = %refused,
                    "the lazy file system server refuses connections; ending it"
                );
                let gone = tokio::task::spawn_blocking(move || serving.end())
                    .await
                    .map_err(|e| LazyServerError::Start(e.to_string()))?;
                if !gone {
                    return Err(io("connect")(refused));
                }
            }
            ended_one = true;
            grace = Instant::now() + DYING_GRACE;
        }
    }

    /// Publishes a layer's blob; returns its path.
    pub async fn add(
        &self,
        name: &str,
        chunks: Vec<ChunkEntry>,
    ) -> Result<PathBuf, LazyServerError> {
        match self.call(&LazyRequest::Add { name: name.to_string(), chunks }).await? {
            LazyReply::Added { path } => Ok(path),
            other => Err(LazyServerError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    /// Withdraws a layer's blob (mounts using it keep working until they go).
    pub async fn remove(&self, name: &str) -> Result<(), LazyServerError> {
        self.call(&LazyRequest::Remove { name: name.to_string() }).await.map(drop)
    }

    pub async fn stats(&self) -> Result<LazyStats, LazyServerError> {
        match self.call(&LazyRequest::Stats).await? {
            LazyReply::Stats(stats) => Ok(stats),
            other => Err(LazyServerError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    pub async fn clear_cache(&self) -> Result<(), LazyServerError> {
        self.call(&LazyRequest::ClearCache).await.map(drop)
    }

    /// Unmounts and ends the server (brigd leaves with no container that reads a layer).
    pub async fn stop(&self) -> Result<(), LazyServerError> {
        self.inner.stopping.store(true, Ordering::Release);
        let inner = self.inner.clone();
        let _ = tokio::task::spawn_blocking(move || inner.end_keeper()).await;
        if !self.inner.serving().alive() {
            lock(&self.inner.device).take();
            return Ok(());
        }
        self.call(&LazyRequest::Stop).await?;
        let _ = std::fs::remove_file(self.inner.config.socket.with_extension("pid"));
        let gone = Instant::now() + END_DEADLINE;
        while self.inner.serving().alive() && Instant::now() < gone {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        lock(&self.inner.device).take();
        Ok(())
    }
}

/// `<run>/lazyfs.keeper` and the keeper's log (the server's).
fn keeper_paths(config: &ServerConfig) -> (PathBuf, PathBuf) {
    (config.socket.with_extension("keeper"), config.socket.with_extension("log"))
}

/// brigd and the server died together and `keeper` still holds the mount's device: a new server
/// takes the mount over with a copy of it. `None` if that fails (the caller mounts afresh).
fn take_over_from(
    keeper: &DeviceKeeper,
    config: &ServerConfig,
    binary: &Path,
) -> Option<PidRecord> {
    let device = keeper
        .device()
        .inspect_err(|e| tracing::warn!(error = %e, "cannot copy the device keeper's device"))
        .ok()?;
    match start_taking_over(config, binary, &device) {
        Ok(started) => {
            tracing::warn!(
                keeper = keeper.pid(),
                new = started.pid,
                "the lazy file system server died with brigd; a new one took over its mount \
                 from the device keeper"
            );
            Some(started)
        }
        Err(e) => {
            tracing::error!(error = %e, "a new server could not take over the kept mount");
            None
        }
    }
}

/// Starts a server that takes the mount over with a copy of `device` (this process's
/// descriptor of the mount's `/dev/fuse`), and records it.
fn start_taking_over(
    config: &ServerConfig,
    binary: &Path,
    device: &OwnedFd,
) -> Result<PidRecord, LazyServerError> {
    let mut config = config.clone();
    let own = i32::try_from(std::process::id()).unwrap_or(0);
    config.takeover = Some(DeviceRef { pid: own, fd: device.as_raw_fd() });
    start_recorded(&config, binary)
}

/// Starts the server and records it in `<run>/lazyfs.pid`.
fn start_recorded(config: &ServerConfig, binary: &Path) -> Result<PidRecord, LazyServerError> {
    let pid = spawn(config, binary)?;
    let record =
        PidRecord::of(pid).ok_or_else(|| LazyServerError::Start("it exited at once".into()))?;
    write_record(&config.socket.with_extension("pid"), &record).map_err(io("record the server"))?;
    Ok(record)
}

/// Starts the server in a process group of its own (brigd's death does not reach it) and waits
/// until it answers; its log goes to `<run>/lazyfs.log`.
fn spawn(config: &ServerConfig, binary: &Path) -> Result<i32, LazyServerError> {
    use std::os::unix::process::CommandExt;
    let log_path = config.socket.with_extension("log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io("open the server's log"))?;
    let json = serde_json::to_string(config)
        .map_err(|e| io("encode the config")(std::io::Error::other(e)))?;
    let mut child = std::process::Command::new(binary)
        .arg("--config")
        .arg(json)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| LazyServerError::Start(format!("{}: {e}", binary.display())))?;
    let pid =
        i32::try_from(child.id()).map_err(|_| LazyServerError::Start("pid out of range".into()))?;
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: String = log
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("; ");
            return Err(LazyServerError::Start(format!("exited with {status}: {tail}")));
        }
        if call_blocking(&config.socket, &LazyRequest::Stats, Duration::from_secs(2)).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LazyServerError::Timeout(START_DEADLINE));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reaps it if it ends while this brigd runs; a later brigd is not its parent.
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_and_garbled_frames_are_errors() {
        assert!(frame_len((MAX_FRAME_BYTES + 1).to_le_bytes()).is_err());
        assert_eq!(frame_len(12u32.to_le_bytes()).expect("len"), 12);
        assert!(decode::<LazyRequest>(b"{not json").is_err());
        let frame = encode(&LazyRequest::Remove { name: "ab".into() }).expect("encode");
        let len = frame_len(frame[..4].try_into().expect("header")).expect("len");
        assert!(
            matches!(decode(&frame[4..4 + len]), Ok(LazyRequest::Remove { name }) if name == "ab")
        );
    }
}

//! The node's end of a shim's control socket: send spawn requests, and route `Spawned` and
//! `Exited` reports to whoever waits for them.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use crate::control;
use crate::shim_proto::{ExitInfo, FromShim, SpawnSpec, ToShim, MAX_MESSAGE_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum ShimConnError {
    #[error("control socket")]
    Socket(#[source] std::io::Error),
    #[error("shim sent an undecodable message")]
    Decode(#[source] postcard::Error),
    #[error("cannot encode request")]
    Encode(#[source] postcard::Error),
    #[error("the container's shim is gone")]
    Gone,
    #[error("spawn failed: {0}")]
    SpawnFailed(String),
}

struct Waiter {
    spawned: Option<oneshot::Sender<Result<i32, String>>>,
    exited: Option<oneshot::Sender<ExitInfo>>,
}

/// Connection to one shim. Reports are dispatched by a background task.
pub struct ShimConn {
    fd: AsyncFd<OwnedFd>,
    waiters: Mutex<HashMap<u64, Waiter>>,
    init_died: Mutex<Option<ExitInfo>>,
}

fn nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
    fcntl(fd, FcntlArg::F_SETFL(OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK))
        .map_err(std::io::Error::from)?;
    Ok(())
}

/// `fd` (a `SOCK_SEQPACKET` socket) made non-blocking and registered with the runtime.
pub(crate) fn async_socket(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    nonblocking(&fd)?;
    #[allow(unsafe_code)]
    // SAFETY: `fd` is an open OwnedFd that moves into the AsyncFd and is dropped only with
    // it; an OwnedFd always reports the same descriptor from as_raw_fd.
    let registered = unsafe { AsyncFd::register(fd) };
    registered.map_err(Into::into)
}

/// Receives one message of at most `max` bytes and the descriptors attached to it, waiting
/// for it; `None` when the peer closed the socket. The buffer is sized to the message waiting.
pub(crate) async fn recv_message(
    fd: &AsyncFd<OwnedFd>,
    max: usize,
) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    loop {
        let mut guard = fd.readable().await?;
        let mut buf = Vec::new();
        let received = guard.try_io(|fd| {
            let len = control::peek_len(fd.get_ref().as_fd()).map_err(std::io::Error::from)?;
            // A longer one than allowed still fails in recv (MSG_TRUNC).
            buf.resize(len.clamp(1, max), 0);
            control::recv(fd.get_ref().as_fd(), &mut buf).map_err(std::io::Error::from)
        });
        match received {
            Ok(Ok(Some((len, fds)))) => {
                buf.truncate(len);
                return Ok(Some((buf, fds)));
            }
            Ok(Ok(None)) => return Ok(None),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

impl ShimConn {
    pub fn new(fd: OwnedFd) -> Result<Arc<ShimConn>, ShimConnError> {
        let fd = async_socket(fd).map_err(ShimConnError::Socket)?;
        Ok(Arc::new(ShimConn {
            fd,
            waiters: Mutex::new(HashMap::new()),
            init_died: Mutex::new(None),
        }))
    }

    /// Receives one message (waiting for it).
    pub async fn recv(&self) -> Result<FromShim, ShimConnError> {
        Ok(self.recv_with_fds().await?.0)
    }

    /// Receives one message and the descriptors attached to it.
    pub async fn recv_with_fds(&self) -> Result<(FromShim, Vec<OwnedFd>), ShimConnError> {
        match recv_message(&self.fd, MAX_MESSAGE_BYTES).await {
            Ok(Some((bytes, fds))) => {
                Ok((postcard::from_bytes(&bytes).map_err(ShimConnError::Decode)?, fds))
            }
            Ok(None) => Err(ShimConnError::Gone),
            Err(e) => Err(ShimConnError::Socket(e)),
        }
    }

    /// Routes reports to waiters until the shim hangs up. Run as a task per container.
    pub async fn dispatch(self: Arc<Self>) {
        loop {
            let msg = match self.recv().await {
                Ok(msg) => msg,
                Err(e) => {
                    tracing::debug!(error = %e, "shim connection ended");
                    break;
                }
            };
            let mut waiters = self.waiters.lock();
            match msg {
                FromShim::Spawned { exec_id, pid } => {
                    if let Some(tx) = waiters.get_mut(&exec_id).and_then(|w| w.spawned.take()) {
                        let _ = tx.send(Ok(pid));
                    }
                }
                FromShim::SpawnFailed { exec_id, error } => {
                    if let Some(mut w) = waiters.remove(&exec_id) {
                        if let Some(tx) = w.spawned.take() {
                            let _ = tx.send(Err(error));
                        }
                    }
                }
                FromShim::Exited { exec_id, status } => {
                    match waiters.remove(&exec_id).and_then(|mut w| w.exited.take()) {
                        Some(tx) => {
                            let _ = tx.send(status);
                        }
                        None => {
                            tracing::debug!(spawn_id = exec_id, "an exit report nobody waits for")
                        }
                    }
                }
                FromShim::InitDied { status } => {
                    *self.init_died.lock() = Some(status);
                }
                FromShim::Ready { .. }
                | FromShim::UserNamespace
                | FromShim::Reattached { .. }
                | FromShim::ReattachedAt { .. }
                | FromShim::ReattachedKeeping { .. }
                | FromShim::KeptFds { .. }
                | FromShim::KeptFdsInput { .. } => {}
            }
        }
        // Wake everyone still waiting: their senders drop, receivers see the shim gone.
        self.waiters.lock().clear();
    }

    /// Whether the container's init has died.
    pub fn init_died(&self) -> Option<ExitInfo> {
        *self.init_died.lock()
    }

    /// Sends a message without descriptors.
    pub async fn send(&self, msg: &ToShim) -> Result<(), ShimConnError> {
        let bytes = postcard::to_allocvec(msg).map_err(ShimConnError::Encode)?;
        self.send_bytes(&bytes, &[]).await.map_err(ShimConnError::Socket)
    }

    /// Sends a message with `fds` attached.
    pub async fn send_with_fds(
        &self,
        msg: &ToShim,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), ShimConnError> {
        let bytes = postcard::to_allocvec(msg).map_err(ShimConnError::Encode)?;
        self.send_bytes(&bytes, fds).await.map_err(ShimConnError::Socket)
    }

    async fn send_bytes(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| {
                control::send(fd.get_ref().as_fd(), bytes, fds).map_err(std::io::Error::from)
            }) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// A receiver for the exit of process `exec_id`, started for an earlier connection.
    /// Register before [`ShimConn::dispatch`] runs, or an exit reported meanwhile is missed.
    pub fn expect_exit(&self, exec_id: u64) -> oneshot::Receiver<ExitInfo> {
        let (exited_tx, exited_rx) = oneshot::channel();
        self.waiters.lock().insert(exec_id, Waiter { spawned: None, exited: Some(exited_tx) });
        exited_rx
    }

    /// Asks the shim to start a process; returns its host pid and a receiver for its exit.
    /// The last `keep_fds` of `fds` are held by the shim for a node that reconnects
    /// ([`ToShim::SpawnKeeping`]); with `keeps_input`, the last of them is the write end of
    /// the process's stdin ([`ToShim::SpawnKeepingInput`]).
    pub async fn spawn(
        &self,
        spec: SpawnSpec,
        fds: &[BorrowedFd<'_>],
        keep_fds: u8,
        keeps_input: bool,
    ) -> Result<(i32, oneshot::Receiver<ExitInfo>), ShimConnError> {
        let (spawned_tx, spawned_rx) = oneshot::channel();
        let (exited_tx, exited_rx) = oneshot::channel();
        let exec_id = spec.exec_id;
        self.waiters
            .lock()
            .insert(exec_id, Waiter { spawned: Some(spawned_tx), exited: Some(exited_tx) });
        let msg = match keep_fds {
            0 => ToShim::Spawn(spec),
            keep_fds if keeps_input => ToShim::SpawnKeepingInput { spec, keep_fds },
            keep_fds => ToShim::SpawnKeeping { spec, keep_fds },
        };
        let bytes = postcard::to_allocvec(&msg).map_err(ShimConnError::Encode)?;
        let sent = loop {
            let mut guard = self.fd.writable().await.map_err(ShimConnError::Socket)?;
            match guard.try_io(|fd| {
                control::send(fd.get_ref().as_fd(), &bytes, fds).map_err(std::io::Error::from)
            }) {
                Ok(result) => break result,
                Err(_would_block) => continue,
            }
        };
        if let Err(e) = sent {
            self.waiters.lock().remove(&exec_id);
            return Err(ShimConnError::Socket(e));
        }
        match spawned_rx.await {
            Ok(Ok(pid)) => Ok((pid, exited_rx)),
            Ok(Err(message)) => Err(ShimConnError::SpawnFailed(message)),
            Err(_) => Err(ShimConnError::Gone),
        }
    }
}

//! The node's end of the shim spawner ([`crate::shim::spawner`]): one helper process that
//! forks every shim, so starting a container costs the same with 10 or 10,000 live (a spawn
//! from brigd itself copies and then closes its whole descriptor table, several entries per
//! live container).
//!
//! Calls block for a fork's worth of time; run them off the async workers. The helper is
//! started on first use and again if it dies.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use parking_lot::Mutex;

use crate::control;
use crate::shim_proto::{FromSpawner, ToSpawner};

/// How long the helper may take to answer one request.
const REPLY_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SpawnerError {
    #[error("cannot start the shim spawner {path}")]
    Start {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("shim spawner: {0}")]
    Io(&'static str, #[source] nix::Error),
    #[error("the shim spawner hung up")]
    Gone,
    #[error("the shim spawner sent an undecodable reply")]
    Decode(#[source] postcard::Error),
    #[error("cannot encode a spawn request")]
    Encode(#[source] postcard::Error),
    #[error("the shim spawner hung up before it answered")]
    Lost,
    #[error("the shim spawner could not start a shim: {0}")]
    Failed(String),
}

struct Helper {
    sock: OwnedFd,
    process: std::process::Child,
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Only the helper: its shims live on their own control sockets.
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Starts shims through the node's spawner helper.
pub struct ShimSpawner {
    shim_path: PathBuf,
    helper: Mutex<Option<Helper>>,
}

impl ShimSpawner {
    pub fn new(shim_path: PathBuf) -> ShimSpawner {
        ShimSpawner { shim_path, helper: Mutex::new(None) }
    }

    /// Starts a shim with `control` as its stdin and `stderr` as its stderr; returns its pid.
    /// Blocking.
    pub fn spawn(&self, control: &OwnedFd, stderr: &OwnedFd) -> Result<i32, SpawnerError> {
        self.call(&ToSpawner::Spawn, &[control.as_fd(), stderr.as_fd()])
    }

    /// Starts a typist that writes all of `input` into the terminal whose master is `master`
    /// ([`ToSpawner::Type`]); returns its pid. Blocking.
    pub fn type_into(&self, master: &OwnedFd, input: &OwnedFd) -> Result<i32, SpawnerError> {
        self.call(&ToSpawner::Type, &[master.as_fd(), input.as_fd()])
    }

    fn call(&self, message: &ToSpawner, fds: &[BorrowedFd<'_>]) -> Result<i32, SpawnerError> {
        let mut helper = self.helper.lock();
        // A helper that died since the last call is replaced once.
        for attempt in 0..2 {
            let h = match helper.as_ref() {
                Some(h) => h,
                None => helper.insert(self.start()?),
            };
            match request(h, message, fds) {
                // It was gone before it read the request, so nothing was started: retry.
                Err(SpawnerError::Gone) if attempt == 0 => {
                    tracing::warn!("the shim spawner is gone; starting it again");
                    *helper = None;
                }
                // Lost mid-request: a shim may or may not run on `control`, so no retry (the
                // caller drops its end, which ends such a shim). The next call starts afresh.
                Err(e @ (SpawnerError::Gone | SpawnerError::Lost | SpawnerError::Io(..))) => {
                    *helper = None;
                    return Err(e);
                }
                result => return result,
            }
        }
        Err(SpawnerError::Gone)
    }

    fn start(&self) -> Result<Helper, SpawnerError> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (ours, theirs) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .map_err(|e| SpawnerError::Io("socketpair", e))?;
        let timeout = nix::sys::time::TimeVal::new(REPLY_DEADLINE.as_secs() as i64, 0);
        nix::sys::socket::setsockopt(&ours, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| SpawnerError::Io("reply deadline", e))?;
        let process = std::process::Command::new(&self.shim_path)
            .arg("--spawner")
            .stdin(std::process::Stdio::from(theirs))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|source| SpawnerError::Start { path: self.shim_path.clone(), source })?;
        tracing::debug!(pid = process.id(), "shim spawner started");
        Ok(Helper { sock: ours, process })
    }
}

fn request(h: &Helper, message: &ToSpawner, fds: &[BorrowedFd<'_>]) -> Result<i32, SpawnerError> {
    let bytes = postcard::to_allocvec(message).map_err(SpawnerError::Encode)?;
    control::send(h.sock.as_fd(), &bytes, fds).map_err(|e| match e {
        nix::Error::EPIPE | nix::Error::ECONNRESET => SpawnerError::Gone,
        e => SpawnerError::Io("send", e),
    })?;
    let mut buf = [0u8; 1024];
    // A signal handled meanwhile interrupts the wait (a receive timeout is never restarted).
    let received = loop {
        match control::recv(h.sock.as_fd(), &mut buf) {
            Err(nix::Error::EINTR) => continue,
            other => break other,
        }
    };
    let (len, _) =
        received.map_err(|e| SpawnerError::Io("receive", e))?.ok_or(SpawnerError::Lost)?;
    match postcard::from_bytes(&buf[..len]).map_err(SpawnerError::Decode)? {
        FromSpawner::Spawned { pid } => Ok(pid),
        FromSpawner::Failed { error } => Err(SpawnerError::Failed(error)),
    }
}

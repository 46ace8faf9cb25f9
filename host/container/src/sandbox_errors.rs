//! How the container runtime's errors read as a tier's [`SandboxError`]: what a client can
//! fix (a bad path, a busy session) apart from what the sandbox ran out of or lost.

use brig_core::sandbox::SandboxError;

use crate::files::FileError;
use crate::runtime::RuntimeError;
use crate::runtime::SHIM_ENDED;
use crate::session::SessionError;

impl From<RuntimeError> for SandboxError {
    fn from(e: RuntimeError) -> SandboxError {
        match &e {
            // The shim refuses a spawn only when it cannot fork: the sandbox's pids are used up.
            RuntimeError::Shim(crate::shim_conn::ShimConnError::SpawnFailed(_)) => {
                SandboxError::Exhausted(brig_core::sandbox::chain(&e))
            }
            // No room on the node's disk for the writable layer.
            RuntimeError::Rootfs(crate::rootfs::RootfsError::Store(store))
                if store.is_no_space() =>
            {
                SandboxError::Exhausted(brig_core::sandbox::chain(&e))
            }
            // The shim hung up (it died, taking the container): the same answer the node
            // gives once it has noticed (`Container::death`).
            RuntimeError::Shim(crate::shim_conn::ShimConnError::Gone) => {
                SandboxError::Lost(SHIM_ENDED.into())
            }
            RuntimeError::Shim(crate::shim_conn::ShimConnError::Socket(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::NotConnected
                ) =>
            {
                SandboxError::Lost(SHIM_ENDED.into())
            }
            _ => SandboxError::Internal(brig_core::sandbox::chain(&e)),
        }
    }
}

impl From<FileError> for SandboxError {
    fn from(e: FileError) -> SandboxError {
        // What a path names that the files API cannot serve is the caller's to fix: a magic
        // link or a loop of links, a device with nothing behind it, a name too long.
        let refused = |errno: i32| {
            [libc::ELOOP, libc::ENXIO, libc::ENODEV, libc::ENAMETOOLONG, libc::EXDEV]
                .contains(&errno)
        };
        match &e {
            FileError::Io { source, .. } if source.raw_os_error().is_some_and(refused) => {
                SandboxError::BadRequest(e.to_string())
            }
            FileError::Io { source, .. } if source.raw_os_error() == Some(libc::EROFS) => {
                SandboxError::PermissionDenied(e.to_string())
            }
            FileError::TooManyDirs { .. } => SandboxError::TooLarge(e.to_string()),
            // A process of the sandbox holds a lease on the file.
            FileError::Io { source, .. } if source.raw_os_error() == Some(libc::EAGAIN) => {
                SandboxError::Conflict(format!("{e} (a process in the sandbox holds the file)"))
            }
            _ => match e.io_kind() {
                Some(kind) => SandboxError::Io { kind, message: e.to_string() },
                None => SandboxError::BadRequest(e.to_string()),
            },
        }
    }
}

impl From<SessionError> for SandboxError {
    fn from(e: SessionError) -> SandboxError {
        let text = brig_core::sandbox::chain(&e);
        match e {
            SessionError::Busy => SandboxError::Conflict(text),
            SessionError::Idle => SandboxError::BadRequest(text),
            SessionError::Closed => SandboxError::NotFound(text),
            SessionError::Runtime(_) | SessionError::Io(_) => SandboxError::Internal(text),
        }
    }
}

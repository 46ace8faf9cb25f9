//! The shim's raw system calls that have no safe wrapper (fork, adopting inherited descriptors,
//! bringing the loopback interface up) and its socket and host-pid helpers.
#![allow(unsafe_code)]

use std::os::fd::{FromRawFd, OwnedFd};

use nix::unistd::{ForkResult, Pid};

use super::ShimError;
use crate::shim_proto::CONTROL_FD;

/// Takes ownership of descriptor `fd`, installed before exec by whoever started this process
/// (the node for the spawner's control socket; the spawner for a shim's control socket and
/// template namespace) and taken once, by its one caller below; `what` names it in the error
/// when it is not open.
fn inherited(fd: i32, what: &'static str) -> Result<OwnedFd, ShimError> {
    nix::fcntl::fcntl(
        // SAFETY: only borrowed for this one fcntl; validity is what the call checks.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_GETFD,
    )
    .map_err(|e| ShimError::Sys(what, e))?;
    // SAFETY: `fd` is open (checked above), installed for this caller alone, taken once.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(owned)
}

/// Takes ownership of the control socket installed as stdin.
pub fn control_socket() -> Result<OwnedFd, ShimError> {
    inherited(CONTROL_FD, "control socket (fd 0)")
}

/// The node's template mount namespace, which the spawner installs as fd 3
/// (`mounts::make_template`).
pub fn template_mount_ns() -> Result<OwnedFd, ShimError> {
    inherited(TEMPLATE_FD, "template mount namespace (fd 3)")
}

/// An `O_PATH` descriptor of directory `path` (close-on-exec): a place to reach later, from
/// another namespace or root.
pub fn open_dir_path(path: &std::path::Path, what: &'static str) -> Result<OwnedFd, ShimError> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty())
        .map_err(|e| ShimError::Sys(what, e))
}

/// Where the spawner installs the template mount namespace in a shim.
pub const TEMPLATE_FD: i32 = 3;

pub enum Forked {
    Parent(Pid),
    Child,
}

/// fork(2).
pub fn fork() -> Result<Forked, ShimError> {
    // SAFETY: the shim is single-threaded (it never starts threads: no async runtime, no thread
    // spawns), so the child is a complete copy with no lock held by a vanished thread, and may
    // run arbitrary code before exec.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Parent { child }) => Ok(Forked::Parent(child)),
        Ok(ForkResult::Child) => Ok(Forked::Child),
        Err(e) => Err(ShimError::Sys("fork", e)),
    }
}

/// Brings up `lo` in the current network namespace.
pub fn loopback_up() -> Result<(), ShimError> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| ShimError::Sys("socket for lo", e))?;
    // SAFETY: an all-zero ifreq is a valid value of this plain C struct.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS reads into `req`, a properly sized ifreq that outlives the call;
    // `sock` is an open socket.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as libc::Ioctl, &mut req) } < 0 {
        return Err(ShimError::Sys("SIOCGIFFLAGS lo", nix::Error::last()));
    }
    // SAFETY: the union member ifru_flags is the one SIOCGIFFLAGS just filled.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as libc::Ioctl, &req) } < 0 {
        return Err(ShimError::Sys("SIOCSIFFLAGS lo", nix::Error::last()));
    }
    Ok(())
}

/// Installs `fds[i]` as descriptor `i` (inheritable) and closes every descriptor from
/// `fds.len()` up, including the sources. For the child just before exec: the caller has
/// released ownership of every descriptor it holds (they are raw numbers from here).
pub fn install_fds(fds: &[std::os::fd::RawFd]) -> Result<(), nix::Error> {
    // First park every source above the target range, so no dup2 overwrites a later source.
    let mut parked = Vec::with_capacity(fds.len());
    for fd in fds {
        // SAFETY: F_DUPFD_CLOEXEC only creates a new descriptor from an open one.
        let raw = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 64) };
        if raw < 0 {
            return Err(nix::Error::last());
        }
        parked.push(raw);
    }
    for (target, raw) in parked.iter().enumerate() {
        // SAFETY: `raw` is a descriptor we just created; `target` (0..fds.len()) is replaced
        // deliberately: this process is about to exec and owns its descriptor table.
        if unsafe { libc::dup2(*raw, target as libc::c_int) } < 0 {
            return Err(nix::Error::last());
        }
    }
    // SAFETY: closing the parked copies and every higher descriptor; nothing in this process
    // uses them after this point (it execs next).
    let rc = unsafe {
        libc::syscall(libc::SYS_close_range, fds.len() as libc::c_uint, libc::c_uint::MAX, 0)
    };
    if rc < 0 {
        return Err(nix::Error::last());
    }
    Ok(())
}

/// Ignores `sig` (for SIGCHLD: children are reaped by the kernel).
pub fn ignore_signal(sig: nix::sys::signal::Signal) {
    // SAFETY: installing SIG_IGN runs no handler code, so no signal-safety invariant applies.
    let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
}

/// Resets `sig` to its default disposition.
pub fn default_signal(sig: nix::sys::signal::Signal) {
    // SAFETY: installing SIG_DFL runs no handler code, so no signal-safety invariant applies.
    let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
}

/// A `SOCK_SEQPACKET` socket bound at `path` (replacing a stale one), mode 0600; [`listen`]
/// makes it take connections.
pub fn bind(path: &std::path::Path) -> Result<OwnedFd, ShimError> {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let _ = std::fs::remove_file(path);
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| ShimError::Sys("socket", e))?;
    let addr = UnixAddr::new(path).map_err(|e| ShimError::Sys("socket path", e))?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&sock), &addr)
        .map_err(|e| ShimError::Sys("bind shim socket", e))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ShimError::Io("chmod shim socket", e))?;
    Ok(sock)
}

/// Takes connections on a socket from [`bind`]. A connecting process's peer credentials are
/// those of the process that called this.
pub fn listen(sock: &OwnedFd) -> Result<(), ShimError> {
    use nix::sys::socket::{listen, Backlog};
    listen(sock, Backlog::new(4).map_err(|e| ShimError::Sys("backlog", e))?)
        .map_err(|e| ShimError::Sys("listen", e))
}

/// This process's pid as the host sees it, read through the host's /proc.
pub fn own_host_pid(host_proc: &OwnedFd) -> Result<i32, ShimError> {
    let link = nix::fcntl::readlinkat(host_proc, "self")
        .map_err(|e| ShimError::Sys("read the host's /proc/self", e))?;
    link.to_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ShimError::Protocol(format!("host /proc/self is {link:?}")))
}

/// The host's pid of `child` (a pid of this namespace): the `Pid:` line of a pidfd's fdinfo
/// read through the host's /proc shows it in the host's namespace.
pub fn host_pid_of(host_proc: &OwnedFd, child: Pid) -> Result<i32, ShimError> {
    let target = rustix::process::Pid::from_raw(child.as_raw())
        .ok_or_else(|| ShimError::Protocol(format!("no such child: {child}")))?;
    let pidfd = rustix::process::pidfd_open(target, rustix::process::PidfdFlags::empty())
        .map_err(|e| ShimError::Io("pidfd_open", e.into()))?;
    let path = format!("self/fdinfo/{}", std::os::fd::AsRawFd::as_raw_fd(&pidfd));
    let info = nix::fcntl::openat(
        host_proc,
        path.as_str(),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| ShimError::Sys("open pidfd fdinfo", e))?;
    // A few short lines; the pid is on the first few.
    let mut buf = [0u8; 512];
    let n = nix::unistd::read(&info, &mut buf).map_err(|e| ShimError::Sys("read fdinfo", e))?;
    let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
    text.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|pid: &i32| *pid > 0)
        .ok_or_else(|| ShimError::Protocol(format!("no host pid in pidfd fdinfo: {text:?}")))
}

/// Points the shim's stderr at /dev/null.
pub fn stderr_to_null() -> Result<(), ShimError> {
    let null = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| ShimError::Sys("open /dev/null", e))?;
    nix::unistd::dup2_stderr(&null).map_err(|e| ShimError::Sys("dup2 stderr", e))
}

/// Accepts one connection (blocking mode, close-on-exec).
pub fn accept(listener: &OwnedFd) -> Result<OwnedFd, ShimError> {
    use std::os::fd::AsRawFd;
    let fd =
        nix::sys::socket::accept4(listener.as_raw_fd(), nix::sys::socket::SockFlag::SOCK_CLOEXEC)
            .map_err(|e| ShimError::Sys("accept", e))?;
    // SAFETY: accept4 just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new command line for the spawner's children (`/proc/<pid>/cmdline`, what `ps` shows),
/// prepared once in the spawner: a fork has the same argument area at the same address.
pub struct Retitle {
    start: u64,
    area: Vec<u8>,
}

impl Retitle {
    /// `title` over this process's argument area, as setproctitle does: the title and a NUL
    /// at its start and the area's last byte not a NUL, which tells the kernel to read only up
    /// to the title's NUL. `None` if the area cannot be found or has no room.
    pub fn prepare(title: &str) -> Option<Retitle> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let (start, end) =
            (crate::runtime::stat_field(&stat, 48)?, crate::runtime::stat_field(&stat, 49)?);
        let len = usize::try_from(end.checked_sub(start)?).ok()?;
        if len < title.len() + 2 {
            return None;
        }
        let mut area = vec![b' '; len];
        area[..title.len()].copy_from_slice(title.as_bytes());
        area[title.len()] = 0;
        Some(Retitle { start, area })
    }

    /// Writes the title into this process's argument area. Best effort: a process that keeps
    /// its command line works the same.
    pub fn apply(&self) {
        use std::os::unix::fs::FileExt;
        let mem = std::fs::OpenOptions::new().write(true).open("/proc/self/mem");
        if let Err(e) = mem.and_then(|m| m.write_all_at(&self.area, self.start)) {
            tracing::debug!(error = %e, "command line not retitled");
        }
    }
}

/// Installs seccomp filter `program` on the calling thread without setting `no_new_privs`
/// (`seccompiler::apply_filter` sets it): the kernel takes the filter only from a process that
/// holds `CAP_SYS_ADMIN` in its user namespace, and refuses with `EACCES` otherwise.
pub(super) fn install_seccomp(program: &seccompiler::BpfProgram) -> Result<(), nix::errno::Errno> {
    let mut filter: Vec<libc::sock_filter> = program
        .iter()
        .map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k })
        .collect();
    let len = u16::try_from(filter.len()).map_err(|_| nix::errno::Errno::E2BIG)?;
    let prog = libc::sock_fprog { len, filter: filter.as_mut_ptr() };
    // SAFETY: `prog` points at `filter`, `len` instructions that stay alive (and unchanged)
    // for the call; the kernel copies the program in and keeps no pointer to it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(())
}

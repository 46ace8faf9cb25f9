//! `brig-shim --spawner`: the node's one helper that starts shims.
//!
//! Starting a process from brigd costs time in the number of descriptors brigd holds: the
//! child gets a copy of the descriptor table and exec closes every close-on-exec entry, one
//! or more per live container. The spawner is started once, early, holds a handful of
//! descriptors, and forks each shim from its own small address space; brigd only sends it the
//! shim's control socket and stderr pipe and reads back the pid.
//!
//! ```text
//! node ── ToSpawner::Spawn + [control, stderr] ──▶ spawner ── fork (no exec) ─────────▶ shim
//!                                                   (+ the template mount namespace, fd 3)
//!      ◀── FromSpawner::Spawned { pid } ──────────
//! node ── ToSpawner::Type + [master, input] ─────▶ spawner ── fork ─▶ typist
//! ```
//! A typist writes a command's stdin given whole into its terminal (as the command reads it)
//! and exits; being the spawner's child, not the node's, it goes on if the node dies.
//! A shim is not exec'd: the fork goes on as the shim (`shim::run_with`), with the seccomp
//! programs the spawner compiled once. Its pages stay the spawner's until it writes them, so
//! the binary's and the C library's relocated data, which an exec'd process fills in for
//! itself, are one copy for every shim, and a create skips the exec and the dynamic loading.
//! Every shim has the spawner's address-space layout: nothing in a container can read it
//! (pid 1 is not dumpable and its memory belongs to the host's user namespace; see `shim`),
//! and what the container runs is exec'd afresh.
//! The spawner is the shims' parent (and their subreaper: each shim's pid 1 comes back to it
//! when the first process exits), with SIGCHLD ignored so the kernel reaps them. When the
//! node hangs up it exits; its shims carry on (a shim's life follows its own control socket,
//! not its parent).

use std::os::fd::{AsFd, IntoRawFd, OwnedFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{sys, ShimError};
use crate::control;
use crate::shim_proto::{FromSpawner, ToSpawner};

/// Serves spawn requests until the node hangs up.
pub fn run() -> Result<(), ShimError> {
    let control = sys::control_socket()?;
    sys::stderr_to_null()?;
    // Exited shims are reaped by the kernel: waitpid(-1) walks every child, 10,000 of them.
    sys::ignore_signal(nix::sys::signal::Signal::SIGCHLD);
    // A shim forks the container's pid 1 and exits: pid 1 comes back to the spawner, not to
    // the host's init, and is reaped the same way.
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| ShimError::Sys("become the shims' subreaper", e))?;
    // Every shim starts its container's mount namespace from this one (see `mounts`).
    let template = super::mounts::make_template()?;
    // Compiled once: every shim confines its container with these.
    let programs = super::security::seccomp_programs()?;
    // Called what an exec'd shim was, not after the spawner's command line.
    let title = sys::Retitle::prepare(SHIM_TITLE);
    // Small: a spawn request is a tag and two descriptors.
    let mut buf = vec![0u8; 256];
    loop {
        let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(0) | Err(nix::Error::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(ShimError::Sys("poll", e)),
        }
        let (len, fds) = match control::recv(control.as_fd(), &mut buf) {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(()),
            Err(nix::Error::EINTR | nix::Error::EAGAIN) => continue,
            Err(e) => return Err(ShimError::Sys("receive", e)),
        };
        let reply = match postcard::from_bytes::<ToSpawner>(&buf[..len]) {
            Ok(ToSpawner::Spawn) if fds.len() == 2 => {
                spawn(&programs, title.as_ref(), fds, &template)
            }
            Ok(ToSpawner::Type) if fds.len() == 2 => start_typist(fds),
            Ok(ToSpawner::Spawn | ToSpawner::Type) => FromSpawner::Failed {
                error: format!("a request carries 2 descriptors, not {}", fds.len()),
            },
            Err(e) => FromSpawner::Failed { error: format!("undecodable request: {e}") },
        };
        let bytes =
            postcard::to_allocvec(&reply).map_err(|e| ShimError::Protocol(e.to_string()))?;
        control::send(control.as_fd(), &bytes, &[]).map_err(|e| ShimError::Sys("reply", e))?;
    }
}

/// Forks a shim with `fds` = [control socket, stderr] as its stdin and stderr; the child runs
/// the shim from here, confining its container with `programs`, under `title`.
fn spawn(
    programs: &super::security::SeccompPrograms,
    title: Option<&sys::Retitle>,
    fds: Vec<OwnedFd>,
    template: &OwnedFd,
) -> FromSpawner {
    fork_with(
        fds,
        |[control, stderr, null]| [control, null, stderr],
        Some(template),
        || {
            // The shim reaps its own children (from a signalfd).
            sys::default_signal(nix::sys::signal::Signal::SIGCHLD);
            if let Some(title) = title {
                title.apply();
            }
            match super::run_with(programs) {
                Ok(()) => 0,
                Err(e) => {
                    let line = format!("brig-shim: {}\n", super::describe(&e));
                    let _ = nix::unistd::write(std::io::stderr(), line.as_bytes());
                    1
                }
            }
        },
    )
}

/// A shim's command line, as `ps` shows it.
const SHIM_TITLE: &str = "brig-shim";

/// Forks a typist with `fds` = [a terminal's master, the input to type into it]: the input
/// on fd 0, the terminal on fd 1, nothing else (not the node's socket).
fn start_typist(fds: Vec<OwnedFd>) -> FromSpawner {
    let layout = |[master, input, null]: [OwnedFd; 3]| [input, master, null];
    fork_with(fds, layout, None, || i32::from(type_in().is_err()))
}

/// Forks a child whose fds 0-2 are `layout` of the request's two descriptors and /dev/null,
/// and fd 3 a copy of `fd3` if given (every other descriptor closed), and which exits with
/// what `child` returns.
fn fork_with(
    fds: Vec<OwnedFd>,
    layout: impl FnOnce([OwnedFd; 3]) -> [OwnedFd; 3],
    fd3: Option<&OwnedFd>,
    child: impl FnOnce() -> i32,
) -> FromSpawner {
    let null = match nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => return FromSpawner::Failed { error: format!("open /dev/null: {e}") },
    };
    match sys::fork() {
        Ok(sys::Forked::Child) => {
            let mut fds = fds.into_iter();
            let (Some(first), Some(second)) = (fds.next(), fds.next()) else {
                std::process::exit(126)
            };
            let mut raw = layout([first, second, null]).map(IntoRawFd::into_raw_fd).to_vec();
            raw.extend(fd3.map(std::os::fd::AsRawFd::as_raw_fd));
            if sys::install_fds(&raw).is_err() {
                std::process::exit(126);
            }
            std::process::exit(child())
        }
        Ok(sys::Forked::Parent(pid)) => FromSpawner::Spawned { pid: pid.as_raw() },
        Err(e) => FromSpawner::Failed { error: super::describe(&e) },
    }
}

/// Copies fd 0 into fd 1, a terminal's master that the node may have made non-blocking (the
/// flag is the file's, shared with the node's copy): a full terminal is waited for. Ends at the
/// input's end, or with an error once the terminal has closed (EIO).
fn type_in() -> nix::Result<()> {
    let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
    let (input, terminal) = (stdin.as_fd(), stdout.as_fd());
    let mut buf = [0u8; 4096];
    loop {
        let n = nix::unistd::read(input, &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            match nix::unistd::write(terminal, rest) {
                Ok(written) => rest = &rest[written..],
                Err(nix::Error::EAGAIN) => {
                    let mut fds = [PollFd::new(terminal, PollFlags::POLLOUT)];
                    match poll(&mut fds, PollTimeout::NONE) {
                        Ok(_) | Err(nix::Error::EINTR) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(nix::Error::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

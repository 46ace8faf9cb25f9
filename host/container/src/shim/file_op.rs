//! File operations with the container's rights: the node asks ([`ToShim::FileOp`]), the shim
//! forks a child, and the child does the operation as container root, in the container's
//! namespaces, cgroups, root directory and confinement (it inherits them all from the shim,
//! which took them once). So the kernel checks every open as it would for a process of the
//! sandbox (a file its own root may not read cannot be read through the files API either), an
//! upload's pages are the container's (charged to its memory cgroup, counted in its pids),
//! and paths resolve in its mount namespace. The checks of [`crate::files`] (regular files on
//! the sandbox's disk, opened without blocking) still apply on top.
//!
//! The child answers on the request's own reply socket and never talks to the node's control
//! connection: a child that is slow or killed delays no other request. The shim only forks and
//! reaps it (an exit nobody waits for).
//!
//! [`ToShim::FileOp`]: crate::shim_proto::ToShim::FileOp

#![allow(unsafe_code)]

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use crate::control;
use crate::files::{FileError, RootDir};
use crate::shim_files::{wire_entry, wire_error};
use crate::shim_proto::{FileReply, FileRequest, WireFileError};

/// A child that has not finished a bounded operation by then dies of SIGALRM (a write ends
/// when the node closes its pipe instead).
const CHILD_DEADLINE_SECS: u32 = 300;

/// Starts the child for `request`. `fds`: the reply socket, then the pipe a write or a
/// listing uses. A request that cannot start is answered here.
pub fn start(request: FileRequest, mut fds: Vec<OwnedFd>) {
    let wants_pipe = matches!(
        request,
        FileRequest::Write { .. } | FileRequest::List { .. } | FileRequest::Watch { .. }
    );
    if fds.is_empty() {
        return;
    }
    let reply = fds.remove(0);
    let pipe = fds.pop();
    if !fds.is_empty() || pipe.is_some() != wants_pipe {
        let error = other("wrong descriptors for a file request");
        answer(&reply, &FileReply::Failed(error), None);
        return;
    }
    match super::sys::fork() {
        Ok(super::sys::Forked::Child) => {
            let code = run(request, &reply, pipe);
            // SAFETY: `_exit` ends this forked child without running the shim's exit handlers
            // or destructors (those belong to the shim, which goes on).
            unsafe { libc::_exit(code) }
        }
        Ok(super::sys::Forked::Parent(_)) => {}
        Err(e) => {
            // A full pids cgroup, say: the sandbox's own limit refuses it.
            let error = other(&format!("cannot start the file operation: {e}"));
            answer(&reply, &FileReply::Failed(error), None);
        }
    }
}

fn other(message: &str) -> WireFileError {
    WireFileError::Other { path: String::new(), message: message.to_string() }
}

fn answer(reply: &OwnedFd, message: &FileReply, fd: Option<&OwnedFd>) -> bool {
    let Ok(bytes) = postcard::to_allocvec(message) else { return false };
    let fds: Vec<_> = fd.iter().map(|f| f.as_fd()).collect();
    control::send(reply.as_fd(), &bytes, &fds).is_ok()
}

/// Answers an entry with its metadata.
fn answer_entry(reply: &OwnedFd, entry: brig_core::files::Entry) -> bool {
    let (entry, metadata) = wire_entry(entry);
    answer(reply, &FileReply::EntryWithMetadata(entry, metadata), None)
}

/// The child's work; its exit code (0 when it answered).
fn run(request: FileRequest, reply: &OwnedFd, pipe: Option<OwnedFd>) -> i32 {
    if !matches!(request, FileRequest::Write { .. } | FileRequest::Watch { .. }) {
        // SAFETY: alarm only schedules SIGALRM for this process; its default action ends it.
        unsafe { libc::alarm(CHILD_DEADLINE_SECS) };
    }
    close_inherited(reply, pipe.as_ref());
    raise_oom_score();
    let root = match rustix::fs::open(
        "/",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(root) => root,
        Err(e) => {
            let error = FileError::Io { path: "/".into(), source: e.into() };
            return i32::from(!answer(reply, &FileReply::Failed(wire_error(&error)), None));
        }
    };
    // Container root inside the user namespace: what it makes is its own.
    let dir = RootDir::new(root.as_fd(), 0);
    let outcome = match request {
        FileRequest::Read { path } => dir.open_read(&path).map(|file| {
            let fd = OwnedFd::from(file);
            answer(reply, &FileReply::Opened, Some(&fd))
        }),
        FileRequest::Write { path, append, parents, mode } => {
            match dir.open_write(&path, append, parents, mode) {
                Ok(file) => {
                    if !answer(reply, &FileReply::Ready, None) {
                        return 1;
                    }
                    copy_in(pipe, file, &path)
                        .map(|bytes| answer(reply, &FileReply::Written { bytes }, None))
                }
                Err(e) => Err(e),
            }
        }
        FileRequest::Stat { path } => dir.stat(&path).map(|e| answer_entry(reply, e)),
        FileRequest::List { path } => dir.list(&path).map(|entries| {
            let (wire, metadata): (Vec<_>, Vec<_>) = entries.into_iter().map(wire_entry).unzip();
            let bytes = postcard::to_allocvec(&wire).and_then(|mut bytes| {
                bytes.extend(postcard::to_allocvec(&metadata)?);
                Ok(bytes)
            });
            let sent = pipe
                .map(std::fs::File::from)
                .is_some_and(|mut out| bytes.is_ok_and(|bytes| out.write_all(&bytes).is_ok()));
            sent && answer(reply, &FileReply::Done, None)
        }),
        FileRequest::Watch { path, recursive } => {
            match super::file_watch::start(dir, &path, recursive) {
                Ok(watching) => {
                    if !answer(reply, &FileReply::Ready, None) {
                        return 1;
                    }
                    if let Some(pipe) = pipe {
                        watching.serve(pipe);
                    }
                    return 0;
                }
                Err(e) => Err(e),
            }
        }
        FileRequest::SetMetadata { path, metadata } => {
            dir.set_metadata(&path, &metadata.into_iter().collect()).map(|e| answer_entry(reply, e))
        }
        FileRequest::Mkdir { path, parents } => {
            dir.mkdir(&path, parents).map(|()| answer(reply, &FileReply::Done, None))
        }
        FileRequest::Remove { path, recursive } => {
            dir.remove(&path, recursive).map(|()| answer(reply, &FileReply::Done, None))
        }
    };
    match outcome {
        Ok(answered) => i32::from(!answered),
        Err(e) => i32::from(!answer(reply, &FileReply::Failed(wire_error(&e)), None)),
    }
}

/// Gives this child the OOM score of every container process
/// ([`crate::runtime::PROCESS_OOM_SCORE_ADJ`]): when an upload fills the container's memory,
/// the child is killed, not the shim. Its `/proc` files are host root's while it is not
/// dumpable (as the shim is not), so it is dumpable for the one write; it holds nothing by
/// then but its own two descriptors and runs with the container's rights only.
fn raise_oom_score() {
    // SAFETY: prctl with integer arguments changes only this process's dumpable flag (its
    // memory is its own copy: a forked child, not one sharing the shim's).
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    let _ = std::fs::write("/proc/self/oom_score_adj", crate::runtime::PROCESS_OOM_SCORE_ADJ);
    // SAFETY: as above.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
}

/// Copies the pipe into the file until the node closes the pipe; the bytes copied.
fn copy_in(pipe: Option<OwnedFd>, mut file: std::fs::File, path: &str) -> Result<u64, FileError> {
    let failed = |source: std::io::Error| FileError::Io { path: path.to_string(), source };
    let Some(pipe) = pipe else { return Ok(0) };
    let mut pipe = std::fs::File::from(pipe);
    // `io::copy` between a pipe and a file splices, without a buffer of its own.
    std::io::copy(&mut pipe, &mut file).map_err(failed)
}

/// Closes every descriptor the child inherited from the shim except its own two (the node's
/// control socket, the shim's listener, the host's /proc): the child needs none of them.
fn close_inherited(reply: &OwnedFd, pipe: Option<&OwnedFd>) {
    let mut keep: Vec<u32> = [Some(reply), pipe]
        .into_iter()
        .flatten()
        .filter_map(|fd| u32::try_from(fd.as_raw_fd()).ok())
        .collect();
    keep.sort_unstable();
    let mut from = 0u32;
    for k in keep {
        if k > from {
            close_range(from, k - 1);
        }
        from = k + 1;
    }
    close_range(from, u32::MAX);
}

fn close_range(first: u32, last: u32) {
    // SAFETY: closes descriptors of this forked child only; none of them is used after (the
    // child keeps its reply socket and pipe, outside the ranges, and its own `OwnedFd`s for
    // those are the only ones it goes on using).
    unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
}

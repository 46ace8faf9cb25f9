//! Starting a requested process without copying the shim: `clone(CLONE_VM | CLONE_VFORK)` on a
//! stack of its own, as `posix_spawn` does. The child shares the shim's memory until it execs
//! or exits, and the shim is suspended meanwhile; so the child only makes system calls on what
//! [`super::child::prepare`] made ready: it allocates nothing, takes no lock and never unwinds.
//!
//! Why not fork: every exec's CPU time is charged to the container, and fork's share of it
//! (copying the shim's page tables, the copy-on-write faults that follow in both processes,
//! tearing the copy down again at exec) was about a third of what the shim spent per
//! `exec true`, on containers whose quota may be 1 ms per 100 ms.
#![allow(unsafe_code)]

use std::fmt::Write as _;
use std::os::fd::{AsRawFd, RawFd};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

use super::child::Prepared;
use crate::shim_proto::{EXIT_BAD_SETUP, EXIT_CANNOT_EXEC};

/// The child's stack: it runs a few system-call wrappers and formats at most one error line.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// A page below the stack that faults: a child that overran its stack dies of SIGSEGV
/// instead of writing into the shim's memory.
const GUARD_BYTES: usize = 4096;

/// Descriptors the child installs at most: stdin, stdout, stderr and 255 extras.
const MAX_INSTALLED: usize = 3 + u8::MAX as usize;

/// The stack children run on, reused: a child is done with it once `spawn` returns, which
/// gives its pages back, so an idle shim holds none of it.
pub struct ChildStack {
    base: std::ptr::NonNull<u8>,
}

impl ChildStack {
    pub fn new() -> Result<Self, Errno> {
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                GUARD_BYTES + CHILD_STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        let Some(base) =
            std::ptr::NonNull::new(base.cast::<u8>()).filter(|_| base != libc::MAP_FAILED)
        else {
            return Err(Errno::last());
        };
        let stack = Self { base };
        // SAFETY: the lowest page of the mapping just made, which nothing uses.
        if unsafe { libc::mprotect(base.as_ptr().cast(), GUARD_BYTES, libc::PROT_NONE) } < 0 {
            return Err(Errno::last());
        }
        Ok(stack)
    }

    fn usable(&mut self) -> &mut [u8] {
        // SAFETY: the mapping above the guard page is this value's, readable and writable,
        // for as long as it lives; `&mut self` makes this the only reference to it.
        unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr().add(GUARD_BYTES), CHILD_STACK_BYTES)
        }
    }

    /// Returns the pages a child touched (they read back as zeros on the next use).
    fn give_back(&mut self) {
        let stack = self.usable();
        // SAFETY: MADV_DONTNEED on this value's own private anonymous pages, which nothing
        // refers to any more: the child that used them has exec'd or exited.
        let _ =
            unsafe { libc::madvise(stack.as_mut_ptr().cast(), stack.len(), libc::MADV_DONTNEED) };
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; no reference into it outlives `self`.
        let _ = unsafe { libc::munmap(self.base.as_ptr().cast(), GUARD_BYTES + CHILD_STACK_BYTES) };
    }
}

/// Starts the prepared process and returns its pid once it has exec'd or exited. The child is
/// reaped like a forked one (it signals SIGCHLD when it ends).
pub fn spawn(prepared: &Prepared, stack: &mut ChildStack) -> Result<Pid, Errno> {
    // No signal may reach the child while it shares the shim's memory and still has the
    // shim's dispositions; it resets them and then unblocks everything itself.
    let mut saved = SigSet::empty();
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), Some(&mut saved))?;
    let callback: nix::sched::CloneCb<'_> = Box::new(|| run(prepared));
    // CLONE_VM | CLONE_VFORK: the shim is single-threaded and suspended until the child execs
    // or exits, so nothing else touches the memory they share meanwhile. The child runs `run`
    // on `stack`, which nothing else uses while it lives (the stack is reused only by a later
    // spawn); `run` never returns, allocates nothing and changes no shared memory except its
    // own stack and errno (the shim reads errno only after a failed call of its own).
    // SAFETY: the shim is single-threaded and suspended while the child shares its memory, and
    // the child runs only `run` (no allocation, no return) on a stack nothing else uses.
    let started = unsafe {
        nix::sched::clone(
            callback,
            stack.usable(),
            CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
            Some(libc::SIGCHLD),
        )
    };
    stack.give_back();
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&saved), None);
    started
}

/// An error line formatted on the stack (truncated at its size).
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len() - self.len;
        let take = s.len().min(room);
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

/// Prints `brig: <message>` to fd 2 and exits with `code`, without flushing or running
/// anything of the shim's (`_exit`).
fn die(code: i32, message: std::fmt::Arguments<'_>) -> ! {
    let mut line = Line { buf: [0; 512], len: 0 };
    let _ = write!(line, "brig: {message}");
    let end = line.len.min(line.buf.len() - 1);
    line.buf[end] = b'\n';
    // SAFETY: writes `end + 1` initialised bytes of `line.buf` to fd 2; a closed fd 2 only
    // makes the write fail.
    let _ = unsafe { libc::write(2, line.buf.as_ptr().cast(), end + 1) };
    // SAFETY: _exit ends this process at once; it touches no memory shared with the shim.
    unsafe { libc::_exit(code) }
}

/// The child: joins its cgroups, takes its session (and terminal), descriptors, signals,
/// directory and user, then execs.
fn run(p: &Prepared) -> ! {
    if let Some(f) = p.failure.as_ref().filter(|f| f.early) {
        die(f.code, format_args!("{}", f.message));
    }
    // Join the exec's cgroups first, so everything it becomes is counted and can be killed.
    for fd in &p.cgroups {
        // SAFETY: writes one byte from a static string to an open descriptor.
        if unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) } < 0 {
            die(EXIT_BAD_SETUP, format_args!("cannot join cgroup: {}", Errno::last()));
        }
    }
    // SAFETY: setsid has no memory arguments.
    let _ = unsafe { libc::setsid() };
    if p.terminal {
        // Without it the shell runs, but with no job control and no ^C.
        let Some(stdin) = p.stdio.first() else {
            die(EXIT_BAD_SETUP, format_args!("no terminal to take"))
        };
        // SAFETY: TIOCSCTTY takes an integer argument, no memory.
        if unsafe { libc::ioctl(stdin.as_raw_fd(), libc::TIOCSCTTY, 0) } < 0 {
            die(EXIT_BAD_SETUP, format_args!("cannot take the terminal: {}", Errno::last()));
        }
    }
    if let Err(e) = install_fds(p) {
        die(EXIT_BAD_SETUP, format_args!("cannot install descriptors: {e}"));
    }
    for sig in [Signal::SIGPIPE, Signal::SIGCHLD, Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: installing SIG_DFL runs no handler code; the disposition table is this
        // child's own copy (no CLONE_SIGHAND).
        let _ = unsafe { libc::signal(sig as libc::c_int, libc::SIG_DFL) };
    }
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    if let Some(f) = &p.failure {
        die(f.code, format_args!("{}", f.message));
    }
    // SAFETY: `cwd` is a NUL-terminated string the shim keeps alive while the child runs.
    if unsafe { libc::chdir(p.cwd.as_ptr()) } < 0 {
        let e = Errno::last();
        die(EXIT_BAD_SETUP, format_args!("cannot enter working directory {}: {e}", p.cwd_text));
    }
    // Raw system calls: the C library's wrappers would try to change every thread's ids.
    // SAFETY: `groups` is a live array of `groups.len()` gid_t.
    if unsafe { libc::syscall(libc::SYS_setgroups, p.groups.len(), p.groups.as_ptr()) } < 0 {
        die(EXIT_BAD_SETUP, format_args!("setgroups: {}", Errno::last()));
    }
    // SAFETY: setresgid takes integers only.
    if unsafe { libc::syscall(libc::SYS_setresgid, p.gid, p.gid, p.gid) } < 0 {
        die(EXIT_BAD_SETUP, format_args!("setgid {}: {}", p.gid, Errno::last()));
    }
    // SAFETY: setresuid takes integers only.
    if unsafe { libc::syscall(libc::SYS_setresuid, p.uid, p.uid, p.uid) } < 0 {
        die(EXIT_BAD_SETUP, format_args!("setuid {}: {}", p.uid, Errno::last()));
    }
    // The shim confined itself (bounding set, no_new_privs, seccomp, no core dumps) before it
    // started serving, so this process inherited all of it; exec leaves a root process exactly
    // the bounding set's capabilities, a non-root one none.
    let mut last = Errno::ENOENT;
    for candidate in &p.candidates {
        // SAFETY: the path, argv and envp are NUL-terminated strings and NULL-terminated
        // pointer arrays that the shim keeps alive while the child runs.
        unsafe { libc::execve(candidate.as_ptr(), p.argv.as_ptr(), p.envp.as_ptr()) };
        let e = Errno::last();
        if e != Errno::ENOENT && e != Errno::ENOTDIR {
            last = e;
        }
    }
    let code = if last == Errno::ENOENT { EXIT_CANNOT_EXEC } else { EXIT_BAD_SETUP };
    die(code, format_args!("{}: {}", p.program, last.desc()))
}

/// Installs `stdio[i]` as descriptor `i` (inheritable) and closes every descriptor above.
fn install_fds(p: &Prepared) -> Result<(), Errno> {
    let count = p.stdio.len().min(MAX_INSTALLED);
    // First park every source above the target range, so no dup2 overwrites a later source.
    let mut parked: [RawFd; MAX_INSTALLED] = [-1; MAX_INSTALLED];
    for (slot, fd) in parked.iter_mut().zip(&p.stdio[..count]) {
        // SAFETY: F_DUPFD_CLOEXEC only creates a new descriptor from an open one.
        *slot = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 64) };
        if *slot < 0 {
            return Err(Errno::last());
        }
    }
    for (target, raw) in parked[..count].iter().enumerate() {
        // SAFETY: `raw` is a descriptor just created; `target` is replaced deliberately: this
        // child owns its own descriptor table (no CLONE_FILES) and execs next.
        if unsafe { libc::dup2(*raw, target as libc::c_int) } < 0 {
            return Err(Errno::last());
        }
    }
    // SAFETY: closes the parked copies and every higher descriptor of this child's own table.
    let rc = unsafe {
        libc::syscall(libc::SYS_close_range, count as libc::c_uint, libc::c_uint::MAX, 0)
    };
    if rc < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

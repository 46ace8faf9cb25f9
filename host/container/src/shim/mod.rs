//! `brig-shim`: one small process per container, started by the node, that creates the
//! container's namespaces, is its pid 1, and starts processes in it on the node's request.
//!
//! ```text
//! host pid ns ─ node ── spawner ── brig-shim ─╴fork, exit╶─ brig-shim, pid 1 ─┬─ exec …
//!                                                (mounts, chroot, reaps)      └─ exec …
//!                                               └─────────── container pid ns ───────────┘
//! ```
//! The first process, forked by the spawner in the host's namespaces (no exec: it shares the
//! spawner's pages until it writes them), clones the host mounts the container is
//! built from, joins the container's cgroups, enters the node's template mount namespace
//! (`mounts`) and makes its user namespace (the node writes the id maps) and the others; only a
//! child enters a new pid namespace, so it forks the shim that goes on as pid 1 and exits.
//! Pid 1 builds the mount tree and chroots into it (`mounts`). Pid 1 is visible
//! in the container but out of its reach: non-dumpable with its memory made in the host's
//! user namespace (no ptrace, no `/proc/1/fd`), unkillable from inside (the kernel drops
//! signals to a namespace's init that it has no handler for; SIGCHLD is blocked and read from
//! a signalfd), and confined like every container process. It talks only to the node, over an
//! inherited socket. It is single-threaded (so `fork` is sound, and so is a child that shares
//! its memory until exec: see `spawn`).

mod child;
mod file_op;
mod file_watch;
mod mounts;
pub mod security;
mod spawn;
pub mod spawner;
mod sys;
mod users;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{Gid, Pid, Uid};

use crate::control;
use crate::shim_proto::{ExitInfo, FromShim, ToShim, MAX_MESSAGE_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("{0}")]
    Sys(&'static str, #[source] nix::Error),
    #[error("{0}")]
    Io(&'static str, #[source] std::io::Error),
    #[error("seccomp filter: {0}")]
    Seccomp(String),
    #[error("capabilities: {0}")]
    Caps(String),
    #[error("protocol: {0}")]
    Protocol(String),
}

/// An error with its sources, on one line.
pub fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// The shim's whole life, in a process of its own (`brig-shim` with no arguments). Returns
/// when the container is gone or the node hung up.
pub fn run() -> Result<(), ShimError> {
    run_with(&security::seccomp_programs()?)
}

/// The shim's whole life with its container's seccomp `programs` already compiled: how the
/// spawner's children run it (see `spawner`), sharing the spawner's compiled programs.
pub(crate) fn run_with(programs: &security::SeccompPrograms) -> Result<(), ShimError> {
    let control = sys::control_socket()?;
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let config = match receive(&control, &mut buf)? {
        ToShim::Configure(config) => config,
        other => return Err(ShimError::Protocol(format!("expected Configure, got {other:?}"))),
    };
    // Bound in the host's mount namespace while this process is still host root: a restarted
    // node finds the container here. It listens only once the container's pid 1 has it, so a
    // node that connects learns pid 1 from the socket's peer credentials.
    let listener = sys::bind(&config.socket)?;
    let upper = sys::open_dir_path(&config.upper, "open upper directory")?;
    // The host's /proc, where the shim reads its own pid and its children's as the node sees
    // them once it is in the container's pid namespace.
    let host_proc = sys::open_dir_path(std::path::Path::new("/proc"), "open the host's /proc")?;
    let sources = mounts::Sources::clone_from_host(&config)?;
    for procs in &config.join_cgroups {
        std::fs::write(procs, b"0").map_err(|e| ShimError::Io("join cgroup", e))?;
    }
    // Leave the host's mount namespace for the node's template: the container's will be a
    // copy of that (one empty mount), not of the host's.
    let template = sys::template_mount_ns()?;
    nix::sched::setns(&template, CloneFlags::CLONE_NEWNS)
        .map_err(|e| ShimError::Sys("enter the template mount namespace", e))?;
    drop(template);
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| ShimError::Sys("unshare user namespace", e))?;
    // The node writes our uid/gid maps (it holds CAP_SETUID in the parent namespace).
    send(&control, &FromShim::UserNamespace)?;
    match receive(&control, &mut buf)? {
        ToShim::IdsMapped => {}
        other => return Err(ShimError::Protocol(format!("expected IdsMapped, got {other:?}"))),
    }
    nix::unistd::setgroups(&[]).map_err(|e| ShimError::Sys("setgroups", e))?;
    nix::unistd::setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0))
        .map_err(|e| ShimError::Sys("setresgid", e))?;
    nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0))
        .map_err(|e| ShimError::Sys("setresuid", e))?;
    // Pid 1 is visible to the container: nothing there may trace it or open its descriptors
    // (the node's control socket, the host's /proc). Without `dumpable`, that takes
    // CAP_SYS_PTRACE in the user namespace its memory was made in, the host's (the spawner was
    // exec'd there, and a fork keeps its memory's namespace); fork keeps the flag.
    nix::sys::prctl::set_dumpable(false).map_err(|e| ShimError::Sys("set non-dumpable", e))?;
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWCGROUP
            | CloneFlags::CLONE_NEWPID,
    )
    .map_err(|e| ShimError::Sys("unshare namespaces", e))?;

    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    chld.thread_block().map_err(|e| ShimError::Sys("block SIGCHLD", e))?;
    // Only a child enters the new pid namespace: the shim goes on as that child, the
    // container's pid 1, and this process (outside it) exits. One process per container.
    let (gone_r, gone_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| ShimError::Sys("pipe", e))?;
    match sys::fork()? {
        sys::Forked::Child => drop(gone_w),
        sys::Forked::Parent(_) => std::process::exit(0),
    }
    // The node sees one process from here: the first has exited once the pipe ends.
    let mut byte = [0u8; 1];
    while let Err(nix::Error::EINTR) | Ok(1..) = nix::unistd::read(&gone_r, &mut byte) {}
    drop(gone_r);
    let host_pid = sys::own_host_pid(&host_proc)?;
    mounts::build(&config, sources)?;
    sys::listen(&listener)?;
    // From here the shim only spawns, reaps and talks to the node: it takes the confinement of
    // the processes it starts, once, and they inherit it (no per-exec setup cost). Being pid 1,
    // it gives up exactly what every container process gives up.
    security::drop_bounding_set()?;
    security::confine(programs)?;
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
    // Setup errors went to the node over stderr; from here on the node may go away, and a
    // write to a pipe nobody reads would kill the shim (SIGPIPE).
    sys::stderr_to_null()?;
    let upper_fd = std::os::fd::AsRawFd::as_raw_fd(&upper);
    send(&control, &FromShim::Ready { init_pid: host_pid, upper_fd })?;
    let links = Links { listener, upper, host_proc, host_pid, survive_node: config.survive_node };
    serve(Some(control), &links)
}

/// Receives one message that carries no descriptors.
fn receive(control: &OwnedFd, buf: &mut [u8]) -> Result<ToShim, ShimError> {
    let (len, _) = control::recv(control.as_fd(), buf)
        .map_err(|e| ShimError::Sys("receive", e))?
        .ok_or_else(|| ShimError::Protocol("the node hung up".into()))?;
    postcard::from_bytes(&buf[..len]).map_err(|e| ShimError::Protocol(e.to_string()))
}

fn send(control: &OwnedFd, msg: &FromShim) -> Result<(), ShimError> {
    let bytes = postcard::to_allocvec(msg).map_err(|e| ShimError::Protocol(e.to_string()))?;
    control::send(control.as_fd(), &bytes, &[]).map_err(|e| ShimError::Sys("send to node", e))
}

/// What the shim keeps for reconnecting nodes.
struct Links {
    listener: OwnedFd,
    upper: OwnedFd,
    /// The host's /proc, where host pids are read.
    host_proc: OwnedFd,
    /// The shim's own pid as the host sees it (in here it is 1).
    host_pid: i32,
    survive_node: bool,
}

/// Serves spawn requests and reports exits until the node hangs up and the container is not
/// to survive it (the shim is pid 1: when it returns, the kernel kills every process of the
/// container). A reconnecting node replaces the current connection.
fn serve(mut control: Option<OwnedFd>, links: &Links) -> Result<(), ShimError> {
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    let sigfd = SignalFd::with_flags(&chld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| ShimError::Sys("signalfd", e))?;
    // By pid in here: the exec id and the pid the node knows.
    let mut running: HashMap<Pid, (u64, i32)> = HashMap::new();
    let mut kept = Kept::default();
    let mut next_exec_id = 1u64;
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let mut stack = spawn::ChildStack::new().map_err(|e| ShimError::Sys("child stack", e))?;
    loop {
        let mut fds = vec![
            PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(links.listener.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(c) = &control {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(e) => return Err(ShimError::Sys("poll", e)),
        }
        let ready = |i: usize| fds.get(i).and_then(|f| f.revents()).is_some_and(|r| !r.is_empty());
        let (child_ready, accept_ready, control_ready) = (ready(0), ready(1), ready(2));
        drop(fds);
        if child_ready {
            while let Ok(Some(_)) = sigfd.read_signal() {}
            reap(control.as_ref(), &mut running, &mut kept)?;
        }
        // A node that reconnects replaces the connection it was polled with: what made that
        // one ready (its predecessor's hang-up, say) is not the new one's, whose receive would
        // block (no reaping meanwhile) until the new node sends something.
        let mut replaced = false;
        if accept_ready {
            if let Ok(conn) = sys::accept(&links.listener) {
                let report = FromShim::ReattachedKeeping {
                    init_pid: links.host_pid,
                    running: running.values().copied().collect(),
                    next_exec_id,
                    upper_fd: std::os::fd::AsRawFd::as_raw_fd(&links.upper),
                    kept: kept.list(),
                };
                if hand_over(&conn, &report, &kept).is_ok() {
                    control = Some(conn);
                    replaced = true;
                }
            }
        }
        if control_ready && !replaced {
            let Some(c) = control.as_ref() else { continue };
            let received =
                control::recv(c.as_fd(), &mut buf).map_err(|e| ShimError::Sys("receive", e));
            let (len, fds) = match received {
                Ok(Some(message)) => message,
                Ok(None) | Err(_) => {
                    if links.survive_node {
                        // The node went away; the container waits for it to come back.
                        control = None;
                        continue;
                    }
                    // Take the container down with us (pid 1) rather than orphan it.
                    return Ok(());
                }
            };
            let msg: ToShim = postcard::from_bytes(&buf[..len])
                .map_err(|e| ShimError::Protocol(e.to_string()))?;
            let (spec, fds, keep) = match msg {
                ToShim::Configure(_) | ToShim::IdsMapped => {
                    return Err(ShimError::Protocol("setup message after setup".into()))
                }
                ToShim::ReleaseKept { exec_id } => {
                    kept.by_exec.remove(&exec_id);
                    continue;
                }
                ToShim::ReleaseKeptInput { exec_id } => {
                    if let Some(entry) = kept.by_exec.get_mut(&exec_id) {
                        entry.input = None;
                    }
                    continue;
                }
                ToShim::FileOp(request) => {
                    file_op::start(request, fds);
                    continue;
                }
                ToShim::Spawn(spec) => (spec, fds, ToKeep::default()),
                ToShim::SpawnKeeping { spec, keep_fds } => {
                    let (fds, keep) = split_kept(fds, keep_fds, false);
                    (spec, fds, keep)
                }
                ToShim::SpawnKeepingInput { spec, keep_fds } => {
                    let (fds, keep) = split_kept(fds, keep_fds, true);
                    (spec, fds, keep)
                }
            };
            next_exec_id = next_exec_id.max(spec.exec_id + 1);
            // A reply the node is no longer there to take is its hang-up, not the shim's
            // failure: the container must not die because the node did mid-spawn.
            let prepared = child::prepare(&spec, fds);
            let started = spawn_retrying(&prepared, &mut stack).and_then(|pid| {
                sys::host_pid_of(&links.host_proc, pid).map(|host| (pid, host)).inspect_err(|_| {
                    // Not reported, so not the node's to wait for: it dies, and is reaped.
                    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                })
            });
            let delivered = match started {
                Ok((pid, host_pid)) => {
                    // The child joined its cgroups before it exec'd, and the shim resumes only
                    // after that exec: a kill right after this reply finds it there.
                    drop(prepared);
                    running.insert(pid, (spec.exec_id, host_pid));
                    kept.hold(spec.exec_id, host_pid, keep);
                    let spawned = FromShim::Spawned { exec_id: spec.exec_id, pid: host_pid };
                    send(c, &spawned).is_ok()
                }
                // A full pids cgroup (a fork bomb, say) refuses this one request; the
                // shim, and with it the container, stays up.
                Err(e) => {
                    drop(prepared);
                    let error = describe(&e);
                    send(c, &FromShim::SpawnFailed { exec_id: spec.exec_id, error }).is_ok()
                }
            };
            if !delivered {
                if !links.survive_node {
                    return Ok(());
                }
                control = None;
            }
        }
    }
}

/// Starts a prepared process. EAGAIN (the container's pids limit is reached) is retried for
/// about half a second, long enough for the processes a timeout just killed to be reaped.
fn spawn_retrying(
    prepared: &child::Prepared,
    stack: &mut spawn::ChildStack,
) -> Result<Pid, ShimError> {
    let mut delay = std::time::Duration::from_millis(2);
    let mut waited = std::time::Duration::ZERO;
    loop {
        match spawn::spawn(prepared, stack) {
            Err(nix::Error::EAGAIN) if waited < SPAWN_RETRY_BUDGET => {
                std::thread::sleep(delay);
                waited += delay;
                delay = (delay * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other.map_err(|e| ShimError::Sys("spawn", e)),
        }
    }
}

/// How long a spawn request waits for room under the pids limit.
const SPAWN_RETRY_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

/// Ended kept processes the node has not released, at most; past it the oldest is forgotten
/// (its output descriptors closed).
const MAX_KEPT_EXITS: usize = 1024;

/// Output descriptors held for processes started with `SpawnKeeping`, by exec id.
#[derive(Default)]
struct Kept {
    by_exec: std::collections::BTreeMap<u64, KeptEntry>,
}

/// What a spawn request asks the shim to keep: the node's read ends of the output and,
/// for streamed stdin, its write end.
#[derive(Default)]
struct ToKeep {
    output: Vec<OwnedFd>,
    input: Option<OwnedFd>,
}

/// Splits the last `keep_fds` descriptors of a spawn request off (the last of them the
/// stdin's write end, with `input`).
fn split_kept(mut fds: Vec<OwnedFd>, keep_fds: u8, input: bool) -> (Vec<OwnedFd>, ToKeep) {
    let mut output = fds.split_off(fds.len().saturating_sub(usize::from(keep_fds)));
    let input = if input { output.pop() } else { None };
    (fds, ToKeep { output, input })
}

struct KeptEntry {
    /// As the host sees it.
    pid: i32,
    fds: Vec<OwnedFd>,
    /// The write end of its stdin, until the node closes it.
    input: Option<OwnedFd>,
    exit: Option<ExitInfo>,
}

impl Kept {
    fn hold(&mut self, exec_id: u64, pid: i32, keep: ToKeep) {
        if !keep.output.is_empty() {
            let entry = KeptEntry { pid, fds: keep.output, input: keep.input, exit: None };
            self.by_exec.insert(exec_id, entry);
        }
    }

    /// A kept process ended: its exit is remembered (with its descriptors) until the node
    /// releases it, so a node that dies before reading the rest gets both again.
    fn exited(&mut self, exec_id: u64, status: ExitInfo) {
        if let Some(entry) = self.by_exec.get_mut(&exec_id) {
            entry.exit = Some(status);
        }
        while self.by_exec.values().filter(|e| e.exit.is_some()).count() > MAX_KEPT_EXITS {
            let oldest = self.by_exec.iter().find(|(_, e)| e.exit.is_some()).map(|(id, _)| *id);
            oldest.map(|id| self.by_exec.remove(&id));
        }
    }

    fn list(&self) -> Vec<crate::shim_proto::KeptSpawn> {
        let kept = self.by_exec.iter();
        kept.map(|(id, e)| crate::shim_proto::KeptSpawn { exec_id: *id, pid: e.pid, exit: e.exit })
            .collect()
    }
}

/// Sends a reconnecting node the report, then each kept process's descriptors.
fn hand_over(conn: &OwnedFd, report: &FromShim, kept: &Kept) -> Result<(), ShimError> {
    let bytes = postcard::to_allocvec(report).map_err(|e| ShimError::Protocol(e.to_string()))?;
    control::send(conn.as_fd(), &bytes, &[]).map_err(|e| ShimError::Sys("send report", e))?;
    for (exec_id, entry) in &kept.by_exec {
        let exec_id = *exec_id;
        let msg = match entry.input {
            Some(_) => FromShim::KeptFdsInput { exec_id },
            None => FromShim::KeptFds { exec_id },
        };
        let bytes = postcard::to_allocvec(&msg).map_err(|e| ShimError::Protocol(e.to_string()))?;
        let fds: Vec<_> = entry.fds.iter().chain(&entry.input).map(|fd| fd.as_fd()).collect();
        control::send(conn.as_fd(), &bytes, &fds).map_err(|e| ShimError::Sys("send fds", e))?;
    }
    Ok(())
}

/// Reaps exited children, orphans of the container among them (the shim is its pid 1).
/// Reports go to the connected node, if any.
fn reap(
    control: Option<&OwnedFd>,
    running: &mut HashMap<Pid, (u64, i32)>,
    kept: &mut Kept,
) -> Result<(), ShimError> {
    loop {
        let (pid, status) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, ExitInfo::Code(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, ExitInfo::Signal(sig as i32)),
            Ok(WaitStatus::StillAlive) | Err(nix::Error::ECHILD) => return Ok(()),
            Ok(_) => continue,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(ShimError::Sys("waitpid", e)),
        };
        if let Some((exec_id, _)) = running.remove(&pid) {
            if let Some(c) = control {
                let _ = send(c, &FromShim::Exited { exec_id, status });
            }
            kept.exited(exec_id, status);
        }
    }
}

//! Running a command in a container with streamed output: the engine behind `exec`.
//!
//! ```text
//! request ─▶ pipes + exec cgroup ─▶ shim spawns ─▶ task: read stdout/stderr ─▶ events
//!                                                  deadline timer ─▶ kill whole tree
//! events: Stdout(bytes) | Stderr(bytes) … Exited(code or signal, timed_out, truncated, oom_killed)
//! ```
//! Output is capped across stdout and stderr together: past the cap the bytes are read and
//! dropped (so the command never blocks on a full pipe) and the exit says `truncated`. A
//! deadline kills the command's whole cgroup, daemons it started included. Events go through
//! a bounded channel, so a slow client slows the command instead of growing memory.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, Notify};

pub use brig_core::exec::{ExecEvent, ExecExit};

use crate::runtime::{Container, Process, RuntimeError, SpawnRequest};
use crate::shim_conn::ShimConn;
use crate::shim_proto::{ExitInfo, ToShim};
use crate::spool::{Recovered, Spool, SpoolHeader, SpoolTarget};
use brig_hostkit::terminal::{TerminalMaster, TerminalSize};

/// Read size for output pipes.
const READ_BYTES: usize = 64 << 10;
/// After the process exits, how long to wait for its pipes to close (a background child may
/// hold them open forever).
const DRAIN_GRACE: Duration = Duration::from_millis(100);
/// Reads of what is already buffered when the grace ends (a pipe holds 64 KiB; a background
/// writer that keeps filling it is not followed further).
const DRAIN_READS: usize = 16;
/// Events buffered between the engine and its consumer.
const EVENT_QUEUE: usize = 64;

/// What to feed the command on stdin.
#[derive(Debug, Clone, Default)]
pub enum Stdin {
    /// /dev/null-like: closed at once.
    #[default]
    Null,
    /// These bytes, then end of file. Off a terminal, the command reads them from a sealed
    /// in-memory file (not a pipe), so a node restart cannot cut them short.
    Bytes(Vec<u8>),
    /// The caller writes through [`Exec::stdin`].
    Stream,
}

#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub user: Option<String>,
    pub stdin: Stdin,
    pub timeout: Option<Duration>,
    /// Cap on stdout + stderr bytes delivered.
    pub output_limit: u64,
    /// Run on a terminal of this size: its output (stdout and stderr as one) comes as
    /// `Stdout`, its input goes through [`Exec::terminal`].
    pub terminal: Option<TerminalSize>,
    /// Spool the output here, and have the shim keep the output pipes, so the command and
    /// its output outlive the node (`crate::spool`, `crate::kept`).
    pub spool: Option<SpoolTarget>,
}

/// How a process ended, as the sandbox interface says it: a code, a signal, or neither (the
/// process could not be waited for: the container died).
pub(crate) fn code_and_signal(status: Option<ExitInfo>) -> (Option<i32>, Option<i32>) {
    match status {
        Some(ExitInfo::Code(c)) => (Some(c), None),
        Some(ExitInfo::Signal(s)) => (None, Some(s)),
        None => (None, None),
    }
}

/// A running command.
pub struct Exec {
    pub pid: i32,
    pub events: mpsc::Receiver<ExecEvent>,
    /// Present when the request asked for [`Stdin::Stream`]; drop it to send end of file.
    pub stdin: Option<StdinPipe>,
    /// The command's terminal, when it runs on one: input, window size.
    pub terminal: Option<Arc<TerminalMaster>>,
    /// Its spool, where the request asked for one and the file could be made.
    pub spool: Option<std::path::PathBuf>,
    kill: Arc<Notify>,
}

impl Exec {
    /// A handle that kills the command (and its tree) when triggered.
    pub fn killer(&self) -> Killer {
        Killer(self.kill.clone())
    }
}

/// The write end of a command's streamed stdin. Where the shim keeps a copy for a node that
/// restarts ([`crate::kept`]), dropping this has the shim close that copy too, so the
/// command reads end of file.
pub struct StdinPipe {
    pipe: pipe::Sender,
    /// The shim holding a copy, and the command's spawn id there.
    kept_by: Option<(Arc<ShimConn>, u64)>,
}

impl StdinPipe {
    /// `process`'s stdin on `fd`, the write end; `kept`: its shim holds a copy too.
    fn new(fd: OwnedFd, process: &Process, kept: bool) -> Result<Self, RuntimeError> {
        let pipe = pipe::Sender::from_owned_fd(fd)
            .map_err(|source| RuntimeError::Io { what: "pipe".into(), source })?;
        let kept_by = process.keeper.clone().filter(|_| kept).map(|shim| (shim, process.exec_id));
        Ok(Self { pipe, kept_by })
    }

    pub async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.pipe.write_all(bytes).await
    }
}

impl Drop for StdinPipe {
    fn drop(&mut self) {
        let Some((shim, exec_id)) = self.kept_by.take() else { return };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = shim.send(&ToShim::ReleaseKeptInput { exec_id }).await;
            });
        }
    }
}

/// Kills a running command from anywhere.
#[derive(Clone)]
pub struct Killer(Arc<Notify>);

impl Killer {
    pub fn kill(&self) {
        self.0.notify_one();
    }
}

fn pipe_pair() -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| RuntimeError::Io { what: "pipe".into(), source: e.into() })
}

/// Stdin given whole, as a sealed in-memory file the command reads from its start. Nothing
/// of it lives only in this process, so a node that restarts while the command reads loses
/// none of it (a pipe the node fed would end where the node stopped writing). The file's
/// pages are charged to the process that made it, and are at most the request's size. (The
/// guest's agent makes its commands' whole stdin the same way.)
pub fn stdin_file(bytes: &[u8]) -> Result<OwnedFd, RuntimeError> {
    use rustix::fs::{MemfdFlags, SealFlags};
    use std::io::{Seek, Write};
    let io = |source: std::io::Error| RuntimeError::Io { what: "stdin file".into(), source };
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    let fd = rustix::fs::memfd_create("brig-stdin", flags).map_err(|e| io(e.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).map_err(io)?;
    let seals = SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL;
    rustix::fs::fcntl_add_seals(&file, seals).map_err(|e| io(e.into()))?;
    // The command shares this file offset: it reads from the first byte.
    file.rewind().map_err(io)?;
    Ok(file.into())
}

fn receiver(fd: OwnedFd) -> Result<pipe::Receiver, RuntimeError> {
    pipe::Receiver::from_owned_fd(fd)
        .map_err(|source| RuntimeError::Io { what: "pipe".into(), source })
}

/// Starts `request` in `container`: on pipes, or on a new terminal whose slave is the
/// command's stdin, stdout and stderr.
pub async fn exec(container: &Arc<Container>, request: ExecRequest) -> Result<Exec, RuntimeError> {
    let argv = request.spool.as_ref().map(|_| request.argv.clone()).unwrap_or_default();
    let spooled = request.spool.is_some();
    let spawn = SpawnRequest {
        argv: request.argv,
        env: request.env,
        cwd: request.cwd,
        user: request.user,
        terminal: request.terminal.is_some(),
    };
    let started = Instant::now();
    let (process, stdout, stderr, stdin, terminal) = match request.terminal {
        None => {
            let (out_r, out_w) = pipe_pair()?;
            let (err_r, err_w) = pipe_pair()?;
            let keep = if spooled { vec![out_r.as_fd(), err_r.as_fd()] } else { Vec::new() };
            // Stdin given whole is a file the command reads; otherwise a pipe written to.
            let (input, writer) = match &request.stdin {
                Stdin::Bytes(bytes) => (stdin_file(bytes)?, None),
                Stdin::Null | Stdin::Stream => {
                    let (in_r, in_w) = pipe_pair()?;
                    (in_r, Some(in_w))
                }
            };
            // Streamed stdin outlives the node with the output: a restarted node writes on.
            let streamed = matches!(request.stdin, Stdin::Stream);
            let input_kept = spooled && streamed;
            let keep_input = writer.as_ref().map(AsFd::as_fd).filter(|_| input_kept);
            let stdio = [input.as_fd(), out_w.as_fd(), err_w.as_fd()];
            let process = container.spawn(spawn, stdio, &[], &keep, keep_input).await?;
            drop((keep, keep_input));
            drop((input, out_w, err_w));
            // Without a stream, the write end goes now: the command reads end of file.
            let stdin = match writer.filter(|_| streamed) {
                Some(in_w) => Some(StdinPipe::new(in_w, &process, input_kept)?),
                None => None,
            };
            (process, Output::Pipe(receiver(out_r)?), Some(receiver(err_r)?), stdin, None)
        }
        Some(size) => {
            let (master, slave) = brig_hostkit::terminal::open(size)?;
            let dup = |fd: &OwnedFd| {
                fd.try_clone()
                    .map_err(|source| RuntimeError::Io { what: "terminal".into(), source })
            };
            let (out, err) = (dup(&slave)?, dup(&slave)?);
            let keep = if spooled { vec![master.as_fd()] } else { Vec::new() };
            let stdio = [slave.as_fd(), out.as_fd(), err.as_fd()];
            let process = container.spawn(spawn, stdio, &[], &keep, None).await?;
            drop(keep);
            drop((slave, out, err));
            // Stdin given whole is typed in by a typist of the node's spawner, which outlives
            // the node: a crash cannot cut it short.
            if let Stdin::Bytes(bytes) = &request.stdin {
                let (master, input) = (dup(&master)?, stdin_file(bytes)?);
                let spawner = container.spawner.clone();
                tokio::task::spawn_blocking(move || spawner.type_into(&master, &input))
                    .await
                    .map_err(|e| RuntimeError::Setup(format!("typist task: {e}")))??;
            }
            let master = Arc::new(TerminalMaster::new(master)?);
            (process, Output::Terminal(master.clone()), None, None, Some(master))
        }
    };
    let spool = request.spool.and_then(|target| {
        let header = SpoolHeader {
            exec_id: target.exec_id,
            spawn_id: process.exec_id,
            cgroup: process.cgroup_name(),
            argv,
            started_unix_ms: unix_ms(SystemTime::now()),
            timeout_ms: request.timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            output_limit: request.output_limit,
            terminal: terminal.is_some(),
        };
        Spool::create(&target.dir, &header, container.finished_spools.spares())
            .inspect_err(|e| tracing::warn!(error = %e, "command not spooled"))
            .ok()
    });
    let spool_path = spool.as_ref().map(|s| s.path().to_path_buf());
    let (pid, events, kill) = start_job(JobSpec {
        container: container.clone(),
        process,
        stdout,
        stderr,
        timeout: request.timeout,
        budget: Budget::new(request.output_limit),
        started,
        spool,
    });
    Ok(Exec { pid, events, stdin, terminal, spool: spool_path, kill })
}

/// A job to start: everything but its event channel and kill switch.
struct JobSpec {
    container: Arc<Container>,
    process: Process,
    stdout: Output,
    stderr: Option<pipe::Receiver>,
    timeout: Option<Duration>,
    budget: Budget,
    started: Instant,
    spool: Option<Spool>,
}

/// Starts a job's task; returns the command's pid, its events and its kill switch.
fn start_job(spec: JobSpec) -> (i32, mpsc::Receiver<ExecEvent>, Arc<Notify>) {
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    let kill = Arc::new(Notify::new());
    let pid = spec.process.pid;
    let job = Job {
        container: spec.container,
        process: spec.process,
        stdout: spec.stdout,
        stderr: spec.stderr,
        events: tx,
        kill: kill.clone(),
        timeout: spec.timeout,
        budget: spec.budget,
        started: spec.started,
        spool: spec.spool,
    };
    tokio::spawn(job.run());
    (pid, rx, kill)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Goes on with a command an earlier run of the node started, from its spool and the output
/// descriptors its shim kept: reading resumes where the spool ends, the deadline counts from
/// the command's start, and the output cap counts what was delivered before. `None` if the
/// shim did not keep the command (its shim predates keeping, or it was not handed back).
pub fn resume(
    container: &Arc<Container>,
    path: &std::path::Path,
    recovered: &Recovered,
) -> Option<Exec> {
    let header = &recovered.header;
    let reclaimed = container.reclaim_process(header.spawn_id, &header.cgroup);
    let Some((process, mut fds, input)) = reclaimed else {
        tracing::warn!(
            container = container.name(),
            exec_id = header.exec_id,
            spawn_id = header.spawn_id,
            cgroup = %header.cgroup,
            "the shim did not keep this command"
        );
        return None;
    };
    let (stdout, stderr, terminal) = if header.terminal {
        let master = Arc::new(TerminalMaster::new(fds.pop()?).ok()?);
        (Output::Terminal(master.clone()), None, Some(master))
    } else {
        let err = if fds.len() == 2 { fds.pop().and_then(|fd| receiver(fd).ok()) } else { None };
        (Output::Pipe(receiver(fds.pop()?).ok()?), err, None)
    };
    // Its stdin, if a client streamed it: still open, kept by the shim, written on from here.
    let stdin = input.and_then(|fd| StdinPipe::new(fd, &process, true).ok());
    let now = SystemTime::now();
    let ran = now
        .duration_since(SystemTime::UNIX_EPOCH + Duration::from_millis(header.started_unix_ms))
        .unwrap_or_default();
    let mut budget = Budget::new(header.output_limit);
    for event in &recovered.events {
        match event {
            ExecEvent::Stdout(b) => budget.stdout_bytes += b.len() as u64,
            ExecEvent::Stderr(b) => budget.stderr_bytes += b.len() as u64,
            ExecEvent::Exited(_) | ExecEvent::Detached(_) => {}
        }
    }
    budget.delivered = recovered.spooled_output;
    budget.truncated = recovered.gap && recovered.spooled_output >= header.output_limit;
    tracing::debug!(
        container = container.name(),
        exec_id = header.exec_id,
        spawn_id = header.spawn_id,
        pid = process.pid,
        replayed = recovered.events.len(),
        "a kept command goes on"
    );
    let (pid, events, kill) = start_job(JobSpec {
        container: container.clone(),
        process,
        stdout,
        stderr,
        timeout: header.timeout_ms.map(|t| Duration::from_millis(t).saturating_sub(ran)),
        budget,
        started: Instant::now().checked_sub(ran).unwrap_or_else(Instant::now),
        spool: Some(Spool::reopen(path, recovered)),
    });
    Some(Exec { pid, events, stdin, terminal, spool: Some(path.to_path_buf()), kill })
}

/// Where a command's stdout comes from: a pipe, or its terminal.
enum Output {
    Pipe(pipe::Receiver),
    Terminal(Arc<TerminalMaster>),
}

impl Output {
    /// Waits for a pipe to have something, or reads a terminal.
    async fn wait(&self, buf: &mut [u8]) -> std::io::Result<Got> {
        match self {
            Output::Pipe(p) => p.readable().await.map(|()| Got::Ready),
            Output::Terminal(t) => t.read(buf).await.map(Got::Read),
        }
    }
}

/// Waits until `pipe` (if there is one) has something to take; never ready otherwise.
async fn wait_optional(pipe: &Option<pipe::Receiver>) -> std::io::Result<()> {
    match pipe {
        Some(p) => p.readable().await,
        None => std::future::pending().await,
    }
}

/// What waiting on a command's stdout gave.
enum Got {
    /// A pipe has something to take ([`take`]).
    Ready,
    /// A terminal's bytes, read into the buffer.
    Read(usize),
}

struct Job {
    container: Arc<Container>,
    process: Process,
    stdout: Output,
    /// `None` on a terminal (stderr goes to it too).
    stderr: Option<pipe::Receiver>,
    events: mpsc::Sender<ExecEvent>,
    kill: Arc<Notify>,
    timeout: Option<Duration>,
    budget: Budget,
    started: Instant,
    /// Where each delivered chunk is written first.
    spool: Option<Spool>,
}

/// Output accounting shared by both streams.
struct Budget {
    limit: u64,
    delivered: u64,
    truncated: bool,
    stdout_bytes: u64,
    stderr_bytes: u64,
}

impl Budget {
    fn new(limit: u64) -> Budget {
        Budget { limit, delivered: 0, truncated: false, stdout_bytes: 0, stderr_bytes: 0 }
    }

    /// Takes what may still be delivered of `chunk`.
    fn admit(&mut self, chunk: &[u8], stdout: bool) -> Option<Bytes> {
        if stdout {
            self.stdout_bytes += chunk.len() as u64;
        } else {
            self.stderr_bytes += chunk.len() as u64;
        }
        let room = self.limit.saturating_sub(self.delivered);
        if chunk.len() as u64 > room {
            self.truncated = true;
        }
        let take = (chunk.len() as u64).min(room) as usize;
        self.delivered += take as u64;
        (take > 0).then(|| Bytes::copy_from_slice(&chunk[..take]))
    }
}

/// How often a command whose output has ended is checked for being gone.
const GONE_CHECK: Duration = Duration::from_secs(2);

/// How long a command may have been gone without its exit report before its status is
/// unknown. The report comes from the shim, the container's pid 1, which shares the
/// container's CPU quota: with the quota spent by the container's own processes (a
/// 10-millicore container running a busy loop) on a loaded host, it can be seconds late.
const GONE_GRACE: Duration = Duration::from_secs(10);

/// Waits for the command's exit report; if the process has been gone for [`GONE_GRACE`] and
/// the report still has not come (it can be lost across repeated node restarts), ends with
/// the status unknown rather than leave the exec running forever.
async fn wait_or_gone(process: &mut Process) -> Option<ExitInfo> {
    let mut gone_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            exit = process.wait() => return exit,
            () = tokio::time::sleep(GONE_CHECK) => {
                // Looked for in its exec cgroup, not by pid alone: pids are reused (a node
                // that starts many threads goes round pid_max in a minute).
                let gone = !process.cgroup.pids().contains(&process.pid);
                if !gone {
                    gone_since = None;
                    continue;
                }
                let since = *gone_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= GONE_GRACE {
                    tracing::warn!(pid = process.pid, exec = process.exec_id, "a command's exit report never came; its status is unknown");
                    return None;
                }
            }
        }
    }
}

/// What one look at an output stream gave.
enum Taken {
    /// Moved through the spool already.
    Spooled(Bytes),
    /// Read into memory (a terminal, or past what the spool takes): spooled on delivery.
    Read(Bytes),
    /// Nothing to hand on (nothing waited, or all of it was over the output cap).
    Nothing,
    End,
}

/// Takes what waits in a command's output pipe: spliced through the spool while the spool and
/// the output cap have room (so no byte taken from the pipe lives only in this process; see
/// [`Spool::splice_from`]), read otherwise.
fn take(
    pipe: &pipe::Receiver,
    spool: &mut Option<Spool>,
    budget: &mut Budget,
    stdout: bool,
    buf: &mut [u8],
) -> std::io::Result<Taken> {
    let room = budget.limit.saturating_sub(budget.delivered);
    let spool_room = spool.as_ref().map_or(0, Spool::room);
    let taken = match spool {
        Some(spool) if room > 0 && spool_room > 0 => {
            let max = (buf.len() as u64).min(room).min(spool_room) as usize;
            pipe.try_io(|| spool.splice_from(pipe.as_fd(), stdout, max)).map(|moved| match moved {
                Some(chunk) => {
                    budget.admit(&chunk, stdout);
                    Taken::Spooled(chunk)
                }
                None => Taken::End,
            })
        }
        _ => pipe.try_read(buf).map(|n| match n {
            0 => Taken::End,
            n => budget.admit(&buf[..n], stdout).map_or(Taken::Nothing, Taken::Read),
        }),
    };
    match taken {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Taken::Nothing),
        other => other,
    }
}

/// Spools a chunk read into memory, then hands it on (a spliced chunk is on disk already).
async fn deliver(
    spool: &mut Option<Spool>,
    events: &mpsc::Sender<ExecEvent>,
    stdout: bool,
    chunk: Taken,
) -> Result<(), ()> {
    let chunk = match chunk {
        Taken::Spooled(chunk) => chunk,
        Taken::Read(chunk) => {
            if let Some(spool) = spool {
                spool.output(stdout, &chunk);
            }
            chunk
        }
        Taken::Nothing | Taken::End => return Ok(()),
    };
    let event = if stdout { ExecEvent::Stdout(chunk) } else { ExecEvent::Stderr(chunk) };
    events.send(event).await.map_err(|_| ())
}

impl Job {
    async fn run(mut self) {
        let deadline_hit = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // The deadline and explicit kills act on the cgroup from their own task, so they fire
        // even while the event channel is full.
        let killer = {
            let (timeout, kill, deadline_hit, killed) =
                (self.timeout, self.kill.clone(), deadline_hit.clone(), killed.clone());
            let cgroup_kill = self.process.tree_killer();
            tokio::spawn(async move {
                let sleep = async {
                    match timeout {
                        Some(t) => tokio::time::sleep(t).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = sleep => deadline_hit.store(true, std::sync::atomic::Ordering::Relaxed),
                    () = kill.notified() => killed.store(true, std::sync::atomic::Ordering::Relaxed),
                }
                tokio::task::spawn_blocking(cgroup_kill).await.ok();
            })
        };
        let mut budget = std::mem::replace(&mut self.budget, Budget::new(0));
        let mut out_buf = vec![0u8; READ_BYTES];
        let mut err_buf = vec![0u8; READ_BYTES];
        let (mut out_open, mut err_open) = (true, self.stderr.is_some());
        let mut status: Option<Option<ExitInfo>> = None;
        let mut drain_until: Option<tokio::time::Instant> = None;
        while out_open || err_open {
            let grace = async {
                match drain_until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                got = self.stdout.wait(&mut out_buf), if out_open => {
                    let taken = match got {
                        Ok(Got::Ready) => match &self.stdout {
                            Output::Pipe(p) => take(p, &mut self.spool, &mut budget, true, &mut out_buf),
                            Output::Terminal(_) => Ok(Taken::Nothing),
                        },
                        Ok(Got::Read(0)) | Err(_) => Ok(Taken::End),
                        Ok(Got::Read(n)) => Ok(budget.admit(&out_buf[..n], true).map_or(Taken::Nothing, Taken::Read)),
                    };
                    match taken {
                        Ok(Taken::End) | Err(_) => out_open = false,
                        Ok(Taken::Nothing) => {}
                        Ok(chunk) => if deliver(&mut self.spool, &self.events, true, chunk).await.is_err() { break; },
                    }
                },
                ready = wait_optional(&self.stderr), if err_open => {
                    let taken = match (ready, &self.stderr) {
                        (Ok(()), Some(p)) => take(p, &mut self.spool, &mut budget, false, &mut err_buf),
                        _ => Ok(Taken::End),
                    };
                    match taken {
                        Ok(Taken::End) | Err(_) => err_open = false,
                        Ok(Taken::Nothing) => {}
                        Ok(chunk) => if deliver(&mut self.spool, &self.events, false, chunk).await.is_err() { break; },
                    }
                },
                exit = self.process.wait(), if status.is_none() => {
                    status = Some(exit);
                    drain_until = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                },
                () = grace => {
                    // What the command wrote before it exited is in the pipes now, however
                    // late this task ran (a loaded node): take it before giving up on the
                    // writers it left behind.
                    if out_open {
                        for _ in 0..DRAIN_READS {
                            let taken = match &self.stdout {
                                Output::Pipe(p) => take(p, &mut self.spool, &mut budget, true, &mut out_buf),
                                Output::Terminal(t) => match t.try_read(&mut out_buf) {
                                    Ok(n @ 1..) => Ok(budget.admit(&out_buf[..n], true).map_or(Taken::Nothing, Taken::Read)),
                                    _ => Ok(Taken::End),
                                },
                            };
                            match taken {
                                Ok(Taken::Read(b)) => { let _ = deliver(&mut self.spool, &self.events, true, Taken::Read(b)).await; }
                                Ok(Taken::Spooled(b)) => { let _ = deliver(&mut self.spool, &self.events, true, Taken::Spooled(b)).await; }
                                _ => break,
                            }
                        }
                    }
                    if let (true, Some(pipe)) = (err_open, self.stderr.as_mut()) {
                        for _ in 0..DRAIN_READS {
                            match take(pipe, &mut self.spool, &mut budget, false, &mut err_buf) {
                                Ok(chunk @ (Taken::Read(_) | Taken::Spooled(_))) => {
                                    let _ = deliver(&mut self.spool, &self.events, false, chunk).await;
                                }
                                _ => break,
                            }
                        }
                    }
                    break;
                }
            }
        }
        tracing::debug!(
            pid = self.process.pid,
            spawn_id = self.process.exec_id,
            reported = status.is_some(),
            "a command's output ended"
        );
        let status = match status {
            Some(s) => s,
            None => wait_or_gone(&mut self.process).await,
        };
        tracing::debug!(
            pid = self.process.pid,
            spawn_id = self.process.exec_id,
            ?status,
            "a command ended"
        );
        killer.abort();
        // Only a SIGKILL can be the OOM killer; read the counter just then.
        let oom_killed =
            status == Some(ExitInfo::Signal(libc::SIGKILL)) && self.container.new_oom_kills() > 0;
        let (exit_code, signal) = code_and_signal(status);
        let exit = ExecExit {
            exit_code,
            signal,
            timed_out: deadline_hit.load(std::sync::atomic::Ordering::Relaxed),
            killed: killed.load(std::sync::atomic::Ordering::Relaxed),
            truncated: budget.truncated,
            oom_killed,
            duration: self.started.elapsed(),
            stdout_bytes: budget.stdout_bytes,
            stderr_bytes: budget.stderr_bytes,
        };
        let reusable = !exit.timed_out && !exit.killed;
        if let Some(spool) = &mut self.spool {
            spool.exit(&exit);
            // The spool has it all now: the shim may let go of its copies of the pipes.
            self.process.release_kept();
            self.container.spool_finished(spool.path().to_path_buf());
        }
        let _ = self.events.send(ExecEvent::Exited(exit)).await;
        self.process.cleanup(reusable);
    }
}

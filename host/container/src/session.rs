//! Persistent shell sessions: a shell whose working directory, environment, functions and
//! background jobs survive between commands (what SWE-style rollouts depend on).
//!
//! The session is a shell running a small driver loop. Commands do not travel on the shell's
//! stdin, so a program that reads stdin (`cat`, `python`, `read`) can neither eat the next
//! command nor fake the end of one:
//!
//! ```text
//! fd 3  node → shell   "<nonce>\0<command>\0"        the next command
//! fd 4  shell → node   "<nonce> <status> <cwd>\n"     the command finished
//! fd 0  node → shell   input for the running command (interactive programs)
//! fd 1,2               output; after each command the driver writes "\x1e<nonce>\x1e" to both,
//!                      so output is cut exactly at the command's end
//! ```
//! A command that outlives its call's timeout keeps running; its later output is buffered (up
//! to a bound) for the next [`Session::wait`]. The nonce is random per command; it lives in a
//! shell variable, so only the session's own commands could read it — the channel reports to
//! the same agent that could print anything anyway, and grading never relies on it.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, Mutex};

use crate::runtime::{Container, Process, RuntimeError, SpawnRequest};
pub use crate::session_journal::{SessionJournal, SessionRecord};

/// The driver loop. Runs under bash or busybox sh.
pub const DRIVER: &str = r#"trap ':' INT
while IFS= read -r -d '' __brig_nonce <&3 && IFS= read -r -d '' __brig_cmd <&3; do
  eval "$__brig_cmd" 3<&- 4>&-
  __brig_rc=$?
  printf '\036%s\036' "$__brig_nonce"
  printf '\036%s\036' "$__brig_nonce" >&2
  printf '%s %s %s\n' "$__brig_nonce" "$__brig_rc" "$PWD" >&4
done
"#;

/// Output kept for a command nobody is waiting on.
const BACKLOG_BYTES: usize = 4 << 20;
/// The bound of a recorded session's backlog file: the output above plus frame headers.
const BACKLOG_FILE_BYTES: u64 = (BACKLOG_BYTES as u64) * 2;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the session is running another command; wait for it or interrupt it")]
    Busy,
    #[error("no command is running in the session")]
    Idle,
    #[error("the session's shell has exited")]
    Closed,
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("session I/O")]
    Io(#[source] std::io::Error),
}

/// What a session command produces (the interface's, so every tier's sessions speak it).
pub use brig_core::sandbox::SessionEvent;

/// One shell session (in a container, or in a microVM through its agent).
pub struct Session {
    state: Mutex<State>,
    control: mpsc::Sender<Control>,
    process: Mutex<Box<dyn SessionProcess>>,
    journal: Option<Arc<SessionJournal>>,
    /// For a session taken back after a node restart: a command the node believed running
    /// may never have reached the shell; a waiter that sees the shell idle twice, with no
    /// report in between, forgets it.
    idle_probe: Option<IdleProbe>,
    /// The shell's host pid, where known (for the log).
    shell_pid: Option<i32>,
}

/// Where a container's sessions are recorded so they outlive the node.
#[derive(Debug, Clone)]
pub struct SessionKeep {
    pub dir: std::path::PathBuf,
    pub session_id: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

struct State {
    commands: Writer,
    stdin: Writer,
    running: Option<String>,
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;

/// The shell a session drives, wherever it runs.
pub trait SessionProcess: Send {
    /// SIGINT to the running command (the shell's process group); the shell survives.
    fn interrupt(&mut self) -> Result<(), SessionError>;
    /// Ends the shell and everything it started.
    fn close(&mut self);
}

impl SessionProcess for Process {
    fn interrupt(&mut self) -> Result<(), SessionError> {
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGINT,
        )
        .map_err(|e| SessionError::Io(e.into()))
    }

    fn close(&mut self) {
        self.kill_tree();
        self.release_kept();
    }
}

/// A running session shell's descriptors (the driver's protocol, see the module docs) and the
/// handle that interrupts or ends it.
pub struct SessionParts {
    /// fd 3: the next command.
    pub commands: Writer,
    /// fd 0: input for the running command.
    pub stdin: Writer,
    pub stdout: ReadHalf,
    pub stderr: ReadHalf,
    /// fd 4: completion reports.
    pub done: ReadHalf,
    pub process: Box<dyn SessionProcess>,
}

/// A session taken back after a node restart: its record says whether a command runs.
pub struct Resumed {
    pub journal: Arc<SessionJournal>,
    pub running: Option<String>,
    /// What the session's commands wrote while nobody waited, kept by the earlier run (read
    /// back by [`Session::resume_parts`]; `None` for a new session).
    pub backlog: Option<crate::session_backlog::Backlog>,
    /// Whether the shell waits for a command now (a container's, from `/proc`).
    pub idle_probe: Option<IdleProbe>,
    /// The nonce of a command the shell may have got without the record saying so.
    pub orphan: Option<String>,
}

/// Tells whether a session's shell is between commands.
pub type IdleProbe = Box<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> + Send + Sync,
>;

/// How often a waiter on a taken-back session checks that its command is really there.
const IDLE_PROBE_EVERY: Duration = Duration::from_millis(500);
/// Probes in a row that find the shell idle, with no output meanwhile, before the waiter
/// takes its command for lost (a second apart at least: a command's report may still be on
/// its way from a slow guest).
const IDLE_PROBES_TO_GIVE_UP: u32 = 3;

/// The environment a session shell starts with: the caller's, plus settings that keep tools
/// from paging or prompting.
pub fn session_env(mut env: Vec<(String, String)>) -> Vec<(String, String)> {
    for (k, v) in [("TERM", "dumb"), ("PAGER", "cat"), ("GIT_PAGER", "cat"), ("PS1", "")] {
        if !env.iter().any(|(key, _)| key == k) {
            env.push((k.to_string(), v.to_string()));
        }
    }
    env
}

enum Control {
    /// Deliver events of the running command to this sink (replacing any earlier one).
    Attach(mpsc::Sender<SessionEvent>),
    Detach,
    Started(String),
}

fn io(e: std::io::Error) -> SessionError {
    SessionError::Io(e)
}

impl Session {
    /// Starts a session running `shell` (e.g. `/bin/bash`) as `user` in `cwd`. With `keep`,
    /// the shim holds the node's ends of its pipes and the session is recorded, so a restarted
    /// node takes it back ([`Session::resume`]).
    pub async fn open(
        container: &Arc<Container>,
        shell: &str,
        env: Vec<(String, String)>,
        cwd: &str,
        user: Option<String>,
        keep: Option<SessionKeep>,
    ) -> Result<Session, SessionError> {
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SessionError::Io(e.into()))
        };
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (cmd_r, cmd_w) = pipe()?;
        let (done_r, done_w) = pipe()?;
        let request = SpawnRequest {
            argv: vec![shell.to_string(), "-c".to_string(), DRIVER.to_string()],
            env: session_env(env),
            cwd: cwd.to_string(),
            user,
            terminal: false,
        };
        // The node's ends, in the order a restarted node gets them back (see `resume`).
        let kept = [cmd_w.as_fd(), in_w.as_fd(), out_r.as_fd(), err_r.as_fd(), done_r.as_fd()];
        let kept: &[_] = if keep.is_some() { &kept } else { &[] };
        let process = container
            .spawn(
                request,
                [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()],
                &[cmd_r.as_fd(), done_w.as_fd()],
                kept,
                None,
            )
            .await?;
        drop((in_r, out_w, err_w, cmd_r, done_w));
        let shell_pid = Some(process.pid);
        let (spawn_id, cgroup) = (process.exec_id, process.cgroup_name());
        let parts = parts_of([cmd_w, in_w, out_r, err_r, done_r], Box::new(process))?;
        let mut session = match keep {
            Some(keep) => Session::recorded(parts, keep, spawn_id, cgroup),
            None => Session::from_parts(parts),
        };
        session.shell_pid = shell_pid;
        Ok(session)
    }

    /// A session over a shell that already runs [`DRIVER`], recorded in `keep.dir` so a
    /// restarted node takes it back ([`Session::resume_parts`]); `spawn_id` and `cgroup` name
    /// the shell for the tier (a container's shim), empty where the tier needs neither.
    pub fn recorded(
        parts: SessionParts,
        keep: SessionKeep,
        spawn_id: u64,
        cgroup: String,
    ) -> Session {
        let record = SessionRecord {
            session_id: keep.session_id,
            spawn_id,
            cgroup,
            running: None,
            next: crate::session_journal::new_nonce(),
        };
        let journal = SessionJournal::create(&keep.dir, record)
            .inspect_err(|e| tracing::warn!(error = %e, "session not recorded"))
            .ok()
            .map(Arc::new);
        let resumed = journal.map(|journal| Resumed {
            journal,
            running: None,
            backlog: None,
            idle_probe: None,
            orphan: None,
        });
        Session::with_journal(parts, resumed)
    }

    /// Takes back a session an earlier run of the node recorded, from the shell's pipes its
    /// shim kept; `None` if the shim did not keep them.
    pub fn resume(
        container: &Arc<Container>,
        dir: &std::path::Path,
        record: SessionRecord,
    ) -> Option<Session> {
        let (process, fds, _) = container.reclaim_process(record.spawn_id, &record.cgroup)?;
        let fds: [std::os::fd::OwnedFd; 5] = fds.try_into().ok()?;
        // What runs is what the shell shows, not only what was recorded: the node may have
        // died between handing over a command (or seeing one finish) and recording it.
        let pipe = crate::session_journal::pipe_name(&fds[0])?;
        let pid = process.pid;
        let parts = parts_of(fds, Box::new(process)).ok()?;
        let probe: IdleProbe = Box::new(move || {
            let idle = crate::session_journal::shell_waits_for_command(pid, &pipe, 1);
            Box::pin(std::future::ready(idle))
        });
        let mut session = Session::resume_parts(parts, dir, record, probe);
        session.shell_pid = Some(pid);
        Some(session)
    }

    /// Takes back a recorded session whose shell's descriptors the tier got back (`parts`);
    /// `probe` tells whether the shell waits for a command.
    pub fn resume_parts(
        parts: SessionParts,
        dir: &std::path::Path,
        record: SessionRecord,
        probe: IdleProbe,
    ) -> Session {
        // A command is recorded as running just before the shell gets it, so a record that
        // says idle means the shell got nothing after its last recorded end. Records written
        // by earlier versions recorded the command just after handing it over: the recorded
        // next nonce may be in the shell then, and its markers and report are dropped (its
        // output goes to the next waiter). New commands draw a fresh nonce.
        // A command whose end nobody was told of stays recorded as running; its output and
        // end wait in the backlog.
        let running = record.running.clone();
        let orphan = running.is_none().then(|| record.next.clone());
        let journal = SessionJournal::reopen(dir, record);
        journal.rotate_next();
        let backlog = journal.backlog(BACKLOG_FILE_BYTES);
        let resumed = Resumed {
            journal: Arc::new(journal),
            running,
            backlog: Some(backlog),
            idle_probe: Some(probe),
            orphan,
        };
        Session::with_journal(parts, Some(resumed))
    }

    /// A session over a shell that already runs [`DRIVER`] with these descriptors.
    pub fn from_parts(parts: SessionParts) -> Session {
        Session::with_journal(parts, None)
    }

    fn with_journal(parts: SessionParts, resumed: Option<Resumed>) -> Session {
        let (journal, running, backlog_file, idle_probe, orphan) = match resumed {
            Some(r) => (Some(r.journal), r.running, r.backlog, r.idle_probe, r.orphan),
            None => (None, None, None, None, None),
        };
        let (control, control_rx) = mpsc::channel(16);
        let (backlog_file, backlog) = match (backlog_file, &journal) {
            (Some(mut file), _) => {
                let kept = file.load();
                (Some(file), crate::session_backlog::kept_undelivered(kept, running.is_some()))
            }
            (None, Some(journal)) => (Some(journal.backlog(BACKLOG_FILE_BYTES)), Vec::new()),
            (None, None) => (None, Vec::new()),
        };
        // A kept command that already finished (its end is in the backlog) is not watched for.
        let finished = backlog.iter().any(|e| matches!(e, SessionEvent::Done { .. }));
        let reader = Reader {
            stdout: parts.stdout,
            stderr: parts.stderr,
            done: parts.done,
            control: control_rx,
            backlog_file,
            journal: journal.clone(),
            nonce: if finished { String::new() } else { running.clone().unwrap_or_default() },
            orphan_marker: orphan.map(|n| format!("\x1e{n}\x1e")),
            kept: backlog,
        };
        tokio::spawn(reader.run());
        Session {
            state: Mutex::new(State { commands: parts.commands, stdin: parts.stdin, running }),
            control,
            process: Mutex::new(parts.process),
            journal,
            idle_probe,
            shell_pid: None,
        }
    }

    /// Runs `command`; events stream into `sink` until it finishes or `timeout` passes
    /// (then `Pending`, and the command keeps running).
    pub async fn run(
        &self,
        command: &str,
        timeout: Duration,
        sink: mpsc::Sender<SessionEvent>,
    ) -> Result<(), SessionError> {
        {
            let mut state = self.state.lock().await;
            if state.running.is_some() {
                return Err(SessionError::Busy);
            }
            // A recorded session's nonces are drawn ahead and recorded, so a node that dies
            // after handing the shell a command but before recording it still knows its nonce.
            let nonce = match &self.journal {
                Some(journal) => journal.take_next(),
                None => crate::session_journal::new_nonce(),
            };
            self.control
                .send(Control::Started(nonce.clone()))
                .await
                .map_err(|_| SessionError::Closed)?;
            let mut message = Vec::with_capacity(nonce.len() + command.len() + 2);
            message.extend_from_slice(nonce.as_bytes());
            message.push(0);
            message.extend_from_slice(command.replace('\0', "").as_bytes());
            message.push(0);
            // Recorded before the shell has it: a quick command's end, recorded by the
            // reader, must not come before its start (a restart would take an idle session
            // for a busy one). A node that dies between the two finds the shell idle when
            // it waits ([`IdleProbe`]).
            if let Some(journal) = &self.journal {
                journal.running(Some(&nonce));
            }
            if state.commands.write_all(&message).await.is_err() {
                if let Some(journal) = &self.journal {
                    journal.running(None);
                }
                return Err(SessionError::Closed);
            }
            state.running = Some(nonce);
        }
        self.wait_on(timeout, sink).await
    }

    /// Waits for the running command, streaming its output (including what was buffered
    /// since the last call) into `sink`.
    pub async fn wait(
        &self,
        timeout: Duration,
        sink: mpsc::Sender<SessionEvent>,
    ) -> Result<(), SessionError> {
        if self.state.lock().await.running.is_none() {
            return Err(SessionError::Idle);
        }
        self.wait_on(timeout, sink).await
    }

    async fn wait_on(
        &self,
        timeout: Duration,
        sink: mpsc::Sender<SessionEvent>,
    ) -> Result<(), SessionError> {
        let (tx, mut rx) = mpsc::channel(64);
        self.control.send(Control::Attach(tx)).await.map_err(|_| SessionError::Closed)?;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut probe = tokio::time::interval(IDLE_PROBE_EVERY);
        probe.tick().await;
        let mut idle_seen = 0;
        loop {
            tokio::select! {
                _ = probe.tick(), if self.idle_probe.is_some() => {
                    let idle = match &self.idle_probe {
                        Some(probe) => probe().await,
                        None => false,
                    };
                    idle_seen = if idle { idle_seen + 1 } else { 0 };
                    if idle_seen >= IDLE_PROBES_TO_GIVE_UP {
                        // Nothing runs: the node died before the command reached the shell.
                        self.state.lock().await.running = None;
                        if let Some(journal) = &self.journal {
                            journal.running(None);
                        }
                        let _ = self.control.send(Control::Detach).await;
                        return Err(SessionError::Idle);
                    }
                }
                event = rx.recv() => match event {
                    Some(event) => {
                        idle_seen = 0;
                        let done = matches!(event, SessionEvent::Done { .. });
                        if done {
                            self.state.lock().await.running = None;
                        }
                        if sink.send(event).await.is_err() || done {
                            break;
                        }
                    }
                    None => {
                        self.state.lock().await.running = None;
                        return Err(SessionError::Closed);
                    }
                },
                () = &mut deadline => {
                    if let Some(pid) = self.shell_pid {
                        let shell = crate::session_journal::shell_state(pid);
                        tracing::debug!(pid, %shell, "a session command is still running");
                    }
                    let _ = sink.send(SessionEvent::Pending).await;
                    break;
                }
            }
        }
        let _ = self.control.send(Control::Detach).await;
        Ok(())
    }

    /// Writes input for the running command (an interactive program).
    pub async fn input(&self, bytes: &[u8]) -> Result<(), SessionError> {
        self.state.lock().await.stdin.write_all(bytes).await.map_err(|_| SessionError::Closed)
    }

    /// Interrupts the running command (SIGINT to the session's process group); the shell
    /// survives and reports the command's status.
    pub async fn interrupt(&self) -> Result<(), SessionError> {
        self.process.lock().await.interrupt()
    }

    /// Ends the session: the shell and everything it started.
    pub async fn close(&self) {
        if let Some(journal) = &self.journal {
            journal.remove();
        }
        self.process.lock().await.close();
    }
}

/// Parts of a container session from the node's ends of its pipes: fd 3's writer, stdin's
/// writer, stdout's, stderr's and fd 4's readers.
fn parts_of(
    [cmd_w, in_w, out_r, err_r, done_r]: [std::os::fd::OwnedFd; 5],
    process: Box<dyn SessionProcess>,
) -> Result<SessionParts, SessionError> {
    let sender = |fd| pipe::Sender::from_owned_fd(fd).map_err(io);
    let receiver = |fd| pipe::Receiver::from_owned_fd(fd).map_err(io);
    Ok(SessionParts {
        commands: Box::new(sender(cmd_w)?),
        stdin: Box::new(sender(in_w)?),
        stdout: Box::new(receiver(out_r)?),
        stderr: Box::new(receiver(err_r)?),
        done: Box::new(receiver(done_r)?),
        process,
    })
}

/// Reads the shell's output and completion reports; routes them to the attached waiter.
struct Reader {
    stdout: ReadHalf,
    stderr: ReadHalf,
    done: ReadHalf,
    control: mpsc::Receiver<Control>,
    /// Told when a command finishes.
    journal: Option<Arc<SessionJournal>>,
    /// Where a recorded session keeps what nobody waited for, so it outlives the node.
    backlog_file: Option<crate::session_backlog::Backlog>,
    /// What an earlier run of the node kept in that file.
    kept: Vec<SessionEvent>,
    /// The running command's nonce (empty: idle), for a session taken back mid-command.
    nonce: String,
    /// Markers of a command handed to the shell by a node that died before recording it:
    /// removed from the output.
    orphan_marker: Option<String>,
}

/// Per-stream state: whether the sync marker of the finishing command was seen.
struct Stream {
    pending: BytesMut,
    synced: bool,
    open: bool,
}

impl Reader {
    async fn run(mut self) {
        let mut sink: Option<mpsc::Sender<SessionEvent>> = None;
        let mut backlog: Vec<SessionEvent> = Vec::new();
        let mut backlog_bytes = 0usize;
        let mut dropped = 0u64;
        for event in std::mem::take(&mut self.kept) {
            match event {
                SessionEvent::Dropped { bytes } => dropped += bytes,
                SessionEvent::Stdout(ref b) | SessionEvent::Stderr(ref b) => {
                    backlog_bytes += b.len();
                    backlog.push(event);
                }
                event => backlog.push(event),
            }
        }
        let mut nonce = std::mem::take(&mut self.nonce);
        // The nonce of the last command that finished, while its end is undelivered.
        let mut done_nonce = String::new();
        let mut finished: Option<(i32, String)> = None;
        let mut out = Stream { pending: BytesMut::new(), synced: false, open: true };
        let mut err = Stream { pending: BytesMut::new(), synced: false, open: true };
        let mut done_line = BytesMut::new();
        let (mut out_buf, mut err_buf, mut done_buf) =
            (vec![0u8; 64 << 10], vec![0u8; 64 << 10], vec![0u8; 4096]);
        let mut done_open = true;
        loop {
            let mut events: Vec<SessionEvent> = Vec::new();
            // Control first: `Started(nonce)` is queued before the command is written, so it
            // must be seen before any output or completion of that command.
            tokio::select! {
                biased;
                ctl = self.control.recv() => match ctl {
                    Some(Control::Attach(tx)) => {
                        if dropped > 0 {
                            let _ = tx.send(SessionEvent::Dropped { bytes: dropped }).await;
                            dropped = 0;
                        }
                        // Recorded idle before the waiter sees the end (it may start the
                        // next command as soon as it does).
                        if backlog.iter().any(|e| matches!(e, SessionEvent::Done { .. })) {
                            if let Some(journal) = &self.journal {
                                journal.running(None);
                            }
                        }
                        for e in backlog.drain(..) {
                            let _ = tx.send(e).await;
                        }
                        backlog_bytes = 0;
                        if let Some(file) = &mut self.backlog_file {
                            file.clear();
                        }
                        sink = Some(tx);
                    }
                    Some(Control::Detach) => sink = None,
                    Some(Control::Started(n)) => {
                        // A command starts only once the last one's end was taken, so an end
                        // still here is stale: handed to this command's waiter, it would take
                        // the place of this command's own, and every later one's in turn.
                        if let Some(last) = backlog.iter().rposition(|e| matches!(e, SessionEvent::Done { .. })) {
                            tracing::warn!("a session's backlog held the end of an earlier command; dropped");
                            backlog.drain(..=last);
                        }
                        nonce = n;
                        finished = None;
                        out.synced = false;
                        err.synced = false;
                    }
                    None => return,
                },
                n = self.stdout.read(&mut out_buf), if out.open => match n {
                    Ok(0) | Err(_) => out.open = false,
                    Ok(n) => { out.pending.extend_from_slice(&out_buf[..n]); }
                },
                n = self.stderr.read(&mut err_buf), if err.open => match n {
                    Ok(0) | Err(_) => err.open = false,
                    Ok(n) => { err.pending.extend_from_slice(&err_buf[..n]); }
                },
                n = self.done.read(&mut done_buf), if done_open => match n {
                    Ok(0) | Err(_) => done_open = false,
                    Ok(n) => done_line.extend_from_slice(&done_buf[..n]),
                },
            }
            let marker = format!("\x1e{nonce}\x1e");
            if let Some(orphan) = &self.orphan_marker {
                for stream in [&mut out, &mut err] {
                    if let Some(pos) = find(&stream.pending, orphan.as_bytes()) {
                        let tail = stream.pending.split_off(pos);
                        stream.pending.extend_from_slice(&tail[orphan.len()..]);
                    }
                }
            }
            for (stream, is_out) in [(&mut out, true), (&mut err, false)] {
                take_output(stream, &marker, !nonce.is_empty(), is_out, &mut events);
            }
            while let Some(pos) = done_line.iter().position(|b| *b == b'\n') {
                let line = done_line.split_to(pos + 1);
                let text = String::from_utf8_lossy(&line[..pos]).into_owned();
                let mut parts = text.splitn(3, ' ');
                if parts.next() == Some(nonce.as_str()) {
                    let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(-1);
                    finished = Some((code, parts.next().unwrap_or("").to_string()));
                }
            }
            let all_closed = !out.open && !err.open;
            if let Some((code, cwd)) = &finished {
                if (out.synced || !out.open) && (err.synced || !err.open) {
                    events.push(SessionEvent::Done { exit_code: *code, cwd: cwd.clone() });
                    finished = None;
                    done_nonce = std::mem::take(&mut nonce);
                }
            }
            for event in events {
                let done = matches!(event, SessionEvent::Done { .. });
                let told_idle = done && sink.is_some();
                if told_idle {
                    // Recorded idle before the waiter sees the end, as at Attach.
                    if let Some(journal) = &self.journal {
                        journal.running(None);
                    }
                }
                let undelivered = match &sink {
                    Some(tx) => tx.send(event).await.err().map(|e| e.0),
                    None => Some(event),
                };
                if done {
                    // The waiter stops at Done; what follows belongs to the next waiter.
                    sink = None;
                }
                if let Some(event) = undelivered {
                    sink = None;
                    if told_idle {
                        // Nobody was told the command ended: a restarted node must still
                        // find it running, with its end in the backlog.
                        if let Some(journal) = &self.journal {
                            journal.running(Some(&done_nonce));
                        }
                    }
                    let size = match &event {
                        SessionEvent::Stdout(b) | SessionEvent::Stderr(b) => b.len(),
                        _ => 0,
                    };
                    let on_disk = match &mut self.backlog_file {
                        Some(file) if backlog_bytes + size <= BACKLOG_BYTES => file.append(&event),
                        _ => true,
                    };
                    if backlog_bytes + size > BACKLOG_BYTES || !on_disk {
                        dropped += size as u64;
                        if let Some(file) = &mut self.backlog_file {
                            file.append(&SessionEvent::Dropped { bytes: size as u64 });
                        }
                    } else {
                        backlog_bytes += size;
                        backlog.push(event);
                    }
                }
            }
            if all_closed && !done_open {
                // The shell is gone: dropping the sink tells the waiter.
                return;
            }
        }
    }
}

/// Moves output out of `stream.pending` into events. While a command runs, output up to its
/// sync marker is its own; the marker is removed, and what follows it is held until the
/// command's `Done` has been delivered (it belongs to whatever runs next). A tail that could be
/// the start of the marker is held back until more bytes arrive.
fn take_output(
    stream: &mut Stream,
    marker: &str,
    active: bool,
    is_out: bool,
    events: &mut Vec<SessionEvent>,
) {
    let wrap = |b: Bytes| if is_out { SessionEvent::Stdout(b) } else { SessionEvent::Stderr(b) };
    if stream.pending.is_empty() || (active && stream.synced) {
        return;
    }
    if !active {
        events.push(wrap(stream.pending.split().freeze()));
        return;
    }
    let marker = marker.as_bytes();
    if let Some(pos) = find(&stream.pending, marker) {
        let before = stream.pending.split_to(pos);
        let _ = stream.pending.split_to(marker.len());
        if !before.is_empty() {
            events.push(wrap(before.freeze()));
        }
        stream.synced = true;
        return;
    }
    let hold =
        (1..marker.len()).rev().find(|k| stream.pending.ends_with(&marker[..*k])).unwrap_or(0);
    let emit = stream.pending.len() - hold;
    if emit > 0 {
        events.push(wrap(stream.pending.split_to(emit).freeze()));
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(bytes: &[u8]) -> Stream {
        Stream { pending: BytesMut::from(bytes), synced: false, open: true }
    }

    #[test]
    fn output_is_cut_at_the_marker() {
        let mut events = Vec::new();
        let mut s = stream(b"hello\n\x1eabc\x1eafter");
        take_output(&mut s, "\x1eabc\x1e", true, true, &mut events);
        assert_eq!(events, vec![SessionEvent::Stdout(Bytes::from_static(b"hello\n"))]);
        assert!(s.synced);
        assert_eq!(&s.pending[..], b"after");
        events.clear();
        take_output(&mut s, "", false, true, &mut events);
        assert_eq!(events, vec![SessionEvent::Stdout(Bytes::from_static(b"after"))]);
    }

    #[test]
    fn a_possible_marker_prefix_is_held_back() {
        let mut events = Vec::new();
        let mut s = stream(b"data\x1eab");
        take_output(&mut s, "\x1eabc\x1e", true, false, &mut events);
        assert_eq!(events, vec![SessionEvent::Stderr(Bytes::from_static(b"data"))]);
        assert_eq!(&s.pending[..], b"\x1eab");
    }
}

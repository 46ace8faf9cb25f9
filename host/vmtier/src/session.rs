//! Shell sessions in a microVM: the container tier's session engine
//! (`brig_container::session`) driving a shell the guest's agent runs, its descriptors carried
//! over one vsock connection (the agent protocol's SESSION request). Each descriptor becomes an
//! in-memory pipe on this side, so the engine cannot tell the shell is in another kernel.
//!
//! A sandbox's sessions are kept: the agent keeps the shell when the connection ends, the
//! session is recorded in `<tier dir>/<id>.sessions/`, and a restarted node takes it back
//! ([`VmTier::resume_sessions`]): the agent hands the shell's descriptors to the new
//! connection, and tells whether the shell waits for a command (the engine's idle probe).

use std::path::{Path, PathBuf};
use std::time::Duration;

use brig_container::session::{
    session_env, IdleProbe, Session, SessionError, SessionJournal, SessionKeep, SessionParts,
    SessionProcess, DRIVER,
};
use brig_vmm_api::agent::{self, AgentRequest, ProcessRun, SessionProbe};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::agent_link::{
    close_kept_session, kept_sessions, request_with_body, request_within, KEPT_REQUEST,
};
use crate::{MicroVm, VmTier, VmTierError};

/// Buffer of each in-memory pipe.
const PIPE_BYTES: usize = 256 << 10;
/// How long a closing session's last frame (IN_CLOSE) gets to reach the agent.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The session's shell as the engine sees it: interrupt and close travel to the agent.
struct GuestShell {
    /// `None` once closed.
    frames: Option<mpsc::UnboundedSender<(u8, Vec<u8>)>>,
    /// Agent frames to the engine, and the engine's writers to frames.
    tasks: Vec<JoinHandle<()>>,
    /// Frames to the agent.
    to_agent: Option<JoinHandle<()>>,
    /// The agent keeps the shell when the connection ends; closing it takes IN_CLOSE.
    kept: bool,
}

impl SessionProcess for GuestShell {
    fn interrupt(&mut self) -> Result<(), SessionError> {
        let frames = self.frames.as_ref().ok_or(SessionError::Closed)?;
        frames.send((agent::IN_INTERRUPT, Vec::new())).map_err(|_| SessionError::Closed)
    }

    /// Ends the shell and everything it started: a kept session's with IN_CLOSE (sent before
    /// the connection ends), another's by hanging up.
    fn close(&mut self) {
        let frames = self.frames.take();
        if self.kept {
            if let (Some(frames), Some(to_agent)) = (frames, self.to_agent.take()) {
                let _ = frames.send((agent::IN_CLOSE, Vec::new()));
                let abort = to_agent.abort_handle();
                tokio::spawn(async move {
                    if tokio::time::timeout(CLOSE_GRACE, to_agent).await.is_err() {
                        abort.abort();
                    }
                });
            }
        }
        self.hang_up();
    }
}

impl GuestShell {
    /// Ends the connection; a kept session's shell goes on in the guest.
    fn hang_up(&mut self) {
        for task in self.tasks.iter().chain(&self.to_agent) {
            task.abort();
        }
    }
}

impl Drop for GuestShell {
    fn drop(&mut self) {
        self.hang_up();
    }
}

/// Copies what the engine writes into `from` to the agent as frames of `kind`.
fn forward(
    mut from: DuplexStream,
    kind: u8,
    frames: mpsc::UnboundedSender<(u8, Vec<u8>)>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 || frames.send((kind, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    })
}

impl VmTier {
    /// Where `vm`'s sessions are recorded.
    pub fn sessions_dir(&self, vm: &MicroVm) -> PathBuf {
        self.sessions_dir_named(&vm.id)
    }

    /// Where the sessions of `name` (a VM, or a container of a container-host VM) are
    /// recorded.
    pub fn sessions_dir_named(&self, name: &str) -> PathBuf {
        self.cfg.dir.join(format!("{name}.{SESSIONS_EXT}"))
    }

    /// Opens a shell session in `vm`: `shell` (an absolute path in the guest) with `env`, in
    /// `cwd`, kept between commands. With `keep`, the session outlives this node: the agent
    /// keeps it under `keep.session_id` and it is recorded in `keep.dir`.
    pub async fn open_session(
        &self,
        vm: &MicroVm,
        shell: &str,
        env: Vec<(String, String)>,
        cwd: &str,
        keep: Option<SessionKeep>,
    ) -> Result<Session, VmTierError> {
        if vm.is_paused() {
            return Err(VmTierError::Paused);
        }
        if !shell.starts_with('/') {
            return Err(VmTierError::Agent(format!(
                "the session shell {shell:?} is not an absolute path"
            )));
        }
        // The shell runs the driver with the session's environment and directory as data.
        let process = ProcessRun {
            argv: vec![shell.to_string(), "-c".to_string(), DRIVER.to_string()],
            env: session_env(env),
            cwd: Some(cwd.to_string()).filter(|c| !c.is_empty()),
        };
        let request =
            AgentRequest::Session { process, keep: keep.as_ref().map(|k| k.session_id.clone()) };
        let stream = request_with_body(&vm.uds, &request, &[]).await?;
        Ok(match keep {
            Some(keep) => {
                Session::recorded(parts_over_agent(stream, true)?, keep, 0, String::new())
            }
            None => over_agent(stream)?,
        })
    }

    /// Takes back the sessions recorded for `vm` whose shells its agent kept (see
    /// [`resume_kept_sessions`]).
    pub async fn resume_sessions(&self, vm: &MicroVm) -> Vec<(String, Session)> {
        resume_kept_sessions(&vm.uds, &self.sessions_dir(vm), None, &vm.id).await
    }
}

/// Takes back the sessions recorded in `dir` whose shells the agent behind `uds` kept (the
/// VM's own, or `container`'s), by the node's session ids; records of shells the agent no
/// longer has are removed, and kept shells with no record are ended. `owner` names the VM or
/// container in logs.
pub(crate) async fn resume_kept_sessions(
    uds: &Path,
    dir: &Path,
    container: Option<&str>,
    owner: &str,
) -> Vec<(String, Session)> {
    let records = {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || SessionJournal::read_all(&dir))
            .await
            .unwrap_or_default()
    };
    let kept = match kept_sessions(uds, container).await {
        Ok(kept) => kept,
        Err(e) => {
            tracing::warn!(owner, error = %e, "cannot list the guest's kept sessions");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for record in records {
        let id = record.session_id.clone();
        if !kept.contains(&id) {
            tracing::warn!(owner, session = %id, "the guest no longer keeps a session");
            SessionJournal::forget(dir, &id);
            continue;
        }
        let request = AgentRequest::SessionAttach {
            id: id.clone(),
            container: container.map(str::to_string),
        };
        let parts = match request_with_body(uds, &request, &[]).await {
            Ok(stream) => parts_over_agent(stream, true),
            Err(e) => Err(e),
        };
        match parts {
            Ok(parts) => {
                let probe = idle_probe(uds.to_owned(), id.clone(), container.map(str::to_string));
                out.push((id, Session::resume_parts(parts, dir, record, probe)));
            }
            Err(e) => {
                tracing::warn!(owner, session = %id, error = %e, "cannot attach a kept session");
            }
        }
    }
    for id in kept.iter().filter(|id| !out.iter().any(|(taken, _)| taken == *id)) {
        tracing::info!(owner, session = %id, "ending a kept session with no record");
        if let Err(e) = close_kept_session(uds, id, container).await {
            tracing::debug!(session = %id, error = %e, "a kept session not ended");
        }
    }
    out
}

/// The extension of a VM's session records directory in its tier's directory.
pub(crate) const SESSIONS_EXT: &str = "sessions";

/// Asks the agent behind `uds` whether kept session `id`'s shell (of `container`, or the
/// VM's own) waits for a command (an unanswered probe says no, so a waiter keeps waiting).
fn idle_probe(uds: PathBuf, id: String, container: Option<String>) -> IdleProbe {
    Box::new(move || {
        let (uds, id, container) = (uds.clone(), id.clone(), container.clone());
        Box::pin(async move {
            let request = AgentRequest::SessionProbe { id, container };
            let Ok(out) = request_within(&uds, &request, KEPT_REQUEST).await else {
                return false;
            };
            out.exit_code == 0
                && serde_json::from_slice::<SessionProbe>(&out.stdout).is_ok_and(|p| p.idle)
        })
    })
}

/// A session over an agent connection that has just started a session shell (the SESSION
/// request, or a container's): its frames become the engine's in-memory pipes.
pub(crate) fn over_agent(stream: crate::ExecStream) -> Result<Session, VmTierError> {
    Ok(Session::from_parts(parts_over_agent(stream, false)?))
}

/// The engine's parts over an agent connection carrying a session shell's descriptors;
/// `kept`: the agent keeps the shell when the connection ends.
pub(crate) fn parts_over_agent(
    stream: crate::ExecStream,
    kept: bool,
) -> Result<SessionParts, VmTierError> {
    let (mut reader, writer) = stream.into_parts();
    let mut writer =
        writer.ok_or_else(|| VmTierError::Agent("no connection to write to".into()))?;
    let (frames_tx, mut frames_rx) = mpsc::unbounded_channel::<(u8, Vec<u8>)>();
    let (mut out_w, out_r) = tokio::io::duplex(PIPE_BYTES);
    let (mut err_w, err_r) = tokio::io::duplex(PIPE_BYTES);
    let (mut done_w, done_r) = tokio::io::duplex(PIPE_BYTES);
    // Agent frames to the engine's pipes; the pipes close when the shell ends.
    let from_agent = tokio::spawn(async move {
        loop {
            let mut head = [0u8; 5];
            if reader.read_exact(&mut head).await.is_err() {
                return;
            }
            let Ok((kind, len)) = agent::parse_header(head) else { return };
            let mut data = vec![0u8; len];
            if reader.read_exact(&mut data).await.is_err() {
                return;
            }
            let written = match kind {
                agent::STDOUT => out_w.write_all(&data).await,
                agent::STDERR => err_w.write_all(&data).await,
                agent::SESSION_DONE => done_w.write_all(&data).await,
                _ => return,
            };
            if written.is_err() {
                return;
            }
        }
    });
    // Frames to the agent, from every writer.
    let to_agent = tokio::spawn(async move {
        while let Some((kind, data)) = frames_rx.recv().await {
            if writer.write_all(&agent::encode_frame(kind, &data)).await.is_err() {
                return;
            }
        }
    });
    let (stdin_w, stdin_r) = tokio::io::duplex(PIPE_BYTES);
    let (commands_w, commands_r) = tokio::io::duplex(PIPE_BYTES);
    let tasks = vec![
        from_agent,
        forward(stdin_r, agent::IN_STDIN, frames_tx.clone()),
        forward(commands_r, agent::IN_COMMAND, frames_tx.clone()),
    ];
    let boxed = |r: DuplexStream| -> Box<dyn AsyncRead + Send + Unpin> { Box::new(r) };
    let shell = GuestShell { frames: Some(frames_tx), tasks, to_agent: Some(to_agent), kept };
    Ok(SessionParts {
        commands: Box::new(commands_w),
        stdin: Box::new(stdin_w),
        stdout: boxed(out_r),
        stderr: boxed(err_r),
        done: boxed(done_r),
        process: Box::new(shell),
    })
}

//! Shell sessions, the same for every tier that has them: the tier opens one
//! ([`brig_core::Sandbox::open_session`]), the node keeps it by id in the sandbox's table and
//! streams its output to the client as it comes.

use std::sync::Arc;
use std::time::Duration;

use brig_core::sandbox::{Op, SandboxError, Session, SessionEvent, SessionSpec};
use brig_proto::{AuditKind, OutputStream, Reply, SessionOpenRequest};
use brig_transport::Exchange;
use tokio::sync::mpsc;

use crate::limits::Limit;
use crate::table::sandboxes::SandboxEntry;
use crate::{Node, NodeError};

impl Node {
    /// The sandbox of a session request, resumed if paused; refused where the tier has none.
    async fn session_host(&self, sandbox: &str) -> Result<Arc<SandboxEntry>, NodeError> {
        let entry = self.live(sandbox).await?;
        entry.require(Op::Sessions)?;
        Ok(entry)
    }

    fn session_of(entry: &SandboxEntry, id: &str) -> Result<Arc<dyn Session>, NodeError> {
        entry.sessions.get(id).ok_or_else(|| NodeError::NoSuchSession(id.to_string()))
    }

    pub(crate) async fn session_open(&self, req: SessionOpenRequest) -> Result<String, NodeError> {
        // The shell, its environment and directory reach it as data: what execve cannot
        // carry is refused here, for every tier.
        let shell = req.shell.clone().unwrap_or_else(|| "/bin/sh".to_string());
        brig_core::check_command(&[shell], &req.env, &req.cwd)?;
        let entry = self.session_host(&req.sandbox).await?;
        let max = self.inner.config.limits.sessions_per_sandbox;
        entry.sessions.check_room(max)?;
        let id = entry.sessions.new_id();
        let spec = SessionSpec {
            id: id.clone(),
            shell: req.shell,
            env: req.env,
            cwd: req.cwd,
            user: req.user,
        };
        let session = entry.sandbox.open_session(spec).await.map_err(|e| entry.fail(e))?;
        entry.touch();
        match entry.sessions.add(&id, session, max) {
            Ok(()) => Ok(id),
            // Another client took the last place while this shell started.
            Err(session) => {
                session.close().await;
                Err(Limit::SessionsPerSandbox.reached(max))
            }
        }
    }

    pub(crate) async fn session_input(
        &self,
        sandbox: &str,
        session: &str,
        data: &[u8],
    ) -> Result<(), NodeError> {
        let entry = self.session_host(sandbox).await?;
        Self::session_of(&entry, session)?.input(data).await.map_err(|e| entry.fail(e))
    }

    pub(crate) async fn session_interrupt(
        &self,
        sandbox: &str,
        session: &str,
    ) -> Result<(), NodeError> {
        let entry = self.session_host(sandbox).await?;
        Self::session_of(&entry, session)?.interrupt().await.map_err(|e| entry.fail(e))
    }

    pub(crate) async fn session_close(
        &self,
        sandbox: &str,
        session: &str,
    ) -> Result<(), NodeError> {
        let entry = self.session_host(sandbox).await?;
        let removed = entry.sessions.remove(session);
        removed.ok_or_else(|| NodeError::NoSuchSession(session.to_string()))?.close().await;
        Ok(())
    }

    /// Ids of a sandbox's open sessions (for a client that reconnects).
    pub(crate) fn session_ids(&self, sandbox: &str) -> Result<Vec<String>, NodeError> {
        let entry = self.inner.sandboxes.get(sandbox)?;
        Ok(entry.sessions.ids())
    }

    /// Runs (`Some(command)`) or waits on (`None`) a session command, streaming its output.
    pub(crate) async fn session_stream(
        &self,
        sandbox: &str,
        session: &str,
        command: Option<&str>,
        timeout_ms: u64,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let entry = self.session_host(sandbox).await?;
        let timeout = Duration::from_millis(
            timeout_ms.clamp(1, self.inner.config.container.max_exec_timeout_ms),
        );
        if let Some(command) = command {
            self.inner.audit.record(
                sandbox,
                AuditKind::SessionCommand { session: session.into(), command: command.into() },
            );
        }
        let session = Self::session_of(&entry, session)?;
        let reply = stream_session(session.as_ref(), command, timeout, exchange)
            .await
            .map_err(|e| entry.fail(e));
        entry.touch();
        reply
    }
}

/// Runs or waits on a session command; its events go to the client as replies, and the last
/// reply (`SessionDone` or `SessionPending`) comes back.
async fn stream_session(
    session: &dyn Session,
    command: Option<&str>,
    timeout: Duration,
    exchange: &mut Exchange,
) -> Result<Option<Reply>, SandboxError> {
    let (tx, mut rx) = mpsc::channel(64);
    let run = async {
        match command {
            Some(c) => session.run(c, timeout, tx).await,
            None => session.wait(timeout, tx).await,
        }
    };
    let forward = async {
        let mut last = None;
        let mut delivered = true;
        while let Some(event) = rx.recv().await {
            let reply = match event {
                SessionEvent::Stdout(b) => {
                    Reply::Output { stream: OutputStream::Stdout, data: b.to_vec() }
                }
                SessionEvent::Stderr(b) => {
                    Reply::Output { stream: OutputStream::Stderr, data: b.to_vec() }
                }
                SessionEvent::Dropped { bytes } => Reply::Output {
                    stream: OutputStream::Stderr,
                    data: format!("[brig: {bytes} bytes of output dropped while nobody waited]\n")
                        .into_bytes(),
                },
                SessionEvent::Done { exit_code, cwd } => {
                    last = Some(Reply::SessionDone { exit_code, cwd });
                    continue;
                }
                SessionEvent::Pending => {
                    last = Some(Reply::SessionPending);
                    continue;
                }
            };
            if delivered {
                delivered = exchange.reply(&reply).await.is_ok();
            }
        }
        last
    };
    let (ran, last) = tokio::join!(run, forward);
    ran?;
    Ok(Some(last.unwrap_or(Reply::SessionPending)))
}

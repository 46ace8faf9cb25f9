//! Shell sessions in container and microVM sandboxes: one engine
//! (`brig_container::session`), whether the shell runs on the node's kernel or in a guest
//! behind its agent; output streamed to the client as it comes.

use std::sync::Arc;
use std::time::Duration;

use brig_container::session::{Session, SessionEvent, SessionTable};
use brig_proto::{AuditKind, OutputStream, Reply, SessionOpenRequest};
use brig_transport::Exchange;
use tokio::sync::mpsc;

use crate::sandboxes::{SandboxEntry, TierHandle};
use crate::{Node, NodeError};

impl Node {
    /// The sandbox of a session request (a container or a microVM), resumed if paused.
    async fn session_host(&self, sandbox: &str) -> Result<Arc<SandboxEntry>, NodeError> {
        let entry = self.live(sandbox).await?;
        match &entry.handle {
            TierHandle::Container(_) | TierHandle::Microvm(_) | TierHandle::Hosted(_) => Ok(entry),
            TierHandle::Fncall(_) => Err(NodeError::WrongTier {
                id: sandbox.to_string(),
                tier: entry.tier,
                op: "sessions",
            }),
        }
    }

    fn session_of(entry: &SandboxEntry, id: &str) -> Result<Arc<Session>, NodeError> {
        let found = sessions(entry).and_then(|table| table.get(id));
        found.ok_or_else(|| NodeError::NoSuchSession(id.to_string()))
    }

    pub(crate) async fn session_open(&self, req: SessionOpenRequest) -> Result<String, NodeError> {
        // The shell, its environment and directory reach it as data: what execve cannot
        // carry is refused here, for every tier.
        let shell = req.shell.clone().unwrap_or_else(|| "/bin/sh".to_string());
        brig_core::check_command(&[shell], &req.env, &req.cwd)?;
        let entry = self.session_host(&req.sandbox).await?;
        let id = match &entry.handle {
            TierHandle::Container(c) => c.open_session(req).await?,
            TierHandle::Microvm(vm) => {
                if req.user.is_some() {
                    return Err(NodeError::WrongTier {
                        id: req.sandbox,
                        tier: entry.tier,
                        op: "a session as another user (microVM sessions run as root)",
                    });
                }
                let shell = req.shell.unwrap_or_else(|| "/bin/sh".to_string());
                let cwd = if req.cwd.is_empty() { "/".to_string() } else { req.cwd };
                let session = vm
                    .tier
                    .open_session(vm, &shell, req.env, &cwd)
                    .await
                    .map_err(crate::microvm::vm_error)?;
                vm.sessions.add(session)
            }
            TierHandle::Hosted(h) => {
                let shell = req.shell.unwrap_or_else(|| h.shell.clone());
                let env = crate::container::merged_env(&h.env, req.env);
                let cwd = if req.cwd.is_empty() { "/".to_string() } else { req.cwd };
                let session = h
                    .guest()
                    .open_session(&shell, env, &cwd, req.user)
                    .await
                    .map_err(crate::container_host::host_error)?;
                h.sessions.add(session)
            }
            TierHandle::Fncall(_) => unreachable!("session_host refuses fncall sandboxes"),
        };
        entry.touch();
        Ok(id)
    }

    pub(crate) async fn session_input(
        &self,
        sandbox: &str,
        session: &str,
        data: &[u8],
    ) -> Result<(), NodeError> {
        let entry = self.session_host(sandbox).await?;
        Ok(Self::session_of(&entry, session)?.input(data).await?)
    }

    pub(crate) async fn session_interrupt(
        &self,
        sandbox: &str,
        session: &str,
    ) -> Result<(), NodeError> {
        let entry = self.session_host(sandbox).await?;
        Ok(Self::session_of(&entry, session)?.interrupt().await?)
    }

    pub(crate) async fn session_close(
        &self,
        sandbox: &str,
        session: &str,
    ) -> Result<(), NodeError> {
        let entry = self.session_host(sandbox).await?;
        let removed = sessions(&entry).and_then(|table| table.remove(session));
        removed.ok_or_else(|| NodeError::NoSuchSession(session.to_string()))?.close().await;
        Ok(())
    }

    /// Ids of a sandbox's open sessions (for a client that reconnects).
    pub(crate) fn session_ids(&self, sandbox: &str) -> Result<Vec<String>, NodeError> {
        let entry = self.inner.sandboxes.get(sandbox)?;
        Ok(sessions(&entry).map(SessionTable::ids).unwrap_or_default())
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
        let reply = stream_session(&session, command, timeout, exchange).await;
        entry.touch();
        reply
    }
}

/// A sandbox's session table (none for fncall sandboxes).
fn sessions(entry: &SandboxEntry) -> Option<&SessionTable> {
    match &entry.handle {
        TierHandle::Container(c) => Some(&c.sessions),
        TierHandle::Microvm(vm) => Some(&vm.sessions),
        TierHandle::Hosted(h) => Some(&h.sessions),
        TierHandle::Fncall(_) => None,
    }
}

/// Runs or waits on a session command; its events go to the client as replies, and the last
/// reply (`SessionDone` or `SessionPending`) comes back.
async fn stream_session(
    session: &Session,
    command: Option<&str>,
    timeout: Duration,
    exchange: &mut Exchange,
) -> Result<Option<Reply>, NodeError> {
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

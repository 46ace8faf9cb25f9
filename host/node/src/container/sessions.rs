//! Shell sessions in container sandboxes, with their output streamed to the client.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use brig_container::session::{Session, SessionEvent};
use brig_proto::{OutputStream, Reply, SessionOpenRequest};
use brig_transport::Exchange;
use tokio::sync::mpsc;

use super::{merged_env, ContainerSandbox};
use crate::NodeError;

impl ContainerSandbox {
    pub async fn open_session(&self, req: SessionOpenRequest) -> Result<String, NodeError> {
        let shell = req.shell.unwrap_or_else(|| self.shell.clone());
        let cwd = if req.cwd.is_empty() { "/".to_string() } else { req.cwd };
        let session =
            Session::open(&self.container, &shell, merged_env(&self.env, req.env), &cwd, req.user)
                .await?;
        let id = format!("s{}", self.next_session.fetch_add(1, Ordering::Relaxed));
        self.sessions.lock().insert(id.clone(), Arc::new(session));
        Ok(id)
    }

    fn session(&self, id: &str) -> Result<Arc<Session>, NodeError> {
        self.sessions
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| NodeError::NoSuchSession(id.to_string()))
    }

    /// Runs (`Some(command)`) or waits on (`None`) a session command, streaming its output.
    pub async fn session_run(
        &self,
        session: &str,
        command: Option<&str>,
        timeout: Duration,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let session = self.session(session)?;
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
                        data: format!(
                            "[brig: {bytes} bytes of output dropped while nobody waited]\n"
                        )
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

    pub async fn session_input(&self, session: &str, data: &[u8]) -> Result<(), NodeError> {
        Ok(self.session(session)?.input(data).await?)
    }

    pub async fn session_interrupt(&self, session: &str) -> Result<(), NodeError> {
        Ok(self.session(session)?.interrupt().await?)
    }

    pub async fn session_close(&self, session: &str) -> Result<(), NodeError> {
        let removed = self.sessions.lock().remove(session);
        let session = removed.ok_or_else(|| NodeError::NoSuchSession(session.to_string()))?;
        session.close().await;
        Ok(())
    }

    /// Ids of the open sessions (for a client that reconnects).
    pub fn session_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.sessions.lock().keys().cloned().collect();
        ids.sort();
        ids
    }
}

//! The shell sessions a container sandbox keeps (requests are served in `crate::sessions`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use brig_container::session::Session;
use brig_proto::SessionOpenRequest;

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

    pub fn session(&self, id: &str) -> Result<Arc<Session>, NodeError> {
        self.sessions
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| NodeError::NoSuchSession(id.to_string()))
    }

    /// Forgets session `id` (the caller closes it).
    pub fn remove_session(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().remove(id)
    }

    /// Ids of the open sessions (for a client that reconnects).
    pub fn session_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.sessions.lock().keys().cloned().collect();
        ids.sort();
        ids
    }
}

//! The shell sessions a container sandbox keeps (requests are served in `crate::sessions`).

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
        Ok(self.sessions.add(session))
    }
}

//! A stateful fncall sandbox as a [`brig_core::Sandbox`]: a workspace directory that tool calls
//! see as their files. Nothing runs between calls, so a pause has nothing to stop, and a fork's
//! children share the files copy-on-write.

use std::sync::Arc;

use brig_core::files::Entry;
use brig_core::sandbox::{
    BoxFuture, Capabilities, FileAccess, ForkChild, ForkKind, ForkOptions, Forked, Op, PauseKind,
    Persistence, ReadSource, Sandbox, SandboxError, UploadTarget, WriteOptions,
};
use brig_core::{CallReport, Tier, ToolCall};

use crate::{FncallBackend, FncallError, Workspace};

/// What an fncall sandbox serves.
pub const FNCALL_CAPS: Capabilities = Capabilities::new(
    &[Op::ToolCalls, Op::Files, Op::FileAppend, Op::Pause, Op::Fork, Op::Qos],
    FileAccess::Local,
    PauseKind::Nothing,
    ForkKind::Files,
    Persistence::Spec,
);

/// A workspace and the backend whose tools run in it.
pub struct FncallSandbox {
    workspace: Workspace,
    backend: FncallBackend,
    /// Calls hold it shared; a fork holds it alone, so no call writes while the files freeze.
    gate: tokio::sync::RwLock<()>,
}

impl FncallSandbox {
    pub fn new(workspace: Workspace, backend: FncallBackend) -> FncallSandbox {
        FncallSandbox { workspace, backend, gate: tokio::sync::RwLock::new(()) }
    }

    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }
}

impl Sandbox for FncallSandbox {
    fn tier(&self) -> Tier {
        Tier::Fncall
    }

    fn capabilities(&self) -> Capabilities {
        FNCALL_CAPS
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'_, Result<CallReport, SandboxError>> {
        Box::pin(async move {
            let _calling = self.gate.read().await;
            Ok(self.backend.call(call, Some(&self.workspace)).await?)
        })
    }

    fn read<'a>(
        &'a self,
        path: &'a str,
        _max_bytes: u64,
    ) -> BoxFuture<'a, Result<ReadSource, SandboxError>> {
        Box::pin(async move { Ok(ReadSource::File(self.workspace.open_read(path)?)) })
    }

    fn open_write<'a>(
        &'a self,
        path: &'a str,
        o: WriteOptions,
    ) -> BoxFuture<'a, Result<UploadTarget, SandboxError>> {
        Box::pin(
            async move { Ok(self.workspace.open_write(path, o.append, o.parents, o.mode)?.into()) },
        )
    }

    fn stat<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Entry, SandboxError>> {
        Box::pin(async move { Ok(self.workspace.stat(path)?) })
    }

    fn list<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, SandboxError>> {
        Box::pin(async move { Ok(self.workspace.list(path)?) })
    }

    fn mkdir<'a>(
        &'a self,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.workspace.mkdir(path, parents)?) })
    }

    fn remove<'a>(
        &'a self,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.workspace.remove_path(path, recursive)?) })
    }

    /// Children sharing the workspace's files copy-on-write (copies where the node cannot
    /// mount overlays). Calls in the parent wait while it forks.
    fn fork(
        &self,
        children: Vec<ForkChild>,
        _options: ForkOptions,
    ) -> BoxFuture<'_, Result<Forked, SandboxError>> {
        Box::pin(async move {
            let _forking = self.gate.write().await;
            let keys: Vec<String> = children.iter().map(|c| c.id.to_string()).collect();
            let backend = self.backend.clone();
            let parent = Workspace::open(self.workspace.path())?;
            let made = tokio::task::spawn_blocking(move || backend.fork_workspaces(&parent, &keys))
                .await
                .map_err(|e| SandboxError::internal("forking a workspace", &e))??;
            Ok(made
                .into_iter()
                .map(|ws| Ok(Arc::new(FncallSandbox::new(ws, self.backend.clone())) as _))
                .collect())
        })
    }

    fn destroy(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        let removed = self.backend.remove_workspace(&self.workspace).map_err(SandboxError::from);
        brig_core::sandbox::ready(removed)
    }
}

impl From<FncallError> for SandboxError {
    fn from(e: FncallError) -> SandboxError {
        let text = brig_core::sandbox::chain(&e);
        match e {
            FncallError::ToolNotFound(_) => SandboxError::NotFound(text),
            FncallError::BadToolName(_) | FncallError::InvalidComponent(_) => {
                SandboxError::BadRequest(text)
            }
            FncallError::Busy(_) => SandboxError::Exhausted(text),
            FncallError::PathEscape(_) => SandboxError::PermissionDenied(text),
            FncallError::File { source, .. } => {
                SandboxError::Io { kind: source.kind(), message: text }
            }
            FncallError::Engine(_) | FncallError::Io { .. } | FncallError::Internal(_) => {
                SandboxError::Internal(text)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_meaning() {
        let escape = SandboxError::from(FncallError::PathEscape("../x".into()));
        assert!(matches!(escape, SandboxError::PermissionDenied(_)));
        let busy = SandboxError::from(FncallError::Busy(4));
        assert!(matches!(busy, SandboxError::Exhausted(_)));
        let missing = SandboxError::from(FncallError::File {
            path: "a".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
        assert!(matches!(missing, SandboxError::Io { kind: std::io::ErrorKind::NotFound, .. }));
        assert!(matches!(
            SandboxError::from(FncallError::ToolNotFound("jq".into())),
            SandboxError::NotFound(_)
        ));
    }

    #[test]
    fn fncall_sandboxes_run_tool_calls_not_commands() {
        assert!(FNCALL_CAPS.supports(Op::ToolCalls));
        assert!(!FNCALL_CAPS.supports(Op::Exec));
        assert!(!FNCALL_CAPS.supports(Op::Sessions));
    }
}

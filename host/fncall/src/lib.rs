//! The fncall tier: tool calls as WASI 0.2 components on Wasmtime.
//!
//! ```text
//! FncallBackend
//!  ├─ engine      one wasmtime::Engine: pooling allocator (CoW heaps, slots kept resident),
//!  │              epoch interruption driven by a ticker thread, optional fuel
//!  ├─ registry    tools by name → content-addressed component (sha256) → InstancePre,
//!  │              precompiled once into <state>/precompiled/<engine key>/<sha256>.cwasm
//!  └─ invoke      one call = fresh Store + WasiCtx → instantiate → call → drop
//! ```
//! Every call gets a fresh instance, so nothing leaks between calls; a stateful fncall sandbox
//! is a workspace directory preopened into each of its calls ([`workspace`]).
//!
//! Guest failures are outcomes ([`brig_core::CallOutcome`]): a trap, a passed deadline, a memory
//! cap, an output cap or exhausted fuel ends that call only. Calls run on the caller's tokio
//! runtime; a long-running guest yields to the executor at every epoch tick, so it cannot starve
//! other calls or the network.
#![deny(unsafe_code)]

mod config;
mod cow;
mod engine;
mod error;
mod invoke;
mod output;
mod precompiled;
mod registry;
pub mod sandbox;
pub mod workspace;

pub use config::FncallConfig;
pub use cow::MAX_DEPTH as MAX_LAYER_DEPTH;
pub use error::FncallError;
pub use registry::{ToolSummary, ToolWorld, MAX_COMPONENT_BYTES};
pub use sandbox::FncallSandbox;
pub use workspace::Workspace;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_core::{CallReport, ToolCall};

/// The fncall tier of one node. Cheap to clone.
#[derive(Clone)]
pub struct FncallBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: FncallConfig,
    engine: engine::BrigEngine,
    registry: registry::ToolRegistry,
    workspaces: PathBuf,
    layers: cow::Layers,
}

/// Workspace copies a fork runs at once where it cannot share them.
const COPY_PARALLELISM: usize = 4;

impl FncallBackend {
    /// Opens the tier with its state under `state_dir` (components, precompiled cache,
    /// workspaces), loading every registered tool.
    pub fn open(config: FncallConfig, state_dir: &Path) -> Result<FncallBackend, FncallError> {
        let engine = engine::BrigEngine::new(&config)?;
        let registry = registry::ToolRegistry::open(&engine, state_dir)?;
        let workspaces = state_dir.join("workspaces");
        std::fs::create_dir_all(&workspaces)
            .map_err(|source| FncallError::Io { path: workspaces.clone(), source })?;
        let layers = cow::Layers::new(workspaces.clone());
        Ok(FncallBackend {
            inner: Arc::new(Inner { config, engine, registry, workspaces, layers }),
        })
    }

    pub fn config(&self) -> &FncallConfig {
        &self.inner.config
    }

    /// Registers `bytes` as tool `name`, replacing an earlier tool of that name.
    /// Compiles on a blocking thread; a bad component is refused with its reason.
    pub async fn add_tool(&self, name: &str, bytes: Vec<u8>) -> Result<ToolSummary, FncallError> {
        let this = self.clone();
        let name = name.to_string();
        let prepared = tokio::task::spawn_blocking(move || {
            this.inner.registry.prepare(&this.inner.engine, &name, &bytes)
        })
        .await
        .map_err(|e| FncallError::Internal(format!("compile task failed: {e}")))??;
        let description = match &prepared.pre {
            registry::ToolPre::Tool(pre) => invoke::describe(&self.inner.engine, pre).await?,
            registry::ToolPre::Command(_) => "WASI command (wasi:cli/run)".to_string(),
        };
        self.inner.registry.commit(prepared, description)
    }

    /// Registers every `*.wasm` in `dir` under its file stem, skipping unchanged ones.
    pub async fn add_tools_from_dir(&self, dir: &Path) -> Result<Vec<ToolSummary>, FncallError> {
        let mut added = Vec::new();
        let entries = std::fs::read_dir(dir)
            .map_err(|source| FncallError::Io { path: dir.to_owned(), source })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("wasm") {
                continue;
            }
            let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let bytes = std::fs::read(&path)
                .map_err(|source| FncallError::Io { path: path.clone(), source })?;
            added.push(self.add_tool(name, bytes).await?);
        }
        Ok(added)
    }

    pub fn tools(&self) -> Vec<ToolSummary> {
        self.inner.registry.list()
    }

    pub fn remove_tool(&self, name: &str) -> Result<(), FncallError> {
        self.inner.registry.remove(name)
    }

    /// Runs one call in a fresh instance, with `workspace` preopened if given.
    pub async fn call(
        &self,
        call: ToolCall,
        workspace: Option<&Workspace>,
    ) -> Result<CallReport, FncallError> {
        let tool = self.inner.registry.get(&call.tool)?;
        invoke::run(&self.inner.engine, &self.inner.config, &tool, call, workspace).await
    }

    /// Creates the workspace of a new stateful sandbox named `key`.
    pub fn create_workspace(&self, key: &str) -> Result<Workspace, FncallError> {
        Workspace::create(&self.inner.workspaces.join(key))
    }

    /// New workspaces named `keys`, each starting with `parent`'s files: shared copy-on-write
    /// through overlayfs where the node can mount, else copied. A call or upload writing to
    /// the parent meanwhile may or may not be seen by the children (the sandbox holds calls
    /// back while it forks). Blocking.
    pub fn fork_workspaces(
        &self,
        parent: &Workspace,
        keys: &[String],
    ) -> Result<Vec<Workspace>, FncallError> {
        let layers = &self.inner.layers;
        match layers.fork(&workspace_key(parent)?, keys) {
            Ok(()) => keys.iter().map(|k| self.open_existing(k)).collect(),
            Err(cow::ForkError::Failed(e)) => Err(e),
            Err(cow::ForkError::CannotShare(why)) => {
                tracing::debug!(error = %brig_core::sandbox::chain(&why), "fork copies the workspace");
                // Copies run a few at a time: each is a `cp` waiting on the disk.
                let mut results = Vec::with_capacity(keys.len());
                for batch in keys.chunks(COPY_PARALLELISM) {
                    std::thread::scope(|scope| {
                        let copies: Vec<_> = batch
                            .iter()
                            .map(|key| scope.spawn(move || self.copy_workspace(parent.path(), key)))
                            .collect();
                        for copy in copies {
                            results.push(copy.join().unwrap_or_else(|_| {
                                Err(FncallError::Io {
                                    path: parent.path().to_owned(),
                                    source: std::io::Error::other("a copy thread panicked"),
                                })
                            }));
                        }
                    });
                }
                let (made, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
                let made: Vec<Workspace> = made.into_iter().filter_map(Result::ok).collect();
                match failed.into_iter().find_map(Result::err) {
                    None => Ok(made),
                    Some(e) => {
                        for ws in &made {
                            let _ = self.remove_workspace(ws);
                        }
                        Err(e)
                    }
                }
            }
        }
    }

    /// A new workspace named `key` holding a copy of `parent`'s files (modes, symlinks and
    /// timestamps kept). Blocking: copies.
    fn copy_workspace(&self, parent: &Path, key: &str) -> Result<Workspace, FncallError> {
        let child = self.create_workspace(key)?;
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg("--reflink=auto")
            .arg("--")
            .arg(parent.join("."))
            .arg(child.path())
            .status()
            .map_err(|source| FncallError::Io { path: child.path().to_owned(), source })?;
        if !status.success() {
            // Best effort: a half-copied child is not a sandbox.
            let _ = child.remove();
            return Err(FncallError::Io {
                path: child.path().to_owned(),
                source: std::io::Error::other(format!("copying the parent workspace: cp {status}")),
            });
        }
        Ok(child)
    }

    /// Removes a workspace and everything in it (its overlay and its use of shared layers
    /// too). A call still running in it fails its file operations from then on.
    pub fn remove_workspace(&self, workspace: &Workspace) -> Result<(), FncallError> {
        if self.inner.layers.remove(&workspace_key(workspace)?)? {
            return Ok(());
        }
        workspace.remove()
    }

    /// At node shutdown: detaches the workspaces' overlays (remounted when the node opens its
    /// state again).
    pub fn shutdown(&self) {
        let detached = self.inner.layers.unmount_all();
        if detached > 0 {
            tracing::debug!(detached, "workspace overlays detached");
        }
    }

    /// Frozen layers some workspace still shares.
    pub fn shared_layers(&self) -> usize {
        self.inner.layers.layer_count()
    }

    /// Removes the shared layers no workspace uses (left by a crash mid-fork); call after
    /// every surviving sandbox's workspace was opened. Returns how many went.
    pub fn sweep_layers(&self) -> usize {
        self.inner.layers.sweep()
    }

    fn open_existing(&self, key: &str) -> Result<Workspace, FncallError> {
        Workspace::open(&self.inner.workspaces.join(key))
    }

    /// Opens the workspace of an existing sandbox (after a node restart).
    pub fn open_workspace(&self, key: &str) -> Result<Workspace, FncallError> {
        self.inner.layers.adopt(key)?;
        self.open_existing(key)
    }
}

/// The name a workspace has under the node's workspace directory.
fn workspace_key(workspace: &Workspace) -> Result<String, FncallError> {
    workspace.path().file_name().map(|n| n.to_string_lossy().into_owned()).ok_or_else(|| {
        FncallError::Io {
            path: workspace.path().to_owned(),
            source: std::io::Error::other("a workspace path without a name"),
        }
    })
}

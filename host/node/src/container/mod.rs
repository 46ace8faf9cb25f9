//! The container tier as the node sees it: turning create requests into containers (and
//! re-attaching to the ones an earlier run of the node left), pausing, resuming, forking and
//! checkpointing them. Execs are in [`exec`], sessions in [`sessions`].

mod exec;
mod sessions;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use brig_container::cgroup::CgroupLimits;
use brig_container::protect::{Protected, Protections};
use brig_container::rootfs::LayerSource;
use brig_container::runtime::{Container, ContainerSpec, Runtime, RuntimeConfig};
use brig_container::session::SessionTable;
use brig_container::shim_proto::ExitInfo;
use brig_core::SandboxId;
use brig_images::{LayerStore, ResolvedLayer};
use brig_proto::{CreateRequest, ExecResult};

use crate::config::ContainerConfig;
use crate::exec_hub::ExecTable;
use crate::sandboxes::ContainerRecord;
use crate::NodeError;

/// The container tier of a node.
pub(crate) struct ContainerTier {
    runtime: Runtime,
    config: ContainerConfig,
    images_dir: PathBuf,
}

impl ContainerTier {
    /// Opens the tier, or says why it cannot be offered here.
    /// `run_dir` holds mounts (not under the private state directory: container root must
    /// traverse it to reach its rootfs before it pivots); `cgroup_parent` is unique per daemon.
    pub fn open(
        config: &ContainerConfig,
        state_dir: &Path,
        run_dir: &Path,
        cgroup_parent: &str,
        survive_node: bool,
    ) -> Result<ContainerTier, String> {
        if !config.enabled {
            return Err("disabled in the node configuration".into());
        }
        if !nix::unistd::geteuid().is_root() {
            return Err("brigd is not running as root".into());
        }
        let images_dir = config.images_dir.clone().unwrap_or_else(|| state_dir.join("images"));
        let runtime = Runtime::new(RuntimeConfig {
            run_dir: run_dir.to_owned(),
            shim_path: config
                .shim_path
                .clone()
                .unwrap_or_else(brig_container::runtime::default_shim_path),
            id_base: config.id_base,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: cgroup_parent.to_string(),
            survive_node,
        })
        .map_err(|e| crate::error::chain(&e))?;
        Ok(ContainerTier { runtime, config: config.clone(), images_dir })
    }

    pub fn shutdown(&self) {
        self.runtime.shutdown();
    }

    /// The layers of `image`, bottom first: `env:NAME`, or parts joined by `+`, each a store
    /// reference (`kind/name[@version]`, `sha256:…`) or a plain image file name. Store layers
    /// are marked in use; their digests come back for [`LayerStore::release`].
    async fn resolve_image(
        &self,
        image: &str,
        store: Option<&LayerStore>,
    ) -> Result<(Vec<LayerSource>, Vec<String>), NodeError> {
        let bad = |why: &str| NodeError::BadImage(image.to_string(), why.to_string());
        let parts: Vec<String> = match (image.starts_with("env:"), store) {
            (true, Some(store)) => store.expand(image)?,
            (true, None) => return Err(bad("no layer store on this node")),
            (false, _) => image.split('+').map(str::to_string).collect(),
        };
        if parts.len() > 32 {
            return Err(bad("more than 32 layers"));
        }
        let store_refs: Vec<String> =
            parts.iter().filter(|p| LayerStore::is_store_reference(p)).cloned().collect();
        let resolved = match (store_refs.is_empty(), store) {
            (true, _) => Vec::new(),
            (false, Some(store)) => store.acquire(&store_refs).await?,
            (false, None) => return Err(bad("no layer store on this node")),
        };
        let digests: Vec<String> = resolved.iter().map(|r| r.digest.clone()).collect();
        match self.plain_layers(&parts, resolved) {
            Ok(layers) => Ok((layers, digests)),
            Err(e) => {
                if let Some(store) = store {
                    store.release(&digests);
                }
                Err(e)
            }
        }
    }

    /// Puts plain image files and resolved store layers together, in order.
    fn plain_layers(
        &self,
        parts: &[String],
        resolved: Vec<ResolvedLayer>,
    ) -> Result<Vec<LayerSource>, NodeError> {
        let mut resolved = resolved.into_iter();
        let mut layers = Vec::new();
        for name in parts {
            if LayerStore::is_store_reference(name) {
                let r = resolved
                    .next()
                    .ok_or_else(|| NodeError::BadImage(name.clone(), "not resolved".into()))?;
                layers.push(LayerSource { image: r.meta, device: Some(r.blob) });
                continue;
            }
            let bad = |why: &str| NodeError::BadImage(name.clone(), why.to_string());
            let ok = !name.is_empty()
                && name.len() <= 128
                && !name.starts_with('.')
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b));
            if !ok {
                return Err(bad("layer names are 1-128 of [A-Za-z0-9._@-], joined by +"));
            }
            let path = self.images_dir.join(format!("{name}.erofs"));
            if !path.is_file() {
                return Err(bad(&format!(
                    "no layer {name:?} in {} or the layer store",
                    self.images_dir.display()
                )));
            }
            layers.push(LayerSource::image(path));
        }
        Ok(layers)
    }

    /// Names of the layer images in the local images directory.
    pub fn local_images(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(&self.images_dir) else { return Vec::new() };
        let mut names: Vec<String> = dir
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".erofs").map(str::to_string))
            .collect();
        names.sort();
        names
    }

    pub async fn create(
        &self,
        id: &SandboxId,
        req: &CreateRequest,
        store: Option<&LayerStore>,
    ) -> Result<ContainerSandbox, NodeError> {
        let image = req.image.as_deref().ok_or_else(|| {
            NodeError::BadImage(String::new(), "a container needs an image".into())
        })?;
        let (layers, digests) = self.resolve_image(image, store).await?;
        let c = &self.config;
        let pick =
            |asked: Option<u64>, default: u64, max: u64| asked.unwrap_or(default).clamp(1, max);
        let l = req.limits;
        let (memory_bytes, cpu_millis) = self.requested(&l);
        let spec = ContainerSpec {
            name: id.to_string(),
            hostname: hostname(id),
            layers,
            limits: CgroupLimits {
                memory_bytes: Some(memory_bytes),
                pids: Some(pick(l.pids, c.default_pids, c.max_pids)),
                cpu_millis: Some(cpu_millis),
            },
            disk_bytes: pick(l.disk_mib, c.default_disk_mib, c.max_disk_mib) << 20,
            seed: None,
            protect: Protections { paths: protected_paths(&req.protected)?, reveal: false },
        };
        let container = match self.runtime.create(&spec).await {
            Ok(c) => c,
            Err(e) => {
                if let Some(store) = store {
                    store.release(&digests);
                }
                return Err(e.into());
            }
        };
        let shell = if brig_container::files::RootDir::new(container.root(), container.id_base())
            .stat("/bin/bash")
            .is_ok()
        {
            "/bin/bash"
        } else {
            "/bin/sh"
        };
        Ok(ContainerSandbox {
            container: Arc::new(container),
            env: req.env.clone(),
            shell: shell.to_string(),
            layers: spec.layers,
            limits: spec.limits,
            disk_bytes: spec.disk_bytes,
            execs: ExecTable::default(),
            sessions: SessionTable::default(),
            layer_digests: digests,
            protected: spec.protect.paths,
        })
    }

    /// The memory (bytes) and CPU (millicores) a container with `limits` gets.
    pub fn requested(&self, l: &brig_proto::SandboxLimits) -> (u64, u64) {
        requested(&self.config, l)
    }

    /// Takes back a container an earlier run of the node started.
    pub async fn attach(
        &self,
        id: &SandboxId,
        record: &ContainerRecord,
        store: Option<&LayerStore>,
    ) -> Result<ContainerSandbox, NodeError> {
        let container = self.runtime.attach(&id.to_string()).await?;
        if let (Some(store), false) = (store, record.layer_digests.is_empty()) {
            store.acquire(&record.layer_digests).await?;
        }
        Ok(ContainerSandbox {
            container: Arc::new(container),
            env: record.env.clone(),
            shell: record.shell.clone(),
            layers: record
                .layers
                .iter()
                .map(|(image, device)| LayerSource { image: image.clone(), device: device.clone() })
                .collect(),
            limits: CgroupLimits {
                memory_bytes: Some(record.memory_bytes),
                pids: Some(record.pids),
                cpu_millis: Some(record.cpu_millis),
            },
            disk_bytes: record.disk_bytes,
            execs: ExecTable::default(),
            sessions: SessionTable::default(),
            layer_digests: record.layer_digests.clone(),
            protected: record
                .protected
                .iter()
                .map(|(path, hidden)| Protected { path: path.clone(), hidden: *hidden })
                .collect(),
        })
    }

    /// Removes containers an earlier run left that the node has no record of.
    pub fn remove_orphans(&self, keep: &[String]) {
        self.runtime.remove_orphans(keep);
    }

    /// A new container on the parent's layers, starting from a copy of its writable layer.
    /// The caller keeps the parent frozen (or paused) meanwhile.
    pub async fn fork(
        &self,
        parent: &ContainerSandbox,
        id: &SandboxId,
        store: Option<&LayerStore>,
        reveal: bool,
    ) -> Result<ContainerSandbox, NodeError> {
        let seed = parent.container.upper_path().ok_or_else(|| {
            NodeError::BadImage(id.to_string(), "the parent has no writable layer".into())
        })?;
        if let (Some(store), false) = (store, parent.layer_digests.is_empty()) {
            store.acquire(&parent.layer_digests).await?;
        }
        let spec = ContainerSpec {
            name: id.to_string(),
            hostname: hostname(id),
            layers: parent.layers.clone(),
            limits: parent.limits,
            disk_bytes: parent.disk_bytes,
            seed: Some(seed),
            protect: Protections { paths: parent.protected.clone(), reveal },
        };
        let container = match self.runtime.create(&spec).await {
            Ok(c) => c,
            Err(e) => {
                if let Some(store) = store {
                    store.release(&parent.layer_digests);
                }
                return Err(e.into());
            }
        };
        Ok(ContainerSandbox {
            container: Arc::new(container),
            env: parent.env.clone(),
            shell: parent.shell.clone(),
            layers: parent.layers.clone(),
            limits: parent.limits,
            disk_bytes: parent.disk_bytes,
            execs: ExecTable::default(),
            sessions: SessionTable::default(),
            layer_digests: parent.layer_digests.clone(),
            protected: parent.protected.clone(),
        })
    }

    fn timeout(&self, asked: Option<u64>) -> Duration {
        Duration::from_millis(
            asked
                .unwrap_or(self.config.default_exec_timeout_ms)
                .min(self.config.max_exec_timeout_ms),
        )
    }

    fn output_limit(&self, asked: Option<u64>) -> u64 {
        asked
            .unwrap_or(self.config.default_output_limit_bytes)
            .min(self.config.max_output_limit_bytes)
    }
}

/// One container sandbox.
pub(crate) struct ContainerSandbox {
    pub container: Arc<Container>,
    env: Vec<(String, String)>,
    shell: String,
    layers: Vec<LayerSource>,
    limits: CgroupLimits,
    disk_bytes: u64,
    pub(crate) execs: ExecTable,
    pub sessions: SessionTable,
    /// Store layers this container uses (released when it is destroyed).
    pub layer_digests: Vec<String>,
    /// Protected paths (kept for forks).
    protected: Vec<Protected>,
}

/// The memory (bytes) and CPU (millicores) a container with `limits` gets under `c`, on the
/// node's kernel or in a container-host VM.
pub(crate) fn requested(c: &ContainerConfig, l: &brig_proto::SandboxLimits) -> (u64, u64) {
    (
        pick(l.memory_mib, c.default_memory_mib, c.max_memory_mib) << 20,
        pick(l.cpu_millis, c.default_cpu_millis, c.max_cpu_millis),
    )
}

/// A limit: as asked, or the default, within 1..=max.
pub(crate) fn pick(asked: Option<u64>, default: u64, max: u64) -> u64 {
    asked.unwrap_or(default).clamp(1, max)
}

pub(crate) fn merged_env(
    base: &[(String, String)],
    extra: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        base.iter().filter(|(k, _)| !extra.iter().any(|(e, _)| e == k)).cloned().collect();
    env.extend(extra);
    env
}

fn result_of(exit: brig_container::exec::ExecExit) -> ExecResult {
    let (exit_code, signal) = match exit.status {
        Some(ExitInfo::Code(c)) => (Some(c), None),
        Some(ExitInfo::Signal(s)) => (None, Some(s)),
        None => (None, None),
    };
    ExecResult {
        exit_code,
        signal,
        timed_out: exit.timed_out,
        killed: exit.killed,
        truncated: exit.truncated,
        oom_killed: exit.oom_killed,
        duration_us: u64::try_from(exit.duration.as_micros()).unwrap_or(u64::MAX),
        stdout_bytes: exit.stdout_bytes,
        stderr_bytes: exit.stderr_bytes,
    }
}

/// Checks the protected paths a create request names.
fn protected_paths(asked: &[brig_proto::ProtectedPath]) -> Result<Vec<Protected>, NodeError> {
    if asked.len() > 64 {
        return Err(NodeError::BadProtected("at most 64 protected paths".into()));
    }
    asked
        .iter()
        .map(|p| {
            let path =
                brig_container::protect::validate(&p.path).map_err(NodeError::BadProtected)?;
            Ok(Protected { path, hidden: p.hidden })
        })
        .collect()
}

/// A container's hostname: derived from its sandbox id, so forks differ from their parent.
pub(crate) fn hostname(id: &SandboxId) -> String {
    format!("sandbox-{}", &id.to_string()[12..])
}

impl ContainerSandbox {
    pub fn is_alive(&self) -> bool {
        self.container.is_alive()
    }

    /// Its memory limit (bytes) and CPU limit (millicores).
    pub fn requested(&self) -> (u64, u64) {
        (self.limits.memory_bytes.unwrap_or(0), self.limits.cpu_millis.unwrap_or(0))
    }

    /// What a restarted node needs to take this container back.
    pub fn record(&self) -> ContainerRecord {
        ContainerRecord {
            layers: self.layers.iter().map(|l| (l.image.clone(), l.device.clone())).collect(),
            layer_digests: self.layer_digests.clone(),
            env: self.env.clone(),
            shell: self.shell.clone(),
            memory_bytes: self.limits.memory_bytes.unwrap_or(0),
            pids: self.limits.pids.unwrap_or(0),
            cpu_millis: self.limits.cpu_millis.unwrap_or(0),
            disk_bytes: self.disk_bytes,
            protected: self.protected.iter().map(|p| (p.path.clone(), p.hidden)).collect(),
        }
    }

    /// Freezes every process and pushes reclaimable memory out; returns the bytes freed.
    pub async fn pause(&self) -> Result<u64, NodeError> {
        let c = self.container.clone();
        tokio::task::spawn_blocking(move || -> Result<u64, NodeError> {
            c.set_frozen(true)?;
            Ok(c.reclaim())
        })
        .await
        .map_err(|e| NodeError::Io {
            what: "pause task".into(),
            source: std::io::Error::other(e),
        })?
    }

    /// Thaws every process.
    pub async fn resume(&self) -> Result<(), NodeError> {
        let c = self.container.clone();
        tokio::task::spawn_blocking(move || c.set_frozen(false)).await.map_err(|e| {
            NodeError::Io { what: "resume task".into(), source: std::io::Error::other(e) }
        })??;
        Ok(())
    }

    /// Freezes (`true`) or thaws the container, blocking (for forks and checkpoints).
    pub async fn set_frozen(&self, frozen: bool) -> Result<(), NodeError> {
        let c = self.container.clone();
        tokio::task::spawn_blocking(move || c.set_frozen(frozen)).await.map_err(|e| {
            NodeError::Io { what: "freezer task".into(), source: std::io::Error::other(e) }
        })??;
        Ok(())
    }

    /// Kills everything in the container and removes it.
    pub async fn destroy(&self) -> Result<(), NodeError> {
        self.sessions.close_all().await;
        Ok(self.container.destroy().await?)
    }
}

impl ContainerSandbox {
    /// Packs the writable layer into a new store layer, without `scrub` paths. The container is
    /// frozen while its changes are copied, so the layer is a consistent point in time. The
    /// layer's source says what it goes on top of: `checkpoint of ID on IMAGE`.
    pub async fn checkpoint(
        &self,
        store: &LayerStore,
        id: &str,
        image: &str,
        name: &str,
        version: Option<u32>,
        scrub: &[String],
    ) -> Result<brig_images::LayerInfo, NodeError> {
        let upper = self.container.upper_path().ok_or_else(|| {
            NodeError::BadImage(id.to_string(), "no writable layer to checkpoint".into())
        })?;
        for path in scrub {
            if path.split('/').any(|p| p == "..") {
                return Err(NodeError::BadImage(
                    path.clone(),
                    "scrub paths may not contain ..".into(),
                ));
            }
        }
        let staging = brig_images::build::Staging::new_in(&store.work_dir())?;
        let root = staging.path().join("root");
        let container = self.container.clone();
        let scrub = scrub.to_vec();
        let target = root.clone();
        tokio::task::spawn_blocking(move || -> Result<(), NodeError> {
            std::fs::create_dir(&target)
                .map_err(|source| NodeError::Io { what: "checkpoint staging".into(), source })?;
            container.set_frozen(true)?;
            let copied = brig_images::build::stage_dir(&upper, &target);
            let thawed = container.set_frozen(false);
            copied?;
            thawed?;
            for path in scrub {
                let victim = target.join(path.trim_start_matches('/'));
                let _ = if victim.is_dir() {
                    std::fs::remove_dir_all(&victim)
                } else {
                    std::fs::remove_file(&victim)
                };
            }
            Ok(())
        })
        .await
        .map_err(|e| NodeError::Io {
            what: "checkpoint task".into(),
            source: std::io::Error::other(e),
        })??;
        let source =
            brig_images::ImportSource::Shifted(staging, format!("checkpoint of {id} on {image}"));
        Ok(store.import(name, version, source).await?)
    }
}

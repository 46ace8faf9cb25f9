//! The container tier as the node sees it: resolving a create request's image into layers
//! (local layer files and the layer store, which the node owns), choosing limits, and handing
//! the rest to `brig_container::sandbox::ContainerSandbox`; taking back the containers an
//! earlier run of the node left.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_container::protect::{Protected, Protections};
use brig_container::rootfs::LayerSource;
use brig_container::runtime::{ContainerSpec, Runtime, RuntimeConfig};
use brig_container::sandbox::{hostname, ContainerSandbox};
use brig_container::writable_store::StoreConfig;
use brig_core::SandboxId;
use brig_hostkit::cgroup::CgroupLimits;
use brig_images::{LayerStore, ResolvedLayer};
use brig_proto::CreateRequest;

use crate::host::free_page_reporting::ReportingFiles;
use crate::host::host_settings::{HostOriginals, HostSettingsRecord};
use crate::NodeError;
use brig_container::record::ContainerRecord;

/// The container tier.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerConfig {
    /// Offer the tier (it also needs root, cgroups, overlayfs and EROFS; without them the node
    /// logs why and offers fncall only).
    pub enabled: bool,
    /// Where layer images (`<name>.erofs`) are found; default `<state>/images`.
    pub images_dir: Option<PathBuf>,
    /// Scratch for mounts; default `/run/brig/<hash of the state directory>`.
    pub run_dir: Option<PathBuf>,
    /// The brig-shim binary; default next to brigd.
    pub shim_path: Option<PathBuf>,
    /// Host uid/gid of container root (65536 ids from here are mapped).
    pub id_base: u32,
    pub default_memory_mib: u64,
    pub max_memory_mib: u64,
    pub default_cpu_millis: u64,
    pub max_cpu_millis: u64,
    /// Lower the host's CFS bandwidth slice (`kernel.sched_cfs_bandwidth_slice_us`, a
    /// host-wide setting) to this while the node runs, so containers with quotas of a
    /// millisecond or two run on every CPU instead of waiting for the next period; the old
    /// value is put back at shutdown. 0 leaves the kernel's value.
    pub cpu_bandwidth_slice_us: u64,
    /// The smallest CPU quota per CFS period: a container capped so low that a 100 ms period
    /// would give it less gets a longer period (up to 1 s) at the same rate, so a short exec
    /// in a quiet container is not held for the next period. 0 keeps 100 ms periods.
    pub cpu_min_quota_us: u64,
    /// Set `favordynmods` on the host's cgroup2 mount while the node runs (a host-wide kernel
    /// setting, put back at shutdown): the cgroup migration every exec makes then never waits
    /// for an RCU grace period (143 ms in one trace at 10,000 containers; `docs/density.md`).
    pub cgroup_favor_dynmods: bool,
    /// Where the node is itself a VM whose kernel reports free memory to the hypervisor
    /// (virtio-balloon free page reporting), stop reporting while the node runs (a host-wide
    /// setting, put back at shutdown): otherwise memory a destroyed sandbox freed loses its
    /// backing, and the next create's kernel objects fault in the hypervisor too (10-18 µs a
    /// page against 1.1 µs; `docs/density.md`).
    pub hold_freed_memory: bool,
    /// Raise the kernel's largest memory cgroup shrinker id once per boot, at start, to what
    /// this many containers take (five superblocks each), while few memory cgroups exist:
    /// otherwise the first fill after a boot grows every memory cgroup's shrinker map each
    /// time a new superblock passes the largest id (a quarter of all CPU at 9,000 containers;
    /// `docs/density.md`). Every memory cgroup then holds a map that size (0.78 MiB for
    /// 10,000). 0 leaves the kernel to grow it.
    pub reserve_shrinker_ids_for: u64,
    /// Keep up to this many destroyed containers' cgroups, emptied and reset, for the next
    /// creates (cgroup v1 hosts): a spare is renamed instead of made, so a create skips the
    /// memory cgroup's `mkdir` (its shrinker map, ~1 MiB on a node sized for 10,000) and,
    /// for the same CPU limit, the CFS bandwidth writes that each walk every CPU cgroup on
    /// the host (`docs/density.md`). Each spare holds its kernel memory meanwhile. 0 keeps
    /// none.
    pub spare_cgroups: usize,
    /// A spare cgroup not taken within this many seconds is removed, a few a second, so a
    /// node that stops creating gives their memory back. 0 keeps spares until shutdown.
    pub spare_cgroups_idle_secs: u64,
    pub default_pids: u64,
    pub max_pids: u64,
    pub default_disk_mib: u64,
    pub max_disk_mib: u64,
    /// Where containers' writable layers live. On disk, a layer is a directory with an XFS
    /// project quota of the sandbox's disk size on one sparse image per node
    /// (`<state>/writable.xfs`, loop-mounted under the run directory): a full disk is ENOSPC,
    /// and the layer costs the sandbox no memory. In memory it is a tmpfs charged to the
    /// sandbox's memory limit (a disk larger than the memory fills into the OOM killer).
    /// - `auto` (the default): on disk where the kernel has XFS project quotas, else in memory
    ///   (the node logs why);
    /// - `disk`: on disk; where the kernel has no XFS quotas, an ext4 image per layer, which
    ///   costs each create a sparse copy and a loop mount (~10 ms: 105 against 247 creates/s
    ///   on the development machine);
    /// - `memory`: always a tmpfs.
    pub writable_layer: WritableLayer,
    /// The sparse image's size with `writable_layer = "disk"`: all writable layers together
    /// hold at most this (the node's disk holds what they hold; at least 512).
    pub writable_store_mib: u64,
    pub default_exec_timeout_ms: u64,
    pub max_exec_timeout_ms: u64,
    /// Cap on stdout + stderr returned per exec (DSec lost tens of GB to `yes`).
    pub default_output_limit_bytes: u64,
    pub max_output_limit_bytes: u64,
}

/// Where containers' writable layers live ([`ContainerConfig::writable_layer`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WritableLayer {
    Auto,
    Disk,
    Memory,
}

impl Default for ContainerConfig {
    fn default() -> Self {
        ContainerConfig {
            enabled: true,
            images_dir: None,
            run_dir: None,
            shim_path: None,
            id_base: 100_000,
            default_memory_mib: 1024,
            max_memory_mib: 16 * 1024,
            default_cpu_millis: 1000,
            max_cpu_millis: 16_000,
            cpu_bandwidth_slice_us: 500,
            cpu_min_quota_us: brig_hostkit::cgroup::DEFAULT_CPU_MIN_QUOTA_US,
            cgroup_favor_dynmods: true,
            hold_freed_memory: true,
            reserve_shrinker_ids_for: 10_000,
            spare_cgroups: brig_container::runtime::DEFAULT_SPARE_CGROUPS,
            spare_cgroups_idle_secs: brig_container::runtime::DEFAULT_SPARE_CGROUPS_IDLE_SECS,
            default_pids: 1024,
            max_pids: 32_768,
            default_disk_mib: 1024,
            max_disk_mib: 64 * 1024,
            writable_layer: WritableLayer::Auto,
            writable_store_mib: 64 * 1024,
            default_exec_timeout_ms: 10 * 60 * 1000,
            max_exec_timeout_ms: 24 * 60 * 60 * 1000,
            default_output_limit_bytes: 16 << 20,
            max_output_limit_bytes: 1 << 30,
        }
    }
}

/// The container tier of a node.
pub(crate) struct ContainerTier {
    runtime: Arc<Runtime>,
    config: ContainerConfig,
    images_dir: PathBuf,
    /// Where the host settings to put back, and who relies on them, are recorded.
    settings: HostSettingsRecord,
}

/// What one change of a host-wide setting did: the host's value it replaced (logged, with what
/// was done), or `None` when nothing was changed or the change failed (logged as a warning).
fn replaced<T: std::fmt::Debug, E: std::fmt::Display>(
    result: Result<Option<T>, E>,
    done: &str,
    failed: &str,
) -> Option<T> {
    match result {
        Ok(Some(was)) => {
            tracing::info!(?was, "{done} (put back when the last brigd leaves)");
            Some(was)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "{failed}");
            None
        }
    }
}

/// Lowers the CFS bandwidth slice, sets `favordynmods` and holds freed memory from the
/// hypervisor as the configuration asks; returns the host's values it replaced.
fn change_host_settings(config: &ContainerConfig) -> HostOriginals {
    let slice_us = config.cpu_bandwidth_slice_us;
    let bandwidth_slice_us = replaced(
        brig_hostkit::cgroup::lower_bandwidth_slice(slice_us),
        &format!("lowered the host's CFS bandwidth slice to {slice_us} µs"),
        "cannot lower the CFS bandwidth slice",
    );
    let favored = config.cgroup_favor_dynmods.then(|| {
        replaced(
            brig_hostkit::cgroup_favor::favor_dynamic_modifications(),
            "set favordynmods on the cgroup2 mount",
            "cannot set favordynmods on the cgroup2 mount",
        )
    });
    let page_reporting_order = config.hold_freed_memory.then(|| {
        replaced(
            ReportingFiles::host().hold(),
            "holding freed memory: no free page reporting to the hypervisor",
            "cannot hold freed memory from the hypervisor",
        )
    });
    HostOriginals {
        bandwidth_slice_us,
        favored: favored.flatten(),
        page_reporting_order: page_reporting_order.flatten(),
    }
}

/// Raises the largest shrinker id for `containers` on a thread of its own, unless this boot
/// already has (`shrinker_ids`); the node serves meanwhile.
fn reserve_shrinker_ids(run_dir: &Path, containers: u64) {
    use crate::host::shrinker_ids::{Reserved, ShrinkerIds, SUPERBLOCKS_PER_CONTAINER};
    if containers == 0 {
        return;
    }
    let ids = containers.saturating_mul(SUPERBLOCKS_PER_CONTAINER);
    let record = ShrinkerIds::beside(run_dir);
    let spawned = std::thread::Builder::new().name("brig-shrinker-reserve".into()).spawn(
        move || match record.reserve(ids) {
            Ok(Reserved::Now { ids, took }) => {
                tracing::info!(ids, ?took, "reserved memory cgroup shrinker ids for this boot")
            }
            Ok(Reserved::Already { ids }) => {
                tracing::debug!(ids, "memory cgroup shrinker ids already reserved this boot")
            }
            Err(e) => {
                tracing::warn!(error = %crate::error::chain(&e), "cannot reserve shrinker ids")
            }
        },
    );
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the thread that reserves shrinker ids");
    }
}

impl ContainerTier {
    /// Opens the tier, or says why it cannot be offered here.
    /// `run_dir` holds mounts (not under the private state directory: container root of
    /// earlier builds' shims traversed it to reach its rootfs); `cgroup_parent` is unique per
    /// daemon.
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
        // Host-wide: the host's values go back when the last brigd using them leaves.
        let settings = HostSettingsRecord::beside(run_dir);
        let originals = settings.join(|| change_host_settings(config));
        tracing::debug!(?originals, "host settings put back when the last brigd leaves");
        reserve_shrinker_ids(run_dir, config.reserve_shrinker_ids_for);
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
            spool_dir: Some(state_dir.join("spool")),
            cpu_min_quota_us: config.cpu_min_quota_us,
            spare_cgroups: config.spare_cgroups,
            spare_cgroups_idle_secs: config.spare_cgroups_idle_secs,
            writable_store: {
                let store = |images_fallback| StoreConfig {
                    image: state_dir.join("writable.xfs"),
                    size_bytes: config.writable_store_mib << 20,
                    images_fallback,
                };
                match config.writable_layer {
                    WritableLayer::Auto => Some(store(false)),
                    WritableLayer::Disk => Some(store(true)),
                    WritableLayer::Memory => None,
                }
            },
        })
        .map_err(|e| crate::error::chain(&e))?;
        Ok(ContainerTier {
            runtime: Arc::new(runtime),
            config: config.clone(),
            images_dir,
            settings,
        })
    }

    pub fn shutdown(&self) {
        self.runtime.shutdown();
        if let Some(originals) = self.settings.leave() {
            if let Some(was) = originals.bandwidth_slice_us {
                brig_hostkit::cgroup::restore_bandwidth_slice(was);
            }
            if let Some(favored) = &originals.favored {
                brig_hostkit::cgroup_favor::restore(favored);
            }
            if let Some(order) = originals.page_reporting_order {
                if let Err(e) = ReportingFiles::host().restore(order) {
                    tracing::warn!(error = %e, "cannot restore free page reporting");
                }
            }
        }
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
        binds: Vec<brig_container::protect::Bind>,
    ) -> Result<ContainerSandbox, NodeError> {
        let image = req.image.as_deref().ok_or_else(|| {
            NodeError::BadImage(String::new(), "a container needs an image".into())
        })?;
        let (layers, digests) = self.resolve_image(image, store).await?;
        let c = &self.config;
        let l = req.limits;
        let (memory_bytes, cpu_millis) = self.requested(&l);
        let protected = match protected_paths(&req.protected) {
            Ok(p) => p,
            Err(e) => {
                if let Some(store) = store {
                    store.release(&digests);
                }
                return Err(e);
            }
        };
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
            protect: Protections { paths: protected, reveal: false, binds },
        };
        // An environment's own settings (a pulled image's config), the request's variables on
        // top of its variables.
        let config = store.map(|s| s.env_config(image)).unwrap_or_default();
        let defaults = brig_container::sandbox::ProcessDefaults {
            env: brig_container::sandbox::merged_env(&config.env, req.env.clone()),
            command: config.command(),
            cwd: config.working_dir,
            user: config.user,
        };
        match ContainerSandbox::create(&self.runtime, spec, defaults, digests.clone()).await {
            Ok(sandbox) => Ok(sandbox),
            Err(e) => {
                if let Some(store) = store {
                    store.release(&digests);
                }
                // No room on the node's disk for the writable layer: resource_exhausted, as
                // for any other full disk.
                if let brig_container::runtime::RuntimeError::Rootfs(
                    brig_container::rootfs::RootfsError::Store(full),
                ) = &e
                {
                    if full.is_no_space() {
                        let kind = std::io::ErrorKind::StorageFull;
                        let source = std::io::Error::new(kind, brig_core::sandbox::chain(&e));
                        return Err(NodeError::Io { what: "the writable layer".into(), source });
                    }
                }
                Err(e.into())
            }
        }
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
        let sandbox = ContainerSandbox::attach(&self.runtime, id, record).await?;
        if let (Some(store), false) = (store, record.layer_digests.is_empty()) {
            store.acquire(&record.layer_digests).await?;
        }
        Ok(sandbox)
    }

    /// The runtime, for what acts on its containers as a whole (strays).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Removes containers an earlier run left that the node has no record of; how many.
    pub fn remove_orphans(&self, keep: &[String]) -> usize {
        self.runtime.remove_orphans(keep)
    }
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

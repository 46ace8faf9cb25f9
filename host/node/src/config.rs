//! Node configuration.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use brig_core::NodeId;
use brig_fncall::FncallConfig;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// This node's id; it is encoded in every sandbox id the node hands out.
    pub node_id: u32,
    /// Idle TTL for sandboxes that do not ask for one.
    pub default_idle_ttl_ms: u64,
    /// Longest idle TTL a sandbox may ask for.
    pub max_idle_ttl_ms: u64,
    /// Live sandboxes this node holds at most.
    pub max_sandboxes: usize,
    /// How often idle sandboxes are looked for.
    pub reap_interval_ms: u64,
    /// Largest file upload accepted, in bytes.
    pub max_upload_bytes: u64,
    /// Largest file read from a guest (a microVM's, or a container-host VM's container) in one
    /// request, in MiB; it passes through the node's memory (at most 256).
    pub max_guest_read_mib: u64,
    /// What happens to running containers when the daemon exits.
    pub on_exit: OnExit,
    pub fncall: FncallConfig,
    pub container: ContainerConfig,
    pub images: ImagesConfig,
    /// Semantic egress services (`pypi`, `debian`, a mirror) and the destinations each one
    /// stands for on this node.
    pub egress_services: Vec<(String, Vec<brig_core::Destination>)>,
    pub admission: crate::admission::AdmissionConfig,
    pub microvm: crate::microvm::MicrovmConfig,
    pub fullvm: crate::fullvm::FullvmConfig,
    /// Container-host VMs: containers on a guest's kernel instead of the node's.
    pub container_host: crate::container_host::ContainerHostConfig,
    /// The node's own compressed swap, so that a paused sandbox's memory can leave RAM.
    pub swap: crate::swap::SwapConfig,
    /// Bounds per sandbox, per connection and per node that keep one client from taking all.
    pub limits: crate::limits::LimitsConfig,
    /// Volumes: named directory trees sandboxes mount.
    pub volumes: crate::volumes::VolumesConfig,
}

/// What a stopping daemon does with its containers.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnExit {
    /// Containers keep running (each under its shim) and the next daemon run takes them back:
    /// sandboxes outlive daemon upgrades and crashes.
    #[default]
    Keep,
    /// Every container is destroyed with the daemon.
    Destroy,
}

impl std::str::FromStr for OnExit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "keep" => Ok(OnExit::Keep),
            "destroy" => Ok(OnExit::Destroy),
            other => Err(format!("expected keep or destroy, got {other:?}")),
        }
    }
}

/// The layer store.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesConfig {
    pub enabled: bool,
    pub backend: BlobBackendConfig,
    /// Local chunk cache; default `<state>/chunk-cache`.
    pub cache_dir: Option<PathBuf>,
    pub cache_max_mib: u64,
    /// Verified chunks kept in memory.
    pub cache_memory_mib: u64,
    /// Where `image pull` may fetch from and how.
    pub registries: RegistriesConfig,
}

/// Registries images are pulled from (`[images.registries]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RegistriesConfig {
    /// Registries (`host:port`) spoken to over plain HTTP; none by default.
    pub insecure: Vec<String>,
    /// Credentials, by registry.
    pub credentials: Vec<RegistryCredential>,
    /// PEM files of CAs trusted besides the system's (a registry with a private CA).
    pub ca_files: Vec<PathBuf>,
    /// Mirrors by registry (`"docker.io" = ["mirror.local:5000"]`), tried in order before
    /// the registry itself.
    pub mirrors: std::collections::BTreeMap<String, Vec<String>>,
    /// Most uncompressed bytes of one layer and of one image.
    pub max_layer_mib: u64,
    pub max_image_mib: u64,
}

impl Default for RegistriesConfig {
    fn default() -> Self {
        RegistriesConfig {
            insecure: Vec::new(),
            credentials: Vec::new(),
            ca_files: Vec::new(),
            mirrors: Default::default(),
            max_layer_mib: 32 * 1024,
            max_image_mib: 64 * 1024,
        }
    }
}

/// A registry's user and password (`[[images.registries.credentials]]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegistryCredential {
    pub registry: String,
    pub username: String,
    pub password: String,
}

impl RegistriesConfig {
    /// The puller's settings.
    pub fn pull_config(&self) -> brig_registry::PullConfig {
        brig_registry::PullConfig {
            insecure: self.insecure.clone(),
            credentials: self
                .credentials
                .iter()
                .map(|c| (c.registry.clone(), c.username.clone(), c.password.clone()))
                .collect(),
            ca_files: self.ca_files.clone(),
            mirrors: self.mirrors.iter().map(|(r, m)| (r.clone(), m.clone())).collect(),
            max_layer_bytes: self.max_layer_mib << 20,
            max_image_bytes: self.max_image_mib << 20,
            ..brig_registry::PullConfig::default()
        }
    }
}

/// Where layer data lives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum BlobBackendConfig {
    /// A directory; default `<state>/blobs`.
    Local { dir: Option<PathBuf> },
    /// An S3-compatible object store.
    S3(brig_images::backend::S3Config),
}

impl Default for ImagesConfig {
    fn default() -> Self {
        ImagesConfig {
            enabled: true,
            backend: BlobBackendConfig::Local { dir: None },
            cache_dir: None,
            cache_max_mib: 10 * 1024,
            cache_memory_mib: 64,
            registries: RegistriesConfig::default(),
        }
    }
}

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

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: 0,
            default_idle_ttl_ms: 30 * 60 * 1000,
            max_idle_ttl_ms: 24 * 60 * 60 * 1000,
            max_sandboxes: 200_000,
            reap_interval_ms: 1000,
            max_upload_bytes: 64 << 30,
            max_guest_read_mib: 256,
            on_exit: OnExit::Keep,
            fncall: FncallConfig::default(),
            container: ContainerConfig::default(),
            images: ImagesConfig::default(),
            egress_services: Vec::new(),
            admission: Default::default(),
            microvm: Default::default(),
            fullvm: Default::default(),
            container_host: Default::default(),
            swap: Default::default(),
            limits: Default::default(),
            volumes: Default::default(),
        }
    }
}

impl NodeConfig {
    pub fn node_id(&self) -> NodeId {
        NodeId(self.node_id)
    }
}

//! Container-host VMs in the node: their configuration, the pool
//! (`brig_vmtier::hosts::ContainerHosts`) and the create requests that go to it. Placement: the
//! create's `placement`, else `[container_host] placement` (`host` or `vm`), see `crate::tiers::hosted`.

use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

use brig_core::{SandboxId, Tier};
use brig_vmtier::hosts::{ContainerHosts, HostedCreate, HostedSandbox};
use brig_vmtier::{VmTier, VmTierConfig};
use serde::{Deserialize, Serialize};

use crate::tiers::container::ContainerConfig;
use crate::NodeError;

/// Where containers go when a create does not say.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PlacementPolicy {
    /// The node's kernel.
    #[default]
    Host,
    /// A container-host VM.
    Vm,
}

/// `[container_host]` in the node configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerHostConfig {
    /// Guest kernel and initramfs; the initramfs's init starts brig-agent's container service
    /// when the command line says `brig.role=container-host` (scripts/build-vm-guests.sh
    /// builds one). Without them the node has no container-host VMs.
    pub kernel: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    /// Memory of each container-host VM; 0 sizes it by the node: a quarter of its memory.
    pub mem_mib: usize,
    /// vCPUs of each; 0: as many as the node has.
    pub vcpus: usize,
    /// Most container-host VMs at once.
    pub max_vms: usize,
    /// Where a container goes when its create does not say.
    pub placement: PlacementPolicy,
    /// The brig-vmm binary; default: beside the running daemon.
    pub vmm: Option<PathBuf>,
    /// How long a container-host VM may take to boot to its agent (a slow, emulated host
    /// needs more than a real one).
    pub boot_limit_s: u64,
}

impl Default for ContainerHostConfig {
    fn default() -> Self {
        ContainerHostConfig {
            kernel: None,
            initrd: None,
            cmdline: "console=ttyS0 reboot=t panic=-1 quiet initcall_blacklist=i8042_init \
                      pci=off brig.role=container-host"
                .into(),
            mem_mib: 0,
            vcpus: 0,
            max_vms: 2,
            placement: PlacementPolicy::Host,
            vmm: None,
            boot_limit_s: 180,
        }
    }
}

/// The container-host VMs, or why the node has none.
pub(crate) fn open(
    cfg: &ContainerHostConfig,
    containers: &ContainerConfig,
    state_dir: &Path,
) -> Result<Arc<ContainerHosts>, String> {
    let (Some(kernel), Some(initrd)) = (&cfg.kernel, &cfg.initrd) else {
        return Err(
            "no guest kernel and initramfs configured ([container_host] kernel, initrd)".into()
        );
    };
    let (node_mib, node_cpus) = node_size();
    let tier = VmTier::open(VmTierConfig {
        vmm: crate::tiers::microvm::vmm_binary(cfg.vmm.as_ref()),
        kernel: kernel.clone(),
        initrd: initrd.clone(),
        cmdline: cfg.cmdline.clone(),
        mem_mib: if cfg.mem_mib == 0 { (node_mib / 4).max(512) } else { cfg.mem_mib },
        vcpus: if cfg.vcpus == 0 { node_cpus } else { cfg.vcpus }.clamp(1, 64),
        dir: state_dir.join("container-host"),
        ksm: false,
        warm: 0,
        root_image: None,
        boot_limit: std::time::Duration::from_secs(cfg.boot_limit_s.max(1)),
    });
    let tier = crate::tiers::microvm::offered(Tier::Container, tier)?;
    // A previous daemon's VMs are adopted or stopped by `Node::restore`, which has the records.
    let images_dir = containers.images_dir.clone().unwrap_or_else(|| state_dir.join("images"));
    Ok(Arc::new(ContainerHosts::new(tier, cfg.max_vms, images_dir)))
}

/// The node's memory (MiB) and CPUs.
fn node_size() -> (usize, usize) {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: usize = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(4 << 20);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (kib >> 10, cpus)
}

/// Creates sandbox `id`'s container in a container-host VM, with the limits the node's
/// container policy gives it.
pub(crate) async fn create(
    hosts: &ContainerHosts,
    id: &SandboxId,
    req: &brig_proto::CreateRequest,
    cfg: &ContainerConfig,
) -> Result<HostedSandbox, NodeError> {
    let image = req
        .image
        .clone()
        .ok_or_else(|| NodeError::BadImage(String::new(), "a container needs an image".into()))?;
    let refuse = |op| NodeError::WrongTier { id: id.to_string(), tier: Tier::Container, op };
    if req.egress.is_some() {
        return Err(refuse("egress rules (not yet for containers in a container-host VM)"));
    }
    if !req.protected.is_empty() {
        return Err(refuse("protected paths (not yet for containers in a container-host VM)"));
    }
    let (memory_bytes, cpu_millis) = crate::tiers::container::requested(cfg, &req.limits);
    let l = &req.limits;
    let pick = crate::tiers::container::pick;
    let create = HostedCreate {
        id: *id,
        image,
        env: req.env.clone(),
        memory_bytes,
        cpu_millis,
        pids: pick(l.pids, cfg.default_pids, cfg.max_pids),
        disk_bytes: pick(l.disk_mib, cfg.default_disk_mib, cfg.max_disk_mib) << 20,
    };
    hosts.create(create).await.map_err(|e| NodeError::sandbox(&id.to_string(), Tier::Container, e))
}

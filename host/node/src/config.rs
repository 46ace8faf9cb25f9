//! Node configuration.

use serde::{Deserialize, Serialize};

use brig_core::NodeId;
use brig_fncall::FncallConfig;

use crate::environments::images::ImagesConfig;
use crate::tiers::container::ContainerConfig;

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
    pub admission: crate::policy::admission::AdmissionConfig,
    pub microvm: crate::tiers::microvm::MicrovmConfig,
    pub fullvm: crate::tiers::fullvm::FullvmConfig,
    /// Container-host VMs: containers on a guest's kernel instead of the node's.
    pub container_host: crate::tiers::container_host::ContainerHostConfig,
    /// The node's own compressed swap, so that a paused sandbox's memory can leave RAM.
    pub swap: crate::host::swap::SwapConfig,
    /// Bounds per sandbox, per connection and per node that keep one client from taking all.
    pub limits: crate::limits::LimitsConfig,
    /// Volumes: named directory trees sandboxes mount.
    pub volumes: crate::environments::volumes::VolumesConfig,
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

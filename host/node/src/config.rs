//! Node configuration.

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
    pub fncall: FncallConfig,
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
            fncall: FncallConfig::default(),
        }
    }
}

impl NodeConfig {
    pub fn node_id(&self) -> NodeId {
        NodeId(self.node_id)
    }
}

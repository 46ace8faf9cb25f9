//! Cluster messages: node heartbeats to the control plane, routes from it to nodes, projects.

use serde::{Deserialize, Serialize};

use crate::NodeStatus;

/// What a node tells every control-plane replica, once a second.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    pub status: NodeStatus,
    /// Where clients reach the node (QUIC).
    pub addr: String,
    /// SHA-256 of the node's certificate, which clients pin.
    pub cert_sha256: String,
    /// Images the node can serve without the shared store; `None`: it reads the store.
    pub images: Option<Vec<String>>,
    /// Live sandboxes per project (quota accounting).
    pub live_by_project: Vec<(String, u64)>,
}

/// The control plane's answer to a heartbeat: the key it signs node tokens with.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ClusterKey {
    /// Ed25519 public key (32 bytes).
    #[serde(with = "serde_bytes")]
    pub public_key: Vec<u8>,
}

/// How a client reaches the node that owns a sandbox: address, pin, and a token the control
/// plane signed for this node and the client's project.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NodeRoute {
    pub node: u32,
    pub addr: String,
    pub cert_sha256: String,
    pub token: String,
    pub expires_unix_ms: u64,
}

/// One node as a control-plane replica sees it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NodeSummary {
    pub node: u32,
    pub addr: String,
    pub healthy: bool,
    pub last_heartbeat_ms_ago: u64,
    pub tiers: Vec<crate::Tier>,
    pub sandboxes: u64,
    /// Placement load (largest resource ratio) in thousandths.
    pub load_permille: u32,
}

/// Limits of a project; a nested project (`team/a`) is also held to its ancestors' limits.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProjectLimits {
    pub max_live: Option<u64>,
    pub max_creates_per_sec: Option<u32>,
}

/// Who a connection's token speaks for (`NodeOp::Whoami`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CallerInfo {
    /// The project it is scoped to; `None` for an admin token.
    pub project: Option<String>,
    pub admin: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ProjectInfo {
    pub name: String,
    pub limits: ProjectLimits,
    /// Live sandboxes of this project and its sub-projects, from the last heartbeats.
    pub live: u64,
}

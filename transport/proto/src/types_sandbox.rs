//! Sandboxes: tiers, creation, state, listing.

use serde::{Deserialize, Serialize};

/// Isolation tier of a sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    Fncall,
    Container,
    Microvm,
    Fullvm,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CreateRequest {
    pub tier: Option<Tier>,
    /// Image for the container and VM tiers: a layer name, or layers bottom first joined by
    /// `+` (`debian-12+flask-ws+harness`); unused by fncall.
    pub image: Option<String>,
    pub labels: Vec<(String, String)>,
    /// Destroy the sandbox after this long without a request; `None` takes the node default.
    pub idle_ttl_ms: Option<u64>,
    pub limits: SandboxLimits,
    /// Environment every command in the sandbox starts with.
    pub env: Vec<(String, String)>,
    /// What the idle TTL does; `None` takes the node default (destroy).
    pub idle_action: Option<IdleAction>,
    /// Destroy after being paused this long.
    pub paused_ttl_ms: Option<u64>,
    /// Destroy after this long, whatever it is doing.
    pub max_lifetime_ms: Option<u64>,
    /// Egress rules (`pypi`, `10.0.0.0/8:443`, …): `None` gives no network beyond loopback;
    /// `Some` gives a link to the node that lets only these through (empty: nothing yet).
    pub egress: Option<Vec<String>>,
    /// Paths of the image the agent may read but not change, or may not see at all.
    pub protected: Vec<ProtectedPath>,
    /// CPU QoS class; `None`: latency-sensitive.
    pub qos: Option<QosClass>,
    /// Where a container runs: on the node's kernel or in a container-host VM; `None`: the
    /// node's policy decides.
    pub placement: Option<Placement>,
    /// The project the sandbox is charged to; set by the control plane (a node ignores it
    /// from a project-scoped client, whose token names the project).
    pub project: Option<String>,
    /// When the create pulls its image (`oci:REF` the node lacks), send
    /// [`crate::PullProgress`] replies while it does, before the `Sandbox` one.
    pub pull_progress: bool,
    /// Volumes mounted into the sandbox (container tier on the node's kernel).
    pub volumes: Vec<crate::VolumeMount>,
}

/// Which kernel a container runs on.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The node's own kernel.
    HostKernel,
    /// A container-host VM shared with the node's other in-VM containers: a kernel crash an
    /// agent causes takes down that VM, not the node.
    Vm,
}

/// How a sandbox's CPU work is scheduled against others' under overcommit.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QosClass {
    /// Normal CPU weight.
    #[default]
    LatencySensitive,
    /// Smallest weight and idle scheduling: runs on what others leave.
    BestEffort,
}

/// A path an agent must not change (or see); evaluation can reveal it read-only on a fork.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ProtectedPath {
    pub path: String,
    pub hidden: bool,
}

/// What the idle TTL does to a sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleAction {
    Pause,
    Destroy,
    /// Pause keeping its files only (`SandboxOp::PauseFilesOnly`).
    PauseFilesOnly,
}

/// One sandbox, or every sandbox whose labels include all the given pairs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Sandbox(String),
    Labels(Vec<(String, String)>),
}

/// New lifetimes for a sandbox; `None` leaves a field as it is.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct TtlUpdate {
    pub sandbox: String,
    pub idle_ttl_ms: Option<u64>,
    pub idle_action: Option<IdleAction>,
    /// `Some(None)` removes the limit.
    pub paused_ttl_ms: Option<Option<u64>>,
    pub max_lifetime_ms: Option<Option<u64>>,
}

/// Resource limits of a sandbox; `None` takes the node default.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SandboxLimits {
    pub memory_mib: Option<u64>,
    /// CPU in thousandths of a core (1000 = one core).
    pub cpu_millis: Option<u64>,
    pub pids: Option<u64>,
    /// Writable-disk quota.
    pub disk_mib: Option<u64>,
}

/// Lifecycle state as clients see it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Running,
    Paused,
    Stopped,
    Failed,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    pub id: String,
    pub tier: Tier,
    pub state: SandboxState,
    pub labels: Vec<(String, String)>,
    pub created_unix_ms: u64,
    pub last_used_unix_ms: u64,
    pub idle_ttl_ms: u64,
    pub idle_action: IdleAction,
    pub paused_ttl_ms: Option<u64>,
    pub max_lifetime_ms: Option<u64>,
    /// When it was paused, if it is.
    pub paused_unix_ms: Option<u64>,
    /// The image (container and VM tiers).
    pub image: Option<String>,
    /// Resource use; filled by `Status` (not by `List`) for tiers that measure it.
    pub usage: Option<SandboxUsage>,
    /// Egress rules, if the sandbox has a network link.
    pub egress: Option<Vec<String>>,
    /// The sandbox's address on its link.
    pub address: Option<String>,
    pub qos: QosClass,
    /// Where a container runs: `host-kernel`, or `vm:<name>` for a container-host VM.
    pub placement: Option<String>,
    /// The volumes it mounts (by id, as mounted).
    pub volumes: Vec<crate::VolumeMount>,
    /// Paused keeping its files only: its processes ended, and its resume starts it with
    /// none running (a cold boot).
    pub paused_files_only: bool,
}

/// What a sandbox has used.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SandboxUsage {
    /// CPU time of all its processes since creation.
    pub cpu_ns: u64,
    /// Memory charged to it now (page cache included).
    pub memory_bytes: u64,
}

/// What a sandbox used at one moment of its life (`SandboxOp::UsageHistory`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsageSample {
    pub unix_ms: u64,
    /// CPU time of all its processes since creation, at that moment.
    pub cpu_ns: u64,
    /// Memory charged to it then.
    pub memory_bytes: u64,
}

/// Label selector: every pair must match. Empty matches everything.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ListRequest {
    pub labels: Vec<(String, String)>,
    /// Only this project's sandboxes (and its sub-projects'); project-scoped clients always
    /// see only their own.
    pub project: Option<String>,
}

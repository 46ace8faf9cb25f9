//! What a restarted node needs to take each kind of sandbox back: the on-disk formats of a
//! sandbox record's tier part (re-exported from `brig_core::sandbox`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a restarted node needs to take a container back (the on-disk format of a sandbox
/// record's `container` field).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ContainerRecord {
    pub layers: Vec<(PathBuf, Option<PathBuf>)>,
    pub layer_digests: Vec<String>,
    pub env: Vec<(String, String)>,
    pub shell: String,
    pub memory_bytes: u64,
    pub pids: u64,
    pub cpu_millis: u64,
    pub disk_bytes: u64,
    /// Protected paths: (path, hidden).
    #[serde(default)]
    pub protected: Vec<(String, bool)>,
    /// The directory and user commands start with when a request names none (its image's).
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// Its image's command (`Entrypoint` + `Cmd`).
    #[serde(default)]
    pub command: Vec<String>,
    /// Host directories bound into it (volumes): (source, path inside, read-only).
    #[serde(default)]
    pub binds: Vec<(PathBuf, String, bool)>,
}

/// What a restarted node needs to adopt a VM back (the on-disk format of a sandbox record's
/// `machine` field). Which VMM process serves it, and proof that it is the one the node
/// started, are the VM tier's own (its pid file holds pid and start time).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MachineRecord {
    /// The snapshot its memory is mapped from (its environment's, or a saved one).
    pub memory_from: PathBuf,
    /// Its image's read-only layers, base first.
    #[serde(default)]
    pub layers: Vec<PathBuf>,
    /// Its own writable disk, and the read-only base that disk overlays (a full VM's image).
    #[serde(default)]
    pub writable: Option<PathBuf>,
    #[serde(default)]
    pub cow_base: Option<PathBuf>,
    /// Its network device: namespace and tap.
    #[serde(default)]
    pub net: Option<(PathBuf, String)>,
    /// Saved to `memory_from` with no VMM running.
    pub paused: bool,
}

/// What a restarted node needs to take back a container in a container-host VM: the VM (by
/// name, with the layer disks it was booted with) and what the container's commands start
/// with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostedRecord {
    /// The container-host VM's name (`chost-N`).
    pub vm: String,
    /// Its disks, in order.
    pub vm_layers: Vec<PathBuf>,
    pub env: Vec<(String, String)>,
    pub shell: String,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
}

//! What a restarted node needs to take the VM tiers' sandboxes back: their parts of the
//! sandbox records ([`brig_core::records::TierRecord`]s of kind [`MACHINE_RECORD_KIND`], a microVM's or
//! full VM's, and [`HOSTED_RECORD_KIND`], a container's in a container-host VM).

use std::path::PathBuf;

use brig_core::records::{RecordError, TierRecord};
use serde::{Deserialize, Serialize};

/// The kind of a VM's tier record (microVMs and full VMs: the sandbox's tier tells which).
pub const MACHINE_RECORD_KIND: &str = "machine";
/// The kind of a container-host VM's container's tier record.
pub const HOSTED_RECORD_KIND: &str = "hosted";
/// The versions written; every one up to them reads.
pub const MACHINE_RECORD_VERSION: u32 = 1;
pub const HOSTED_RECORD_VERSION: u32 = 1;

/// What a restarted node needs to adopt a VM back (version 1; the format of a sandbox
/// record's `machine` field before records were tagged). Which VMM process serves it, and
/// proof that it is the one the node started, are the VM tier's own (its pid file holds pid
/// and start time).
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

impl MachineRecord {
    pub fn to_tier(&self) -> Result<TierRecord, RecordError> {
        TierRecord::new(MACHINE_RECORD_KIND, MACHINE_RECORD_VERSION, self)
    }

    pub fn from_tier(record: &TierRecord) -> Result<MachineRecord, RecordError> {
        record.body(MACHINE_RECORD_KIND, MACHINE_RECORD_VERSION)
    }
}

/// What a restarted node needs to take back a container in a container-host VM: the VM (by
/// name, with the layer disks it was booted with) and what the container's commands start
/// with (version 1; the format of a sandbox record's `hosted` field before records were
/// tagged).
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

impl HostedRecord {
    pub fn to_tier(&self) -> Result<TierRecord, RecordError> {
        TierRecord::new(HOSTED_RECORD_KIND, HOSTED_RECORD_VERSION, self)
    }

    pub fn from_tier(record: &TierRecord) -> Result<HostedRecord, RecordError> {
        record.body(HOSTED_RECORD_KIND, HOSTED_RECORD_VERSION)
    }
}

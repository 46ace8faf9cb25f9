//! What a restarted node needs to take a container back: the container tier's part of its
//! sandbox record ([`brig_core::records::TierRecord`] of kind [`RECORD_KIND`]).

use std::path::PathBuf;

use brig_core::records::{RecordError, TierRecord};
use serde::{Deserialize, Serialize};

/// The kind of a container's tier record.
pub const RECORD_KIND: &str = "container";
/// The version written; every one up to it reads.
pub const RECORD_VERSION: u32 = 1;

/// A container's record (version 1; the format of a sandbox record's `container` field
/// before records were tagged).
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

impl ContainerRecord {
    pub fn to_tier(&self) -> Result<TierRecord, RecordError> {
        TierRecord::new(RECORD_KIND, RECORD_VERSION, self)
    }

    pub fn from_tier(record: &TierRecord) -> Result<ContainerRecord, RecordError> {
        record.body(RECORD_KIND, RECORD_VERSION)
    }
}

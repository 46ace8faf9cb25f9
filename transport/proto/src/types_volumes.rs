//! Volumes: named directory trees that outlive sandboxes, each on one node, mounted into
//! sandboxes at create and reached without a sandbox through [`VolumeOp`].

use serde::{Deserialize, Serialize};

use crate::FileKind;

/// Requests about volumes. A volume is named by its id (`vol-<node>-<hex>`, which names the
/// node that holds it) or by its name within the caller's project.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum VolumeOp {
    /// Reply: [`crate::Reply::Volume`].
    Create(VolumeCreateRequest),
    /// Reply: [`crate::Reply::Volumes`]: a project's (set for a project-scoped client), or
    /// with `None` every one (admins).
    List { project: Option<String> },
    /// Reply: [`crate::Reply::Volume`].
    Get { volume: String },
    /// Refused (`conflict`) while a sandbox mounts it.
    Delete { volume: String },
    /// Raw file bytes follow the frame until the stream ends; reply
    /// [`crate::Reply::VolumeEntries`] with the written file.
    Write(VolumeWriteRequest),
    /// Reply: [`crate::Reply::FileData`], then raw bytes until the stream ends.
    Read { volume: String, path: String, offset: u64, len: Option<u64> },
    /// A directory's entries `depth` levels down (1: its own), sorted by path.
    ListDir { volume: String, path: String, depth: u32 },
    /// One entry (a symlink itself).
    Stat { volume: String, path: String },
    /// Makes a directory (and with `parents` its parents); reply: its entry.
    Mkdir { volume: String, path: String, parents: bool, attrs: VolumeAttrs },
    /// Removes a file, a symlink or a directory tree.
    Remove { volume: String, path: String },
    /// Changes an entry's mode and owner; reply: its entry.
    SetAttrs { volume: String, path: String, attrs: VolumeAttrs },
}

/// What a new volume is called and how much it may hold.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeCreateRequest {
    /// Letters, digits, `.`, `_` and `-`; at most 64 bytes; unique within the project.
    pub name: String,
    /// Its quota; `None` takes the node's default.
    pub quota_mib: Option<u64>,
    /// The project it belongs to; set by the control plane (a node takes it from a
    /// project-scoped client's token).
    pub project: Option<String>,
}

/// Mode and owner of an entry made or changed in a volume; `None` keeps the default
/// (0644 files, 0755 directories, owned by the sandbox's root).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VolumeAttrs {
    pub mode: Option<u32>,
    /// Owner and group as a sandbox sees them.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// A file written into a volume (the bytes follow the request).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeWriteRequest {
    pub volume: String,
    pub path: String,
    /// Make missing parent directories.
    pub parents: bool,
    pub attrs: VolumeAttrs,
}

/// A volume as its node reports it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeInfo {
    pub id: String,
    pub name: String,
    pub project: Option<String>,
    pub quota_bytes: u64,
    pub used_bytes: u64,
    pub created_unix_ms: u64,
    /// The sandboxes that mount it now.
    pub mounted_by: Vec<String>,
}

/// One entry of a volume (paths from the volume's root, `/` first).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct VolumeEntry {
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    /// Owner and group as a sandbox sees them.
    pub uid: u32,
    pub gid: u32,
    pub atime_unix_ms: u64,
    pub mtime_unix_ms: u64,
    pub ctime_unix_ms: u64,
    /// A symlink's target.
    pub target: Option<String>,
}

/// A volume mounted into a sandbox at create.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    /// Its id or its name in the sandbox's project.
    pub volume: String,
    /// Absolute path in the sandbox.
    pub path: String,
    pub read_only: bool,
}

impl VolumeOp {
    pub fn kind(&self) -> &'static str {
        match self {
            VolumeOp::Create(_) => "volume_create",
            VolumeOp::List { .. } => "volume_list",
            VolumeOp::Get { .. } => "volume_get",
            VolumeOp::Delete { .. } => "volume_delete",
            VolumeOp::Write(_) => "volume_write",
            VolumeOp::Read { .. } => "volume_read",
            VolumeOp::ListDir { .. } => "volume_list_dir",
            VolumeOp::Stat { .. } => "volume_stat",
            VolumeOp::Mkdir { .. } => "volume_mkdir",
            VolumeOp::Remove { .. } => "volume_remove",
            VolumeOp::SetAttrs { .. } => "volume_set_attrs",
        }
    }

    /// The volume the operation is about; `None` for create and list.
    pub fn volume(&self) -> Option<&str> {
        match self {
            VolumeOp::Create(_) | VolumeOp::List { .. } => None,
            VolumeOp::Write(r) => Some(&r.volume),
            VolumeOp::Get { volume }
            | VolumeOp::Delete { volume }
            | VolumeOp::Read { volume, .. }
            | VolumeOp::ListDir { volume, .. }
            | VolumeOp::Stat { volume, .. }
            | VolumeOp::Mkdir { volume, .. }
            | VolumeOp::Remove { volume, .. }
            | VolumeOp::SetAttrs { volume, .. } => Some(volume),
        }
    }

    /// The volume the operation names, to be rewritten (a name becomes the id it stands for).
    pub fn volume_mut(&mut self) -> Option<&mut String> {
        match self {
            VolumeOp::Create(_) | VolumeOp::List { .. } => None,
            VolumeOp::Write(r) => Some(&mut r.volume),
            VolumeOp::Get { volume }
            | VolumeOp::Delete { volume }
            | VolumeOp::Read { volume, .. }
            | VolumeOp::ListDir { volume, .. }
            | VolumeOp::Stat { volume, .. }
            | VolumeOp::Mkdir { volume, .. }
            | VolumeOp::Remove { volume, .. }
            | VolumeOp::SetAttrs { volume, .. } => Some(volume),
        }
    }
}

//! Files and tools.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileWriteRequest {
    pub sandbox: String,
    pub path: String,
    /// Unix permission bits for a new file; `None` is 0644.
    pub mode: Option<u32>,
    pub append: bool,
    /// Create missing parent directories.
    pub parents: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileReadRequest {
    pub sandbox: String,
    pub path: String,
    pub offset: u64,
    /// Bytes to read; `None` reads to the end.
    pub len: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileStat {
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub modified_unix_ms: u64,
    /// Owner and group as the sandbox sees them (0 where a tier does not say).
    pub uid: u32,
    pub gid: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ToolWorld {
    /// Exports `brig:tool/tool`.
    Tool,
    /// Exports `wasi:cli/run`.
    Command,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ToolInfo {
    pub name: String,
    pub digest: String,
    pub world: ToolWorld,
    pub description: String,
    pub size_bytes: u64,
}

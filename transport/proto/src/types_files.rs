//! Files and tools.

use std::collections::BTreeMap;

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
    /// User metadata kept with the file (lowercase keys; empty where a tier keeps none).
    pub metadata: BTreeMap<String, String>,
}

/// Watch a directory (and, if asked, every directory below it, those made later too) for
/// changes as they happen. The replies are [`crate::Reply::FileEvents`] batches until the
/// client closes the stream; the first is empty and says the watch is in place.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileWatchRequest {
    pub sandbox: String,
    pub path: String,
    pub recursive: bool,
}

/// What happened to an entry, as E2B's envd names it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChange {
    /// Made, or moved in (its new name).
    Create,
    Write,
    Remove,
    /// Moved away (its old name).
    Rename,
    /// Its mode, owner, times or metadata changed.
    Chmod,
}

/// One change under a watched directory.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileEvent {
    /// The entry's path in the sandbox.
    pub path: String,
    pub change: FileChange,
    pub is_dir: bool,
}

/// A batch of changes, in the order they happened.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FileEvents {
    pub events: Vec<FileEvent>,
    /// Changes lost since the last batch because the watcher's queue was full (the client
    /// read too slowly, or the tree changed faster than a queue holds): the tree should be
    /// listed again.
    pub lost: bool,
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

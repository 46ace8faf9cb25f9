//! Metadata of files inside a sandbox, as every tier reports it.

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Metadata of one entry; `path` is as the sandbox sees it (relative to its workspace or root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mode: u32,
    pub modified_unix_ms: u64,
    /// Owner and group as the sandbox sees them (0 where a tier does not say).
    pub uid: u32,
    pub gid: u32,
}

/// Most entries one directory listing returns.
pub const MAX_LIST_ENTRIES: usize = 100_000;

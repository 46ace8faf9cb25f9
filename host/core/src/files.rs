//! Metadata of files inside a sandbox, as every tier reports it, and the user metadata a file
//! may carry.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// The user metadata kept with a file or directory ([`FileMetadata`]); empty where a
    /// tier keeps none.
    pub metadata: FileMetadata,
}

/// Most entries one directory listing returns.
pub const MAX_LIST_ENTRIES: usize = 100_000;

/// User metadata of a file: lowercase keys to printable values, kept with the file as
/// extended attributes named [`METADATA_XATTR_PREFIX`]`<key>` (so it follows the file through
/// a rename, and a command in the sandbox reads it with `getfattr`).
pub type FileMetadata = BTreeMap<String, String>;

/// The extended attributes that hold a file's metadata: E2B's names, so scripts written for
/// E2B find them.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";
/// Most metadata keys read from one file (more cannot fit in [`MAX_METADATA_BYTES`]).
pub const MAX_METADATA_KEYS: usize = 512;
/// Longest key: an attribute name is at most 255 bytes with its prefix (E2B's bound).
pub const MAX_METADATA_KEY_BYTES: usize = 255 - METADATA_XATTR_PREFIX.len();
/// Most bytes of one file's metadata, keys (each with its prefix) and values together: what
/// fits in one inode's attribute space on ext4 (E2B's bound).
pub const MAX_METADATA_BYTES: usize = 4096;

/// Why metadata was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata key {0:?} is not an HTTP token (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_METADATA_KEY_BYTES} bytes)")]
    BadKey(String),
    #[error("the value of metadata key {0:?} is not printable US-ASCII")]
    BadValue(String),
    #[error("{0} bytes of metadata (keys with their {prefix} prefix, and values); a file carries at most {MAX_METADATA_BYTES}", prefix = METADATA_XATTR_PREFIX)]
    TooLarge(usize),
}

/// `metadata` as it is kept: keys lowercased (as E2B's envd does), every key and value
/// checked, the whole within [`MAX_METADATA_BYTES`].
pub fn checked_metadata(metadata: &FileMetadata) -> Result<FileMetadata, MetadataError> {
    let mut out = FileMetadata::new();
    let mut bytes = 0;
    for (key, value) in metadata {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES || !key.chars().all(token) {
            return Err(MetadataError::BadKey(key.clone()));
        }
        if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(MetadataError::BadValue(key.clone()));
        }
        bytes += METADATA_XATTR_PREFIX.len() + key.len() + value.len();
        out.insert(key.to_ascii_lowercase(), value.clone());
    }
    if bytes > MAX_METADATA_BYTES {
        return Err(MetadataError::TooLarge(bytes));
    }
    Ok(out)
}

/// What happened to an entry under a watched directory, as E2B's envd names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// Made, or moved in (its new name).
    Create,
    Write,
    Remove,
    /// Moved away (its old name).
    Rename,
    /// Its mode, owner, times or extended attributes (metadata) changed.
    Chmod,
}

/// One change under a watched directory; `path` is as the sandbox sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changed {
    pub path: String,
    pub change: Change,
    pub is_dir: bool,
}

/// Changes in the order they happened; `lost` if some were lost before them (a queue was
/// full): whoever watches should look at the tree again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchBatch {
    pub changes: Vec<Changed>,
    pub lost: bool,
}

/// Most directories one recursive watch follows.
pub const MAX_WATCHED_DIRS: usize = 10_000;
/// Most changes in one [`WatchBatch`].
pub const MAX_WATCH_BATCH: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> FileMetadata {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn metadata_is_lowercased_and_bad_keys_values_and_sizes_are_refused() {
        let ok = checked_metadata(&meta(&[("Owner", "ann"), ("x-Tag", "a b~")])).expect("ok");
        assert_eq!(ok, meta(&[("owner", "ann"), ("x-tag", "a b~")]));
        assert_eq!(
            checked_metadata(&meta(&[("a b", "x")])),
            Err(MetadataError::BadKey("a b".into()))
        );
        assert_eq!(checked_metadata(&meta(&[("", "x")])), Err(MetadataError::BadKey("".into())));
        assert_eq!(
            checked_metadata(&meta(&[("k", "line\nbreak")])),
            Err(MetadataError::BadValue("k".into()))
        );
        let long = "k".repeat(MAX_METADATA_KEY_BYTES + 1);
        assert_eq!(checked_metadata(&meta(&[(&long, "")])), Err(MetadataError::BadKey(long)));
        let fits = meta(&[("k", &"v".repeat(MAX_METADATA_BYTES - 10))]);
        assert!(checked_metadata(&fits).is_ok());
        let big = meta(&[("k", &"v".repeat(MAX_METADATA_BYTES - 9))]);
        assert_eq!(checked_metadata(&big), Err(MetadataError::TooLarge(MAX_METADATA_BYTES + 1)));
    }
}

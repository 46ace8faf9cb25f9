//! The workspace of a stateful fncall sandbox, and file operations on it from the host side.
//!
//! Guests see the workspace through WASI preopens; the API's file operations go through a
//! capability handle (`cap_std::fs::Dir`) on the same directory. Both resolve every path
//! beneath the workspace: `..`, absolute paths and symlinks that point outside fail with
//! [`FncallError::PathEscape`] instead of reaching the host.

use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};

use crate::FncallError;

/// A sandbox workspace directory.
pub struct Workspace {
    path: PathBuf,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace").field("path", &self.path).finish()
    }
}

pub use brig_core::files::{Entry, EntryKind, MAX_LIST_ENTRIES};

impl Workspace {
    /// Creates a new, empty workspace directory (mode 0700).
    pub fn create(path: &Path) -> Result<Workspace, FncallError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|source| FncallError::Io { path: path.to_owned(), source })?;
        Self::open(path)
    }

    /// Opens an existing workspace.
    pub fn open(path: &Path) -> Result<Workspace, FncallError> {
        let workspace = Workspace { path: path.to_owned() };
        workspace.dir()?;
        Ok(workspace)
    }

    /// The workspace directory, opened for one operation: a node holds 100,000 workspaces
    /// and cannot keep a descriptor open for each.
    fn dir(&self) -> Result<Dir, FncallError> {
        Dir::open_ambient_dir(&self.path, ambient_authority())
            .map_err(|source| FncallError::Io { path: self.path.clone(), source })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the workspace directory and everything in it. A call still running in it fails
    /// its file operations from then on.
    pub fn remove(&self) -> Result<(), FncallError> {
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(FncallError::Io { path: self.path.clone(), source }),
        }
    }

    /// Opens a file for reading.
    pub fn open_read(&self, path: &str) -> Result<std::fs::File, FncallError> {
        let rel = relative(path)?;
        let file = self.dir()?.open(rel).map_err(|e| file_err(path, e))?;
        Ok(file.into_std())
    }

    /// Opens a file for writing: truncating, or appending; creating parents if asked.
    pub fn open_write(
        &self,
        path: &str,
        append: bool,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<std::fs::File, FncallError> {
        use cap_std::fs::OpenOptionsExt;
        let rel = relative(path)?;
        if parents {
            if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
                self.dir()?.create_dir_all(parent).map_err(|e| file_err(path, e))?;
            }
        }
        let mut options = OpenOptions::new();
        options
            .write(true)
            .create(true)
            .append(append)
            .truncate(!append)
            .mode(mode.unwrap_or(0o644) & 0o777);
        let file = self.dir()?.open_with(rel, &options).map_err(|e| file_err(path, e))?;
        Ok(file.into_std())
    }

    /// Metadata of one entry (symlinks are not followed).
    pub fn stat(&self, path: &str) -> Result<Entry, FncallError> {
        let rel = relative(path)?;
        let meta = if rel.as_os_str().is_empty() {
            self.dir()?.dir_metadata()
        } else {
            self.dir()?.symlink_metadata(&rel)
        }
        .map_err(|e| file_err(path, e))?;
        Ok(entry(display(&rel), &meta))
    }

    /// Entries of a directory, sorted by name.
    pub fn list(&self, path: &str) -> Result<Vec<Entry>, FncallError> {
        let rel = relative(path)?;
        let read = if rel.as_os_str().is_empty() {
            self.dir()?.entries()
        } else {
            self.dir()?.read_dir(&rel)
        }
        .map_err(|e| file_err(path, e))?;
        let mut out = Vec::new();
        for item in read.take(MAX_LIST_ENTRIES) {
            let item = item.map_err(|e| file_err(path, e))?;
            let meta = item.metadata().map_err(|e| file_err(path, e))?;
            out.push(entry(display(&rel.join(item.file_name())), &meta));
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    pub fn mkdir(&self, path: &str, parents: bool) -> Result<(), FncallError> {
        let rel = relative(path)?;
        if parents { self.dir()?.create_dir_all(&rel) } else { self.dir()?.create_dir(&rel) }
            .map_err(|e| file_err(path, e))
    }

    pub fn remove_path(&self, path: &str, recursive: bool) -> Result<(), FncallError> {
        let rel = relative(path)?;
        if rel.as_os_str().is_empty() {
            return Err(FncallError::PathEscape(path.to_string()));
        }
        let meta = self.dir()?.symlink_metadata(&rel).map_err(|e| file_err(path, e))?;
        let result = if !meta.is_dir() {
            self.dir()?.remove_file(&rel)
        } else if recursive {
            self.dir()?.remove_dir_all(&rel)
        } else {
            self.dir()?.remove_dir(&rel)
        };
        result.map_err(|e| file_err(path, e))
    }

    /// Total bytes of regular files in the workspace (for status and quotas).
    pub fn disk_usage(&self) -> u64 {
        fn walk(dir: &Dir, depth: usize) -> u64 {
            if depth > 64 {
                return 0;
            }
            let Ok(entries) = dir.entries() else { return 0 };
            let mut total = 0;
            for item in entries.flatten() {
                let Ok(ft) = item.file_type() else { continue };
                if ft.is_dir() {
                    if let Ok(sub) = item.open_dir() {
                        total += walk(&sub, depth + 1);
                    }
                } else if let Ok(meta) = item.metadata() {
                    total += meta.len();
                }
            }
            total
        }
        self.dir().map_or(0, |dir| walk(&dir, 0))
    }
}

/// Turns an API path (`/workspace/x`, `/x`, `x`, `./x`) into a path relative to the workspace.
/// `..` is refused outright; symlinks are resolved safely by cap-std.
fn relative(path: &str) -> Result<PathBuf, FncallError> {
    let trimmed = path.strip_prefix(crate::invoke::GUEST_WORKSPACE).unwrap_or(path);
    let mut out = PathBuf::new();
    for part in Path::new(trimmed).components() {
        match part {
            std::path::Component::Normal(p) => out.push(p),
            std::path::Component::RootDir | std::path::Component::CurDir => {}
            _ => return Err(FncallError::PathEscape(path.to_string())),
        }
    }
    Ok(out)
}

fn display(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".to_string()
    } else {
        rel.to_string_lossy().into_owned()
    }
}

fn file_err(path: &str, source: std::io::Error) -> FncallError {
    // cap-std reports an escape attempt (symlink out of the tree) as PermissionDenied.
    if source.kind() == std::io::ErrorKind::PermissionDenied
        && source.to_string().contains("outside of the filesystem")
    {
        return FncallError::PathEscape(path.to_string());
    }
    FncallError::File { path: path.to_string(), source }
}

fn entry(path: String, meta: &cap_std::fs::Metadata) -> Entry {
    use cap_std::fs::MetadataExt;
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        EntryKind::Symlink
    } else if ft.is_dir() {
        EntryKind::Dir
    } else if ft.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    };
    let modified_unix_ms = meta
        .modified()
        .ok()
        .and_then(|t| t.into_std().duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    let (uid, gid) = (meta.uid(), meta.gid());
    let size = meta.len();
    let mode = meta.mode() & 0o7777;
    Entry { path, kind, size, mode, modified_unix_ms, uid, gid, metadata: Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cannot_escape() {
        let tmp = tempfile::tempdir().expect("tmp");
        let ws = Workspace::create(&tmp.path().join("ws")).expect("create");
        std::fs::write(tmp.path().join("secret"), b"s").expect("secret");
        std::os::unix::fs::symlink(tmp.path().join("secret"), ws.path().join("link"))
            .expect("symlink");
        std::os::unix::fs::symlink("/etc", ws.path().join("etc")).expect("symlink");
        assert!(matches!(ws.open_read("../secret"), Err(FncallError::PathEscape(_))));
        assert!(ws.open_read("link").is_err());
        assert!(ws.open_read("etc/passwd").is_err());
        assert!(ws.open_write("etc/x", false, false, None).is_err());
        // An absolute path means "from the workspace root", never the host root.
        assert!(ws.open_read("/etc/passwd").is_err());
    }

    #[test]
    fn write_read_list_remove() {
        use std::io::{Read, Write};
        let tmp = tempfile::tempdir().expect("tmp");
        let ws = Workspace::create(&tmp.path().join("ws")).expect("create");
        ws.open_write("a/b/c.txt", false, true, None)
            .expect("open")
            .write_all(b"hi")
            .expect("write");
        let mut s = String::new();
        ws.open_read("/workspace/a/b/c.txt").expect("read").read_to_string(&mut s).expect("read");
        assert_eq!(s, "hi");
        let listed = ws.list("a/b").expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].path, "a/b/c.txt");
        assert_eq!(listed[0].kind, EntryKind::File);
        assert_eq!(ws.disk_usage(), 2);
        assert!(ws.remove_path("a", false).is_err());
        ws.remove_path("a", true).expect("remove");
        assert!(ws.stat("a").is_err());
    }
}

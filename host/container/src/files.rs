//! File operations inside a container from the node, confined to the container's root.
//!
//! Every path is resolved with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` against the
//! container's root directory (`/proc/<init>/root`): absolute symlinks and `..` resolve inside
//! the container exactly as they would for a process in it, and nothing resolves outside it.
//! The last component of a path that is created or removed is always handled relative to its
//! already-resolved parent, without following it. Files and directories the node creates are
//! owned by container root.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use brig_core::files::{Entry, EntryKind, MAX_LIST_ENTRIES};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path:?}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0:?} names no file (empty, `.` or `..` as the last component)")]
    BadPath(String),
    #[error("{0:?} is not a regular file")]
    NotRegular(String),
}

impl FileError {
    /// The underlying I/O error kind, if any.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            FileError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

fn err(path: &str) -> impl FnOnce(rustix::io::Errno) -> FileError + '_ {
    move |e| FileError::Io { path: path.to_string(), source: e.into() }
}

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// A container's root directory and the owner for new files.
#[derive(Clone, Copy)]
pub struct RootDir<'a> {
    root: BorrowedFd<'a>,
    owner: u32,
}

/// A container's root directory opened for a few operations (see
/// [`crate::runtime::Container::root_dir`]).
pub struct OwnedRootDir {
    root: OwnedFd,
    owner: u32,
}

impl OwnedRootDir {
    pub fn new(root: OwnedFd, owner: u32) -> Self {
        OwnedRootDir { root, owner }
    }

    pub fn dir(&self) -> RootDir<'_> {
        RootDir::new(self.root.as_fd(), self.owner)
    }
}

impl<'a> RootDir<'a> {
    /// `owner`: host uid (and gid) new files get: container root.
    pub fn new(root: BorrowedFd<'a>, owner: u32) -> Self {
        RootDir { root, owner }
    }

    fn resolve(&self, path: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, FileError> {
        let rel = if path.is_empty() { "/" } else { path };
        rustix::fs::openat2(self.root, rel, flags | OFlags::CLOEXEC, mode, RESOLVE)
            .map_err(err(path))
    }

    /// The resolved parent directory and the final name.
    fn parent<'p>(&self, path: &'p str) -> Result<(OwnedFd, &'p str), FileError> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = match trimmed.rfind('/') {
            Some(i) => (&trimmed[..=i], &trimmed[i + 1..]),
            None => ("/", trimmed),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(FileError::BadPath(path.to_string()));
        }
        Ok((self.resolve(dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?, name))
    }

    fn give_to_owner(&self, fd: BorrowedFd<'_>, path: &str) -> Result<(), FileError> {
        let st = rustix::fs::fstat(fd).map_err(err(path))?;
        if st.st_uid == 0 {
            let id = Some(rustix::fs::Uid::from_raw(self.owner));
            rustix::fs::fchown(fd, id, Some(rustix::fs::Gid::from_raw(self.owner)))
                .map_err(err(path))?;
        }
        Ok(())
    }

    /// Opens a regular file for reading (never blocks on a FIFO).
    pub fn open_read(&self, path: &str) -> Result<std::fs::File, FileError> {
        let fd =
            self.resolve(path, OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK, Mode::empty())?;
        let st = rustix::fs::fstat(&fd).map_err(err(path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(FileError::NotRegular(path.to_string()));
        }
        rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY).map_err(err(path))?;
        Ok(std::fs::File::from(fd))
    }

    /// Opens a file for writing (truncating, or appending), creating it and, if asked, its
    /// parent directories.
    pub fn open_write(
        &self,
        path: &str,
        append: bool,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<std::fs::File, FileError> {
        if parents {
            let trimmed = path.trim_end_matches('/');
            if let Some(i) = trimmed.rfind('/') {
                if i > 0 {
                    self.mkdir(&trimmed[..i], true)?;
                }
            }
        }
        let (parent, name) = self.parent(path)?;
        let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOCTTY | OFlags::CLOEXEC;
        flags |= if append { OFlags::APPEND } else { OFlags::TRUNC };
        // The final component is resolved in the (confined) parent, following a symlink only
        // through a second confined resolution of the whole path.
        let fd = match rustix::fs::openat(
            &parent,
            name,
            flags | OFlags::NOFOLLOW,
            Mode::from_raw_mode(mode.unwrap_or(0o644) & 0o7777),
        ) {
            Err(rustix::io::Errno::LOOP) => {
                self.resolve(path, flags, Mode::from_raw_mode(0o644))?
            }
            other => other.map_err(err(path))?,
        };
        self.give_to_owner(fd.as_fd(), path)?;
        Ok(std::fs::File::from(fd))
    }

    /// Metadata of one entry (a symlink itself, not its target).
    pub fn stat(&self, path: &str) -> Result<Entry, FileError> {
        let trimmed = path.trim_end_matches('/');
        let st = if trimmed.is_empty() || trimmed == "." {
            rustix::fs::fstat(self.root).map_err(err(path))?
        } else {
            let (parent, name) = self.parent(path)?;
            rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err(path))?
        };
        Ok(entry(display(path), &st))
    }

    /// Entries of a directory, sorted by name.
    pub fn list(&self, path: &str) -> Result<Vec<Entry>, FileError> {
        let dir = self.resolve(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let mut reader = rustix::fs::Dir::read_from(&dir).map_err(err(path))?;
        let mut out = Vec::new();
        let base = display(path);
        while let Some(item) = reader.read() {
            let item = item.map_err(err(path))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let Ok(st) = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let full = if base == "/" { format!("/{name}") } else { format!("{base}/{name}") };
            out.push(entry(full, &st));
            if out.len() >= MAX_LIST_ENTRIES {
                break;
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Makes a directory (and its parents, if asked), owned by container root.
    pub fn mkdir(&self, path: &str, parents: bool) -> Result<(), FileError> {
        if !parents {
            let (parent, name) = self.parent(path)?;
            rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)).map_err(err(path))?;
            return self.chown_at(&parent, name, path);
        }
        let mut prefix = String::new();
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            let parent_path = if prefix.is_empty() { "/".to_string() } else { prefix.clone() };
            prefix = format!("{prefix}/{part}");
            match self.resolve(&prefix, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()) {
                Ok(_) => continue,
                Err(FileError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let parent =
                self.resolve(&parent_path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
            match rustix::fs::mkdirat(&parent, part, Mode::from_raw_mode(0o755)) {
                Ok(()) => self.chown_at(&parent, part, path)?,
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(err(path)(e)),
            }
        }
        Ok(())
    }

    fn chown_at(&self, parent: &OwnedFd, name: &str, path: &str) -> Result<(), FileError> {
        let id = Some(rustix::fs::Uid::from_raw(self.owner));
        rustix::fs::chownat(
            parent,
            name,
            id,
            Some(rustix::fs::Gid::from_raw(self.owner)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(err(path))
    }

    /// Removes a file, symlink or (with `recursive`) a directory tree.
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), FileError> {
        let (parent, name) = self.parent(path)?;
        let st = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err(path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return rustix::fs::unlinkat(&parent, name, AtFlags::empty()).map_err(err(path));
        }
        if recursive {
            remove_tree(&parent, name, 0).map_err(err(path))?;
        }
        rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR).map_err(err(path))
    }
}

/// Empties directory `name` in `parent`, never following symlinks.
fn remove_tree(parent: &OwnedFd, name: &str, depth: usize) -> rustix::io::Result<()> {
    if depth > 256 {
        return Err(rustix::io::Errno::LOOP);
    }
    let dir = rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    let mut reader = rustix::fs::Dir::read_from(&dir)?;
    while let Some(item) = reader.read() {
        let item = item?;
        let n = item.file_name().to_string_lossy().into_owned();
        if n != "." && n != ".." {
            names.push((n, item.file_type() == FileType::Directory));
        }
    }
    for (n, is_dir) in names {
        if is_dir {
            remove_tree(&dir, &n, depth + 1)?;
            rustix::fs::unlinkat(&dir, n.as_str(), AtFlags::REMOVEDIR)?;
        } else {
            rustix::fs::unlinkat(&dir, n.as_str(), AtFlags::empty())?;
        }
    }
    Ok(())
}

fn display(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() || trimmed == "." {
        "/".to_string()
    } else if trimmed.starts_with('/') {
        trimmed.to_string()
    } else {
        format!("/{trimmed}")
    }
}

fn entry(path: String, st: &rustix::fs::Stat) -> Entry {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let modified_unix_ms =
        u64::try_from(st.st_mtime).unwrap_or(0) * 1000 + st.st_mtime_nsec / 1_000_000;
    Entry {
        path,
        kind,
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: st.st_mode & 0o7777,
        modified_unix_ms,
    }
}

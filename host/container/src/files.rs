//! File operations inside a container from the node, confined to the container's root.
//!
//! Every path is resolved with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` against the
//! container's root directory (`/proc/<init>/root`): absolute symlinks and `..` resolve inside
//! the container exactly as they would for a process in it, and nothing resolves outside it.
//! The last component of a path that is created or removed is always handled relative to its
//! already-resolved parent, without following it. Files and directories the node creates are
//! owned by container root.
//!
//! Only the sandbox's own files move through here. An existing file is first resolved without
//! being opened (`O_PATH`), checked, and only then opened through that resolution: a FIFO, a
//! device or a socket is refused before anything could block on it, and so is a file of a
//! kernel file system (proc, sysfs, cgroup, …), whose writes and many reads act with the
//! opener's rights, here the node's rather than the sandbox's ([`DISK_FILESYSTEMS`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use brig_core::files::{Entry, EntryKind, FileMetadata, MAX_LIST_ENTRIES};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

use crate::file_metadata;

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
    #[error("{0:?} is not a regular file (a directory, FIFO, device or socket): the files API moves regular files only")]
    NotRegular(String),
    #[error("{path:?} is on a kernel file system ({magic:#x}), not the sandbox's disk: the files API moves the sandbox's own files only (a command in the sandbox may use it)")]
    KernelFile { path: String, magic: u32 },
    #[error("{path:?} holds more than {max} directories: too many to watch")]
    TooManyDirs { path: String, max: usize },
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

/// File systems that hold a sandbox's own files (`statfs` magic numbers): its overlay root and
/// upper tmpfs, its layers (EROFS, FUSE), volumes and disks. Anything else is a kernel file
/// system whose files the file API refuses.
pub const DISK_FILESYSTEMS: &[(u32, &str)] = &[
    (0x794c_7630, "overlay"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58f6, "ramfs"),
    (0x0000_ef53, "ext2/3/4"),
    (0x5846_5342, "xfs"),
    (0x9123_683e, "btrfs"),
    (0xe0f5_e1e2, "erofs"),
    (0x6573_5546, "fuse"),
    (0x7371_7368, "squashfs"),
    (0xf2f5_2010, "f2fs"),
    (0x0000_6969, "nfs"),
    (0x0102_1997, "9p"),
];

/// Dangling links a write follows to make the file they name, at most.
const MAX_DANGLING_LINKS: usize = 8;

/// Names of one directory read before they are removed, at most (then it is read again).
const REMOVE_BATCH: usize = 1024;

/// Where a link at `path` pointing at `target` leads: absolute targets from the root,
/// relative ones from the link's directory.
fn link_target(path: &str, target: &str) -> String {
    if target.starts_with('/') {
        return target.to_string();
    }
    let trimmed = path.trim_end_matches('/');
    let dir = trimmed.rfind('/').map_or("", |i| &trimmed[..i]);
    format!("{dir}/{target}")
}

/// `Ok` if `fd` (any descriptor, `O_PATH` too) is on one of [`DISK_FILESYSTEMS`].
fn check_disk_fs(fd: BorrowedFd<'_>, path: &str) -> Result<(), FileError> {
    let st = rustix::fs::fstatfs(fd).map_err(err(path))?;
    // `f_type` is a C long holding a 32-bit magic number.
    let magic = st.f_type as u32;
    if DISK_FILESYSTEMS.iter().any(|(m, _)| *m == magic) {
        Ok(())
    } else {
        Err(FileError::KernelFile { path: path.to_string(), magic })
    }
}

/// `Ok` if `fd` (any descriptor, `O_PATH` too) is on the sandbox's disks, not a kernel file
/// system.
pub(crate) fn on_disk(fd: BorrowedFd<'_>) -> Result<(), FileError> {
    check_disk_fs(fd, "")
}

/// `Ok` if `fd` is a regular file on the sandbox's disk.
fn check_data_file(fd: BorrowedFd<'_>, path: &str) -> Result<(), FileError> {
    let st = rustix::fs::fstat(fd).map_err(err(path))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(FileError::NotRegular(path.to_string()));
    }
    check_disk_fs(fd, path)
}

/// Opens the file an `O_PATH` descriptor resolved (the same inode, whatever the path now
/// names) with `flags`.
fn reopen(found: &OwnedFd, flags: OFlags, path: &str) -> Result<OwnedFd, FileError> {
    use std::os::fd::AsRawFd;
    let through = format!("/proc/self/fd/{}", found.as_raw_fd());
    rustix::fs::open(through.as_str(), flags | OFlags::CLOEXEC | OFlags::NOCTTY, Mode::empty())
        .map_err(err(path))
}

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

    /// The root directory itself.
    pub fn root(&self) -> BorrowedFd<'a> {
        self.root
    }

    /// A directory, resolved in the root without being opened (`O_PATH`).
    pub fn open_dir(&self, path: &str) -> Result<OwnedFd, FileError> {
        self.resolve(path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
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

    /// Opens a regular file of the sandbox's disk for reading; anything else is refused
    /// before it is opened (so nothing blocks on a FIFO or a device).
    pub fn open_read(&self, path: &str) -> Result<std::fs::File, FileError> {
        let found = self.resolve(path, OFlags::PATH, Mode::empty())?;
        check_data_file(found.as_fd(), path)?;
        // Non-blocking: a lease a process of the sandbox holds on the file makes the open
        // fail at once (EAGAIN) instead of waiting for the lease to break. Reads of a regular
        // file do not depend on the flag.
        Ok(std::fs::File::from(reopen(&found, OFlags::RDONLY | OFlags::NONBLOCK, path)?))
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
        self.open_write_following(path, append, parents, mode, MAX_DANGLING_LINKS)
    }

    fn open_write_following(
        &self,
        path: &str,
        append: bool,
        parents: bool,
        mode: Option<u32>,
        links_left: usize,
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
        check_disk_fs(parent.as_fd(), path)?;
        let access = OFlags::WRONLY | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let mode = Mode::from_raw_mode(mode.unwrap_or(0o644) & 0o7777);
        // A new file is made in the (confined) parent, never through a link: a regular file.
        let made = rustix::fs::openat(
            &parent,
            name,
            access | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
            mode,
        );
        let fd = match made {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => {
                // An existing entry, or a link: resolved in the root without opening it,
                // checked, then opened through that resolution.
                match self.resolve(path, OFlags::PATH, Mode::empty()) {
                    Ok(found) => {
                        check_data_file(found.as_fd(), path)?;
                        let how = if append { OFlags::APPEND } else { OFlags::TRUNC };
                        reopen(&found, access | how, path)?
                    }
                    // A dangling link: its target is made the way any new file is, in its
                    // own (confined) parent, never through a link.
                    Err(FileError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        let target =
                            rustix::fs::readlinkat(&parent, name, Vec::new()).map_err(err(path))?;
                        if links_left == 0 {
                            return Err(err(path)(rustix::io::Errno::LOOP));
                        }
                        let target = link_target(path, &target.to_string_lossy());
                        let raw = mode.as_raw_mode();
                        return self.open_write_following(
                            &target,
                            append,
                            false,
                            Some(raw),
                            links_left - 1,
                        );
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(err(path)(e)),
        };
        // Writes to a regular file block as the disk does, not as a reader would.
        let flags = rustix::fs::fcntl_getfl(&fd).map_err(err(path))?;
        rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK).map_err(err(path))?;
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
            let st =
                rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err(path))?;
            let mut found = entry(display(path), &st);
            found.metadata = file_metadata::read_at(parent.as_fd(), name, found.kind);
            return Ok(found);
        };
        Ok(entry(display(path), &st))
    }

    /// Makes `metadata` the metadata of a file or directory of the sandbox's disk (resolved in
    /// the root; anything else is refused before it is opened; an empty map clears it); its
    /// entry after.
    pub fn set_metadata(&self, path: &str, metadata: &FileMetadata) -> Result<Entry, FileError> {
        let found = self.resolve(path, OFlags::PATH, Mode::empty())?;
        check_disk_fs(found.as_fd(), path)?;
        let kind = FileType::from_raw_mode(rustix::fs::fstat(&found).map_err(err(path))?.st_mode);
        if !matches!(kind, FileType::RegularFile | FileType::Directory) {
            return Err(FileError::NotRegular(path.to_string()));
        }
        file_metadata::write(found.as_fd(), metadata).map_err(err(path))?;
        let st = rustix::fs::fstat(&found).map_err(err(path))?;
        let mut out = entry(display(path), &st);
        out.metadata = file_metadata::read(found.as_fd());
        Ok(out)
    }

    /// The whole `lstat` of one entry (a symlink itself), with its target if it is one.
    pub fn lstat(&self, path: &str) -> Result<(rustix::fs::Stat, Option<String>), FileError> {
        let trimmed = path.trim_end_matches('/');
        if trimmed.is_empty() || trimmed == "." {
            return Ok((rustix::fs::fstat(self.root).map_err(err(path))?, None));
        }
        let (parent, name) = self.parent(path)?;
        let st = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).map_err(err(path))?;
        let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            let link = rustix::fs::readlinkat(&parent, name, Vec::new()).map_err(err(path))?;
            Some(link.to_string_lossy().into_owned())
        } else {
            None
        };
        Ok((st, target))
    }

    /// Sets the mode and the owner (host ids) of a regular file or a directory, resolved in
    /// the root; anything else is refused before it is opened.
    pub fn set_attrs(
        &self,
        path: &str,
        mode: Option<u32>,
        owner: (Option<u32>, Option<u32>),
    ) -> Result<(), FileError> {
        let found = self.resolve(path, OFlags::PATH, Mode::empty())?;
        check_disk_fs(found.as_fd(), path)?;
        let kind = FileType::from_raw_mode(rustix::fs::fstat(&found).map_err(err(path))?.st_mode);
        if !matches!(kind, FileType::RegularFile | FileType::Directory) {
            return Err(FileError::NotRegular(path.to_string()));
        }
        let fd = reopen(&found, OFlags::RDONLY | OFlags::NONBLOCK, path)?;
        if let Some(mode) = mode {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o7777)).map_err(err(path))?;
        }
        if owner.0.is_some() || owner.1.is_some() {
            let (uid, gid) =
                (owner.0.map(rustix::fs::Uid::from_raw), owner.1.map(rustix::fs::Gid::from_raw));
            rustix::fs::fchown(&fd, uid, gid).map_err(err(path))?;
        }
        Ok(())
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
            let mut found = entry(full, &st);
            found.metadata = file_metadata::read_at(dir.as_fd(), &name, found.kind);
            out.push(found);
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
            check_disk_fs(parent.as_fd(), path)?;
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
            check_disk_fs(parent.as_fd(), path)?;
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
        check_disk_fs(parent.as_fd(), path)?;
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

/// Empties directory `name` in `parent`, never following symlinks nor crossing into another
/// file system (a mount inside the tree is refused with `EXDEV`), holding at most
/// [`REMOVE_BATCH`] names of a directory at a time.
fn remove_tree(parent: &OwnedFd, name: &str, depth: usize) -> rustix::io::Result<()> {
    let top = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?.st_dev;
    remove_tree_on(parent, name, depth, top)
}

fn remove_tree_on(parent: &OwnedFd, name: &str, depth: usize, dev: u64) -> rustix::io::Result<()> {
    if depth > 256 {
        return Err(rustix::io::Errno::LOOP);
    }
    loop {
        let dir = rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        if rustix::fs::fstat(&dir)?.st_dev != dev {
            return Err(rustix::io::Errno::XDEV);
        }
        let mut names = Vec::new();
        let mut reader = rustix::fs::Dir::read_from(&dir)?;
        while let Some(item) = reader.read() {
            let item = item?;
            let n = item.file_name().to_string_lossy().into_owned();
            if n != "." && n != ".." {
                names.push((n, item.file_type() == FileType::Directory));
                if names.len() >= REMOVE_BATCH {
                    break;
                }
            }
        }
        if names.is_empty() {
            return Ok(());
        }
        for (n, is_dir) in names {
            if is_dir {
                remove_tree_on(&dir, &n, depth + 1, dev)?;
                rustix::fs::unlinkat(&dir, n.as_str(), AtFlags::REMOVEDIR)?;
            } else {
                rustix::fs::unlinkat(&dir, n.as_str(), AtFlags::empty())?;
            }
        }
    }
}

/// A path as the sandbox sees it: absolute, no trailing slash (`/` for the root).
pub(crate) fn display(path: &str) -> String {
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
        uid: st.st_uid,
        gid: st.st_gid,
        metadata: FileMetadata::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Duration;

    use super::*;

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .expect("open root")
    }

    /// Runs `f` on a thread and fails if it does not return within 5 s (it blocked).
    fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(5)).expect("a file operation blocked")
    }

    #[test]
    fn fifos_and_devices_are_refused_without_blocking() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fifo = tmp.path().join("answer.txt");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o666), 0)
            .expect("mkfifo");
        let root = tmp.path().to_path_buf();
        let (write, read) = within_5s(move || {
            let fd = open_dir(&root);
            let dir = RootDir::new(fd.as_fd(), 0);
            let w = dir.open_write("/answer.txt", false, false, None).map(|_| ());
            let r = dir.open_read("answer.txt").map(|_| ());
            (w, r)
        });
        assert!(matches!(write, Err(FileError::NotRegular(_))), "{write:?}");
        assert!(matches!(read, Err(FileError::NotRegular(_))), "{read:?}");
        // A device, seen through the host's root.
        let host = open_dir(std::path::Path::new("/"));
        let dir = RootDir::new(host.as_fd(), 0);
        let null = dir.open_write("/dev/null", false, false, None).map(|_| ());
        assert!(matches!(null, Err(FileError::NotRegular(_))), "{null:?}");
        let tty = dir.open_read("/dev/tty").map(|_| ());
        assert!(matches!(tty, Err(FileError::NotRegular(_))), "{tty:?}");
    }

    #[test]
    fn kernel_files_are_refused() {
        let host = open_dir(std::path::Path::new("/"));
        let dir = RootDir::new(host.as_fd(), 0);
        for path in ["/proc/self/status", "/proc/1/mem", "/sys/kernel/uevent_seqnum"] {
            let read = dir.open_read(path).map(|_| ());
            assert!(matches!(read, Err(FileError::KernelFile { .. })), "{path}: {read:?}");
        }
        // Refused before anything is opened for writing.
        for path in ["/proc/self/timerslack_ns", "/proc/self/autogroup", "/sys/kernel/new"] {
            let write = dir.open_write(path, false, false, None).map(|_| ());
            assert!(matches!(write, Err(FileError::KernelFile { .. })), "{path}: {write:?}");
        }
        // cgroupfs where this host has it (v1: /sys/fs/cgroup itself is a tmpfs), sysfs.
        let cgroups = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
            .into_iter()
            .find(|p| std::path::Path::new(p).join("cgroup.procs").exists())
            .unwrap_or("/sys/kernel");
        for parent in [cgroups, "/sys/kernel"] {
            let path = format!("{parent}/brig-test-refused");
            let mkdir = dir.mkdir(&path, false);
            let made = std::path::Path::new(&path).exists();
            if made {
                // A regression made it: leave the host as it was before failing.
                let _ = std::fs::remove_dir(&path);
            }
            assert!(matches!(mkdir, Err(FileError::KernelFile { .. })), "{path}: {mkdir:?}");
            assert!(!made, "{path} was made");
        }
    }

    #[test]
    fn regular_files_are_written_read_and_appended_through_links() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink("/data/real.txt", tmp.path().join("link")).expect("link");
        let fd = open_dir(tmp.path());
        let dir = RootDir::new(fd.as_fd(), rustix::process::getuid().as_raw());
        let mut f = dir.open_write("/data/real.txt", false, true, Some(0o600)).expect("new");
        f.write_all(b"one\n").expect("write");
        drop(f);
        // An existing file through a link inside the root: truncated, then appended to.
        let mut f = dir.open_write("/link", false, false, None).expect("through link");
        f.write_all(b"two\n").expect("write");
        drop(f);
        let mut f = dir.open_write("/data/real.txt", true, false, None).expect("append");
        f.write_all(b"three\n").expect("append");
        drop(f);
        let mut text = String::new();
        dir.open_read("/link").expect("read").read_to_string(&mut text).expect("read");
        assert_eq!(text, "two\nthree\n");
        let st = std::fs::metadata(tmp.path().join("data/real.txt")).expect("stat");
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&st.permissions()) & 0o777, 0o600);
        // A dangling link's target is made inside the root.
        std::os::unix::fs::symlink("/made.txt", tmp.path().join("dangling")).expect("link");
        dir.open_write("/dangling", false, false, None)
            .expect("dangling")
            .write_all(b"x")
            .expect("write");
        assert_eq!(std::fs::read(tmp.path().join("made.txt")).expect("made"), b"x");
        // Relative, through a chain, truncating what is there as any write does.
        std::fs::create_dir(tmp.path().join("sub")).expect("sub");
        std::os::unix::fs::symlink("../chain", tmp.path().join("sub/rel")).expect("link");
        std::os::unix::fs::symlink("made2.txt", tmp.path().join("chain")).expect("link");
        dir.open_write("/sub/rel", false, false, None)
            .expect("relative dangling")
            .write_all(b"yy")
            .expect("write");
        assert_eq!(std::fs::read(tmp.path().join("made2.txt")).expect("made2"), b"yy");
        dir.open_write("/sub/rel", false, false, None).expect("again").write_all(b"z").expect("w");
        assert_eq!(std::fs::read(tmp.path().join("made2.txt")).expect("made2"), b"z");
        // A loop of links is refused.
        std::os::unix::fs::symlink("loop2", tmp.path().join("loop1")).expect("link");
        std::os::unix::fs::symlink("loop1", tmp.path().join("loop2")).expect("link");
        assert!(dir.open_write("/loop1", false, false, None).is_err());
    }

    #[test]
    fn a_tree_is_removed_in_batches() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let big = tmp.path().join("t/big");
        std::fs::create_dir_all(&big).expect("mkdir");
        for i in 0..(REMOVE_BATCH * 2 + 7) {
            std::fs::write(big.join(format!("f{i}")), b"").expect("file");
        }
        std::fs::create_dir_all(tmp.path().join("t/a/b/c")).expect("mkdir");
        let fd = open_dir(tmp.path());
        let dir = RootDir::new(fd.as_fd(), rustix::process::getuid().as_raw());
        dir.remove("/t", true).expect("remove");
        assert!(!tmp.path().join("t").exists());
    }
}

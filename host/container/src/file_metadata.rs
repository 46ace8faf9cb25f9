//! User metadata of a sandbox's files ([`FileMetadata`]) as extended attributes named
//! [`METADATA_XATTR_PREFIX`]`<key>`. An entry is reached without being opened (`O_PATH`, its
//! attributes through `/proc/self/fd`), so reading or setting metadata never opens a FIFO or
//! a device and leaves no open or access time behind. Reading is best effort: an entry whose
//! attributes cannot be read (another file system, a symlink, a value the sandbox made too
//! large) shows the metadata that could be read, or none.

use std::os::fd::{AsRawFd, BorrowedFd};

use brig_core::files::{
    EntryKind, FileMetadata, MAX_METADATA_BYTES, MAX_METADATA_KEYS, METADATA_XATTR_PREFIX,
};
use rustix::fs::{Mode, OFlags, XattrFlags};

/// Bytes of attribute names read from one entry, at most (the kernel's own cap).
const MAX_NAME_LIST_BYTES: usize = 64 << 10;

fn through(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// The metadata of the entry `fd` (any descriptor, `O_PATH` too) resolves to.
pub(crate) fn read(fd: BorrowedFd<'_>) -> FileMetadata {
    let path = through(fd);
    let mut out = FileMetadata::new();
    let mut names = vec![0u8; 4096];
    let len = match rustix::fs::listxattr(path.as_str(), &mut names[..]) {
        Ok(n) => n,
        Err(rustix::io::Errno::RANGE) => {
            names.resize(MAX_NAME_LIST_BYTES, 0);
            match rustix::fs::listxattr(path.as_str(), &mut names[..]) {
                Ok(n) => n,
                Err(_) => return out,
            }
        }
        Err(_) => return out,
    };
    let mut value = vec![0u8; MAX_METADATA_BYTES];
    for name in names[..len].split(|b| *b == 0) {
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else { continue };
        let (Ok(key), Ok(full)) = (std::str::from_utf8(key), std::str::from_utf8(name)) else {
            continue;
        };
        if let Ok(n) = rustix::fs::getxattr(path.as_str(), full, &mut value[..]) {
            out.insert(key.to_string(), String::from_utf8_lossy(&value[..n]).into_owned());
            if out.len() >= MAX_METADATA_KEYS {
                break;
            }
        }
    }
    out
}

/// The metadata of entry `name` of directory `dir`, if it is a file or a directory.
pub(crate) fn read_at(dir: BorrowedFd<'_>, name: &str, kind: EntryKind) -> FileMetadata {
    if !matches!(kind, EntryKind::File | EntryKind::Dir) {
        return FileMetadata::new();
    }
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => read(std::os::fd::AsFd::as_fd(&fd)),
        Err(_) => FileMetadata::new(),
    }
}

/// Makes `metadata` the metadata of the entry `fd` resolves to (a file or directory, checked
/// by the caller): keys it lacks are removed, an empty one clears it.
pub(crate) fn write(fd: BorrowedFd<'_>, metadata: &FileMetadata) -> rustix::io::Result<()> {
    let path = through(fd);
    for key in read(fd).keys().filter(|k| !metadata.contains_key(*k)) {
        let name = format!("{METADATA_XATTR_PREFIX}{key}");
        match rustix::fs::removexattr(path.as_str(), name.as_str()) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => return Err(e),
        }
    }
    for (key, value) in metadata {
        let name = format!("{METADATA_XATTR_PREFIX}{key}");
        rustix::fs::setxattr(path.as_str(), name.as_str(), value.as_bytes(), XattrFlags::empty())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::files::{FileError, RootDir};

    fn meta(pairs: &[(&str, &str)]) -> FileMetadata {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn metadata_is_kept_listed_follows_a_rename_and_is_refused_on_fifos() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("d")).expect("mkdir");
        std::fs::write(tmp.path().join("d/a.txt"), b"a").expect("file");
        let root = rustix::fs::open(tmp.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .expect("root");
        let dir = RootDir::new(root.as_fd(), rustix::process::getuid().as_raw());

        let set = dir.set_metadata("/d/a.txt", &meta(&[("owner", "ann")])).expect("set");
        assert_eq!(set.metadata, meta(&[("owner", "ann")]));
        // Metadata is replaced whole: a key left out goes.
        let both = meta(&[("owner", "ann"), ("stage", "eval")]);
        dir.set_metadata("/d/a.txt", &meta(&[("stage", "x"), ("gone", "y")])).expect("again");
        dir.set_metadata("/d/a.txt", &both).expect("replace");
        assert_eq!(dir.stat("/d/a.txt").expect("stat").metadata, both);
        // Kept as an extended attribute of the file, so it follows a rename.
        std::fs::rename(tmp.path().join("d/a.txt"), tmp.path().join("d/b.txt")).expect("mv");
        let listed = dir.list("/d").expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].path.as_str(), &listed[0].metadata), ("/d/b.txt", &both));
        // A directory carries metadata too; an empty map clears it; a file without any
        // lists none.
        dir.set_metadata("/d", &meta(&[("k", "v")])).expect("dir");
        assert_eq!(dir.stat("/d").expect("stat").metadata, meta(&[("k", "v")]));
        assert!(dir.set_metadata("/d", &FileMetadata::new()).expect("clear").metadata.is_empty());
        std::fs::write(tmp.path().join("d/plain"), b"").expect("file");
        assert!(dir.stat("/d/plain").expect("stat").metadata.is_empty());
        // Attributes of other names are not metadata.
        rustix::fs::setxattr(
            tmp.path().join("d/plain").as_path(),
            "user.other",
            b"x",
            XattrFlags::empty(),
        )
        .expect("xattr");
        assert!(dir.stat("/d/plain").expect("stat").metadata.is_empty());
        // A FIFO is refused without being opened.
        let fifo = tmp.path().join("d/fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        let refused = dir.set_metadata("/d/fifo", &meta(&[("k", "v")]));
        assert!(matches!(refused, Err(FileError::NotRegular(_))), "{refused:?}");
        assert!(dir.set_metadata("/d/missing", &meta(&[("k", "v")])).is_err());
    }
}

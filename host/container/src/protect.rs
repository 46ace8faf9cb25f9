//! Protected paths, and host-side writes into a rootfs that a container's symlinks cannot
//! redirect.
//!
//! A sandbox spec can mark paths of its image read-only (test files the agent may read) or
//! hidden (reference answers). Before the container starts, each one is covered by a mount in
//! the merged rootfs: the path's content *from the image layers* (a read-only view of the lower
//! layers alone) bound read-only, or an empty read-only tmpfs (file: an empty read-only file)
//! when hidden. The container's mount namespace is created from the host's, so these mounts are
//! locked there: root inside cannot unmount or remount them (and seccomp refuses `mount` and
//! `umount` anyway). Whatever the agent's writable layer holds at a protected path, including
//! in a fork's copy of it, stays underneath. An evaluation fork (`reveal`) binds every
//! protected path read-only from the image, hidden ones included.
//!
//! Every path is resolved with `openat2(RESOLVE_IN_ROOT)` from the rootfs, so a symlink the
//! agent planted (a fork copies its writable layer) can never point a host-side mount or write
//! outside the container.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::rootfs::RootfsError;

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// One protected path of the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protected {
    /// Absolute path inside the container.
    pub path: String,
    /// Hidden (empty, read-only) rather than read-only.
    pub hidden: bool,
}

/// The protected paths of a container and whether hidden ones are revealed (evaluation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protections {
    pub paths: Vec<Protected>,
    pub reveal: bool,
    /// Host directories bound into the root first (volumes), at paths resolved in the root
    /// as protected ones are.
    pub binds: Vec<Bind>,
}

/// A host directory bound into a container (a volume).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    /// Absolute path inside the container (made, as a directory owned by container root,
    /// if missing).
    pub target: String,
    pub read_only: bool,
}

/// Binds each of `binds` into `merged` (the container's root, not yet started): nosuid,
/// nodev, and read-only where asked. The mounts are locked in the container's namespace as
/// protected paths' are.
pub fn bind(merged: &Path, binds: &[Bind], owner: u32) -> Result<(), RootfsError> {
    let root =
        rustix::fs::open(merged, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(err("open", &merged.to_string_lossy()))?;
    for b in binds {
        let target = open_or_create(root.as_fd(), &b.target, true, owner)?;
        let st = rustix::fs::fstat(&target).map_err(err("stat", &b.target))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            let source = std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                "a volume is mounted on a directory",
            );
            return Err(RootfsError::Io {
                what: "mount a volume at",
                path: b.target.clone().into(),
                source,
            });
        }
        let mnt = |what: &'static str| {
            let path = PathBuf::from(&b.target);
            move |source| RootfsError::Mount { what, path, source }
        };
        mount(Some(&b.source), &fd_path(&target), None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(mnt("bind a volume at"))?;
        let covered =
            open_in(root.as_fd(), &b.target, OFlags::PATH).map_err(err("open", &b.target))?;
        let mut flags =
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        if b.read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        mount(None::<&str>, &fd_path(&covered), None::<&str>, flags, None::<&str>)
            .map_err(mnt("set the options of the volume at"))?;
    }
    Ok(())
}

/// Checks a protected path: absolute, no `.` or `..` components, not the root itself.
pub fn validate(path: &str) -> Result<String, String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if !path.starts_with('/') || parts.is_empty() || parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(format!("{path:?} must be an absolute path below / without . or .."));
    }
    Ok(format!("/{}", parts.join("/")))
}

fn err(what: &'static str, path: &str) -> impl FnOnce(rustix::io::Errno) -> RootfsError {
    let path = PathBuf::from(path);
    move |e| RootfsError::Io { what, path, source: e.into() }
}

fn open_in(root: BorrowedFd<'_>, path: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(root, path, flags | OFlags::CLOEXEC, Mode::empty(), RESOLVE)
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Opens `path` in `root`, creating it (and its parents, as directories owned by `owner`) as a
/// directory or an empty file when it is missing.
fn open_or_create(
    root: BorrowedFd<'_>,
    path: &str,
    dir: bool,
    owner: u32,
) -> Result<OwnedFd, RootfsError> {
    if let Ok(fd) = open_in(root, path, OFlags::PATH) {
        return Ok(fd);
    }
    let mut parent =
        open_in(root, "/", OFlags::PATH | OFlags::DIRECTORY).map_err(err("open", "/"))?;
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for (i, name) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let sofar = format!("/{}", parts[..=i].join("/"));
        match open_in(root, &sofar, OFlags::PATH) {
            Ok(fd) => parent = fd,
            Err(_) => {
                let parent_dir = open_in(
                    root,
                    &format!("/{}", parts[..i].join("/")),
                    OFlags::DIRECTORY | OFlags::RDONLY,
                )
                .map_err(err("open", &sofar))?;
                if last && !dir {
                    let f = rustix::fs::openat(
                        &parent_dir,
                        *name,
                        OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::WRONLY
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o644),
                    )
                    .map_err(err("create", &sofar))?;
                    let _ = rustix::fs::fchown(&f, Some(uid(owner)), Some(gid(owner)));
                } else {
                    rustix::fs::mkdirat(&parent_dir, *name, Mode::from_raw_mode(0o755))
                        .map_err(err("mkdir", &sofar))?;
                    if let Ok(d) = rustix::fs::openat(
                        &parent_dir,
                        *name,
                        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                        Mode::empty(),
                    ) {
                        let _ = rustix::fs::fchown(&d, Some(uid(owner)), Some(gid(owner)));
                    }
                }
                parent = open_in(root, &sofar, OFlags::PATH).map_err(err("open", &sofar))?;
            }
        }
    }
    Ok(parent)
}

fn uid(id: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(id)
}

fn gid(id: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(id)
}

/// Covers every protected path of `merged` (the container's root, not yet started). `pristine`
/// is a read-only view of the image layers alone; `dir` the container's run directory.
pub fn apply(
    dir: &Path,
    merged: &Path,
    pristine: &Path,
    protections: &Protections,
    owner: u32,
) -> Result<(), RootfsError> {
    let root =
        rustix::fs::open(merged, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(err("open", &merged.to_string_lossy()))?;
    let image = rustix::fs::open(
        pristine,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(err("open", &pristine.to_string_lossy()))?;
    for p in &protections.paths {
        let source = open_in(image.as_fd(), &p.path, OFlags::PATH)
            .map_err(err("find in the image the protected path", &p.path))?;
        let is_dir = rustix::fs::fstat(&source).map_err(err("stat", &p.path))?.st_mode
            & libc::S_IFMT
            == libc::S_IFDIR;
        let target = open_or_create(root.as_fd(), &p.path, is_dir, owner)?;
        let mnt = |what: &'static str| {
            let path = PathBuf::from(&p.path);
            move |source| RootfsError::Mount { what, path, source }
        };
        if p.hidden && !protections.reveal {
            if is_dir {
                mount(
                    Some("brig-hidden"),
                    &fd_path(&target),
                    Some("tmpfs"),
                    MsFlags::MS_RDONLY
                        | MsFlags::MS_NOSUID
                        | MsFlags::MS_NODEV
                        | MsFlags::MS_NOEXEC,
                    Some("size=4k,mode=0555"),
                )
                .map_err(mnt("hide"))?;
                continue;
            }
            let empty = dir.join("empty");
            if !empty.exists() {
                std::fs::write(&empty, b"").map_err(|source| RootfsError::Io {
                    what: "create",
                    path: empty.clone(),
                    source,
                })?;
            }
            mount(Some(&empty), &fd_path(&target), None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .map_err(mnt("hide"))?;
        } else {
            mount(
                Some(&fd_path(&source)),
                &fd_path(&target),
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(mnt("bind the image's copy of"))?;
        }
        // The path now resolves to the new mount: make it read-only.
        let covered = open_in(root.as_fd(), &p.path, OFlags::PATH).map_err(err("open", &p.path))?;
        mount(
            None::<&str>,
            &fd_path(&covered),
            None::<&str>,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV,
            None::<&str>,
        )
        .map_err(mnt("make read-only"))?;
    }
    Ok(())
}

/// Replaces `dir/name` inside the rootfs with `content`, owned by `owner`; a symlink planted
/// at either is replaced or refused, never followed out of the rootfs.
pub fn write_inside(
    merged: &Path,
    dir: &str,
    name: &str,
    content: &[u8],
    owner: u32,
) -> Result<(), RootfsError> {
    let root =
        rustix::fs::open(merged, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(err("open", &merged.to_string_lossy()))?;
    let d =
        open_in(root.as_fd(), dir, OFlags::DIRECTORY | OFlags::RDONLY).map_err(err("open", dir))?;
    let _ = rustix::fs::unlinkat(&d, name, rustix::fs::AtFlags::empty());
    let f = rustix::fs::openat(
        &d,
        name,
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(err("create", name))?;
    rustix::io::write(&f, content).map_err(err("write", name))?;
    rustix::fs::fchown(&f, Some(uid(owner)), Some(gid(owner))).map_err(err("chown", name))?;
    Ok(())
}

/// Whether `path` exists inside the rootfs (resolved in it).
pub fn exists_inside(merged: &Path, path: &str) -> bool {
    rustix::fs::open(merged, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .and_then(|root| open_in(root.as_fd(), path, OFlags::PATH))
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protected_paths_are_checked() {
        assert_eq!(validate("/work//tests/").as_deref(), Ok("/work/tests"));
        for bad in ["", "/", "relative", "/a/../etc", "/./a"] {
            assert!(validate(bad).is_err(), "{bad:?} accepted");
        }
    }
}

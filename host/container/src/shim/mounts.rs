//! The container's mount tree, built by the shim as the container's pid 1 inside its new
//! namespaces from copies of host mounts, and the node's template mount namespace that the
//! container's is a copy of.
//!
//! ```text
//! <rootfs>/proc        new procfs (this pid namespace), sensitive files masked
//! <rootfs>/sys         sysfs, read-only
//! <rootfs>/dev         tmpfs: null zero full random urandom tty (bound from the host), pts, shm
//! ```

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::ShimError;
use crate::shim_proto::ShimConfig;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> ShimError {
    move |e| ShimError::Sys(what, e)
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> ShimError {
    move |e| ShimError::Io(what, e)
}

fn inside(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// The template mount namespace's mount points, where pid 1 attaches what it builds from.
const AT_ROOTFS: &str = "/c";
const AT_DEV_DIR: &str = "/v";
const AT_EMPTY_DIR: &str = "/e";
const AT_HOST_DEV: &str = "/d";
const AT_SHARED_SYS: &str = "/s";
/// A procfs and a sysfs of the node's: the kernel lets a user namespace mount a proc or sysfs
/// of its own only where one is already fully visible. Covered once the container has its own.
const AT_TEMPLATE_PROC: &str = "/p";
const AT_TEMPLATE_SYS: &str = "/y";
/// Every mount point the template has.
const TEMPLATE_DIRS: [&str; 7] = [
    AT_ROOTFS,
    AT_DEV_DIR,
    AT_EMPTY_DIR,
    AT_HOST_DEV,
    AT_SHARED_SYS,
    AT_TEMPLATE_PROC,
    AT_TEMPLATE_SYS,
];

/// Detached copies of the host mounts a container is built from, taken by the shim in the
/// host's mount namespace before it leaves it (`open_tree(OPEN_TREE_CLONE)`).
pub(super) struct Sources {
    rootfs: OwnedFd,
    dev_dir: OwnedFd,
    empty_dir: OwnedFd,
    host_dev: OwnedFd,
    shared_sys: Option<OwnedFd>,
}

fn clone_tree(path: &Path, recursive: bool) -> Result<OwnedFd, ShimError> {
    use rustix::mount::OpenTreeFlags as F;
    let mut flags = F::OPEN_TREE_CLONE | F::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= F::AT_RECURSIVE;
    }
    rustix::mount::open_tree(rustix::fs::CWD, path, flags)
        .map_err(|e| ShimError::Io("clone a mount", e.into()))
}

impl Sources {
    /// In the host's mount namespace: the rootfs with what is mounted in it (protected
    /// paths), the /dev and empty directories of the upper tmpfs, the host's /dev (for its
    /// device nodes) and the shared sysfs.
    pub(super) fn clone_from_host(config: &ShimConfig) -> Result<Sources, ShimError> {
        Ok(Sources {
            rootfs: clone_tree(&config.rootfs, true)?,
            dev_dir: clone_tree(&config.dev_dir, false)?,
            empty_dir: clone_tree(&config.empty_dir, false)?,
            host_dev: clone_tree(Path::new("/dev"), false)?,
            shared_sys: config.shared_sys.as_deref().map(|p| clone_tree(p, false)).transpose()?,
        })
    }
}

fn attach(tree: OwnedFd, at: &str) -> Result<(), ShimError> {
    use rustix::mount::MoveMountFlags as F;
    rustix::mount::move_mount(&tree, "", rustix::fs::CWD, at, F::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(|e| ShimError::Io("attach a mount", e.into()))
}

/// Builds the container's mount tree and enters it. The caller is the container's pid 1, in
/// its new namespaces, whose mount namespace is a copy of the node's template: a read-only
/// empty tmpfs as its root, with the mount points above. The host's mounts are not in it,
/// so entering the rootfs is a `chroot` (constant time) rather than a `pivot_root`, which
/// visits every thread on the host; a process that escaped the chroot (it takes
/// CAP_SYS_CHROOT) would find only that empty tmpfs and its own rootfs.
pub(super) fn build(config: &ShimConfig, sources: Sources) -> Result<(), ShimError> {
    make_private()?;
    attach(sources.rootfs, AT_ROOTFS)?;
    // Attached only to be bound from, then detached again.
    let mut staged = vec![AT_DEV_DIR, AT_EMPTY_DIR, AT_HOST_DEV];
    attach(sources.dev_dir, AT_DEV_DIR)?;
    attach(sources.empty_dir, AT_EMPTY_DIR)?;
    attach(sources.host_dev, AT_HOST_DEV)?;
    let has_shared_sys = sources.shared_sys.is_some();
    if let Some(sys_tree) = sources.shared_sys {
        attach(sys_tree, AT_SHARED_SYS)?;
        staged.push(AT_SHARED_SYS);
    }
    let root = Path::new(AT_ROOTFS);
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mkdir_all(&inside(root, "proc"))?;
    mount(Some("proc"), &inside(root, "proc"), Some("proc"), nosuid, None::<&str>)
        .map_err(sys("mount proc"))?;
    mkdir_all(&inside(root, "sys"))?;
    if has_shared_sys {
        bind_readonly(Path::new(AT_SHARED_SYS), &inside(root, "sys"))?;
    } else {
        let readonly = nosuid | MsFlags::MS_RDONLY;
        mount(Some("sysfs"), &inside(root, "sys"), Some("sysfs"), readonly, None::<&str>)
            .map_err(sys("mount sysfs"))?;
    }
    build_dev(root, Path::new(AT_DEV_DIR), Path::new(AT_HOST_DEV))?;
    for path in &config.masked_paths {
        mask(root, path, Path::new(AT_EMPTY_DIR))?;
    }
    for path in &config.readonly_paths {
        make_readonly(root, path)?;
    }
    // The node's proc and sysfs are covered (they are locked in this namespace: they cannot
    // be unmounted), so not even a process that escaped the chroot would see the host's.
    for at in [AT_TEMPLATE_PROC, AT_TEMPLATE_SYS] {
        bind_readonly(Path::new(AT_EMPTY_DIR), Path::new(at))?;
    }
    // What was bound from stays bound; the sources themselves leave the namespace.
    for at in staged {
        umount2(at, MntFlags::MNT_DETACH).map_err(sys("detach a source mount"))?;
    }
    nix::unistd::chdir(root).map_err(sys("chdir rootfs"))?;
    nix::unistd::chroot(".").map_err(sys("chroot"))?;
    nix::unistd::chdir("/").map_err(sys("chdir /"))?;
    nix::unistd::sethostname(&config.hostname).map_err(sys("sethostname"))?;
    super::sys::loopback_up()?;
    Ok(())
}

/// Makes the node's template mount namespace (in the calling process, which must be
/// single-threaded, and which is back in its own mount namespace on return): a read-only
/// empty tmpfs as the root, with the directories of [`TEMPLATE_DIRS`]. The one `pivot_root`
/// of the node; every container's namespace is a copy of this one.
pub fn make_template() -> Result<OwnedFd, ShimError> {
    use nix::fcntl::{open, OFlag};
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    let own = open("/proc/self/ns/mnt", flags, nix::sys::stat::Mode::empty())
        .map_err(sys("open own mount namespace"))?;
    let proc_dir = super::sys::open_dir_path(Path::new("/proc"), "open /proc")?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(sys("unshare mount namespace"))?;
    let made = build_template(&proc_dir);
    // Back to where it was, whatever happened (setns also resets root and cwd).
    nix::sched::setns(&own, nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(sys("back to own mount namespace"))?;
    made
}

fn build_template(proc_dir: &OwnedFd) -> Result<OwnedFd, ShimError> {
    make_private()?;
    // Over /proc, which every system has (the open descriptor keeps procfs reachable).
    let at = "/proc";
    let locked = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("brig-template"), at, Some("tmpfs"), locked, Some("size=16k,mode=0555"))
        .map_err(sys("mount template tmpfs"))?;
    for dir in TEMPLATE_DIRS {
        std::fs::create_dir(inside(Path::new(at), dir)).map_err(io("template mount point"))?;
    }
    // Not read-only: a container's proc (read-write) must not be more permissive than the
    // visible one.
    let proc_at = inside(Path::new(at), AT_TEMPLATE_PROC);
    mount(Some("proc"), &proc_at, Some("proc"), locked, None::<&str>)
        .map_err(sys("mount template proc"))?;
    let sys_at = inside(Path::new(at), AT_TEMPLATE_SYS);
    mount(Some("sysfs"), &sys_at, Some("sysfs"), locked | MsFlags::MS_RDONLY, None::<&str>)
        .map_err(sys("mount template sysfs"))?;
    let readonly = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | locked;
    mount(None::<&str>, at, None::<&str>, readonly, None::<&str>)
        .map_err(sys("remount template read-only"))?;
    nix::unistd::chdir(at).map_err(sys("chdir template"))?;
    nix::unistd::pivot_root(".", ".").map_err(sys("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("detach old root"))?;
    nix::fcntl::openat(
        proc_dir,
        "thread-self/ns/mnt",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(sys("open template mount namespace"))
}

/// Makes every mount of this namespace private: nothing done here propagates elsewhere.
fn make_private() -> Result<(), ShimError> {
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(sys("make / private"))
}

fn mkdir_all(path: &Path) -> Result<(), ShimError> {
    std::fs::create_dir_all(path).map_err(io("mkdir"))
}

/// /dev: `dev_dir` (on the container's upper tmpfs) bound in, with the host's device nodes
/// bound into it, a devpts of its own, and /dev/shm as a plain directory.
fn build_dev(root: &Path, dev_dir: &Path, host_dev: &Path) -> Result<(), ShimError> {
    let dev = inside(root, "dev");
    mkdir_all(&dev)?;
    mount(Some(dev_dir), &dev, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(sys("bind /dev"))?;
    // The upper tmpfs is nodev (locked in this namespace); the device nodes are binds of their
    // own, so they work.
    mount(
        None::<&str>,
        &dev,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(sys("remount /dev"))?;
    for name in DEVICES {
        let target = dev.join(name);
        std::fs::File::create(&target).map_err(io("create device node placeholder"))?;
        mount(Some(&host_dev.join(name)), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(sys("bind device"))?;
    }
    let pts = dev.join("pts");
    mkdir_all(&pts)?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(sys("mount devpts"))?;
    // /dev/shm is a directory of the upper tmpfs (its size counts against the disk quota),
    // not a superblock of its own.
    let shm = dev.join("shm");
    mkdir_all(&shm)?;
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o1777))
        .map_err(io("chmod /dev/shm"))?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(link)).map_err(io("symlink in /dev"))?;
    }
    Ok(())
}

/// Hides `path` under `empty` (read-only) or `/dev/null`.
fn mask(root: &Path, path: &str, empty: &Path) -> Result<(), ShimError> {
    let target = inside(root, path);
    let Ok(meta) = std::fs::metadata(&target) else { return Ok(()) };
    if meta.is_dir() {
        bind_readonly(empty, &target)
    } else {
        mount(
            Some(&inside(root, "dev/null")),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(sys("mask file"))
    }
}

/// Binds `source` at `target`, read-only, nosuid, nodev and noexec.
fn bind_readonly(source: &Path, target: &Path) -> Result<(), ShimError> {
    let locked = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    bind_with(source, target, MsFlags::empty(), locked)
}

fn make_readonly(root: &Path, path: &str) -> Result<(), ShimError> {
    let target = inside(root, path);
    if !target.exists() {
        return Ok(());
    }
    bind_with(&target, &target, MsFlags::MS_REC, MsFlags::MS_NOSUID)
}

/// Binds `source` at `target` (`bind` adds e.g. MS_REC), then remounts it read-only with
/// `flags`: a bind takes its flags only from a remount.
fn bind_with(source: &Path, target: &Path, bind: MsFlags, flags: MsFlags) -> Result<(), ShimError> {
    mount(Some(source), target, None::<&str>, MsFlags::MS_BIND | bind, None::<&str>)
        .map_err(sys("bind read-only"))?;
    let remount = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | flags;
    mount(None::<&str>, target, None::<&str>, remount, None::<&str>)
        .map_err(sys("remount read-only"))
}

//! The container's mount tree, built by the shim as the container's pid 1 inside its new
//! namespaces, and the pivot into it.
//!
//! ```text
//! <rootfs>/proc        new procfs (this pid namespace), sensitive files masked
//! <rootfs>/sys         sysfs, read-only
//! <rootfs>/dev         tmpfs: null zero full random urandom tty (bound from the host), pts, shm
//! ```

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

/// Builds the container's mount tree and pivots into it. The caller is the container's pid 1,
/// in its new namespaces.
pub(super) fn build(config: &ShimConfig) -> Result<(), ShimError> {
    let root = config.rootfs.as_path();
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(sys("make / private"))?;
    // The rootfs mount came from the host's namespace, so it is locked here and pivot_root
    // refuses it; a bind mount made in this namespace is not.
    mount(Some(root), root, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .map_err(sys("bind rootfs"))?;
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mkdir_all(&inside(root, "proc"))?;
    mount(Some("proc"), &inside(root, "proc"), Some("proc"), nosuid, None::<&str>)
        .map_err(sys("mount proc"))?;
    mkdir_all(&inside(root, "sys"))?;
    match &config.shared_sys {
        Some(shared) => bind_readonly(shared, &inside(root, "sys"))?,
        None => mount(
            Some("sysfs"),
            &inside(root, "sys"),
            Some("sysfs"),
            nosuid | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(sys("mount sysfs"))?,
    }
    build_dev(root, &config.dev_dir)?;
    for path in &config.masked_paths {
        mask(root, path, &config.empty_dir)?;
    }
    for path in &config.readonly_paths {
        make_readonly(root, path)?;
    }
    nix::unistd::chdir(root).map_err(sys("chdir rootfs"))?;
    // pivot_root(".", "."): stack the old root under the new one, then detach it.
    nix::unistd::pivot_root(".", ".").map_err(sys("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("detach old root"))?;
    nix::unistd::chdir("/").map_err(sys("chdir /"))?;
    nix::unistd::sethostname(&config.hostname).map_err(sys("sethostname"))?;
    super::sys::loopback_up()?;
    Ok(())
}

fn mkdir_all(path: &Path) -> Result<(), ShimError> {
    std::fs::create_dir_all(path).map_err(io("mkdir"))
}

/// /dev: `dev_dir` (on the container's upper tmpfs) bound in, with the host's device nodes
/// bound into it, a devpts of its own, and /dev/shm as a plain directory.
fn build_dev(root: &Path, dev_dir: &Path) -> Result<(), ShimError> {
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
        mount(
            Some(&Path::new("/dev").join(name)),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
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
